"""Predicted vs measured per-device peak memory over the memory cases (bench/memory_cases.py).

Run: .venv/bin/python bench/memory_accuracy.py [--measured results.json] [--case NAME ...]
     [--runtime torch|planlang|both]

Measured: one real training step per case under torch's MemTracker, single process or 2-4 gloo ranks,
with hand-written torch equivalents of each plan (DDP, parallelize_module, torch.distributed.pipelining,
torch.utils.checkpoint, ZeroRedundancyOptimizer) and, for a subset (`NAME@planlang` rows), on the
planlang runtime itself (planlang.apply of the plan) — bench/memory_measure.py; without --measured it
runs them (10-30 minutes on a loaded 2-core machine). Predicted: `planlang estimate` of the equivalent
plan (memory_cases.to_plan), with DDP's gradient buckets for the hand-written data-parallel cases
(`grad_sync="ddp"`) and the planlang runtime's flat gradient all-reduce otherwise.
Both sides exclude the step's input batch and targets (MemTracker's "Other"): the plan declares the
inputs but not the loss targets, and neither belongs to the parallel layout being estimated.

Prints one row per (case, rank) with the relative error, then the distribution and the share of pairs
within 5 %.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (str(ROOT), str(ROOT / "bench")):
    if p not in sys.path:
        sys.path.insert(0, p)

from memory_cases import CASES_BY_NAME, to_plan  # noqa: E402


def grad_sync(case, runtime: str = "torch") -> str:
    """How the measured run sums data-parallel gradients: the hand-written ddp / zero1 cases use torch's
    DDP (gradient buckets); dp x tp by hand and the planlang runtime use one flat all-reduce."""
    return "ddp" if runtime == "torch" and case.strategy in ("ddp", "zero1") else "flat"


def predicted(case, runtime: str = "torch") -> list:
    from planlang.model.price.estimate import estimate_plan
    from planlang.plan.checker import check_text
    from planlang.plan.complete import complete

    res = check_text(to_plan(case), str(ROOT / "bench" / f"{case.name}.plan"))
    if res.errors or res.plan is None:
        raise RuntimeError(f"{case.name}: plan does not check: {[str(d) for d in res.diagnostics]}")
    if runtime == "planlang":  # as `planlang estimate` prices it: the lowered program where it can run on meta
        from planlang.runtime.program_memory import measure

        return estimate_plan(complete(res.plan), program=measure)
    return estimate_plan(complete(res.plan), grad_sync=grad_sync(case, runtime))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--measured", help="JSON written by bench/memory_measure.py (default: run it now)")
    ap.add_argument("--case", nargs="*", default=None)
    ap.add_argument("--runtime", choices=("torch", "planlang", "both"), default="both",
                    help="which measurements to run (without --measured) and compare")
    args = ap.parse_args()
    if args.measured is None:
        out = Path(tempfile.mkdtemp()) / "measured.json"
        cmd = [sys.executable, str(ROOT / "bench" / "memory_measure.py"), "--json", str(out),
               "--runtime", args.runtime]
        if args.case:
            for c in args.case:
                cmd += ["--case", c]
        t = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        print(f"measured in {time.perf_counter() - t:.0f} s")
        args.measured = str(out)
    measured = json.loads(Path(args.measured).read_text())["results"]
    rows = []
    for m in measured:
        runtime = m.get("runtime", "torch")
        if (args.case and m["case"] not in args.case) or args.runtime not in (runtime, "both"):
            continue
        case = CASES_BY_NAME[m["case"]]
        est = predicted(case, runtime)
        label = m["case"] if runtime == "torch" else f"{m['case']}@planlang"
        for r in m["ranks"]:
            e = est[r["rank"]] if len(est) > 1 else est[0]
            meas = r["peak"]["Total"] - r["peak"].get("inputs", 0)
            err = (e.peak - meas) / meas
            rows.append((label, r["rank"], e.device, meas, e.peak, err, runtime))
    print(f"{'case':40} {'rank':>4} {'device':>11} {'measured MiB':>13} {'predicted MiB':>14} {'error':>8}")
    for name, rank, dev, meas, pred, err, _ in rows:
        flag = "" if abs(err) <= 0.05 else "  <-- over 5 %"
        print(f"{name:40} {rank:>4} {dev:>11} {meas / 2**20:>13.2f} {pred / 2**20:>14.2f} {err * 100:>+7.2f}%{flag}")
    for title, part in (("hand-written torch equivalents", [r for r in rows if r[6] == "torch"]),
                        ("planlang runtime", [r for r in rows if r[6] == "planlang"]), ("all", rows)):
        if part:
            print(f"\n{title}: " + summary(part))
    return 0


def summary(rows: list) -> str:
    errs = [abs(r[5]) for r in rows]
    within = sum(e <= 0.05 for e in errs)
    return (f"{len(rows)} (case, rank) pairs over {len({r[0] for r in rows})} cases\n"
            f"  within 1 %: {sum(e <= 0.01 for e in errs)}   within 5 %: {within} ({100 * within / len(rows):.1f} %)   "
            f"within 10 %: {sum(e <= 0.10 for e in errs)}\n"
            f"  |error|: median {100 * statistics.median(errs):.2f} %, mean {100 * statistics.mean(errs):.2f} %, "
            f"max {100 * max(errs):.2f} %")


if __name__ == "__main__":
    sys.exit(main())
