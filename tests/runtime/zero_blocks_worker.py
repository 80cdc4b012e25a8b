"""Worker for tests/runtime/test_zero_blocks_gloo.py: 2 gloo ranks run `verify` (3 AdamW steps against
one process) on GPT-2 with 3 blocks under ZeRO-3 and ZeRO-2 over dp=2, and record, through hooks on the
model's own block modules, which blocks hold gathered (plain) parameters when each block's forward runs
and when each block's backward has just produced its input's gradient, and which blocks' gradients are
reduce-scattered (FSDP2 DTensor shards) by then. Each rank writes its findings as JSON."""
from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import sys
import tempfile
import traceback
from pathlib import Path

PLANS = Path(__file__).parent / "plans"
CASES = {"zero3": "gpt2_dp2_zero3_blocks", "zero2": "gpt2_dp2_zero2_blocks"}
WORLD = 2


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@functools.cache
def results() -> list[dict]:
    import torch.multiprocessing as mp

    out = Path(tempfile.mkdtemp(prefix="planlang_zero_blocks_"))
    mp.spawn(run, args=(WORLD, _port(), str(out)), nprocs=WORLD, join=True)
    ranks = [json.loads((out / f"results{r}.json").read_text()) for r in range(WORLD)]
    shutil.rmtree(out, ignore_errors=True)
    return ranks


def _state(blocks) -> list[str]:
    """Per block: "gathered" when its parameters are plain tensors (FSDP2 swapped the whole ones in),
    "sharded" when they are its DTensor shards."""
    from torch.distributed.tensor import DTensor

    return ["sharded" if all(isinstance(p, DTensor) for p in b.parameters()) else "gathered" for b in blocks]


def _grads(blocks) -> list[str]:
    """Per block: "none" (no gradient yet), "shard" (FSDP2 reduce-scattered it) or "whole"."""
    from torch.distributed.tensor import DTensor

    out = []
    for b in blocks:
        gs = [p.grad for p in b.parameters()]
        out.append("none" if all(g is None for g in gs) else
                   "shard" if all(isinstance(g, DTensor) for g in gs) else "whole")
    return out


def _case(plan: str) -> dict:
    import torch

    from planlang.model.capture.load import build_model
    from planlang.runtime.apply import load_plan
    from planlang.runtime.verify import verify

    p = load_plan(plan)
    torch.manual_seed(0)
    model = build_model(p.model, p.path, device="cpu")
    blocks = list(model.h)
    from torch.distributed.fsdp import FSDPModule

    log: list[dict] = []

    def pre(module, args):
        # the model's own blocks once sharded (not the tracing before apply, nor verify's deep copies)
        if not any(module is b for b in blocks) or not isinstance(module, FSDPModule):
            return
        i = next(k for k, b in enumerate(blocks) if b is module)
        log.append({"at": f"forward {i}", "params": _state(blocks)})
        xs = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
        if xs:  # the block's backward has produced its input's gradient
            xs[0].register_hook(lambda g, i=i: log.append({"at": f"backward {i}", "params": _state(blocks),
                                                           "grads": _grads(blocks)}) or None)

    for b in blocks:
        b.register_forward_pre_hook(pre)  # before apply: FSDP2's own pre-hook is prepended, runs first
    report: dict = {}
    rows = verify(plan, steps=3, model=model, report=report)
    return {"rows": [r.__dict__ for r in rows], "log": log[:2 * len(blocks)],  # the first step's,
            "units": [type(b).__name__ for b in blocks], "fsdp_units": [isinstance(b, FSDPModule) for b in blocks],
            "report": report}


def run(rank: int, world: int, port: int, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    sys.path.insert(0, os.getcwd())
    out = {}
    for key, stem in CASES.items():
        try:
            out[key] = _case(str(PLANS / f"{stem}.plan"))
        except Exception as e:  # noqa: BLE001 - reported to the test
            out[key] = {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}
    with open(os.path.join(out_dir, f"results{rank}.json"), "w") as f:
        json.dump(out, f)
    from planlang.runtime.teardown import leave

    leave()  # barrier, destroy, exit without finalization (see teardown.py)
