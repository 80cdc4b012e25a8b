"""A Mixture-of-Experts transformer FFN block with top-k gating and *dense* dispatch.

Modules: ``ln`` (LayerNorm), ``router`` (``nn.Linear(hidden, experts, bias=False)``), ``experts``
(ModuleList of MLPs, each ``fc1`` Linear hidden->ffn, ``act`` GELU, ``fc2`` Linear ffn->hidden).

``y = x + sum_e gate[..., e] * experts[e](ln(x))``: the router scores every token, ``torch.topk``
keeps the ``top_k`` best experts, their scores are softmax-normalised and scattered into a dense
``[batch, seq, experts]`` gate matrix (zero for the experts not chosen). Every expert runs on every
token (dense dispatch: ``experts / top_k`` times the FLOPs of a sparse dispatch) so that the
forward has no data-dependent control flow and traces with ``torch.fx.symbolic_trace``; an
expert-parallel plan replaces this by an all-to-all dispatch.

Input ``x``: float32 ``[batch, seq, hidden]``; output of the same shape.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ExpertMLP(nn.Module):
    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class MoEBlock(nn.Module):
    def __init__(self, hidden: int, experts: int, ffn: int, top_k: int) -> None:
        super().__init__()
        if not 1 <= top_k <= experts:
            raise ValueError(f"top_k ({top_k}) must be between 1 and experts ({experts})")
        self.hidden, self.num_experts, self.ffn, self.top_k = hidden, experts, ffn, top_k
        self.ln = nn.LayerNorm(hidden)
        self.router = nn.Linear(hidden, experts, bias=False)
        self.experts = nn.ModuleList(ExpertMLP(hidden, ffn) for _ in range(experts))

    def gates(self, h: torch.Tensor) -> torch.Tensor:
        """Dense ``[..., experts]`` gate weights: softmax over the top-k router scores, 0 elsewhere."""
        logits = self.router(h)
        top = torch.topk(logits, self.top_k, dim=-1)
        weights = F.softmax(top[0], dim=-1)
        return torch.zeros_like(logits).scatter(-1, top[1], weights)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln(x)
        gates = self.gates(h)                                             # [b, s, E]
        outs = torch.stack([expert(h) for expert in self.experts], dim=-2)  # [b, s, E, hidden]
        return x + (gates.unsqueeze(-1) * outs).sum(dim=-2)


def build(hidden: int = 512, experts: int = 8, ffn: int = 2048, top_k: int = 2) -> MoEBlock:
    return MoEBlock(hidden, experts, ffn, top_k)


def example_inputs(batch: int = 2, seq: int = 128, hidden: int = 512) -> tuple[torch.Tensor]:
    return (torch.randn(batch, seq, hidden),)


def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error against a float target of the output's shape."""
    return F.mse_loss(output, target)
