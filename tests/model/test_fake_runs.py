"""A model that reads a value on meta runs under FakeTensorMode (valueless.meta_or_fake): its simulated step
and profile are the same with simulate.MetaOpCache on as off (it stays out of the way there: a fake
tensor's outputs are never remembered), and the first validation against a model has the process's
exit skip the collector's traversals (validation._frozen_at_exit)."""
from __future__ import annotations

import gc

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from planlang.model import validation
from planlang.model.capture.profile import profile_model
from planlang.model.capture.simulate import MetaOpCache, simulate_step


class ReadsAValue(nn.Module):
    """Reads a value where its input is not fake, as Hugging Face's mask creation does."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 16)

    def forward(self, x):
        last = x[:, -1] == 0  # made here: a fake tensor under FakeTensorMode
        if not isinstance(last, FakeTensor) and bool(last.all()):
            x = x + 1
        return self.b(torch.relu(self.a(x))).sum(dim=1)


def _model():
    with torch.device("meta"):
        return ReadsAValue(), {"x": torch.zeros(4, 8, 16, device="meta")}


def test_fake_runs_are_the_same_with_the_cache_and_leave_it_untouched(monkeypatch):
    model, inputs = _model()
    cached = simulate_step(model, inputs, accumulate=True)
    prof = profile_model(model, inputs)
    assert cached.backward_peak > 0 and prof.total_fwd_flops > 0
    monkeypatch.setattr(MetaOpCache, "enabled", False)
    assert simulate_step(model, inputs, accumulate=True) == cached
    plain = profile_model(model, inputs)
    assert plain.modules == prof.modules
    assert (plain.total_fwd_flops, plain.total_bwd_flops, plain.total_saved_bytes) == (
        prof.total_fwd_flops, prof.total_bwd_flops, prof.total_saved_bytes)


def test_the_cache_is_not_entered_under_fake_tensors():
    with FakeTensorMode():
        with MetaOpCache() as cache:
            assert cache not in _get_current_dispatch_mode_stack()
    x = torch.empty(2, 3, device="meta")
    with MetaOpCache({}) as cache:
        assert cache in _get_current_dispatch_mode_stack()
        x * 2
    assert cache.misses == 1


def test_the_exit_is_spared_the_collectors_traversals_once_registered(monkeypatch):
    registered = []
    monkeypatch.setattr(validation.atexit, "register", registered.append)
    monkeypatch.setattr(validation, "_AT_EXIT", [])
    for _ in range(2):
        with validation.collector_paused():
            pass
    assert registered == [gc.freeze]
