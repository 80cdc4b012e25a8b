"""Wall time of `planlang check` per invocation on the bundled examples (target: <= 0.3 s each).

Run: .venv/bin/python bench/check_time.py [--repeat 5]
Prints one row per example plan (median of the repeats, a fresh process each time, as a user runs it),
and the in-process time of parse+resolve+check for comparison.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLANLANG = [sys.executable, "-m", "planlang.cli"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    plans = sorted((ROOT / "examples").rglob("*.plan"))
    from planlang.plan.checker import check_file

    print(f"{'plan':44} {'process (s)':>12} {'in-process (ms)':>16} {'result':>8}")
    worst = 0.0
    for plan in plans:
        rel = plan.relative_to(ROOT)
        walls = []
        rc = 0
        for _ in range(args.repeat):
            t = time.perf_counter()
            rc = subprocess.run(PLANLANG + ["check", str(rel)], cwd=ROOT, capture_output=True).returncode
            walls.append(time.perf_counter() - t)
        check_file(str(plan))  # warm the grammar cache
        t = time.perf_counter()
        for _ in range(args.repeat):
            check_file(str(plan))
        inproc = (time.perf_counter() - t) / args.repeat * 1000
        med = statistics.median(walls)
        worst = max(worst, med)
        print(f"{str(rel):44} {med:12.3f} {inproc:16.1f} {'ok' if rc == 0 else f'rc={rc}':>8}")
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], capture_output=True)
    print(f"\nbare python start: {time.perf_counter() - t:.3f} s; worst check: {worst:.3f} s "
          f"({worst / 0.3:.2f} x the 0.3 s target)")


if __name__ == "__main__":
    main()
