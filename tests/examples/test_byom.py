"""docs/byom.md ("Bring your own model") followed literally: its three files are examples/byom/ as
they stand, `planlang check --model` accepts the plan, and `planlang run` trains the Hugging Face Llama
under it on 2 gloo processes."""
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "byom.md").read_text()
BYOM = ROOT / "examples" / "byom"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC, re.S)


@pytest.mark.parametrize("name, lang", [("llama_dp2.plan", "plan"), ("llama_model.py", "python"),
                                        ("train.py", "python")])
def test_the_guide_shows_the_files_verbatim(name, lang):
    assert (BYOM / name).read_text() in _blocks(lang)


def test_the_guides_commands_run(tmp_path):
    # the guide's commands, from the repository root as written there
    cli = [sys.executable, "-m", "planlang.cli"]
    check = subprocess.run([*cli, "check", "--model", "examples/byom/llama_dp2.plan"], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stdout + check.stderr
    command = next(line for block in _blocks("bash") for line in block.splitlines() if line.startswith("planlang run"))
    run = subprocess.run([*cli, *command.split()[1:]], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    losses = [float(m) for m in re.findall(r"^step \d+: loss (\S+)$", run.stdout, re.M)]
    assert len(losses) == 3 and all(math.isfinite(v) for v in losses)
    assert abs(losses[0] - math.log(256)) < 0.5  # a fresh model on 256 tokens: about ln(256) = 5.55
