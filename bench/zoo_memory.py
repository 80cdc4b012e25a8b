"""Estimated against measured per-rank peak memory for the model zoo on the planlang runtime.

Run: .venv/bin/python bench/zoo_memory.py [--models llama,resnet] [--layouts dp4,zero3] [--out FILE]

For each (model, layout) of tests/zoo/plans.py: `planlang.model.price.estimate.estimate_plan` predicts the
per-device peak (the planlang runtime's gradient sync, "flat"); 4 gloo ranks then run the plan through
`planlang.apply` (the plan's optimizer, ZeRO as it says) - two untracked warm-up steps, then five steps
(forward, loss, backward, gradient sync, optimizer step, zero_grad), each under its own MemTracker (the
step of median peak is reported; a single step's peak moves by a few buffers) with the
model, the optimizer and the batch registered (bench/memory_measure.py's method). The table gives each
rank's measured peak less the step's input and target tensors (created before the step, as
bench/memory_accuracy.py compares: the estimate covers what the step allocates and the state it keeps),
the estimate, and the error (estimate / measured - 1).
"""
from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from memory_measure import _categories, _tracker, without_backward_module_hooks  # noqa: E402

from planlang.lang.diagnostics import Severity  # noqa: E402
from planlang.model.validation import check_with_model  # noqa: E402
from planlang.model.price.estimate import estimate_plan  # noqa: E402
from planlang.runtime.program_memory import measure as measure_program  # noqa: E402
from planlang.model.capture.load import build_model, plan_loss  # noqa: E402
from planlang.plan.checker import check_file  # noqa: E402
from planlang.plan.complete import complete  # noqa: E402
from planlang.plan.types import SPLIT_BACKWARD  # noqa: E402
from tests.zoo.plans import LAYOUTS, ZOO, plan_text  # noqa: E402  (also EXTRA_LAYOUTS: --layouts pp2dp2i)

WORLD = 4
MEASURED_STEPS = 5  # steps measured after the warm-up, each under its own MemTracker; the median is reported


def _worker(rank: int, path: str, port: int, out: str, whole: bool = False) -> None:
    import os

    import planlang.runtime.apply as apply_mod
    from planlang.runtime.teardown import leave
    from planlang.runtime.verify import make_batch

    warnings.filterwarnings("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=_world(path))
    if whole:  # ZeRO-2/3 with the whole model as one FSDP2 unit (no per-block units), for comparison
        apply_mod.zero_blocks = lambda *a, **k: []
    plan = complete(check_file(path).plan)
    torch.manual_seed(0)
    model = build_model(plan.model, plan.path, device="cpu")
    loss_fn = plan_loss(plan)
    inputs, targets = make_batch(model, plan, loss_fn, 1)
    pm = apply_mod.apply(model, plan, loss_fn=loss_fn, targets=tuple(t.to("meta") for t in targets))
    del model
    opt = pm.optimizer()

    def step():
        loss = pm.step(*inputs, *targets)
        del loss
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    step()
    if plan.pipeline is not None and plan.pipeline.schedule.kind in SPLIT_BACKWARD:
        without_backward_module_hooks()
    runner = getattr(pm, "runner", None)  # a pipeline: this rank's stage modules
    # tensors the runtime keeps between steps that MemTracker would not see otherwise: the persistent
    # gradient buckets (made in the warm-up steps; the gradients are their slices only after backward)
    sync = getattr(pm, "_grad_sync", None)
    kept = [b.flat for b in sync.buckets if b.flat is not None] if sync is not None else []
    # a precision plan's f32 master copy of the weights (planlang.runtime.precision.MasterWeights): kept
    # between steps, and not among the parameters MemTracker reads from the optimizer's groups until its step
    kept += list(getattr(opt, "masters", ()))
    peaks = []
    for _ in range(MEASURED_STEPS):
        mt = _tracker()
        mt.track_external(*kept, torch.nn.ModuleList(runner.stage_modules.values()) if runner is not None else pm,
                          opt, *inputs, *targets)
        with mt:
            step()
        peaks.append(_categories(mt.get_tracker_snapshot("peak")))
    # the step of median peak: a step's peak moves by a few buffers from one step to the next (when the
    # garbage collector frees the previous step's autograd graph, what FSDP2's buffers reuse)
    peak = sorted(peaks, key=lambda p: p["Total"])[len(peaks) // 2]
    # MemTracker files a tensor given to track_external as an input unless it saw it otherwise first (a
    # bucket whose slices are gradients): what is filed there beyond the batch is the buckets, the runtime's
    batch = sum(t.numel() * t.element_size() for t in (*inputs, *targets))
    peak["buffers"] += peak["inputs"] - batch
    peak["inputs"] = batch
    peak["units"] = len(getattr(pm, "blocks", ()))  # ZeRO-2/3: FSDP2 units of their own (blocks)
    Path(out, f"rank{rank}.json").write_text(json.dumps(peak))
    leave()


def measure(path: Path, whole: bool = False) -> list[dict]:
    """Each rank's peak by category, one step of `path` through planlang.apply on the plan's gloo ranks."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as out:
        world = _world(str(path))
        mp.start_processes(_worker, args=(str(path), port, out, whole), nprocs=world, join=True,
                           start_method="spawn")
        return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world)]


def _world(path: str) -> int:
    """The plan's devices (the zoo's plans: WORLD)."""
    import math

    return math.prod(complete(check_file(path).plan).mesh.shape)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(ZOO))
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--out", default=None)
    ap.add_argument("--by-category", action="store_true", help="also print each rank's peak and estimate by category")
    ap.add_argument("--plans", nargs="+", help="measure these plan files (on the plan's own number of ranks) "
                                               "instead of the zoo")
    args = ap.parse_args()
    if args.plans:
        return plan_files(args.plans, args.out)
    lines = [f"zoo memory: estimate vs MemTracker on the planlang runtime (bench/zoo_memory.py), {WORLD} gloo "
             f"ranks, torch {torch.__version__}",
             f"{'model':8} {'layout':6} {'rank':>4} {'measured MiB':>13} {'estimate MiB':>13} {'error':>8}"]
    print("\n".join(lines), flush=True)
    errors = []
    with tempfile.TemporaryDirectory() as d:
        for model in args.models.split(","):
            for layout in args.layouts.split(","):
                path = Path(d, f"{model}_{layout}.plan")
                path.write_text(plan_text(model, layout))
                checked = check_with_model(str(path))
                if checked.errors:
                    line = f"{model:8} {layout:6}    - not run: {', '.join(sorted({d.code for d in checked.diagnostics if d.severity is Severity.ERROR}))}"
                    print(line, flush=True)
                    lines.append(line)
                    continue
                plan = complete(checked.plan)
                estimates = estimate_plan(plan, program=measure_program)  # as `planlang estimate` does
                measured = measure(path)
                if args.by_category:  # each rank whose figures differ from the rank before it
                    mib = lambda b: f"{b / 2**20:.3f}"  # noqa: E731
                    for r, peak in enumerate(measured):
                        est = estimates[r * len(estimates) // WORLD]
                        if r and peak == measured[r - 1] and est is estimates[(r - 1) * len(estimates) // WORLD]:
                            continue
                        print(f"  rank {r} measured:", {k: mib(v) for k, v in peak.items() if k != "units"})
                        print(f"  rank {r} estimate:", {k: mib(getattr(est, k)) for k in
                                                        ("parameters", "gradients", "optimizer", "buffers",
                                                         "activations", "peak")})
                for r, peak in enumerate(measured):
                    # a pipeline's estimate is per stage; rank r holds stage r // (ranks per stage) (pp first)
                    est = estimates[r * len(estimates) // WORLD].peak
                    meas = peak["Total"] - peak["inputs"]
                    err = est / meas - 1
                    errors.append(err)
                    line = f"{model:8} {layout:6} {r:>4} {meas / 2**20:>13.3f} {est / 2**20:>13.3f} {err:>+8.1%}"
                    print(line, flush=True)
                    lines.append(line)
    finish(lines, errors, args.out)


def plan_files(paths: list[str], out: str | None) -> None:
    """The same comparison for plan files of any world size (tests/runtime/plans' pp x dp x tp plans)."""
    lines = [f"estimate vs MemTracker on the planlang runtime (bench/zoo_memory.py --plans), gloo, torch {torch.__version__}",
             f"{'plan':28} {'rank':>4} {'device':>8} {'measured MiB':>13} {'estimate MiB':>13} {'error':>8}"]
    print("\n".join(lines), flush=True)
    errors = []
    for path in paths:
        plan = complete(check_file(path).plan)
        estimates = estimate_plan(plan, program=measure_program)
        measured = measure(Path(path))
        for r, peak in enumerate(measured):
            est = estimates[r * len(estimates) // len(measured)]  # rows per stage (pp outermost) or one
            meas = peak["Total"] - peak["inputs"]
            errors.append(est.peak / meas - 1)
            line = (f"{Path(path).stem:28} {r:>4} {est.device:>8} {meas / 2**20:>13.3f} {est.peak / 2**20:>13.3f} "
                    f"{errors[-1]:>+8.1%}")
            print(line, flush=True)
            lines.append(line)
    finish(lines, errors, out)


def finish(lines: list[str], errors: list[float], out: str | None) -> None:
    """The summary line (pairs within 5 %, the worst error), printed and added; the table written to `out`."""
    within = sum(abs(e) <= 0.05 for e in errors)
    tail = f"{within} of {len(errors)} (case, rank) pairs within 5 %; worst {max(errors, key=abs):+.1%}"
    print(tail)
    lines.append(tail)
    if out:
        Path(out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
