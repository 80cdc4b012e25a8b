"""Worker for tests/runtime/test_hf_gloo.py: one launch of 4 gloo ranks runs planlang.runtime.verify on
the Hugging Face GPT-2 plans (tests/runtime/plans/hf_*.plan), whose op graph comes from torch.export
(planlang.model.capture.export_graph); rank 0 writes every plan's rows, `describe` facts, parameter counts and seconds."""
from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

PLANS = Path(__file__).parent / "plans"
WORLD = 4
HF_PLANS = ["hf_gpt2_dp4", "hf_gpt2_dp2_tp2"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@functools.cache
def results() -> dict[str, dict]:
    """Plan stem -> {"rows", "report", "seconds"} or {"error", "seconds"} (rank 0's)."""
    import torch.multiprocessing as mp

    out = Path(tempfile.mkdtemp(prefix="planlang_hf_"))
    plans = [str(PLANS / f"{c}.plan") for c in HF_PLANS]
    try:
        mp.spawn(run, args=(WORLD, _port(), plans, str(out)), nprocs=WORLD, join=True)
        data = json.loads((out / "results.json").read_text())
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return {Path(k).stem: v for k, v in data.items()}


def _numel(plan_path: str) -> dict[str, int]:
    """The plan's model's parameter elements (a tied parameter once), and those of the MLP weights and
    biases Megatron's MLP pattern splits (c_fc weight and bias, c_proj weight), from a meta build."""
    from planlang.model.capture.load import build_model
    from planlang.runtime.apply import load_plan

    plan = load_plan(plan_path)
    model = build_model(plan.model, plan.path)
    split = ("mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight")
    return {"full": sum(p.numel() for p in model.parameters()),
            "mlp_split": sum(p.numel() for n, p in model.named_parameters() if n.endswith(split))}


def run(rank: int, world: int, port: int, plans: list[str], out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from planlang.runtime.verify import verify

    out = {}
    for plan in plans:
        t0 = time.time()
        try:
            report: dict = {}
            rows = verify(plan, steps=3, report=report)
            out[plan] = {"rows": [r.__dict__ for r in rows], "report": report, "numel": _numel(plan)}
        except Exception as e:  # noqa: BLE001 - reported to the test
            import traceback

            out[plan] = {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}
        out[plan]["seconds"] = round(time.time() - t0, 2)
    if rank == 0:
        with open(os.path.join(out_dir, "results.json"), "w") as f:
            json.dump(out, f)
    from planlang.runtime.teardown import leave

    leave()  # barrier, destroy, exit without finalization (see teardown.py)
