"""Pipeline x tensor (x data) parallelism through `planlang.apply` as `planlang verify` drives it, against
one process (planlang.runtime.program_pipeline): GPT-2 (hidden 64) with Megatron attention and MLP.

- 4 ranks (the shared launch of tests/runtime/apply_worker.py): pp2 x tp2 under 1F1B, interleaved
  1F1B (4 stages, 2 per rank) with one checkpoint group per block, and DualPipeV (4 stages in a V);
- 8 ranks (a launch of their own): the README's 3-D plan scaled to CPU (pp2 x dp2 x tp2, 1F1B, ZeRO-1,
  `checkpoint h[*] every 2`), and the same with ZeRO-3 (each stage an FSDP2 unit over dp); stages of their
  own degrees (issue #31): stage 0 on dp4 and stage 1 on dp2 x tp2, and the reverse, with ZeRO-1 over each
  stage's own dp.

Each step's loss, gradients and parameters are judged as `verify` judges them (each within its bound);
besides, each test checks that the plan's mechanism ran: every rank holds its stages' tensor-parallel
pieces only, ZeRO-1 is a ZeroRedundancyOptimizer, ZeRO-3's gradients are FSDP2 shards, and the
checkpoint groups of the rank's stages were wrapped.
"""
from __future__ import annotations

import pytest

from tests.runtime import apply_worker
from tests.runtime.apply_worker import PIPELINE_3D, PIPELINE_TP

# GPT-2 (layers 4, hidden 64, vocab 128, seq 16): its parameter elements, whole, without the (untied) head
WHOLE = 128 * 64 + 16 * 64 + 4 * (2 * 64 + 64 * 192 + 192 + 64 * 64 + 64 + 2 * 64 + 64 * 256 + 256 + 256 * 64 + 64) + 2 * 64


@pytest.fixture(scope="module")
def four() -> list[dict]:
    return apply_worker.results()


@pytest.fixture(scope="module")
def eight() -> list[dict]:
    return apply_worker.launch(tuple(PIPELINE_3D), 8)


def _passes(res: list[dict], config: str) -> None:
    for r, ranks in enumerate(res):
        c = ranks[config]
        assert "error" not in c, f"rank {r}: {c.get('error')}"
        apply_worker.assert_within_bounds(c["rows"])


@pytest.mark.parametrize("config", PIPELINE_TP)
def test_pp2_tp2_matches_one_process(four, config):
    _passes(four, config)


@pytest.mark.parametrize("config", PIPELINE_3D)
def test_pp2_dp2_tp2_matches_one_process(eight, config):
    _passes(eight, config)


@pytest.mark.parametrize("config", PIPELINE_TP)
def test_each_rank_holds_its_stages_tensor_parallel_pieces(four, config):
    sizes = [res[config]["report"]["param_local_numel"] for res in four]
    assert all(res[config]["report"]["model"] == "ProgramPipelinedModel" for res in four)
    # the two tp ranks of a pipeline rank hold pieces of the same size; no rank holds half the model
    assert sizes[0] == sizes[1] and sizes[2] == sizes[3]
    assert max(sizes) < WHOLE / 2


def test_zero1_shards_the_optimizer_state_over_dp(eight):
    for res in eight:
        rep = res["gpt2_3d_cpu"]["report"]
        assert rep["optimizer"] == "ZeroRedundancyOptimizer"
        assert rep["grad_local_numel"] == rep["param_local_numel"]  # gradients whole on each rank
        assert 0.2 * rep["param_local_numel"] < rep["state_numel"] < 0.8 * rep["param_local_numel"]


def test_zero3_stages_are_fsdp2_units_over_dp(eight):
    for res in eight:
        rep = res["gpt2_pp2_dp2_tp2_zero3"]["report"]
        assert rep["fsdp_axes"] == ["dp"]
        assert rep["grad_local_numel"] <= rep["param_local_numel"] // 2 * 1.1  # dim-0 shards over dp = 2
        assert rep["state_numel"] == rep["grad_local_numel"]


@pytest.mark.parametrize("config, groups", [
    ("gpt2_3d_cpu", {0: [["h.0", "h.1"]], 1: [["h.2", "h.3"]]}),  # `every 2`: one group per stage
    ("gpt2_pp2_dp2_tp2_zero3", {0: [["h.0"], ["h.1"]], 1: [["h.2"], ["h.3"]]}),
])
def test_checkpoint_groups_run_in_their_stage(eight, config, groups):
    for r, res in enumerate(eight):
        pp = r // 4  # mesh pp x dp x tp, row-major
        assert res[config]["report"]["checkpoint_groups"] == groups[pp]


@pytest.mark.parametrize("config, tensor_stage", [("gpt2_pp2_hetero", 1), ("gpt2_pp2_hetero_reverse", 0)])
def test_stages_of_their_own_degrees_hold_their_own_pieces(eight, config, tensor_stage):
    """The dp4 stage's four ranks hold its blocks whole, the dp2 x tp2 stage's tp pairs hold halves, and
    ZeRO-1 shards each stage's optimizer state over the stage's own data degree (4 or 2)."""
    reports = [res[config]["report"] for res in eight]
    assert all(rep["model"] == "ProgramPipelinedModel" for rep in reports)
    by_stage = [[rep for r, rep in enumerate(reports) if r // 4 == s] for s in (0, 1)]
    for s, reps in enumerate(by_stage):
        sizes = {rep["param_local_numel"] for rep in reps}
        assert len(sizes) == 1, (s, sizes)  # every device of a stage holds a piece of one size
        dp = 2 if s == tensor_stage else 4
        # ZeroRedundancyOptimizer gives each parameter's state (one exp_avg per element counted) to one rank
        # of its data group: over the stage's 4 ranks, 4 / dp groups of the stage's pieces
        state = sum(rep["state_numel"] for rep in reps)
        assert state == 4 // dp * sizes.pop(), (s, state)
    # the same modules on the same pipeline rank, tensor-parallel here and whole (dp4) in the other plan
    other = "gpt2_pp2_hetero_reverse" if config == "gpt2_pp2_hetero" else "gpt2_pp2_hetero"
    rank = 4 * tensor_stage
    assert eight[rank][config]["report"]["param_local_numel"] < 0.8 * eight[rank][other]["report"]["param_local_numel"]
