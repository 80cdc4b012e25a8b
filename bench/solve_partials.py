"""Every partial plan the project ships, solved and checked as a user would (issue #15):

    planlang solve PLAN > OUT && planlang check OUT

for each plan in examples/partial/ and bench/plan_configs/partial/: the solve's stdout is the plan and
nothing else (it must check as written), its CPU seconds (user + system of the child), whether the search
was complete or cut by --time-limit, the header's step and peak, and the check's exit status.

Run: .venv/bin/python bench/solve_partials.py [--time-limit S] [--only TEXT] [--out FILE]
(default: every plan, --time-limit 300, the table written to bench/results/solve_partials.txt).
"""
from __future__ import annotations

import argparse
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLANLANG = [str(ROOT / ".venv" / "bin" / "planlang")]
RESULT = ROOT / "bench" / "results" / "solve_partials.txt"


def partial_plans() -> list[Path]:
    return sorted((ROOT / "examples" / "partial").glob("*.plan")) + sorted(
        (ROOT / "bench" / "plan_configs" / "partial").glob("*.plan"))


def _child_cpu(before) -> float:
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def solve_and_check(plan: Path, limit: float, out_dir: Path) -> dict:
    out = out_dir / plan.name
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    with open(out, "w") as f:
        solved = subprocess.run(PLANLANG + ["solve", str(plan), "--time-limit", str(limit)], stdout=f,
                                stderr=subprocess.PIPE, text=True, cwd=ROOT)
    cpu, wall = _child_cpu(before), time.monotonic() - t0
    text = out.read_text()
    row = {"plan": str(plan.relative_to(ROOT)), "solve": solved.returncode, "cpu": cpu, "wall": wall,
           "cut": "INCOMPLETE SEARCH" in text, "step": "", "peak": "", "check": None, "why": ""}
    if solved.returncode != 0:
        row["why"] = (solved.stderr.strip().splitlines() or ["?"])[-1][:120]
        return row
    steps = re.findall(r"step ([0-9.]+ ms)", text.split("\n\n")[0])
    peaks = re.findall(r"peak ([0-9.]+ [KMG]i?B)", text.split("\n\n")[0])
    row["step"] = max(steps, key=lambda s: float(s.split()[0]), default="")
    row["peak"] = peaks[0] if peaks else ""
    checked = subprocess.run(PLANLANG + ["check", str(out)], capture_output=True, text=True, cwd=ROOT)
    row["check"] = checked.returncode
    if checked.returncode != 0:
        row["why"] = (checked.stdout + checked.stderr).strip().splitlines()[0][:120]
    return row


def render(rows: list[dict], limit: float) -> str:
    head = f"{'plan':62} {'solve':>5} {'cpu s':>7} {'search':>9} {'slowest step':>13} {'peak (1st)':>11} {'check':>6}"
    lines = [f"`planlang solve PLAN > OUT && planlang check OUT` for every partial plan (--time-limit {limit:g} s "
             "wall; cpu s: the solve process, user + system)", head, "-" * len(head)]
    for r in rows:
        check = "-" if r["check"] is None else ("ok" if r["check"] == 0 else "FAIL")
        lines.append(f"{r['plan']:62} {'ok' if r['solve'] == 0 else 'FAIL':>5} {r['cpu']:>7.1f} "
                     f"{'cut' if r['cut'] else 'complete':>9} {r['step']:>13} {r['peak']:>11} {check:>6}"
                     + (f"  {r['why']}" if r["why"] else ""))
    ok = sum(r["solve"] == 0 and r["check"] == 0 for r in rows)
    lines.append(f"{ok} of {len(rows)} solved and checked")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--time-limit", type=float, default=300.0)
    ap.add_argument("--only", default="", help="only plans whose path contains TEXT")
    ap.add_argument("--out", default=None, help=f"write the table here (default {RESULT.relative_to(ROOT)} for a full run)")
    args = ap.parse_args(argv)
    plans = [p for p in partial_plans() if args.only in str(p)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for p in plans:
            print(f"... {p.relative_to(ROOT)}", file=sys.stderr, flush=True)
            rows.append(solve_and_check(p, args.time_limit, Path(tmp)))
    table = render(rows, args.time_limit)
    print(table, end="")
    out = args.out or (None if args.only else str(RESULT))
    if out:
        Path(out).write_text(table)
    return 0 if all(r["solve"] == 0 and r["check"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
