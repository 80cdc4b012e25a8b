"""DDP from the plan's data axes gives the single-process gradient of the mean loss over the global batch
(real gloo processes; see dist_worker_zero for the runs): dp=2 on 2 ranks, and on a dp x tp = 2 x 2 mesh
with the batch over dp (tp ranks see the same half) or over (dp, tp) (one flattened group of 4)."""
from __future__ import annotations

import pytest

from tests.runtime.dist_worker_zero import world2_results, world4_results

TOL = 1e-5


def _no_error(results, key):
    for r, res in enumerate(results):
        assert key not in res["errors"], f"rank {r}:\n{res['errors'][key]}"
        assert "worker" not in res["errors"], f"rank {r}:\n{res['errors']['worker']}"


def test_ddp_dp2_matches_single_process():
    results = world2_results()
    _no_error(results, "ddp")
    for res in results:
        run = res["ddp"]
        assert run["wrapper"] == "DistributedDataParallel" and run["optimizer"] == "AdamW"
        assert run["grad_err"] <= TOL, run
        assert run["param_err"] <= TOL, run


@pytest.mark.parametrize("key, group_size", [("ddp_dp", 2), ("ddp_dp_tp", 4)])
def test_ddp_on_dp_tp_mesh_matches_single_process(key, group_size):
    results = world4_results()
    _no_error(results, key)
    for res in results:
        run = res[key]
        assert run["group_size"] == group_size
        assert run["grad_err"] <= TOL, run
        assert run["param_err"] <= TOL, run
