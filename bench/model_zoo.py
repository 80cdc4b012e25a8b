"""Model-zoo conformance: every architecture of examples/zoo under every layout, checked and verified.

Run: .venv/bin/python bench/model_zoo.py [--models llama,bert] [--layouts dp4,zero3] [--steps 2]

For each (model, layout) - the plans of tests/zoo/plans.py (bf16: dp4 under `precision = bf16`), 4 gloo
processes on CPU:
  check    `planlang check --model`: the diagnostics' codes (empty: clean)
  program  the lowered per-rank program (no processes): ops run on the whole batch (PL364) and the
           activations whose dim 0 is the batch that are not split over dp (both 0 when the batch stays
           split everywhere)
  verify   `planlang verify --steps N`: PASS when every step's loss, gradients and parameters equal one
           process's within the bound it prints; the worst gradient error and the wall time
Results: a table on stdout and in bench/results/model_zoo.txt (with --out).
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planlang.model.validation import check_with_model  # noqa: E402
from planlang.model.capture.load import build_model  # noqa: E402
from planlang.model.program.lowering import Run  # noqa: E402
from planlang.plan.complete import complete  # noqa: E402
from planlang.runtime.apply import lower_plan  # noqa: E402
from tests.zoo.plans import BATCH, DROPOUT, LAYOUTS, ZOO, plan_text  # noqa: E402


def program_row(path: Path) -> tuple[str, str]:
    res = check_with_model(str(path))
    codes = ",".join(sorted({d.code for d in res.diagnostics})) or "clean"
    if res.errors:
        return codes, "-"
    plan = complete(res.plan)
    prog = lower_plan(build_model(plan.model, plan.path), plan)
    whole = sum(1 for i in prog.instructions if isinstance(i, Run) and i.node.op.output
                and i.node.op.output[0] == BATCH and "dp" not in i.output.axes_of(0))
    return codes, f"{len(prog.fallbacks)} / {whole}"


def verify_row(path: Path, steps: int) -> tuple[str, str, float]:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "planlang.cli", "verify", str(path), "--steps", str(steps), "--quiet"],
                         cwd=ROOT, capture_output=True, text=True, timeout=900,
                         env={**os.environ, "PLANLANG_BACKEND": "gloo"})
    seconds = time.perf_counter() - t0
    verdict = "PASS" if out.returncode == 0 and "PASS" in out.stdout else f"FAIL (exit {out.returncode})"
    errs = [float(m) for m in re.findall(r"\s([0-9.]+e[-+][0-9]+)/[0-9.e+-]+\s+[0-9.]+e", out.stdout)]
    grad = re.findall(r"^\s+\d+\s+\S+\s+\S+\s+\S+\s+(\S+)/", out.stdout, re.M)
    worst = max((float(g) for g in grad), default=float("nan")) if grad else float("nan")
    if verdict != "PASS":
        tail = (out.stderr.strip().splitlines() or ["?"])[-1]
        verdict += f": {tail[:80]}"
    del errs
    return verdict, f"{worst:.1e}", seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(ZOO))
    ap.add_argument("--layouts", default="dp4,dp2tp2,pp2dp2,zero3,bf16")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--dropout", type=float, default=0.0, help="every dropout of the models' configs at this "
                    "probability (as Hugging Face models train by default; the CNNs, which have none, are "
                    "left out); verify compares with dropout off on both sides and says how many calls it turned off")
    ap.add_argument("--out", default=None, help="also write the table here")
    args = ap.parse_args()
    models = [m for m in args.models.split(",") if not args.dropout or m in DROPOUT]
    lines = [f"model zoo conformance (bench/model_zoo.py), {args.steps} verify steps, 4 gloo processes, "
             f"torch {__import__('torch').__version__}"
             + (f", every dropout of the configs at {args.dropout}" if args.dropout else ""),
             f"{'model':8} {'layout':6} {'check':10} {'PL364 / whole':>13} {'verify':8} {'grad err':>9} {'s':>6}"]
    print("\n".join(lines), flush=True)
    with tempfile.TemporaryDirectory() as d:
        for model in models:
            for layout in args.layouts.split(","):
                path = Path(d, f"{model}_{layout}.plan")
                path.write_text(plan_text(model, layout, args.dropout))
                codes, prog = program_row(path)
                verdict, grad, secs = verify_row(path, args.steps) if prog != "-" else ("-", "-", 0.0)
                line = f"{model:8} {layout:6} {codes:10} {prog:>13} {verdict:8} {grad:>9} {secs:6.1f}"
                print(line, flush=True)
                lines.append(line)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
