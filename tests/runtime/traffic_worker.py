"""Worker for tests/runtime/test_traffic_gloo.py: for each plan, one training step (forward, backward,
parameter-gradient sums) under planlang.apply with every collective call recorded by CollectiveSpy.
Rank 0 writes every rank's records to traffic.json. The prediction is not made here (the test makes it
without processes)."""
from __future__ import annotations

import os
import sys


def rows(traffic) -> list:
    return [[t.kind.value, list(t.axes), t.full_bytes, t.bytes, t.phase, t.what] for t in traffic.transfers]


def lowered_with_batch(plan_path: str, microbatch: bool = False):
    """(plan, program, inputs, targets) of one step, from the plan alone (no process group): the model
    built on the CPU from seed 0, verify's batch, the program lowered - for one microbatch of a
    pipeline's batch with `microbatch` (planlang.model.program.pipeline_program)."""
    import torch

    from planlang.model.capture.load import build_model, plan_loss
    from planlang.model.program.pipeline_program import microbatch_plan
    from planlang.runtime.apply import load_plan, lower_plan
    from planlang.runtime.verify import make_batch

    plan = load_plan(plan_path)
    torch.manual_seed(0)
    model = build_model(plan.model, plan.path, device="cpu")
    loss_fn = plan_loss(plan)
    inputs, targets = make_batch(model, plan, loss_fn, 1)
    m = plan.pipeline.microbatches if microbatch and plan.pipeline is not None else 1
    example = tuple(t[: t.shape[0] // m].to("meta") for t in targets) if targets else None
    prog = lower_plan(model, microbatch_plan(plan) if m > 1 else plan, loss_fn, example)
    return plan, prog, inputs, targets


def measure(plan_path: str, inputs, targets) -> dict:
    import torch
    import torch.distributed as dist

    from planlang.model.capture.load import build_model, plan_loss
    from planlang.runtime.apply import apply, load_plan
    from planlang.runtime.traffic import CollectiveSpy

    plan = load_plan(plan_path)
    torch.manual_seed(0)
    model = build_model(plan.model, plan.path, device="cpu")
    pm = apply(model, plan, loss_fn=plan_loss(plan),
               targets=tuple(t.to("meta") for t in targets) if targets else None)
    dist.barrier()
    if hasattr(pm, "runner"):  # a pipeline: forward and backward run together, microbatch by microbatch
        pm.runner.step(*inputs, target=targets[0] if targets else None)  # builds the stages (a probe forward)
        pm.zero_grad()
        dist.barrier()
        with CollectiveSpy(pm.groups) as spy:
            spy.phase = "step"
            pm.runner.step(*inputs, target=targets[0] if targets else None)
        return {"rows": rows(spy.traffic), "unknown": spy.unknown}
    with CollectiveSpy(pm.groups) as spy:
        spy.phase = "forward"
        # step's program (pm(...)'s own would be lowered, and sent from rank 0, inside the spy)
        loss = pm.step_loss(*inputs, *targets)
        spy.phase = "backward"
        with pm.no_sync():  # the gradient sums start in sync_grads, so they are counted in their phase
            loss.backward()
        spy.phase = "grad_sync"
        pm.sync_grads()
    return {"rows": rows(spy.traffic), "unknown": spy.unknown}


def measure_step(plan_path: str, inputs, targets) -> dict:
    """Every collective of a whole training step, the optimizer's included (ZeRO-1's broadcasts): the
    second of two, so that FSDP2's lazy initialisation and the first bucket allocations are not in it."""
    import torch
    import torch.distributed as dist

    from planlang.model.capture.load import build_model, plan_loss
    from planlang.runtime.apply import apply, load_plan
    from planlang.runtime.traffic import CollectiveSpy

    plan = load_plan(plan_path)
    torch.manual_seed(0)
    model = build_model(plan.model, plan.path, device="cpu")
    pm = apply(model, plan, loss_fn=plan_loss(plan),
               targets=tuple(t.to("meta") for t in targets) if targets else None)
    opt = pm.optimizer()
    spy = CollectiveSpy(pm.groups)
    for record in (False, True):
        dist.barrier()
        with spy if record else _nothing():
            spy.phase = "forward"
            loss = pm(*inputs, *targets).loss
            spy.phase = "backward"
            loss.backward()
            spy.phase = "grad_sync"
            pm.sync_grads()
            spy.phase = "zero_step"
            opt.step()
            opt.zero_grad()
    return {"rows": rows(spy.traffic), "unknown": spy.unknown}


def _nothing():
    import contextlib

    return contextlib.nullcontext()


def run(rank: int, world: int, port: int, jobs: list, out_dir: str) -> None:
    """`jobs`: (plan path, inputs, targets[, "step"]) per plan, the same batch on every rank; "step"
    measures the whole step with its optimizer (`measure_step`)."""
    import json
    import traceback

    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    sys.path.insert(0, os.getcwd())
    results = {}
    for plan, inputs, targets, *how in jobs:
        try:
            mine = (measure_step if how == ["step"] else measure)(plan, inputs, targets)
        except Exception as e:  # noqa: BLE001 - reported to the test
            mine = {"error": f"rank {rank}: {type(e).__name__}: {e}\n{traceback.format_exc()}"}
        every = [None] * world
        dist.all_gather_object(every, mine)
        results[plan] = every
    if rank == 0:
        with open(os.path.join(out_dir, "traffic.json"), "w") as f:
            json.dump(results, f)
    from planlang.runtime.teardown import leave

    leave()  # barrier, destroy, exit without finalization (see teardown.py)


def launch(jobs: list, out_dir: str, world: int = 4) -> dict:
    """Run `jobs` ((plan path, inputs, targets) each) on `world` gloo ranks; plan path -> every rank's
    records. Fork where this process runs no other thread (the workers inherit its imports and the
    conversion-path caches the prediction warmed up), spawn otherwise."""
    import json
    import socket
    import threading

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    method = "fork" if threading.active_count() == 1 else "spawn"
    mp.start_processes(run, args=(world, port, jobs, out_dir), nprocs=world, join=True, start_method=method)
    with open(os.path.join(out_dir, "traffic.json")) as f:
        return json.load(f)
