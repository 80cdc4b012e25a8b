"""A two-layer MLP: ``fc1`` (Linear) -> ``act`` (GELU) -> ``fc2`` (Linear).

Input ``x``: float32 ``[batch, in_features]``; output ``[batch, out_features]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    def __init__(self, in_features: int, hidden: int, out_features: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def build(in_features: int = 1024, hidden: int = 4096, out_features: int = 1024) -> MLP:
    return MLP(in_features, hidden, out_features)


def example_inputs(batch: int = 4, in_features: int = 1024) -> tuple[torch.Tensor]:
    return (torch.randn(batch, in_features),)


def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error against a float target of the output's shape."""
    return F.mse_loss(output, target)
