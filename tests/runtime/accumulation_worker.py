"""Worker for tests/runtime/test_accumulation_gloo.py: for each plan (a top-level `microbatches N`), one
process's step on the whole batch, then the plan's step on 4 gloo ranks (N microbatches in sequence, the
gradients summed once) with every collective recorded by CollectiveSpy, and `verify` where asked. Rank 0
writes every rank's results to accumulation.json."""
from __future__ import annotations

import copy
import os
import sys


def rows(traffic) -> list:
    return [[t.kind.value, list(t.axes), t.full_bytes, t.bytes, t.phase, t.what] for t in traffic.transfers]


def batch(plan_path: str):
    """(plan, model, inputs, targets): the model built on the CPU from seed 0, verify's batch (the whole
    step's, global)."""
    import torch

    from planlang.model.capture.load import build_model, plan_loss
    from planlang.runtime.apply import load_plan
    from planlang.runtime.verify import make_batch

    plan = load_plan(plan_path)
    torch.manual_seed(0)
    model = build_model(plan.model, plan.path, device="cpu")
    inputs, targets = make_batch(model, plan, plan_loss(plan), 1)
    return plan, model, inputs, targets


def measure(plan_path: str, verify_steps: int) -> dict:
    import torch
    import torch.distributed as dist

    from planlang.model.capture.load import plan_loss
    from planlang.runtime.apply import apply
    from planlang.runtime.traffic import CollectiveSpy
    from planlang.runtime.verify import verify

    plan, model, inputs, targets = batch(plan_path)
    ref = copy.deepcopy(model)
    loss_fn = plan_loss(plan)
    ref_loss = loss_fn(ref(*inputs), *targets)  # one process, the whole batch at once
    ref_loss.backward()
    ref_grads = {n: p.grad for n, p in ref.named_parameters() if p.grad is not None}

    pm = apply(model, plan, loss_fn=plan_loss(plan, model), targets=tuple(t.to("meta") for t in targets))
    pm.step(*inputs, *targets)  # FSDP2's lazy initialisation and the first bucket allocations
    pm.zero_grad(set_to_none=True)
    dist.barrier()
    with CollectiveSpy(pm.groups) as spy:
        spy.phase = "step"
        loss = pm.step(*inputs, *targets)
    grads = pm.full_grads()
    errs = {n: float((grads[n] - g).abs().max() / g.abs().max().clamp_min(1e-30)) for n, g in ref_grads.items()}
    out = {"rows": rows(spy.traffic), "unknown": spy.unknown, "grad_rel_err": max(errs.values()),
           "grads": sorted(grads), "ref_grads": sorted(ref_grads),
           "loss_rel_err": abs(float(loss) - float(ref_loss.detach())) / abs(float(ref_loss.detach())),
           "microbatches": pm.microbatches}
    if pm.fsdp_axes:  # a user's own accumulation loop: `no_sync` holds FSDP2's reduce-scatters back too
        pm.zero_grad(set_to_none=True)
        micro = pm.microbatch_inputs((*inputs, *targets))
        with CollectiveSpy(pm.groups) as spy:
            spy.phase = "no_sync"
            with pm.no_sync():
                for mb in micro[:-1]:
                    (pm(*mb).loss / len(micro)).backward()
            inside = rows(spy.traffic)
            spy.phase = "last"
            (pm(*micro[-1]).loss / len(micro)).backward()
            pm.sync_grads()
        grads = pm.full_grads()
        out["user_loop"] = {"no_sync_rows": inside, "rows": rows(spy.traffic), "grad_rel_err": max(
            float((grads[n] - g).abs().max() / g.abs().max().clamp_min(1e-30)) for n, g in ref_grads.items())}
    if verify_steps:
        out["verify"] = [r.__dict__ | {"ok": r.ok()} for r in verify(plan_path, steps=verify_steps)]
    return out


def run(rank: int, world: int, port: int, jobs: list, out_dir: str) -> None:
    """`jobs`: (plan path, verify steps) per plan."""
    import json
    import traceback

    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    sys.path.insert(0, os.getcwd())
    results = {}
    for plan, verify_steps in jobs:
        try:
            mine = measure(plan, verify_steps)
        except Exception as e:  # noqa: BLE001 - reported to the test
            mine = {"error": f"rank {rank}: {type(e).__name__}: {e}\n{traceback.format_exc()}"}
        every = [None] * world
        dist.all_gather_object(every, mine)
        results[plan] = every
    if rank == 0:
        with open(os.path.join(out_dir, "accumulation.json"), "w") as f:
            json.dump(results, f)
    from planlang.runtime.teardown import leave

    leave()
