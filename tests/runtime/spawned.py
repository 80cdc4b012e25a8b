"""Run a gloo worker on spawned processes and read back what each rank wrote (rank{r}.json in a folder):
the harness of the test modules that spawn one group of ranks for all their configurations."""
from __future__ import annotations

import json
import os
import socket
import time

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_ranks(worker, world: int, outdir: str, timeout_s: float, *args) -> tuple[list[dict | None], str | None]:
    """`worker(rank, port, outdir, *args)` on `world` spawned processes: each rank's JSON (None where it
    wrote none) and why the run failed (a worker raised, or the timeout passed: the rest are killed)."""
    ctx = mp.start_processes(worker, args=(free_port(), outdir, *args), nprocs=world, join=False,
                             start_method="spawn")
    failed = None
    deadline = time.time() + timeout_s
    try:
        while not ctx.join(timeout=2):
            if time.time() > deadline:
                failed = f"workers timed out after {timeout_s} s"
                break
    except Exception as err:  # noqa: BLE001 - a worker raised; its JSON says why
        failed = str(err)
    for p in ctx.processes:
        if p.is_alive():
            p.kill()
    out: list[dict | None] = []
    for r in range(world):
        path = os.path.join(outdir, f"rank{r}.json")
        out.append(json.load(open(path)) if os.path.exists(path) else None)
    return out, failed


def write_rank(outdir: str, rank: int, body) -> None:
    """On a spawned rank: `body()`'s results written to rank{rank}.json as {"results": ...}, or the error
    with its traceback as {"error": ...} and raised again (so the spawner sees the rank fail); then the
    rank leaves its process group (planlang.runtime.teardown)."""
    import traceback

    try:
        res = {"results": body()}
    except Exception as err:  # noqa: BLE001 - reported by the test
        res = {"error": f"{type(err).__name__}: {err}\n{traceback.format_exc()}"}
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    if "error" in res:
        raise RuntimeError(res["error"])
    from planlang.runtime.teardown import leave

    leave()


def manual_run(worker, world: int) -> None:
    """`python -m tests.runtime.<worker module>`: every rank in a temporary folder, rank 0's results printed."""
    import tempfile

    ranks, failed = spawn_ranks(worker, world, tempfile.mkdtemp(), 3600)
    print(failed or "", json.dumps(ranks[0], indent=1)[:20000])


def written_results(worker, world: int, outdir: str, timeout_s: float) -> list:
    """Each rank's results from workers that write through `write_rank`; the test fails, naming every
    rank's error, when a rank raised, wrote nothing or the run timed out."""
    import pytest

    ranks, failed = spawn_ranks(worker, world, outdir, timeout_s)
    out = [res if res is not None else {"error": "no result"} for res in ranks]
    errors = [f"rank {r}: {res['error']}" for r, res in enumerate(out) if "error" in res]
    if failed or errors:
        pytest.fail((failed or "") + "\n" + "\n".join(errors))
    return [res["results"] for res in out]
