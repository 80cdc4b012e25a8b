"""Worker for tests/runtime/test_apply_gloo.py and test_apply_zero_pipeline_gloo.py: one launch of 4 gloo
ranks runs `verify` on every plan of both files (process start-up and the first lowering dominate the
time, so they are paid once per session); rank 0 writes every plan's rows and `describe` facts, every
other rank its own facts (ZeRO shards differ between ranks)."""
from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

PLANS = Path(__file__).parent / "plans"
WORLD = 4
TP_DP = ["mlp_dp4", "mlp_tp4", "mlp_dp2_tp2", "gpt2_tp4", "gpt2_dp2_tp2_ckpt", "bert_tp2_dp2", "gpt2_dp4_tied"]
ZERO = ["gpt2_dp2_tp2_zero1", "gpt2_dp2_tp2_zero2", "gpt2_dp4_zero3", "gpt2_dp2_fs2_hsdp"]
PIPELINE = ["gpt2_pp4_1f1b", "gpt2_pp4_gpipe", "gpt2_pp2_dp2_zero1", "gpt2_pp2_dp2_zero2", "gpt2_pp4_1f1b_ckpt"]
# pipeline x tensor parallelism: the lowered program cut into stages (planlang.runtime.program_pipeline)
PIPELINE_TP = ["gpt2_pp2_tp2", "gpt2_pp2_tp2_interleaved", "gpt2_pp2_tp2_dualpipev", "gpt2_pp2_hetero_dp1"]
# the same on 8 ranks (a launch of their own): the README's 3-D plan scaled to CPU (ZeRO-1), and ZeRO-3;
# stages of their own degrees (dp4 -> dp2 x tp2, and the reverse; planlang.runtime.heterogeneous)
PIPELINE_3D = ["gpt2_3d_cpu", "gpt2_pp2_dp2_tp2_zero3", "gpt2_pp2_hetero", "gpt2_pp2_hetero_reverse"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def results() -> list[dict]:
    """Per rank: plan stem -> {"rows", "report", "seconds"} or {"error", "seconds"}, for every 4-rank plan."""
    return launch(tuple([*TP_DP, *ZERO, *PIPELINE, *PIPELINE_TP]), WORLD)


@functools.cache
def launch(configs: tuple[str, ...], world: int) -> list[dict]:
    """`verify` of each plan of `configs` on `world` gloo ranks, one launch; per rank as `results`."""
    import torch.multiprocessing as mp

    out = Path(tempfile.mkdtemp(prefix="planlang_apply_"))
    plans = [str(PLANS / f"{c}.plan") for c in configs]
    mp.spawn(run, args=(world, _port(), plans, str(out)), nprocs=world, join=True)
    ranks = []
    for r in range(world):
        data = json.loads((out / ("results.json" if r == 0 else f"results{r}.json")).read_text())
        ranks.append({Path(k).stem: v for k, v in data.items()})
    shutil.rmtree(out, ignore_errors=True)
    return ranks


def run(rank: int, world: int, port: int, plans: list[str], out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    sys.path.insert(0, os.getcwd())
    from planlang.runtime.verify import verify

    out = {}
    for plan in plans:
        t0 = time.time()
        try:
            report: dict = {}
            rows = verify(plan, steps=3, report=report)
            out[plan] = {"rows": [r.__dict__ for r in rows], "report": report}
        except Exception as e:  # noqa: BLE001 - reported to the test
            import traceback

            out[plan] = {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}
        out[plan]["seconds"] = round(time.time() - t0, 2)
    name = "results.json" if rank == 0 else f"results{rank}.json"
    with open(os.path.join(out_dir, name), "w") as f:
        json.dump(out, f)
    from planlang.runtime.teardown import leave

    leave()  # barrier, destroy, exit without finalization (see teardown.py)


def assert_within_bounds(rows: list[dict]) -> None:
    """Three verify steps, each error within the bound verify judged it against, and the optimizer stepped."""
    assert len(rows) == 3
    for row in rows:
        assert row["loss_rel_err"] <= row["loss_bound"], row
        assert row["grad_rel_err"] <= row["grad_bound"], row
        assert row["param_rel_err"] <= row["param_bound"], row
        assert row["worst_grad"], "no gradient was compared"
    assert rows[2]["loss_reference"] != rows[0]["loss_reference"]  # the optimizer really stepped
