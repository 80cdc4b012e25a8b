"""DCP checkpoints resharded on load (real gloo; runs in dist_worker_zero).

Plan A (2 ranks, tp=2: fc1 column-split, fc2.weight split on dim 1) saves after 3 AdamW steps; plan B
(4 ranks, dp=2 x tp=2: fc1.weight split on dim 1, fc2 split on dim 0) loads it with a plain AdamW and
with ZeRO-1 over dp. Parameters and AdamW state (exp_avg, exp_avg_sq, step) must be bit-identical to
A's unsharded state, assembled from A's pieces without DCP; ZeRO-1 saves again (B1). A ZeRO-3 (FSDP2)
run on 2 ranks saves F; a 4-rank ZeRO-3 model split like plan B loads it and saves again (B3).
"""
from __future__ import annotations

import pytest

from tests.runtime.dist_worker_zero import world2_results, world4_results


def _errors(results, *keys):
    for r, res in enumerate(results):
        for k in keys + ("worker",):
            assert k not in res["errors"], f"rank {r}:\n{res['errors'][k]}"


def test_saved_checkpoints_read_back_whole():
    results = world2_results()
    _errors(results, "checkpoint_A", "zero3")
    res = results[0]
    assert res["A_vs_truth"] == [] and res["F_vs_truth"] == []
    # plan A's pieces follow the single-process run exactly (AdamW is elementwise)
    assert all(r["A_vs_reference"] <= 1e-6 for r in results)
    groups = res["A_param_groups"]
    assert len(groups) == 1 and groups[0]["lr"] == 0.01 and groups[0]["betas"] == [0.9, 0.95]
    assert groups[0]["params"] == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]


@pytest.mark.parametrize("key", ["B", "B_zero1"])
def test_plan_b_loads_plan_a_bit_identical(key):
    results = world4_results()
    _errors(results, "load_B" if key == "B" else "load_B_zero1")
    checked = 0
    for r, res in enumerate(results):
        assert res[key]["bad"] == [], f"rank {r}: {res[key]['bad']}"
        assert res[key]["lr"] == 0.01  # from the checkpoint, not the optimizer's own lr=0.5
        checked += res[key]["states_checked"]
    # 4 parameters x 3 states on each of 4 ranks; with ZeRO-1 each (dp-pair, parameter) has one owner
    assert checked == (4 * 4 * 3 if key == "B" else 2 * 4 * 3)


def test_plan_b_state_gathers_to_the_unsharded_state():
    res = world4_results()[0]
    assert res["B_gathered_vs_truth"] == []  # gathered from B's pieces without DCP
    assert res["A_full_vs_truth"] == []  # load_full_state


def test_loaded_state_steps_like_the_unsharded_optimizer():
    results = world4_results()
    for res in results:
        assert res["B"]["step_err"] <= 1e-6 and res["B_zero1"]["step_err"] <= 1e-6
        # ZeRO-1's owner steps the same local tensors as the plain optimizer: identical parameters
        assert res["B"]["after_step"] == res["B_zero1"]["after_step"]


def test_zero1_saves_its_partitioned_state():
    res = world4_results()[0]
    _errors(world4_results(), "load_B_zero1")
    assert res["B1_vs_truth"] == []


def test_fsdp_checkpoint_reshards_into_fsdp_with_tensor_parallel_pieces():
    results = world4_results()
    _errors(results, "load_F")
    for r, res in enumerate(results):
        assert res["F_into_B3"]["bad"] == [], f"rank {r}"
    assert results[0]["B3_vs_truth"] == []
