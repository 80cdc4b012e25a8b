"""bf16 plans: estimated against measured per-rank peak memory on the planlang runtime (CPU, gloo).

Run: .venv/bin/python bench/precision_memory.py [--models gpt2,llama] [--layouts dp4,dp2tp2,zero3]
                                               [--precisions bf16,amp] [--out FILE]

The model zoo's plans (tests/zoo/plans.py) with precision fields in the optimizer block:

    bf16   `precision = bf16`: bf16 parameters and compute, f32 gradient reduction, f32 master weights
           (planlang.runtime.precision.MasterWeights; under ZeRO-3 FSDP2's MixedPrecisionPolicy)
    amp    `compute = bf16`: f32 parameters, matmuls under torch.autocast(bf16), f32 reduction
    pure   `precision = bf16` with `master = bf16`: everything in bf16, no master copy

Each plan is estimated as `planlang estimate` does (estimate_plan with the lowered program run on meta,
or the simulation of the model's code under ZeRO-3) and measured as bench/zoo_memory.py measures: 4 gloo
ranks through planlang.apply, two warm-up steps, then the median of five steps under torch's MemTracker;
the error is
estimate / measured - 1.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from zoo_memory import WORLD, finish, measure  # noqa: E402

from planlang.lang.diagnostics import Severity  # noqa: E402
from planlang.model.validation import check_with_model  # noqa: E402
from planlang.model.price.estimate import estimate_plan  # noqa: E402
from planlang.plan.complete import complete  # noqa: E402
from planlang.runtime.program_memory import measure as measure_program  # noqa: E402
from tests.zoo.plans import plan_text  # noqa: E402

PRECISIONS = {
    "bf16": "    precision = bf16",
    "amp": "    compute = bf16",
    "pure": "    precision = bf16\n    master = bf16",
    "f32": "",
}


# --size medium: each model 4 layers of width 256 (the zoo's are 2 of 64, where fixed per-tensor costs weigh)
MEDIUM = {
    "gpt2": "n_layer = 4, n_embd = 256, vocab_size = 1024",
    "llama": "num_hidden_layers = 4, hidden_size = 256, intermediate_size = 1024, vocab_size = 1024",
    "bert": "num_hidden_layers = 4, hidden_size = 256, intermediate_size = 1024, vocab_size = 1024",
    "vit": "num_hidden_layers = 4, hidden_size = 256, intermediate_size = 1024",
}


def precision_plan(model: str, layout: str, precision: str, size: str = "zoo") -> str:
    """The zoo's plan of `model` under `layout` with the precision fields of `precision` added (`precision`
    "f32": none), the model's config scaled up with `size` "medium"."""
    text = plan_text(model, layout)
    if size == "medium":
        text = text.replace('"()\n', f'"({MEDIUM[model]})\n', 1)
    if precision == "f32":
        return text
    fields = PRECISIONS[precision]
    if "optimizer adamw(lr = 1e-3) {\n" in text:
        return text.replace("optimizer adamw(lr = 1e-3) {\n", "optimizer adamw(lr = 1e-3) {\n" + fields + "\n")
    return text.replace("optimizer adamw(lr = 1e-3) ", "optimizer adamw(lr = 1e-3) {\n" + fields + "\n}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="gpt2,llama,bert")
    ap.add_argument("--layouts", default="dp4,dp2tp2,zero3")
    ap.add_argument("--precisions", default="bf16,amp")
    ap.add_argument("--size", default="zoo", choices=("zoo", "medium"))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    lines = [f"bf16 memory: estimate vs MemTracker on the planlang runtime (bench/precision_memory.py --size "
             f"{args.size}), {WORLD} gloo ranks, torch {torch.__version__}",
             f"{'model':8} {'layout':6} {'prec':5} {'rank':>4} {'measured MiB':>13} {'estimate MiB':>13} {'error':>8}"]
    print("\n".join(lines), flush=True)
    errors = []
    with tempfile.TemporaryDirectory() as d:
        for model in args.models.split(","):
            for layout in args.layouts.split(","):
                for prec in args.precisions.split(","):
                    path = Path(d, f"{model}_{layout}_{prec}.plan")
                    path.write_text(precision_plan(model, layout, prec, args.size))
                    checked = check_with_model(str(path))
                    if checked.errors:
                        codes = sorted({x.code for x in checked.diagnostics if x.severity is Severity.ERROR})
                        line = f"{model:8} {layout:6} {prec:5}    - not run: {', '.join(codes)}"
                        print(line, flush=True)
                        lines.append(line)
                        continue
                    plan = complete(checked.plan)
                    estimates = estimate_plan(plan, program=measure_program)
                    for r, peak in enumerate(measure(path)):
                        est = estimates[r * len(estimates) // WORLD].peak
                        meas = peak["Total"] - peak["inputs"]
                        err = est / meas - 1
                        errors.append(err)
                        line = (f"{model:8} {layout:6} {prec:5} {r:>4} {meas / 2**20:>13.3f} {est / 2**20:>13.3f} "
                                f"{err:>+8.1%}")
                        print(line, flush=True)
                        lines.append(line)
    finish(lines, errors, args.out)


if __name__ == "__main__":
    main()
