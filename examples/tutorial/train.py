"""Train docs/tutorial.md's GPT-2 under a plan: `planlang run PLAN -- examples/tutorial/train.py --steps 3`.

`planlang run` starts one process per device of the plan's mesh (torchrun) with PLANLANG_PLAN set to the
plan's path; every process runs this script.
"""
import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import planlang

# torchrun puts only this script's folder on sys.path; the plan's factory lives in the repository's examples/
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from examples.gpt2.model import build  # noqa: E402  (the factory the plan's `model` line names)

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=3)
args = parser.parse_args()

dist.init_process_group("gloo")  # "nccl" on GPUs
torch.manual_seed(0)  # the same initial weights on every rank
model = build(layers=4, hidden=64, heads=4, vocab=128, seq=16)  # as the plan's `model` line says

pm = planlang.apply(model, os.environ["PLANLANG_PLAN"])
opt = pm.optimizer()  # the plan's optimizer (AdamW, lr 1e-3)

# one global batch, the plan's [batch 16, seq 16], the same on every rank (each takes its piece), learned
# by heart: a toy, so that the loss visibly falls in a few steps
idx = torch.randint(0, 128, (16, 16), generator=torch.Generator().manual_seed(1))
for step in range(args.steps):
    loss = pm.step(idx, idx)  # inputs, then targets: forward, backward and gradient sums, as the plan says
    opt.step()
    opt.zero_grad()
    if dist.get_rank() == 0:
        print(f"step {step}: loss {loss.item():.4f}", flush=True)

dist.barrier()  # every rank done with its collectives before any tears down (gloo aborts otherwise)
dist.destroy_process_group()
