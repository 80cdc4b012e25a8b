"""Worker for tests/runtime/test_apply_gloo.py: run `verify` on several plans in one process group."""
from __future__ import annotations

import os
import sys


def run(rank: int, world: int, port: int, plans: list[str], out_dir: str) -> None:
    import json

    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    sys.path.insert(0, os.getcwd())
    from planlang.runtime.redistribute import ByteRecorder
    from planlang.runtime.verify import verify

    results = {}
    for plan in plans:
        try:
            rows = verify(plan, steps=3)
            results[plan] = {"rows": [r.__dict__ for r in rows]}
        except Exception as e:  # noqa: BLE001 - reported to the test
            import traceback

            results[plan] = {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}
    if rank == 0:
        with open(os.path.join(out_dir, "results.json"), "w") as f:
            json.dump(results, f)
    del ByteRecorder
    dist.destroy_process_group()
