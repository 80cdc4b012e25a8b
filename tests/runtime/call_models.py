"""Models for tests/runtime/test_call_gloo.py whose factory module defines no `loss`: HF GPT-2 then computes
its own loss from `labels=`, which the plan declares as an `input`."""
from __future__ import annotations

import torch


def gpt2(**kw) -> torch.nn.Module:
    from examples.zoo.causal_lm import gpt2 as build
    return build(**kw)
