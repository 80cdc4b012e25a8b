"""ZeRO and pipeline plans through the user entry points (`planlang.apply` → `pm.step`, `pm.optimizer`,
as `planlang verify` drives them) against single-process training: 4 gloo ranks, GPT-2 (hidden 64),
3 AdamW steps, fp32; relative error of the loss and of every gradient (Frobenius norms) ≤ 1e-5.

One launch runs every plan of this file and of test_apply_gloo.py (tests/runtime/apply_worker.py).
Besides parity, each test checks that the plan's mechanism really ran: the ZeRO-1 optimizer is a
ZeroRedundancyOptimizer holding part of the state, ZeRO-2/3 gradients and state are FSDP2 shards, a
pipeline rank holds only its stages. Pipeline x tensor parallelism: tests/runtime/test_pipeline_tp_gloo.py.
"""
from __future__ import annotations

import pytest

from tests.runtime import apply_worker
from tests.runtime.apply_worker import PIPELINE, ZERO

TOL = 1e-5


@pytest.fixture(scope="module")
def results() -> list[dict]:
    """Per rank: plan stem -> {"rows", "report"} or {"error"} (one launch shared with test_apply_gloo.py)."""
    return apply_worker.results()


def _parity(rows: list[dict]) -> None:
    assert len(rows) == 3
    for row in rows:
        assert row["loss_rel_err"] <= TOL, row
        assert row["grad_rel_err"] <= TOL, row
        assert row["worst_grad"], "no gradient was compared"
    assert rows[2]["loss_reference"] != rows[0]["loss_reference"]  # the optimizer really stepped


@pytest.mark.parametrize("config", ZERO + PIPELINE)
def test_matches_single_process(results, config):
    for r, res in enumerate(results):
        c = res[config]
        assert "error" not in c, f"rank {r}: {c.get('error')}"
        _parity(c["rows"])


def test_zero1_shards_optimizer_state_not_gradients(results):
    for config in ("gpt2_dp2_tp2_zero1", "gpt2_pp2_dp2_zero1"):
        for res in results:
            rep = res[config]["report"]
            assert rep["optimizer"] == "ZeroRedundancyOptimizer"
            assert rep["grad_local_numel"] == rep["param_local_numel"]  # gradients whole (all-reduced)
            # whole parameters are spread over dp = 2 ranks: about half the state each, never all of it
            assert 0.25 * rep["param_local_numel"] < rep["state_numel"] < 0.75 * rep["param_local_numel"]


@pytest.mark.parametrize("config, axes, dp", [("gpt2_dp2_tp2_zero2", ["dp"], 2), ("gpt2_dp4_zero3", ["dp"], 4),
                                              ("gpt2_dp2_fs2_hsdp", ["dp", "fs"], 2),  # replicate dp, shard fs
                                              ("gpt2_pp2_dp2_zero2", ["dp"], 2)])
def test_zero2_and_zero3_shard_gradients_and_state_with_fsdp2(results, config, axes, dp):
    for res in results:
        rep = res[config]["report"]
        assert rep["fsdp_axes"] == axes
        assert rep["model"] == "PipelinedModel" if "pp" in config else rep["model"].startswith("FSDP")
        # each rank keeps its dim-0 slice of every local piece: 1/dp of the elements (up to padding rows)
        assert rep["grad_local_numel"] <= rep["param_local_numel"] // dp * 1.1
        assert rep["state_numel"] == rep["grad_local_numel"]


def test_pipeline_ranks_hold_only_their_stages(results):
    for config in PIPELINE:
        sizes = [res[config]["report"]["param_local_numel"] for res in results]
        assert all(res[config]["report"]["model"] == "PipelinedModel" for res in results)
        if config.startswith("gpt2_pp4"):  # four stages, one per rank: together exactly one model
            assert len(set(sizes)) > 1
            # the model's parameters = the embedding tables + 4 blocks + final norm + head; every rank holds
            # less than half of it
            assert max(sizes) < sum(sizes) / 2


@pytest.mark.parametrize("config, groups", [
    ("gpt2_pp4_1f1b_ckpt", [[f"h.{i}.attn", f"h.{i}.mlp"] for i in range(4)]),  # module by module, one per stage
    ("gpt2_pp2_dp2_zero2", [["h.0", "h.1"], ["h.2", "h.3"]]),  # `every 2`: a chain of blocks in each stage
    ("gpt2_pp4_1f1b", []),
])
def test_pipeline_stages_wrap_the_plans_checkpoint_groups(results, config, groups):
    wrapped = sorted({tuple(g) for res in results for g in res[config]["report"]["checkpoint_groups"]})
    assert wrapped == sorted(tuple(g) for g in groups)
