"""Attention with a mask in the simulated step (planlang.model.capture.simulate.fused_attention): a fused
kernel takes the mask, as on devices, instead of the math path, which on meta materialised and saved every
head's scores. Hugging Face decoders pass such a mask under fake tensors (their causal-mask shortcut is
off while tracing): at sequence 2048 the simulation of a 2-layer Llama saved 413 MiB where the real run
saves 149. Reference: the same module run for real on the CPU under the same live-bytes tracker."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from planlang.model.capture.simulate import simulate_step


class MaskedAttention(nn.Module):
    """Two attention layers whose mask is built from positions, as a Hugging Face decoder builds it."""

    def __init__(self, hidden: int = 64, heads: int = 4, additive: bool = False):
        super().__init__()
        self.qkv = nn.ModuleList(nn.Linear(hidden, 3 * hidden) for _ in range(2))
        self.heads, self.additive = heads, additive

    def forward(self, x):
        b, s, h = x.shape
        pos = torch.arange(s, device=x.device)
        mask = (pos[None, :] <= pos[:, None])[None, None].expand(b, 1, s, s)
        if self.additive:
            mask = torch.zeros(mask.shape, dtype=x.dtype, device=x.device).masked_fill(~mask, float("-inf"))
        for qkv in self.qkv:
            q, k, v = qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
            x = x + F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(b, s, h)
        return x


@pytest.mark.parametrize("additive", [False, True], ids=["bool", "additive"])
def test_simulated_masked_attention_saves_what_the_cpu_run_saves(additive):
    torch.manual_seed(0)
    model = MaskedAttention(additive=additive)
    x = torch.randn(2, 256, 64)
    real = simulate_step(model, {"x": x})
    sim = simulate_step(model.to("meta"), {"x": x.to("meta")})
    assert (sim.saved, sim.backward_peak) == (real.saved, real.backward_peak)
    scores = 2 * 4 * 256 * 256 * 4  # one layer's scores, batch x heads x s x s in f32
    assert sim.saved < 2 * scores  # no layer's scores saved (the math path saved both layers' and more)
