"""A BERT-style encoder (Devlin et al. 2019) with Hugging Face ``BertModel`` module names.

Modules:

- ``embeddings``: ``word_embeddings`` ``[vocab, hidden]``, ``position_embeddings``
  ``[seq, hidden]``, ``token_type_embeddings`` ``[2, hidden]``, ``LayerNorm``, ``dropout``;
- ``encoder.layer[i]`` (ModuleList): ``attention.self.{query,key,value}`` (nn.Linear),
  ``attention.output.{dense,LayerNorm,dropout}``, ``intermediate.dense`` +
  ``intermediate.intermediate_act_fn`` (GELU), ``output.{dense,LayerNorm,dropout}``;
- ``pooler.dense`` (+ ``pooler.activation``, Tanh) on the first token;
- ``cls``: an MLM-style head, ``nn.Linear(hidden, vocab)`` (a single Linear; HF's
  ``BertLMPredictionHead`` adds a transform layer and ties the decoder to the word embeddings,
  this one does neither).

Input ``input_ids``: int64 ``[batch, seq]`` (``seq <= build(seq=...)``). All token types are 0
(``token_type_embeddings`` row 0 is used) and there is no padding mask. ``forward`` returns the
tuple ``(mlm_logits [batch, seq, vocab], pooled [batch, hidden])``: the pooler runs in the forward
(its output is there for a classification head), but :func:`loss`, masked-LM cross-entropy, does
not use it, so ``pooler.*`` gets no gradient from it (under DDP: ``find_unused_parameters=True``,
or add a term on ``pooled``). It is ``torch.fx.symbolic_trace``-able.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class BertEmbeddings(nn.Module):
    def __init__(self, vocab: int, hidden: int, seq: int, type_vocab: int, dropout: float) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, hidden)
        self.position_embeddings = nn.Embedding(seq, hidden)
        self.token_type_embeddings = nn.Embedding(type_vocab, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=1e-12)
        self.dropout = nn.Dropout(dropout)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(input_ids.size(1), device=input_ids.device)
        types = torch.zeros_like(input_ids)
        x = (
            self.word_embeddings(input_ids)
            + self.position_embeddings(pos)
            + self.token_type_embeddings(types)
        )
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, dropout: float) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads})")
        self.hidden, self.heads, self.head_dim = hidden, heads, hidden // heads
        self.dropout = dropout
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)

    def _heads(self, t: torch.Tensor, b, s) -> torch.Tensor:
        return t.view(b, s, -1, self.head_dim).transpose(1, 2)  # -1: a tensor-parallel shard has fewer heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s = x.size(0), x.size(1)
        q = self._heads(self.query(x), b, s)
        k = self._heads(self.key(x), b, s)
        v = self._heads(self.value(x), b, s)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0)
        return y.transpose(1, 2).reshape(b, s, -1)


class BertSelfOutput(nn.Module):
    def __init__(self, hidden: int, dropout: float) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=1e-12)
        self.dropout = nn.Dropout(dropout)

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(h)) + residual)


class BertAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.self = BertSelfAttention(hidden, heads, dropout)
        self.output = BertSelfOutput(hidden, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(self.self(x), x)


class BertIntermediate(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, intermediate)
        self.intermediate_act_fn = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.intermediate_act_fn(self.dense(x))


class BertOutput(nn.Module):
    def __init__(self, hidden: int, intermediate: int, dropout: float) -> None:
        super().__init__()
        self.dense = nn.Linear(intermediate, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=1e-12)
        self.dropout = nn.Dropout(dropout)

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(h)) + residual)


class BertLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, intermediate: int, dropout: float) -> None:
        super().__init__()
        self.attention = BertAttention(hidden, heads, dropout)
        self.intermediate = BertIntermediate(hidden, intermediate)
        self.output = BertOutput(hidden, intermediate, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.attention(x)
        return self.output(self.intermediate(a), a)


class BertEncoder(nn.Module):
    def __init__(self, layers: int, hidden: int, heads: int, intermediate: int, dropout: float) -> None:
        super().__init__()
        self.layer = nn.ModuleList(
            BertLayer(hidden, heads, intermediate, dropout) for _ in range(layers)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layer:
            x = layer(x)
        return x


class BertPooler(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.activation = nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(x[:, 0]))


class Bert(nn.Module):
    def __init__(
        self,
        layers: int,
        hidden: int,
        heads: int,
        intermediate: int,
        vocab: int,
        seq: int,
        type_vocab: int = 2,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.embeddings = BertEmbeddings(vocab, hidden, seq, type_vocab, dropout)
        self.encoder = BertEncoder(layers, hidden, heads, intermediate, dropout)
        self.pooler = BertPooler(hidden)
        self.cls = nn.Linear(hidden, vocab)

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.encoder(self.embeddings(input_ids))
        return self.cls(h), self.pooler(h)


def build(
    layers: int = 12,
    hidden: int = 768,
    heads: int = 12,
    intermediate: int = 3072,
    vocab: int = 30522,
    seq: int = 512,
    type_vocab: int = 2,
    dropout: float = 0.0,
) -> Bert:
    return Bert(layers, hidden, heads, intermediate, vocab, seq, type_vocab=type_vocab, dropout=dropout)


def example_inputs(batch: int = 2, seq: int = 512, vocab: int = 30522) -> tuple[torch.Tensor]:
    return (torch.randint(0, vocab, (batch, seq), dtype=torch.int64),)


def loss(output: tuple[torch.Tensor, torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
    """Masked-LM cross-entropy of the ``cls`` logits (``output[0]``) against ``labels``
    ``[batch, seq]``; positions labelled ``-100`` (the unmasked ones) are ignored."""
    logits = output[0]
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=-100)
