"""The estimate's local model (its simulated step and profile, estimate._simulate_local) run folded — as
3 and 4 of its repeated blocks, extrapolated (planlang.model.capture.fold_step, issue #29) — and whole,
side by side: process CPU-s of that call alone (the model probed before), and whether every figure
(rows' StepMemory, Profile, trained parameters) is the same.

    python bench/fold_estimate.py              # every row; writes bench/results/fold_estimate.txt
    python bench/fold_estimate.py --rows 8B --no-write
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "fold_estimate.txt"
ROWS = {
    "8B": "bench/plan_configs/scale/llama3_8b.plan",
    "70B": "bench/plan_configs/scale/llama3_70b.plan",
    "megatron 1.7B": "bench/plan_configs/megatron/megatron_1_7b.plan",
    "gpt2 bf16": "examples/gpt2/gpt2_bf16.plan",
    "gpt2 accumulate": "examples/gpt2/gpt2_accumulate.plan",
    "bert tp": "examples/templates/bert_tp.plan",
}


def measure(path: str) -> tuple[str, float, float, bool]:
    from planlang.model.capture import fold_step
    from planlang.model.price import estimate as E
    from planlang.model.price.caches import LruCache
    from planlang.plan.checker import check_text
    from planlang.plan.complete import complete

    full = ROOT / path
    sys.path.insert(0, str(full.parent))
    plan = complete(check_text(full.read_text(), path=str(full)).plan)
    facts, _ = E._model_facts(plan)
    stage_of, params = E.local_params(plan, facts)
    micro = plan.microbatches
    got, times, how = {}, {}, ""
    for folded in (True, False):
        fold_step.ENABLED = folded
        fold_step.LOG.clear()
        t = time.process_time()
        got[folded] = E._simulate_local(plan, facts, params, E.data_degree(plan) * micro, micro, stage_of,
                                        ("bench",), LruCache("bench", 1))
        times[folded] = time.process_time() - t
        if folded:
            fold, why = fold_step.LOG[-1] if fold_step.LOG else (None, "not run")
            how = str(fold) if fold is not None else f"whole: {why}"
    fold_step.ENABLED = True
    same = got[True][:3] == got[False][:3]
    return how, times[True], times[False], same


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", nargs="*", default=list(ROWS))
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    lines = [f"{'plan':<16} {'blocks':<22} {'folded CPU-s':>12} {'whole CPU-s':>12} {'same':>5}"]
    print(lines[0], flush=True)
    for name in args.rows:
        how, folded, whole, same = measure(ROWS[name])
        lines.append(f"{name:<16} {how:<22} {folded:>12.2f} {whole:>12.2f} {str(same):>5}")
        print(lines[-1], flush=True)
    if not args.no_write:
        RESULTS.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
