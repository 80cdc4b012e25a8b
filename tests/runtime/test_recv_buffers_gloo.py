"""planlang.runtime.recv_buffers.InFlightStage on 4 gloo ranks (4 stages) against torch's PipelineStage:
the same losses and gradients under GPipe and 1F1B with 8 microbatches, while a stage holds receive
buffers for the microbatches in flight only (torch's holds one per microbatch for the stage's life): the
count planlang.model.price.estimate prices."""
from __future__ import annotations

import json
import os
import socket
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

WORLD = 4
MICRO = 8
WIDTH = 16


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(rank: int, stage_cls, schedule_cls) -> dict:
    from torch.distributed.pipelining import PipelineStage

    from planlang.runtime.recv_buffers import InFlightStage

    torch.manual_seed(0)
    full = nn.Sequential(*(m for _ in range(WORLD) for m in (nn.Linear(WIDTH, WIDTH), nn.Tanh())))
    mod = full[2 * rank:2 * rank + 2]
    x = torch.randn(MICRO * 2, WIDTH)
    y = torch.randn(MICRO * 2, WIDTH)
    # activations between the stages require gradients (their metadata says so: torch derives the
    # gradient buffers from it)
    act = torch.empty(2, WIDTH, device="meta", requires_grad=True)
    inp = torch.empty(2, WIDTH, device="meta") if rank == 0 else act
    stage = stage_cls(mod, rank, WORLD, torch.device("cpu"), input_args=(inp,), output_args=(act,))
    # receive buffers allocated and not yet released: activations ("fwd") and gradients ("bwd")
    live, most = {"fwd": 0, "bwd": 0}, {"fwd": 0, "bwd": 0}
    if stage_cls is InFlightStage:
        allocate, release = stage._allocate, stage._release

        def kind(infos) -> str:
            return "bwd" if any(infos is g for g in stage.grad_recv_info.values()) else "fwd"

        def counted_allocate(infos):
            before = sum(1 for i in infos if getattr(i, "_unallocated", False))
            allocate(infos)
            live[kind(infos)] += before
            most[kind(infos)] = max(most[kind(infos)], live[kind(infos)])

        def counted_release(chunk):
            for infos in (stage.args_recv_info.get(chunk, ()), stage.grad_recv_info.get(chunk, ())):
                live[kind(infos)] -= sum(1 for i in infos if not i.is_root_arg and i.tensor_meta is not None
                                         and not getattr(i, "_unallocated", False))
            release(chunk)

        stage._allocate, stage._release = counted_allocate, counted_release
    sched = schedule_cls(stage, MICRO, loss_fn=lambda out, tgt: ((out - tgt) ** 2).mean())
    out = {}
    for step in range(2):  # the second step reuses the descriptors the first made
        for p in mod.parameters():
            p.grad = None
        losses: list = []
        if rank == 0:
            sched.step(x)
        elif rank == WORLD - 1:
            sched.step(target=y, losses=losses)
        else:
            sched.step()
        out[f"loss{step}"] = [float(v.detach()) for v in losses]
    out["grads"] = [p.grad.flatten().tolist() for p in mod.parameters()]
    out["most"], out["live"] = most, sum(live.values())
    out["held_after"] = sum(1 for infos in (*stage.args_recv_info.values(), *stage.grad_recv_info.values())
                            for i in infos if not i.is_root_arg and i.buffer is not None and i.buffer.numel())
    del PipelineStage
    return out


def _worker(rank: int, port: int, outdir: str) -> None:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from planlang.runtime.recv_buffers import InFlightStage

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
    res = {}
    try:
        for sname, sched in (("gpipe", ScheduleGPipe), ("1f1b", Schedule1F1B)):
            for cname, cls in (("torch", PipelineStage), ("inflight", InFlightStage)):
                res[f"{sname}/{cname}"] = _run(rank, cls, sched)
    finally:
        with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
            json.dump(res, f)
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    outdir = str(tmp_path_factory.mktemp("recv"))
    ctx = mp.start_processes(_worker, args=(_free_port(), outdir), nprocs=WORLD, join=False, start_method="spawn")
    deadline = time.time() + 120
    while not ctx.join(timeout=2):
        if time.time() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("recv buffer workers timed out")
    return [json.load(open(os.path.join(outdir, f"rank{r}.json"))) for r in range(WORLD)]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_same_losses_and_gradients_as_torchs_stage(results, schedule):
    for res in results:
        ours, theirs = res[f"{schedule}/inflight"], res[f"{schedule}/torch"]
        assert ours["loss0"] == theirs["loss0"] and ours["loss1"] == theirs["loss1"]
        assert ours["grads"] == theirs["grads"]
    assert len(results[-1][f"{schedule}/torch"]["loss0"]) == MICRO


def test_buffers_live_for_the_microbatches_in_flight_only(results):
    # a stage holds the activations of its microbatches in flight (what planlang.plan.schedule.in_flight
    # counts: 1F1B min(p - s, m), GPipe m) and one gradient at a time; the estimate prices exactly that
    from planlang.plan.schedule import in_flight

    for s, res in enumerate(results):
        for schedule in ("gpipe", "1f1b"):
            most = res[f"{schedule}/inflight"]["most"]
            assert most["fwd"] == (0 if s == 0 else in_flight(schedule, WORLD, s, MICRO)), (schedule, s, most)
            assert most["bwd"] == (0 if s == WORLD - 1 else 1), (schedule, s, most)
            # every buffer released when the step ends; torch's stage keeps one per microbatch
            assert res[f"{schedule}/inflight"]["live"] == 0 and res[f"{schedule}/inflight"]["held_after"] == 0
            assert res[f"{schedule}/torch"]["held_after"] == (0 if s == 0 else MICRO) + (0 if s == WORLD - 1 else MICRO)
