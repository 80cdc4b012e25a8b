"""bench/runtime_overhead.py: its plans check clean, and its native Megatron twin of GPT-2 computes what
the original model computes (so the time and memory ratios compare the same computation)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import runtime_overhead as R  # noqa: E402

from planlang.plan.checker import check_text  # noqa: E402


@pytest.mark.parametrize("case", R.cases(quick=False), ids=lambda c: c.name)
def test_plan_checks_clean(case):
    res = check_text(R.plan_text(case), path=str(ROOT / "bench" / f"{case.name}.plan"))
    assert res.errors == 0, "\n".join(f"{d.code} {d.message}" for d in res.diagnostics)
    assert res.plan is not None
    axes = dict(zip(res.plan.mesh.names, res.plan.mesh.shape))
    assert axes.get("dp", 1) == case.dp and axes.get("tp", 1) == case.tp
    assert (res.plan.pipeline is not None) == (case.kind in ("pp", "pp_dp", "pp_tp"))


@pytest.mark.parametrize("tp", [2, 4])
def test_head_ordered_column_shards_compute_the_original_attention(tp):
    """Simulate the ranks of ColwiseParallel on the reordered fused q/k/v projection in one process: rank
    r's contiguous output chunk, run through the model's own attention code, gives heads r·H/tp … of
    the original attention (before the output projection), so the native side is Megatron's."""
    case = R.Case("t", "tp", "gpt2", tp, R.GPT2_QUICK, 2)
    model = R.build_model(case)
    attn = model.h[0].attn
    x = torch.randn(2, case.kw["seq"], attn.hidden, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        # the original attention's output before c_proj
        q, k, v = attn.c_attn(x).chunk(3, dim=2)
        split = [t.view(2, -1, attn.heads, attn.head_dim).transpose(1, 2) for t in (q, k, v)]
        want = F.scaled_dot_product_attention(*split, is_causal=True).transpose(1, 2).reshape(2, -1, attn.hidden)
        lin = R.linear_from_conv1d(attn.c_attn, R.gpt2_head_order(attn.hidden, tp))
        pieces = []
        for r in range(tp):
            rows = slice(r * 3 * attn.hidden // tp, (r + 1) * 3 * attn.hidden // tp)
            local = F.linear(x, lin.weight[rows], lin.bias[rows])  # what rank r's column shard computes
            lq, lk, lv = local.chunk(3, dim=2)
            hs = [t.view(2, -1, attn.heads // tp, attn.head_dim).transpose(1, 2) for t in (lq, lk, lv)]
            y = F.scaled_dot_product_attention(*hs, is_causal=True).transpose(1, 2).reshape(2, -1, attn.hidden // tp)
            pieces.append(y)
        got = torch.cat(pieces, dim=2)  # row-parallel c_proj consumes the pieces in rank order
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_linear_from_conv1d_is_the_same_map():
    case = R.Case("t", "tp", "gpt2", 2, R.GPT2_QUICK, 2)
    conv = R.build_model(case).h[0].mlp.c_fc
    x = torch.randn(3, 5, conv.nx)
    with torch.no_grad():
        torch.testing.assert_close(R.linear_from_conv1d(conv)(x), conv(x), rtol=1e-5, atol=1e-6)


def test_summary_takes_the_worst_rank_and_refuses_missing_losses():
    case = R.Case("c", "pp", "gpt2", 2, R.GPT2_PP_QUICK, 8, 4)
    ranks = [{"times": {"native": [0.010, 0.012, 0.011], "planlang": [0.011, 0.013, 0.012]},
              "peaks": {"native": {"tracker": 100 * 2**20}, "planlang": {"tracker": 101 * 2**20}},
              "losses": {"native": None, "planlang": None}},
             {"times": {"native": [0.010, 0.012, 0.011], "planlang": [0.011, 0.013, 0.012]},
              "peaks": {"native": {"tracker": 50 * 2**20}, "planlang": {"tracker": 60 * 2**20}},
              "losses": {"native": [2.0, 1.5], "planlang": [2.0, 1.5003]}}]
    row = R.summarize(case, ranks)
    assert row.native_ms == pytest.approx(11.0) and row.planlang_ms == pytest.approx(12.0)
    assert row.memory_ratio == pytest.approx(1.2)  # rank 1, not the ratio of the largest peaks (1.01)
    assert row.native_mib == pytest.approx(100) and row.planlang_mib == pytest.approx(101)
    assert row.loss_rel_diff == pytest.approx(2e-4)
    assert not row.met
    for r in ranks:
        r["losses"] = {"native": None, "planlang": None}
    with pytest.raises(RuntimeError, match="no rank reported losses"):
        R.summarize(case, ranks)
