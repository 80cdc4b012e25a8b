"""The solver at cluster scale (issue #29): candidates the model cannot run are never priced (the
checker's own model rules: a split through the heads, PL365; a dim its axes do not divide, PL362), and
candidates whose parameters and optimizer states alone exceed the budget are not priced either (their
memory floor, a lower bound on the estimator's peak)."""
from __future__ import annotations

from pathlib import Path

import pytest

from planlang.plan.checker import check_text
from planlang.solve import driver
from planlang.solve.pricing import memory_floor

# 3 heads over 4 devices: tp = 2 and tp = 4 split through the heads; only tp = 1 can run
GPT = '''use hardware
use patterns.megatron
model gpt = "examples.gpt2.model:build"(layers = 2, hidden = 48, heads = 3, vocab = 64, seq = 8)
input idx : i64[batch = 8, seq = 8]
mesh ranks of 4 x hardware.cpu {
    dp = ? over hardware.loopback
    tp = ? over hardware.loopback
}
budget BUDGET per device
optimizer adamw
data idx : [dp, _]
for block in h[*] {
    apply megatron.attention(tp) to block.attn
}
'''


def _write(tmp_path: Path, budget: str = "1 GiB") -> str:
    p = tmp_path / "gpt_heads.plan"
    p.write_text(GPT.replace("BUDGET", budget))
    return str(p)


def test_a_split_through_the_heads_is_never_priced(tmp_path, monkeypatch):
    priced = []
    real = driver.price_plan

    def spy(plan, facts, low=None):
        priced.append({a.name: a.size for a in plan.mesh.axes})
        return real(plan, facts, low)

    monkeypatch.setattr(driver, "price_plan", spy)
    search = driver._Search(_write(tmp_path), "time", lambda s: None, prune=False)
    res = search.run()
    assert priced and all(m["tp"] == 1 for m in priced)  # tp 2 and 4 cut through 3 heads
    assert str(dict(res.best.choices)["axis tp"]) == "1"
    n, why = search.gate.refused["PL365"]
    assert n >= 2 and "3 heads" in why
    assert not check_text(res.text, str(tmp_path / "gpt_heads.plan")).errors


def test_the_memory_floor_bounds_every_priced_peak_from_below(tmp_path):
    search = driver._Search(_write(tmp_path), "time", lambda s: None, prune=False)
    res = search.run()
    assert res.tried
    for c in res.tried:
        assert 0 < memory_floor(c.plan, search.facts()) <= c.peak


def test_over_its_floor_nothing_is_priced_and_the_nearest_miss_says_what_it_needs(tmp_path):
    with pytest.raises(driver.Infeasible) as err:
        driver.solve(_write(tmp_path, "1 KiB"))
    assert err.value.smallest_budget is not None and err.value.smallest_budget > 1024
    assert "parameters and optimizer states alone" in str(err.value) and "raise the budget" in str(err.value)


def test_the_floors_local_parameters_kept_in_parts_are_local_params(tmp_path, monkeypatch):
    """memory_floor keeps each parameter's stages per pipeline and its local shape per specs and mesh
    (pricing._local_params): on every candidate of a pp x dp x tp search with stage and spec holes they
    equal planlang.model.price.local_model.local_params of the candidate, field for field."""
    from planlang.model.price.local_model import local_params
    from planlang.solve import pricing
    from tests.solve.test_bounds import SMALL_3D

    path = tmp_path / "small_3d.plan"
    path.write_text(SMALL_3D.replace("BUDGET", "40 GiB"))
    seen = []
    real = pricing._local_params

    def compared(plan, facts):
        got = real(plan, facts)
        assert got == local_params(plan, facts.modules)[1]
        seen.append((plan.mesh, plan.pipeline.stages if plan.pipeline else None))
        return got

    monkeypatch.setattr(pricing, "_local_params", compared)
    driver.solve(str(path), prune=False)
    assert len(set(seen)) > 3 and len({s for _, s in seen}) > 1  # several meshes and stage cuts


def test_a_one_stage_pipeline_is_lowered_once_however_its_stage_is_written(tmp_path, monkeypatch):
    """The stage methods write a one-stage pipeline's stage differently (`h`, `h[0..4]`): pricing.lowered
    lowers such plan values once; lowered afresh, each gives the collectives kept."""
    from planlang.model.price.step_time import lowered_traffic
    from planlang.solve import pricing
    from tests.solve.test_bounds import SMALL_3D

    path = tmp_path / "small_3d.plan"
    # tp fixed at 2: the one-stage candidates are tensor-parallel, so their programs are lowered
    path.write_text(SMALL_3D.replace("BUDGET", "40 GiB").replace("tp = ? over", "tp = 2 over"))
    met: dict = {}
    real = pricing._same_program

    def recorded(plan):
        key = real(plan)
        met.setdefault(key, []).append(plan)
        return key

    monkeypatch.setattr(pricing, "_same_program", recorded)
    search = driver._Search(str(path), "time", lambda s: None, prune=False)
    search.run()
    facts = search.facts()
    shared = [(key, plans) for key, plans in met.items() if len({p.pipeline.stages for p in plans}) > 1]
    assert shared  # the same program reached with its stage written two ways
    assert any(facts.lowered[key].traffic is not None for key, _ in shared)
    for key, plans in shared:
        assert len(plans[0].pipeline.stages) == 1
        for plan in plans:
            fresh = lowered_traffic(plan, None, facts.layers.module)
            assert pricing.CandidateTraffic(None if fresh is None else tuple(fresh)) == facts.lowered[key]
