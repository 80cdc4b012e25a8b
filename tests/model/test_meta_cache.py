"""planlang.model.capture.simulate.MetaOpCache: a meta kernel's outputs remembered by its arguments' metadata. The
simulation, the profile and whole estimates are the same with it as without it (every field, not within
a tolerance), and it never hands out a view, a mutated argument or a storage twice."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from planlang.model.price import caches
from planlang.model.price import estimate as E
from planlang.model.capture.profile import profile_model
from planlang.model.capture.simulate import MetaOpCache, simulate_step
from planlang.plan.complete import complete
from planlang.plan.resolve import Resolver

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def without_cache(monkeypatch):
    def run(fn):
        monkeypatch.setattr(MetaOpCache, "enabled", False)
        try:
            return fn()
        finally:
            monkeypatch.setattr(MetaOpCache, "enabled", True)
    return run


def _gpt(layers=3):
    from examples.gpt2.model import build, loss

    with torch.device("meta"):
        model = build(layers=layers, hidden=64, heads=4, vocab=128, seq=32)
    return model, {"idx": torch.zeros(4, 32, dtype=torch.long, device="meta")}, lambda out, x: loss(out, x["idx"])


def test_simulation_is_the_same_with_the_cache(without_cache):
    model, inputs, loss = _gpt()
    stage_of = {n: (0 if n.startswith(("wte", "wpe", "h.0")) else 1) for n, _ in model.named_modules() if n}
    for kw in ({}, {"stage_of": stage_of, "accumulate": True}, {"blocks": ("h.0", "h.1", "h.2")}):
        plain = without_cache(lambda: simulate_step(model, inputs, loss, **kw))
        cached = simulate_step(model, inputs, loss, **kw)
        again = simulate_step(model, inputs, loss, **kw)  # every kernel a hit now
        assert plain == cached == again, kw


def test_profile_is_the_same_with_the_cache(without_cache):
    model, inputs, loss = _gpt()
    plain = without_cache(lambda: profile_model(model, inputs, loss))
    for _ in range(2):
        cached = profile_model(model, inputs, loss)
        assert cached.modules == plain.modules
        assert (cached.total_fwd_flops, cached.total_bwd_flops, cached.total_saved_bytes) == (
            plain.total_fwd_flops, plain.total_bwd_flops, plain.total_saved_bytes)


@pytest.mark.parametrize("plan", ["examples/gpt2/gpt2_3d.plan", "examples/gpt2/gpt2_bf16.plan",
                                  "examples/templates/bert_tp.plan", "examples/mlp/mlp_2d.plan"])
def test_estimates_are_the_same_with_the_cache(plan, without_cache):
    value = complete(Resolver().resolve_file(str(ROOT / plan)).plan)

    def fresh():
        caches.SIMULATIONS.clear()
        caches.PROFILES.clear()
        return E.estimate_plan(value)

    plain = without_cache(fresh)
    assert fresh() == plain
    assert fresh() == plain


def test_hits_are_fresh_tensors_and_views_are_not_remembered():
    table: dict = {}
    x = torch.empty(4, 8, device="meta")
    with MetaOpCache(table) as cache:
        a = x * 2
        b = x * 2  # a hit: a new storage of the same size, shape, strides and dtype
        v = x.t()  # a view: never remembered
        x.add_(1)  # a mutation: never remembered
    assert cache.hits == 1 and cache.misses == 1
    assert a.untyped_storage()._cdata != b.untyped_storage()._cdata
    assert (b.shape, b.stride(), b.dtype, b.untyped_storage().nbytes()) == (
        a.shape, a.stride(), a.dtype, a.untyped_storage().nbytes())
    assert v.untyped_storage()._cdata == x.untyped_storage()._cdata
    assert len(table) == 1
