"""`planlang verify PLAN --steps 2` as a user runs it (torchrun, gloo), for the gloo tests that judge a
whole plan: the run's table on stdout, its verdict in the exit status."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def verify_text(text: str, folder: Path, name: str, steps: int = 2) -> str:
    """Write `text` as `folder/name.plan`, verify it and return the table; fails the test on a FAIL, a
    refusal or a crash, with the run's output."""
    plan = folder / f"{name}.plan"
    plan.write_text(text)
    out = subprocess.run([sys.executable, "-m", "planlang.cli", "verify", str(plan), "--steps", str(steps), "--quiet"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PLANLANG_BACKEND": "gloo"})
    assert out.returncode == 0 and "PASS" in out.stdout, out.stdout + out.stderr[-3000:]
    return out.stdout
