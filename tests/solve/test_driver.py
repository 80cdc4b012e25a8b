"""The `planlang solve` driver on small plans: holes filled, the result checks, choices are deterministic,
the structure is the expected one, and an infeasible budget is reported with the smallest feasible one."""
from __future__ import annotations

from pathlib import Path

import pytest

from planlang.plan.checker import check_text
from planlang.solve.driver import Infeasible, SolveError, factorizations, solve

MLP = '''# a partial MLP plan
use hardware
model mlp = "examples.mlp.model:build"(in_features = 64, hidden = 256, out_features = 64)
input x : f32[batch = 32, features = 64]
mesh ranks of 4 x hardware.cpu {
    dp = ? over hardware.loopback
    tp = ? over hardware.loopback
}
budget BUDGET per device
optimizer adamw(lr = 0.001) {
    zero = ? over dp
}
data x : [dp, _]
shard fc1.weight : ?
checkpoint ?
'''


def _write(tmp_path: Path, budget: str) -> str:
    p = tmp_path / "mlp_partial.plan"
    p.write_text(MLP.replace("BUDGET", budget))
    return str(p)


def test_factorizations_are_every_ordered_split():
    assert factorizations(8, 2) == [(1, 8), (2, 4), (4, 2), (8, 1)]
    assert len(factorizations(8, 3)) == 10
    assert all(a * b * c == 12 for a, b, c in factorizations(12, 3))


def test_solves_mlp_and_result_checks(tmp_path):
    path = _write(tmp_path, "1 GiB")
    res = solve(path)
    checked = check_text(res.text, path)
    assert not checked.errors
    assert checked.plan is not None and not checked.plan.holes()
    # large batch, small hidden: data parallel over all four processes
    sizes = dict(zip(checked.plan.mesh.names, checked.plan.mesh.shape))
    assert sizes == {"dp": 4, "tp": 1}
    assert "solved by `planlang solve" in res.text
    assert res.best.fits and len(res.tried) >= 3
    # deterministic: the same input gives byte-identical output
    assert solve(path).text == res.text


def test_infeasible_budget_names_the_smallest(tmp_path):
    path = _write(tmp_path, "64 KiB")
    with pytest.raises(Infeasible) as err:
        solve(path)
    assert err.value.smallest_budget and err.value.smallest_budget > 64 * 1024
    assert "raise the budget" in str(err.value)


def test_unknown_objective(tmp_path):
    with pytest.raises(SolveError, match="unknown objective"):
        solve(_write(tmp_path, "1 GiB"), objective="fastest")
