"""Worker for tests/runtime/test_verify_updates_gloo.py: `verify` of one dp2 AdamW plan on 2 gloo ranks,
as written and with wrong runs substituted for the plan's (a wrong learning rate, a parameter left out of
the optimizer, every gradient summed twice); rank 0 writes each run's rows."""
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
    from planlang.runtime.precision import LossScale, wrap_optimizer

    def adamw(pm, p, lr=0.01, skip=0):
        """The plan's AdamW in its precision (master copy, loss scale), over its parameters from `skip` on."""
        params = list(pm.parameters())[skip:]
        prec = p.precision
        make = lambda ps: torch.optim.AdamW(ps, lr=lr)  # noqa: E731
        if not prec.mixed:
            return make(params)
        scale = None if prec.loss_scale is None else LossScale(prec.loss_scale)
        return wrap_optimizer(params, prec, make, fsdp=False, loss_scale=scale)

    right_optimizer, right_apply = verify_mod.plan_optimizer, verify_mod.apply

    def summed_twice(*args, **kwargs):
        pm = right_apply(*args, **kwargs)
        step = pm.step

        def doubled(*xs):
            loss = step(*xs)
            for q in pm.parameters():
                if q.grad is not None:
                    q.grad.mul_(2)
            return loss

        pm.step = doubled
        return pm

    mutants = {
        "as_planned": (right_optimizer, right_apply),
        "wrong_lr": (lambda pm, p: adamw(pm, p, lr=0.1), right_apply),  # the plan says 0.01
        "left_out": (lambda pm, p: adamw(pm, p, skip=1), right_apply),
        "summed_twice": (right_optimizer, summed_twice),
    }
    rows = {}
    for name, (make, apply) in mutants.items():
        verify_mod.plan_optimizer, verify_mod.apply = make, apply
        rows[name] = [r.__dict__ | {"ok": r.ok()} for r in verify_mod.verify(plan, steps=2)]
    if rank == 0:
        with open(out, "w") as f:
            json.dump(rows, f)
    from planlang.runtime.teardown import leave

    leave()
