"""Model factories for bench/plan_quality.py that the bundled examples do not provide.

`encoder_layers` is the model of min-memory-redundancy-ilp §4.2 (Table 1): a stack of Transformer encoder
layers (one, in the paper) without embeddings or a head, so the layer's own memory is what is measured.
It reuses examples/bert's `BertLayer`, so its module names are Hugging Face's and stdlib's
`megatron.bert_layer` template applies to each `layer[i]`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from examples.bert.model import BertLayer


class EncoderLayers(nn.Module):
    """`layers` BERT encoder layers on float hidden states `[batch, seq, hidden]`."""

    def __init__(self, layers: int, hidden: int, heads: int, intermediate: int) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(hidden, heads, intermediate, 0.0) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layer:
            x = layer(x)
        return x


def encoder_layers(layers: int = 1, hidden: int = 1024, heads: int = 16, intermediate: int | None = None) -> EncoderLayers:
    """BERT-style encoder layers; `intermediate` defaults to 4 * hidden (BERT, Megatron-LM)."""
    return EncoderLayers(layers, hidden, heads, intermediate or 4 * hidden)


def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error against a float target of the output's shape (the layer has no head)."""
    return F.mse_loss(output, target)
