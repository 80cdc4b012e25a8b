"""Worker for tests/runtime/test_verify_updates_gloo.py: `verify` of one dp2 AdamW plan on 2 gloo ranks,
as written and with two wrong optimizers substituted for the plan's (a wrong learning rate, a parameter
left out); rank 0 writes each run's rows."""
from __future__ import annotations

import json
import os
import sys


def run(rank: int, world: int, port: int, plan: str, out: str) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    sys.path.insert(0, os.getcwd())
    import planlang.runtime.verify as verify_mod

    right = verify_mod.plan_optimizer
    mutants = {
        "as_planned": right,
        "wrong_lr": lambda pm, p: torch.optim.AdamW(pm.parameters(), lr=2e-3),  # the plan says 1e-3
        "left_out": lambda pm, p: torch.optim.AdamW(list(pm.parameters())[1:], lr=1e-3),
    }
    rows = {}
    for name, make in mutants.items():
        verify_mod.plan_optimizer = make
        rows[name] = [r.__dict__ | {"ok": r.ok()} for r in verify_mod.verify(plan, steps=2)]
    if rank == 0:
        with open(out, "w") as f:
            json.dump(rows, f)
    from planlang.runtime.teardown import leave

    leave()
