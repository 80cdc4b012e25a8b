"""A model with a parameter the loss never reaches (as BERT's pooler under a masked-LM loss): `s` scales a
second output the loss ignores, so it gets no gradient. Its stage's gradient buckets must still be summed
once and exactly (tests/runtime/test_pipeline_gloo.py). And a frozen one, `f` (requires_grad False), which
the gradient sums leave alone."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class UnusedNet(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.a, self.b, self.c = (nn.Linear(width, width) for _ in range(3))
        self.s = nn.Parameter(torch.ones(width))
        self.f = nn.Parameter(torch.full((width,), 0.5), requires_grad=False)

    def forward(self, x: torch.Tensor):
        h = torch.tanh(self.b(torch.tanh(self.a(x)))) * self.f
        return self.c(h), h * self.s


def build() -> UnusedNet:
    return UnusedNet()


def loss(output, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(output[0], target)
