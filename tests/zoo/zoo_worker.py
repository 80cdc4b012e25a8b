"""Worker for tests/zoo/test_zoo_gloo.py: one launch of `world` gloo ranks checks and verifies every zoo
plan of that world size in turn (process start-up, imports and the models' first build dominate a
`planlang verify` of these small models, so they are paid once per launch). What the command does for
each plan is done here on the same plan: `planlang check --model`'s validation (its diagnostics, PL364
among them; the plans are shared out among the ranks, before the process group exists, as validation
measures memory under a fake one) and `verify` under PLANLANG_STRICT=1, so an op that would gather the
batch (PL364) is an error rather than a warning on stderr. Rank 0 writes every plan's rows, each rank the
diagnostics of the plans it checked."""
from __future__ import annotations

import functools
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tests.runtime.apply_worker import _port
from tests.zoo.plans import plan_text

LAUNCH_TIMEOUT_S = 1500  # a hung collective fails the tests instead of stopping the suite


@functools.cache
def launch(cases: tuple[tuple[str, str], ...], world: int, steps: int) -> dict[str, dict]:
    """`check --model` and `verify(steps)` of each (model, layout) on `world` gloo ranks, one launch:
    "model_layout" -> {"rows", "diagnostics", "seconds"} or {"error", "diagnostics", "seconds"}."""
    import torch.multiprocessing as mp  # lazy: torch loads in the test that launches, not at collection

    out = Path(tempfile.mkdtemp(prefix="planlang_zoo_"))
    plans = []
    for model, layout in cases:
        path = out / f"{model}_{layout}.plan"
        path.write_text(plan_text(model, layout))
        plans.append(str(path))
    ctx = mp.spawn(run, args=(world, _port(), plans, steps, str(out)), nprocs=world, join=False)
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            raise TimeoutError(f"the {world}-rank zoo launch ran past {LAUNCH_TIMEOUT_S} s")
    results = json.loads((out / "results.json").read_text())
    for r in range(world):
        for plan, diags in json.loads((out / f"checks{r}.json").read_text()).items():
            results.setdefault(plan, {})["diagnostics"] = diags
    shutil.rmtree(out, ignore_errors=True)
    return {Path(k).stem: v for k, v in results.items()}


def check(plan: str) -> list[dict]:
    """`planlang check --model`'s diagnostics of `plan` (what `planlang verify` shows, and stops at on an error)."""
    # lazy: imported in the spawned rank, not by the test process
    from planlang.model.validation import check_with_model
    from planlang.runtime.program_memory import measure

    res = check_with_model(plan, program=measure)
    return [{"code": d.code, "severity": d.severity.value, "message": str(d)} for d in res.diagnostics]


def run(rank: int, world: int, port: int, plans: list[str], steps: int, out_dir: str) -> None:
    # lazy: the spawned rank imports torch and planlang after its environment is set
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PLANLANG_STRICT="1")
    os.environ.pop("PLANLANG_PL364_SHOWN", None)
    torch.set_num_threads(1)
    sys.path.insert(0, os.getcwd())
    checks = {}
    for plan in plans[rank::world]:  # each rank validates its share, before the gloo group exists
        try:
            checks[plan] = check(plan)
        except Exception as e:  # noqa: BLE001 - reported to the test
            checks[plan] = [{"code": "exception", "severity": "error", "message": f"{type(e).__name__}: {e}"}]
    with open(os.path.join(out_dir, f"checks{rank}.json"), "w") as f:
        json.dump(checks, f)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from planlang.runtime.verify import verify  # lazy: see above

    out: dict[str, dict] = {}
    for plan in plans:
        t0 = time.time()
        try:
            rows = verify(plan, steps=steps)
            out[plan] = {"rows": [r.__dict__ for r in rows]}
        except Exception as e:  # noqa: BLE001 - reported to the test
            import traceback  # lazy: only on a failure

            out[plan] = {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}
        out[plan]["seconds"] = round(time.time() - t0, 2)
    if rank == 0:
        with open(os.path.join(out_dir, "results.json"), "w") as f:
            json.dump(out, f)
    from planlang.runtime.teardown import leave  # lazy: see above

    leave()  # barrier, destroy, exit without finalization (see teardown.py)
