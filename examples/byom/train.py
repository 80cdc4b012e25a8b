"""Train the Llama of llama_model.py under a plan: `planlang run llama_dp2.plan -- train.py`."""
import argparse
import os

import torch
import torch.distributed as dist

import planlang
from llama_model import build  # the module next to this script, as the plan names it

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=5)
args = parser.parse_args()

dist.init_process_group("gloo")  # "nccl" on GPUs
torch.manual_seed(0)  # the same initial weights on every rank
model = build(layers=2, hidden=64, heads=4)  # as the plan's `model` line says

pm = planlang.apply(model, os.environ["PLANLANG_PLAN"])
opt = pm.optimizer()  # the plan's optimizer (AdamW, lr 1e-3)

data = torch.Generator().manual_seed(1)  # the same global batches on every rank
for step in range(args.steps):
    ids = torch.randint(0, 256, (8, 64), generator=data)  # the global batch; each rank takes its piece
    loss = pm.step(ids, ids)  # inputs, then targets: forward, backward, gradient sums
    opt.step()
    opt.zero_grad()
    if dist.get_rank() == 0:
        print(f"step {step}: loss {loss.item():.4f}", flush=True)

dist.barrier()  # every rank done with its collectives before any tears down (gloo aborts otherwise)
dist.destroy_process_group()
