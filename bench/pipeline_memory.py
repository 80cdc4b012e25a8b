"""Pipeline memory: the estimate of every rank of pp x dp (x tp) plans under ZeRO-1 and ZeRO-2, in f32 and bf16
(and pp x tp, interleaved, ZeRO-3, stages of their own degrees: dp4 -> dp2 x tp2 and back), against torch's
MemTracker on the planlang runtime (gloo), then the same estimator at the scale people train.

Run: .venv/bin/python bench/pipeline_memory.py [--out bench/results/pipeline_memory.txt] [--no-measure]

Measured: each plan runs through `planlang.apply` on its own number of gloo ranks (bench/zoo_memory.py's
worker: two untracked warm-up steps, then five steps each under its own MemTracker, the step of median peak
reported, the batch left out). Beside what zoo_memory registers (the model, the optimizer, the batch, the
persistent gradient buckets and a precision plan's master copy), this bench registers the optimizer's
state tensors themselves: ZeroRedundancyOptimizer keeps them in its local optimizer, which MemTracker
reaches only inside the optimizer step, so a peak before the step (the pipeline's flat gradient sum) was
measured without them. The bf16 variants are the f32 plans of tests/runtime/plans with `precision = bf16`
added (written to a temporary folder).

Extrapolated: the 176B GPT of issue #29 (70 layers, hidden 14336, 112 heads, seq 2048, BLOOM's 250880-token
vocabulary split over tp) in TP4 x PP12 x DP8, ZeRO-1, bf16 on 384 A100 80GB, microbatch 2, at 16 and 128
microbatches: each stage's classes by the same `estimate_plan`.
"""
from __future__ import annotations

import argparse
import json
import os
import re
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

from planlang.model.capture.load import build_model, plan_loss  # noqa: E402
from planlang.model.price.estimate import estimate_plan  # noqa: E402
from planlang.plan.checker import check_file, check_text  # noqa: E402
from planlang.plan.complete import complete  # noqa: E402
from planlang.plan.types import SPLIT_BACKWARD  # noqa: E402
from planlang.plan.units import format_bytes  # noqa: E402
from planlang.runtime.program_memory import measure as measure_program  # noqa: E402

PLANS = ROOT / "tests" / "runtime" / "plans"
CASES = ("gpt2_pp2_dp2_zero1", "gpt2_pp2_dp2_zero1_bf16", "gpt2_pp2_dp2_zero2", "gpt2_pp2_dp2_zero2_bf16",
         "gpt2_3d_cpu", "gpt2_3d_cpu_bf16", "gpt2_pp2_tp2", "gpt2_pp2_tp2_bf16", "gpt2_pp2_tp2_interleaved",
         "gpt2_pp2_dp2_tp2_zero3", "gpt2_pp2_dp2_tp2_zero3_bf16", "gpt2_pp2_dp2_looped_bfs", "gpt2_pp2_tp2_looped_bfs",
         "gpt2_pp2_dp2_zero_bubble", "gpt2_pp2_tp2_zero_bubble", "gpt2_pp2_dp2_zbv", "gpt2_pp2_dp2_dualpipev",
         "gpt2_pp2_hetero", "gpt2_pp2_hetero_reverse")
MEASURED_STEPS = 5


def _optimizer_state(opt) -> list[torch.Tensor]:
    """Every tensor of the optimizer's state, through the runtime's wrappers (MasterWeights' `inner`,
    ZeroRedundancyOptimizer's local `optim`)."""
    out, seen, todo = [], set(), [opt]
    while todo:
        o = todo.pop()
        if o is None or id(o) in seen:
            continue
        seen.add(id(o))
        for st in getattr(o, "state", {}).values():
            if isinstance(st, dict):
                out += [t for t in st.values() if isinstance(t, torch.Tensor)]
        todo += [getattr(o, "inner", None), getattr(o, "optim", None)]
    # FSDP2's states are DTensors: their local shards hold the memory
    local = [t.to_local() if hasattr(t, "to_local") else t for t in out]
    return list({id(t): t for t in local}.values())


def _worker(rank: int, path: str, port: int, out: str) -> None:
    import planlang.runtime.apply as apply_mod
    from planlang.runtime.teardown import leave
    from planlang.runtime.verify import make_batch

    warnings.filterwarnings("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    plan = complete(check_file(path).plan)
    dist.init_process_group("gloo", rank=rank, world_size=_world(plan))
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
    runner = getattr(pm, "runner", None)
    sync = getattr(pm, "_grad_sync", None)
    kept = [b.flat for b in sync.buckets if b.flat is not None] if sync is not None else []
    kept += list(getattr(opt, "masters", ()))
    kept += _optimizer_state(opt)
    peaks = []
    for _ in range(MEASURED_STEPS):
        mt = _tracker()
        mt.track_external(*kept, torch.nn.ModuleList(runner.stage_modules.values()) if runner is not None else pm,
                          opt, *inputs, *targets)
        with mt:
            step()
        peaks.append(_categories(mt.get_tracker_snapshot("peak")))
    peak = sorted(peaks, key=lambda p: p["Total"])[len(peaks) // 2]
    batch = sum(t.numel() * t.element_size() for t in (*inputs, *targets))
    Path(out, f"rank{rank}.json").write_text(json.dumps({"Total": peak["Total"], "batch": batch}))
    leave()


def _world(plan) -> int:
    import math

    return math.prod(plan.mesh.shape)


def measure(path: Path) -> list[int]:
    """Each rank's measured peak less the batch, bytes."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    world = _world(complete(check_file(str(path)).plan))
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_worker, args=(str(path), port, out), nprocs=world, join=True, start_method="spawn")
        got = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world)]
    return [g["Total"] - g["batch"] for g in got]


def case_path(name: str, tmp: Path) -> Path:
    """A plan of tests/runtime/plans, or its f32 plan with `precision = bf16` added (`<name>_bf16`)."""
    if (PLANS / f"{name}.plan").exists():
        return PLANS / f"{name}.plan"
    text = (PLANS / f"{name.removesuffix('_bf16')}.plan").read_text()
    one_line = re.sub(r"\{ (zero = \d over \w+) \}", r"{\n    \1\n    precision = bf16\n}", text)
    text = one_line if one_line != text else re.sub(r"(\n\s*zero = \d over \w+\n)", r"\1    precision = bf16\n", text)
    assert "precision = bf16" in text, name
    path = tmp / f"{name}.plan"
    path.write_text(text)
    return path


BIG = """use hardware
use patterns.megatron
model gpt = "examples.gpt2.model:build"(layers = 70, hidden = 14336, heads = 112, vocab = 250880, seq = 2048)
input idx : i64[batch = {batch}, seq = 2048]
mesh cluster of 384 x hardware.a100_80g {{
    pp = 12 over hardware.infiniband_200g
    dp = 8 over hardware.infiniband_200g
    tp = 4 over hardware.nvlink3
}}
optimizer adamw(lr = 0.0006, weight_decay = 0.1) {{
    zero = 1 over dp
    precision = bf16
}}
data idx : [dp, _]
pipeline over pp schedule 1f1b microbatches {micro} {{
    stage wte, wpe, drop, h[0:5]
{middle}
    stage h[65:70], ln_f, lm_head
}}
for block in h[*] {{
    apply megatron.attention(tp) to block.attn
    apply megatron.mlp(tp) to block.mlp
}}
shard wte.weight : [tp, _]
shard lm_head.weight : [tp, _]
checkpoint h[*] every 1
"""


def extrapolate(say) -> None:
    middle = "\n".join(f"    stage h[{5 + 6 * i}:{11 + 6 * i}]" for i in range(10))
    for micro in (16, 128):
        res = check_text(BIG.format(batch=8 * 2 * micro, micro=micro, middle=middle), "gpt176b.plan")
        assert not res.errors, [str(d) for d in res.diagnostics if d.severity.name == "ERROR"]
        rows = estimate_plan(complete(res.plan))
        say(f"# 176B GPT, TP4 x PP12 x DP8, ZeRO-1, bf16, microbatch 2 x {micro} microbatches (global batch "
            f"{16 * micro}): per stage")
        say(f"# {'stage':8} {'params':>10} {'grads':>10} {'optimizer':>10} {'recv bufs':>10} {'activations':>11} "
            f"{'transient':>10} {'peak':>10} {'step s':>8}")
        for r in rows:
            if r.device not in ("stage 0", "stage 1", "stage 11"):
                continue
            say(f"# {r.device:8} {format_bytes(r.parameters):>10} {format_bytes(r.gradients + r.grad_buckets):>10} "
                f"{format_bytes(r.optimizer):>10} {format_bytes(r.buffers - r.grad_buckets):>10} "
                f"{format_bytes(r.activations):>11} {format_bytes(r.transient):>10} {format_bytes(r.peak):>10} "
                f"{r.step_time:>8.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--no-measure", action="store_true", help="the extrapolation only")
    args = ap.parse_args()
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    errors = []
    if not args.no_measure:
        say(f"estimate vs MemTracker on the planlang runtime (bench/pipeline_memory.py), gloo, torch {torch.__version__}")
        say(f"{'plan':26} {'rank':>4} {'device':>8} {'measured MiB':>13} {'estimate MiB':>13} {'error':>8}")
        with tempfile.TemporaryDirectory() as tmp:
            for name in args.cases.split(","):
                path = case_path(name, Path(tmp))
                plan = complete(check_file(str(path)).plan)
                estimates = estimate_plan(plan, program=measure_program)
                for r, meas in enumerate(measure(path)):
                    est = estimates[r * len(estimates) // _world(plan)]  # pp outermost: rows per stage
                    errors.append(est.peak / meas - 1)
                    say(f"{name:26} {r:>4} {est.device:>8} {meas / 2**20:>13.3f} {est.peak / 2**20:>13.3f} "
                        f"{errors[-1]:>+8.1%}")
        say(f"{sum(abs(e) <= 0.05 for e in errors)} of {len(errors)} (plan, rank) pairs within 5 %; "
            f"worst {max(errors, key=abs):+.1%}")
    say("")
    extrapolate(say)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
