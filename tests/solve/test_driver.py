"""The `planlang solve` driver on small plans: holes filled, the result checks, choices are deterministic,
the structure is the expected one, and an infeasible budget is reported with the smallest feasible one."""
from __future__ import annotations

import math
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
    # a batch large enough that splitting it beats the collectives' latency on loopback
    Path(path).write_text(Path(path).read_text().replace("batch = 32", "batch = 4096"))
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


GPT = '''use hardware
model gpt2 = "examples.gpt2.model:build"(layers = 4, hidden = 64, heads = 4, vocab = 128, seq = 64)
input idx : i64[batch = 16, seq = 64]
mesh ranks of 2 x hardware.cpu {
    dp = 2 over hardware.loopback
}
budget BUDGET per device
optimizer adamw(lr = 0.001)
data idx : [dp, _]
checkpoint ?
'''


def _gpt(tmp_path: Path, budget: str) -> str:
    p = tmp_path / "gpt_partial.plan"
    p.write_text(GPT.replace("BUDGET", budget))
    return str(p)


def _price(path: str, text: str):
    from planlang.model.price.estimate import estimate_plan
    from planlang.plan.complete import complete

    rows = estimate_plan(complete(check_text(text, path).plan))
    return max(r.peak for r in rows), max(r.step_time for r in rows)


def test_rotor_checkpoints_fit_and_beat_the_every_k_grid(tmp_path):
    """Between the leanest checkpointing and none, rotor's groups fit the budget, and no `every k`
    grouping of the blocks that fits is faster (both priced by the estimator)."""
    roomy = solve(_gpt(tmp_path, "1 GiB"))
    assert "checkpoint: none" in roomy.text
    none_peak = roomy.best.peak
    budget = int(none_peak * 0.75)
    path = _gpt(tmp_path, f"{budget} B")
    msgs: list[str] = []
    res = solve(path, progress=msgs.append)
    assert any(m.startswith("rotor:") for m in msgs)
    ck = [line for line in res.text.splitlines() if line.startswith("checkpoint ")]
    assert ck, res.text
    checked = check_text(res.text, path)
    assert not checked.errors and not checked.plan.holes()
    peak, step = _price(path, res.text)
    assert peak <= budget
    for k in (1, 2, 4):
        text = GPT.replace("BUDGET", f"{budget} B").replace("checkpoint ?", f"checkpoint h[*] every {k}")
        p, t = _price(path, text)
        if p <= budget:
            assert step <= t * (1 + 1e-9), (k, step, t)


def test_budget_sweep_ends_with_the_unconstrained_optimum(tmp_path):
    """map §5.3: the ILP runs at budgets (1 + α)^n · M below the unconstrained optimum's peak, then
    without a budget; the spec sets are distinct, valid for the hole, and the last is the
    unconstrained one."""
    import re

    from planlang.solve.driver import ALPHA, _Search
    from planlang.solve.sweep import spec_sets

    big = MLP.replace("in_features = 64, hidden = 256, out_features = 64",
                      "in_features = 256, hidden = 1024, out_features = 256").replace(
        "batch = 32, features = 64", "batch = 1024, features = 256")
    p = tmp_path / "big.plan"
    p.write_text(big.replace("BUDGET", "4 MiB"))
    msgs: list[str] = []
    s = _Search(str(p), "time", msgs.append)
    sets = spec_sets(s, {"dp": 2, "tp": 2})
    runs = [m for m in msgs if m.startswith("intra-op ILP")]
    assert "unconstrained" in runs[-1]
    budgets = [float(x) * 2**30 for m in runs[:-1] for x in re.findall(r"budget ([0-9.e-]+) GiB", m)]
    assert budgets, runs  # the unconstrained optimum does not fit 4 MiB: the sweep ran
    for b in budgets:
        n = math.log(b / (4 * 2**20), 1 + ALPHA)
        assert abs(n - round(n)) < 0.01 and 0 <= round(n) < 10
    peaks = [float(re.search(r"peak ([0-9.]+) MiB", m).group(1)) for m in runs]
    assert peaks[-1] >= max(peaks[:-1])  # a budget only ever buys memory with time
    assert len({d[0] for d in sets}) == len(sets)
    opts = s.space.spec_options(s.holes.specs[0][0], {"dp": 2, "tp": 2})
    assert all(d[0] in opts for d in sets)
    p2 = tmp_path / "roomy.plan"
    p2.write_text(big.replace("BUDGET", "16 GiB"))
    free = spec_sets(_Search(str(p2), "time", lambda m: None), {"dp": 2, "tp": 2})
    assert len(free) == 1 and free[0] == sets[-1]


def test_candidates_are_priced_with_their_collectives_as_estimate_prices_them(tmp_path):
    """The solver's step is planlang.model.price.step_time's, as `planlang estimate` gives it for the plan: over a
    link a million times slower than loopback the tensor-parallel candidates pay for their collectives
    and the solver keeps to data parallelism; with the usual link it does not have to."""
    from planlang.model.price.estimate import estimate_plan
    from planlang.plan.complete import complete

    slow = tmp_path / "slow.plan"
    text = (MLP.replace("BUDGET", "1 GiB").replace("tp = ? over hardware.loopback", "tp = ? over slow_link")
            .replace("shard fc1.weight : ?", "shard fc1.weight : [tp, _]"))
    slow.write_text(text + "link slow_link {\n    bandwidth = 1 KB/s\n    latency = 1 ms\n}\n")
    res = solve(str(slow))
    plan = check_text(res.text, str(slow)).plan
    assert dict(zip(plan.mesh.names, plan.mesh.shape))["tp"] == 1
    tp = [c for c in res.tried if dict(c.choices).get("axis tp", "1") != "1"]
    assert tp and all(c.step_time > 1.0 for c in tp)  # the collectives of a step over 1 KB/s
    for c in res.tried[:4]:
        assert c.step_time == pytest.approx(max(r.step_time for r in estimate_plan(c.plan)), rel=1e-9)
    assert max(r.step_time for r in estimate_plan(complete(plan))) == pytest.approx(res.best.step_time, rel=1e-9)


def test_memory_objective_needs_no_more_memory_than_time(tmp_path):
    path = _write(tmp_path, "1 GiB")
    msgs: list[str] = []
    mem = solve(path, objective="memory", progress=msgs.append)
    fast = solve(path, objective="time")
    assert any(m.startswith("intra-op ILP (memory") for m in msgs)
    assert not check_text(mem.text, path).errors
    assert mem.best.peak <= fast.best.peak
    assert fast.best.step_time <= mem.best.step_time
