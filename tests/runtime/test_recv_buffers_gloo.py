"""planlang.runtime.recv_buffers.InFlightStage on 4 gloo ranks (4 stages) against torch's PipelineStage:
the same losses and gradients under GPipe and 1F1B with 8 microbatches, while a stage holds receive
buffers for the microbatches in flight only (torch's holds one per microbatch for the stage's life): the
count planlang.model.price.estimate prices."""
from __future__ import annotations

import json
import os
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch import nn

from tests.runtime.spawned import spawn_ranks

WORLD = 4
MICRO = 8
WIDTH = 16


def _run(rank: int, stage_cls, schedule_cls, chunks: int = 1, micro: int = MICRO) -> dict:
    from planlang.runtime.recv_buffers import InFlightStage

    n = WORLD * chunks  # stages; rank r holds stages r, r + WORLD, ... (interleaved)
    torch.manual_seed(0)
    full = nn.Sequential(*(m for _ in range(n) for m in (nn.Linear(WIDTH, WIDTH), nn.Tanh())))
    x = torch.randn(micro * 2, WIDTH)
    y = torch.randn(micro * 2, WIDTH)
    # activations between the stages require gradients (their metadata says so: torch derives the
    # gradient buffers from it)
    act = torch.empty(2, WIDTH, device="meta", requires_grad=True)
    mine = [rank + k * WORLD for k in range(chunks)]
    stages = [stage_cls(full[2 * s:2 * s + 2], s, n, torch.device("cpu"),
                        input_args=(torch.empty(2, WIDTH, device="meta") if s == 0 else act,), output_args=(act,))
              for s in mine]
    # per stage, receive buffers allocated and not yet released: activations ("fwd") and gradients ("bwd")
    most = {s: {"fwd": 0, "bwd": 0} for s in mine}
    live = {s: {"fwd": 0, "bwd": 0} for s in mine}
    for s, stage in zip(mine, stages):
        if stage_cls is not InFlightStage:
            continue
        allocate, release = stage._allocate, stage._release

        def kind(infos, stage=stage) -> str:
            return "bwd" if any(infos is g for g in stage.grad_recv_info.values()) else "fwd"

        def counted_allocate(infos, s=s, kind=kind, allocate=allocate):
            before = sum(1 for i in infos if getattr(i, "_unallocated", False))
            allocate(infos)
            live[s][kind(infos)] += before
            most[s][kind(infos)] = max(most[s][kind(infos)], live[s][kind(infos)])

        def counted_release(chunk, s=s, stage=stage, kind=kind, release=release):
            for infos in (stage.args_recv_info.get(chunk, ()), stage.grad_recv_info.get(chunk, ())):
                live[s][kind(infos)] -= sum(1 for i in infos if not i.is_root_arg and i.tensor_meta is not None
                                            and not getattr(i, "_unallocated", False))
            release(chunk)

        stage._allocate, stage._release = counted_allocate, counted_release
    loss_fn = lambda out, tgt: ((out - tgt) ** 2).mean()  # noqa: E731
    sched = schedule_cls(stages if chunks > 1 else stages[0], micro, loss_fn=loss_fn)
    out: dict = {}
    for step in range(2):  # the second step reuses the descriptors the first made
        for p in full.parameters():
            p.grad = None
        losses: list = []
        if rank == 0:
            sched.step(x)
        elif rank == WORLD - 1:
            sched.step(target=y, losses=losses)
        else:
            sched.step()
        out[f"loss{step}"] = [float(v.detach()) for v in losses]
    out["grads"] = [p.grad.flatten().tolist() for s in mine for p in full[2 * s].parameters()]
    out["most"] = {str(s): most[s] for s in mine}
    out["live"] = sum(v for s in mine for v in live[s].values())
    out["held_after"] = {str(s): sum(1 for infos in (*st.args_recv_info.values(), *st.grad_recv_info.values())
                                     for i in infos if not i.is_root_arg and i.buffer is not None and i.buffer.numel())
                         for s, st in zip(mine, stages)}
    return out


def _worker(rank: int, port: int, outdir: str) -> None:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    from planlang.runtime.recv_buffers import InFlightStage

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
    res = {}
    try:
        for sname, sched, chunks in (("gpipe", ScheduleGPipe, 1), ("1f1b", Schedule1F1B, 1),
                                     ("interleaved", ScheduleInterleaved1F1B, 2)):
            for cname, cls in (("torch", PipelineStage), ("inflight", InFlightStage)):
                res[f"{sname}/{cname}"] = _run(rank, cls, sched, chunks)
        # three times the microbatches, three chunks: a stage's receives do not grow with the microbatches
        res["interleaved3x/inflight"] = _run(rank, InFlightStage, ScheduleInterleaved1F1B, 3, 3 * MICRO)
    finally:
        with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
            json.dump(res, f)
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    ranks, failed = spawn_ranks(_worker, WORLD, str(tmp_path_factory.mktemp("recv")), 120)
    if failed or None in ranks:
        pytest.fail(f"recv buffer workers: {failed or 'a rank wrote no result'}")
    return ranks


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved"])
def test_same_losses_and_gradients_as_torchs_stage(results, schedule):
    for res in results:
        ours, theirs = res[f"{schedule}/inflight"], res[f"{schedule}/torch"]
        assert ours["loss0"] == theirs["loss0"] and ours["loss1"] == theirs["loss1"]
        assert ours["grads"] == theirs["grads"]
    assert len(results[-1][f"{schedule}/torch"]["loss0"]) == MICRO


@pytest.mark.parametrize("schedule, chunks, micro", [("gpipe", 1, MICRO), ("1f1b", 1, MICRO),
                                                    ("interleaved", 2, MICRO), ("interleaved3x", 3, 3 * MICRO)])
def test_buffers_live_for_the_microbatches_in_flight_only(results, schedule, chunks, micro):
    # under GPipe and 1F1B a stage holds the activations of its microbatches in flight (what
    # planlang.plan.schedule.in_flight counts: 1F1B min(p - s, m), GPipe m) and one gradient at a time:
    # the estimate prices exactly that. torch's interleaved schedule (PipelineScheduleMulti) posts a
    # stage's receives in lockstep with its neighbours' sends, ahead of its own order: at most one
    # activation more than in flight, and one gradient per rank on a chunk's last stage
    # (planlang.plan.schedule.interleaved_receives, what the estimate prices there), whatever the microbatches
    from planlang.plan.schedule import in_flight, interleaved_receives

    n = WORLD * chunks
    kind = schedule.removesuffix("3x")
    for res in results:
        ours = res[f"{schedule}/inflight"]
        for s, most in ours["most"].items():
            s = int(s)
            fwd = 0 if s == 0 else in_flight(kind, n, s, micro, chunks=chunks)
            bwd = 0 if s == n - 1 else 1
            if kind == "interleaved":
                fwd_bound, bwd_bound = interleaved_receives(n, s, micro, chunks)
                assert fwd <= most["fwd"] <= (0 if s == 0 else fwd_bound), (s, most)
                assert most["bwd"] <= (0 if s == n - 1 else bwd_bound), (s, most)
                if schedule == "interleaved3x":  # 24 microbatches: far fewer than one per microbatch
                    assert most["fwd"] < micro
            else:
                assert (most["fwd"], most["bwd"]) == (fwd, bwd), (s, most)
        # every buffer released when the step ends; torch's stage keeps one per microbatch
        assert ours["live"] == 0 and set(ours["held_after"].values()) == {0}
        if schedule == "interleaved3x":  # (no torch twin run)
            continue
        for s, held in res[f"{schedule}/torch"]["held_after"].items():
            assert held == (0 if int(s) == 0 else MICRO) + (0 if int(s) == n - 1 else MICRO)
