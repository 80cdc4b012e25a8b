"""Gradient accumulation (a top-level `microbatches N`) on one GPU: measured peak memory of planlang's
step against the estimate, and the gradients against one process's step on the whole batch.

Run: python bench/accumulation_memory.py [--device cpu]   (one process; NCCL on CUDA, gloo on the CPU)
For N in 1, 2, 4: GPT-2 (12 layers, hidden 768, seq 1024, batch 16) under `planlang.apply` on a mesh of one
device, AdamW; one warm-up step, then one step (pm.step, opt.step, zero_grad) measured with
torch.cuda.max_memory_allocated; `estimate_plan` of the same plan (the simulation of the local model: one
microbatch's activations). The first step's gradients are compared with one process's on the whole batch
(f32, TF32 off). Results: bench/results/accumulation_memory.txt.
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from planlang.model.capture.load import build_model, plan_loss  # noqa: E402
from planlang.model.price.estimate import estimate_plan  # noqa: E402
from planlang.plan.complete import complete  # noqa: E402
from planlang.runtime.apply import apply, load_plan  # noqa: E402
from planlang.runtime.verify import make_batch  # noqa: E402

PLAN = """use hardware
model gpt2 = "examples.gpt2.model:build"(layers = {layers}, hidden = 768, heads = 12, vocab = 50257, seq = 1024)
input idx : i64[batch = {batch}, seq = 1024]
mesh g of 1 x hardware.{device} {{ dp = 1 over hardware.nvlink4 }}
budget {budget} per device
optimizer adamw(lr = 0.001)
data idx : [dp, _]
microbatches {n}
"""


def run(n: int, device: str, layers: int, batch: int, folder: str) -> dict:
    path = Path(folder) / f"acc{n}.plan"
    path.write_text(PLAN.format(n=n, layers=layers, batch=batch, device="h100_sxm" if device == "cuda" else "cpu",
                                budget="70 GiB" if device == "cuda" else "20 GiB"))
    plan = complete(load_plan(str(path)))
    (est,) = estimate_plan(plan)
    torch.manual_seed(0)
    model = build_model(plan.model, plan.path, device="cpu")
    loss_fn = plan_loss(plan)
    inputs, targets = make_batch(model, plan, loss_fn, 1)
    ref = copy.deepcopy(model).to(device)
    ref_loss = loss_fn(ref(*[t.to(device) for t in inputs]), *[t.to(device) for t in targets])
    ref_loss.backward()
    ref_grads = {k: p.grad.detach().cpu() for k, p in ref.named_parameters() if p.grad is not None}
    del ref, ref_loss
    pm = apply(model, plan, loss_fn=loss_fn, targets=tuple(t.to("meta") for t in targets), device=device)
    opt = pm.optimizer()
    xs = [t.to(device) for t in [*inputs, *targets]]
    loss = pm.step(*xs)
    grads = {k: g.detach().cpu() for k, g in pm.full_grads().items()}
    err = max(float((grads[k] - g).abs().max() / g.abs().max().clamp_min(1e-30)) for k, g in ref_grads.items())
    opt.step()
    opt.zero_grad(set_to_none=True)
    peak = None
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    pm.step(*xs)
    opt.step()
    opt.zero_grad(set_to_none=True)
    if device == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    out = dict(n=n, est_peak=est.peak, est_acts=est.activations, measured_peak=peak, grad_err=err,
               loss=float(loss))
    del pm, opt, model, xs
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", rank=0, world_size=1)
    gib = 2 ** 30
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for n in (1, 2, 4):
            r = run(n, args.device, args.layers, args.batch, folder)
            rows.append(r)
            meas = "-" if r["measured_peak"] is None else f"{r['measured_peak'] / gib:.2f} GiB"
            err = "" if r["measured_peak"] is None else f" ({(r['est_peak'] - r['measured_peak']) / r['measured_peak']:+.1%})"
            print(f"microbatches {n}: estimated activations {r['est_acts'] / gib:.2f} GiB, estimated peak "
                  f"{r['est_peak'] / gib:.2f} GiB, measured peak {meas}{err}; gradients vs one process on the "
                  f"whole batch: max rel err {r['grad_err']:.1e}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
