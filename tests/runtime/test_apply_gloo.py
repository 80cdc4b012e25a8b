"""Parity of planlang.apply with single-process training: 4 gloo ranks, several plans, 3 steps each
(fp32; relative error of the loss and of every gradient, Frobenius norms, ≤ 1e-5)."""
from __future__ import annotations

import pytest

from tests.runtime import apply_worker

CONFIGS = apply_worker.TP_DP


@pytest.fixture(scope="module")
def results():
    """Rank 0's rows (one launch shared with test_apply_zero_pipeline_gloo.py)."""
    return apply_worker.results()[0]


@pytest.mark.parametrize("config", CONFIGS)
def test_matches_single_process(results, config):
    r = results[config]
    assert "error" not in r, r.get("error")
    rows = r["rows"]
    assert len(rows) == 3
    for row in rows:
        assert row["loss_rel_err"] <= 1e-5, row
        assert row["grad_rel_err"] <= 1e-5, row
        assert row["worst_grad"], "no gradient was compared"
    # training moved: the loss of step 3 differs from step 1 (the optimizer really stepped)
    assert rows[2]["loss_reference"] != rows[0]["loss_reference"]
