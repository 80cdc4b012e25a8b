"""ZeRO-2 against ZeRO-3 per block: measured per-rank peak beside the estimator's, GPT-2 on 4 gloo ranks.

Run: .venv/bin/python bench/zero_blocks.py [--out bench/results/zero_blocks.txt]

GPT-2 (examples/gpt2) in four shapes - 6 blocks of hidden 256 with a vocabulary of 1024 (a block's
parameters 1.5x the rest's), 3 blocks of hidden 384 with a vocabulary of 4096 (0.56x), and, not among
the shapes the estimator's terms were read off, 4 blocks of hidden 320 with a vocabulary of 2048 (0.94x)
and 2 blocks of hidden 256 (no block between two others) - batch 8 of 32 tokens split over dp = 4, AdamW,
under `zero = 2 over dp` and `zero = 3 over dp`: `planlang.apply` shards each block as its own FSDP2 unit
(planlang.runtime.zero_blocks) and the rest as the root unit. Each rank runs two untracked warm-up
steps, then one step (forward, loss, backward, optimizer step, zero_grad) under torch's MemTracker with
the ParallelModel, the optimizer and the batch registered (bench/zoo_memory.py's method); the table
gives the measured peak less the batch (the estimate covers what the step allocates and the state it
keeps), `planlang.model.price.estimate.estimate_plan`'s peak and the error (estimate / measured - 1). The row
"zero3 whole" runs ZeRO-3 with the whole model as one unit (the runtime before per-block units: the
block list emptied) for comparison; the estimator prices per-block units only, so it has no estimate.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from zoo_memory import WORLD, finish, measure  # noqa: E402  (planlang.apply on 4 gloo ranks, one step under MemTracker)

from planlang.model.price.estimate import estimate_plan  # noqa: E402
from planlang.plan.checker import check_file  # noqa: E402
from planlang.plan.complete import complete  # noqa: E402

MODELS = ("layers = 6, hidden = 256, heads = 4, vocab = 1024, seq = 32",
          "layers = 3, hidden = 384, heads = 4, vocab = 4096, seq = 32",
          "layers = 4, hidden = 320, heads = 5, vocab = 2048, seq = 32",
          "layers = 2, hidden = 256, heads = 4, vocab = 1024, seq = 32")


def plan_text(zero: int, model: str = MODELS[0]) -> str:
    return f"""use hardware
model gpt2 = "examples.gpt2.model:build"({model})
input idx : i64[batch = 8, seq = 32]
mesh ranks of {WORLD} x hardware.cpu {{ dp = {WORLD} over hardware.loopback }}
optimizer adamw(lr = 0.001) {{ zero = {zero} over dp }}
data idx : [dp, _]
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--by-category", action="store_true", help="also print rank 0's peak and estimate by category")
    args = ap.parse_args()
    mib = lambda b: b / 2**20  # noqa: E731
    lines = [f"ZeRO per block: estimate vs MemTracker through planlang.apply (bench/zero_blocks.py), {WORLD} gloo "
             f"ranks, torch {torch.__version__}",
             f"GPT-2 (examples/gpt2), batch 8 of 32 tokens over dp = {WORLD}, AdamW; per-rank peak less the batch",
             f"{'case':12} {'units':>5} {'rank':>4} {'measured MiB':>13} {'estimate MiB':>13} {'error':>8}"]
    print("\n".join(lines), flush=True)
    errors = []
    with tempfile.TemporaryDirectory() as d:
        cases = (("zero2", 2, False), ("zero3", 3, False), ("zero3 whole", 3, True))  # the last: first shape only
        for k, (model, name, zero, whole) in enumerate(
                [(m, n, z, w) for i, m in enumerate(MODELS) for n, z, w in cases[:3 if i == 0 else 2]]):
            if name == "zero2":
                line = f"GPT-2 {model}"
                print(line, flush=True)
                lines.append(line)
            path = Path(d, f"gpt2_{k}.plan")
            path.write_text(plan_text(zero, model))
            plan = complete(check_file(str(path)).plan)
            est = None if whole else estimate_plan(plan)[0]
            measured = measure(path, whole)
            if args.by_category:
                print(f"  {name} rank 0 measured:", {k: f"{mib(v):.3f}" for k, v in measured[0].items()})
                if est is not None:
                    print(f"  {name} estimate:", {k: f"{mib(getattr(est, k)):.3f}" for k in
                                                 ("parameters", "gradients", "optimizer", "buffers", "activations",
                                                  "transient", "peak")})
            for r, peak in enumerate(measured):
                meas = peak["Total"] - peak["inputs"]
                if est is None:
                    line = f"{name:12} {peak['units'] + 1:>5} {r:>4} {mib(meas):>13.3f} {'-':>13} {'-':>8}"
                else:
                    err = est.peak / meas - 1
                    errors.append(err)
                    line = (f"{name:12} {peak['units'] + 1:>5} {r:>4} {mib(meas):>13.3f} {mib(est.peak):>13.3f} "
                            f"{err:>+8.1%}")
                print(line, flush=True)
                lines.append(line)
    finish(lines, errors, args.out)


if __name__ == "__main__":
    main()
