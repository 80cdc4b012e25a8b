"""ZeRO over dp=2 on 2 gloo ranks, 3 AdamW steps on the 2-layer MLP against one process on the whole batch:
ZeRO-1 (DDP + ZeroRedundancyOptimizer), ZeRO-2 and ZeRO-3 (FSDP2 fully_shard); and ZeRO-2 over tp with
the batch over (dp, tp) on 4 ranks (FSDP2's HSDP: replicate over dp, shard over tp)."""
from __future__ import annotations

import pytest

from tests.runtime.dist_worker_zero import world2_results, world4_results

TOL = 1e-5
MLP_NUMEL = 8 * 16 + 16 + 16 * 4 + 4


@pytest.mark.parametrize("key, optimizer", [("zero1", "ZeroRedundancyOptimizer"), ("zero2", "AdamW"),
                                            ("zero3", "AdamW")])
def test_zero_matches_single_process(key, optimizer):
    for r, res in enumerate(world2_results()):
        assert key not in res["errors"], f"rank {r}:\n{res['errors'][key]}"
        run = res[key]
        assert run["optimizer"] == optimizer
        assert run["grad_err"] <= TOL, run
        assert run["param_err"] <= TOL, run


def test_zero2_and_zero3_shard_gradients_and_zero3_parameters():
    for res in world2_results():
        z2, z3 = res["zero2"], res["zero3"]
        # FSDP2 keeps each rank's dim-0 slice of every gradient: half of the elements on dp=2
        assert z2["grad_local_numel"] == MLP_NUMEL // 2 and z3["grad_local_numel"] == MLP_NUMEL // 2
        # stage 3 frees the gathered parameters after forward, stage 2 keeps them for backward
        assert z3["param_sharded_after_forward"] and not z2["param_sharded_after_forward"]
        assert res["zero1"]["wrapper"] == "DistributedDataParallel"


def test_zero2_hsdp_on_dp_tp_mesh():
    for r, res in enumerate(world4_results()):
        assert "hsdp" not in res["errors"], f"rank {r}:\n{res['errors']['hsdp']}"
        run = res["hsdp"]
        assert run["placements"] == ["R", "S(0)"]  # (dp, tp)
        assert run["grad_err"] <= TOL and run["param_err"] <= TOL, run
