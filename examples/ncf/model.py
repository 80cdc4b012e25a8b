"""Neural Collaborative Filtering (He et al. 2017): NeuMF = GMF + MLP, with large embedding tables.

Modules: ``user_embedding`` ``[users, factors]`` and ``item_embedding`` ``[items, factors]`` (the
GMF branch: their elementwise product); ``mlp_user_embedding`` and ``mlp_item_embedding``
(``[users|items, mlp_layers[0] // 2]``, concatenated into the MLP input); ``mlp``
(``nn.Sequential`` of Linear + ReLU: ``mlp_layers[0] -> mlp_layers[1] -> ...``, so ``mlp.0``,
``mlp.2``, ... are the Linears); ``predict`` (``nn.Linear(factors + mlp_layers[-1], 1)``).

With the default 1M users and 100k items the four tables hold 211.2M of the 211.24M parameters,
the case for row-sharding embeddings.

Inputs: ``users`` int64 ``[batch]``, ``items`` int64 ``[batch]``; output: one logit per pair,
float32 ``[batch]`` (apply a sigmoid for the interaction probability). ``torch.fx``-traceable.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


class NCF(nn.Module):
    def __init__(self, users: int, items: int, factors: int, mlp_layers: Sequence[int]) -> None:
        super().__init__()
        mlp_layers = tuple(mlp_layers)
        if len(mlp_layers) < 1 or mlp_layers[0] % 2:
            raise ValueError(f"mlp_layers must start with an even width, got {mlp_layers}")
        self.user_embedding = nn.Embedding(users, factors)
        self.item_embedding = nn.Embedding(items, factors)
        self.mlp_user_embedding = nn.Embedding(users, mlp_layers[0] // 2)
        self.mlp_item_embedding = nn.Embedding(items, mlp_layers[0] // 2)
        layers: list[nn.Module] = []
        for a, b in zip(mlp_layers, mlp_layers[1:]):
            layers += [nn.Linear(a, b), nn.ReLU()]
        self.mlp = nn.Sequential(*layers)
        self.predict = nn.Linear(factors + mlp_layers[-1], 1)
        for emb in (self.user_embedding, self.item_embedding,
                    self.mlp_user_embedding, self.mlp_item_embedding):
            nn.init.normal_(emb.weight, std=0.01)

    def forward(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        gmf = self.user_embedding(users) * self.item_embedding(items)
        mlp = self.mlp(torch.cat([self.mlp_user_embedding(users), self.mlp_item_embedding(items)], dim=-1))
        return self.predict(torch.cat([gmf, mlp], dim=-1)).squeeze(-1)


def build(
    users: int = 1_000_000,
    items: int = 100_000,
    factors: int = 64,
    mlp_layers: Sequence[int] = (256, 128, 64),
) -> NCF:
    return NCF(users, items, factors, mlp_layers)


def example_inputs(
    batch: int = 256, users: int = 1_000_000, items: int = 100_000
) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.randint(0, users, (batch,), dtype=torch.int64),
        torch.randint(0, items, (batch,), dtype=torch.int64),
    )


def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy with logits against 0/1 interaction labels ``[batch]``."""
    return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))
