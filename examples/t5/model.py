"""A T5-style encoder-decoder (Raffel et al. 2020) with Hugging Face ``T5ForConditionalGeneration``
module names and **tied embeddings**.

Modules:

- ``shared``: the token Embedding ``[vocab, d_model]``. ``encoder.embed_tokens`` and
  ``decoder.embed_tokens`` are the same module object, and ``lm_head`` (``nn.Linear(d_model,
  vocab, bias=False)``) uses ``shared.weight`` as its weight: one parameter, listed once by
  ``named_parameters()`` as ``shared.weight``. As in T5, the decoder output is scaled by
  ``d_model ** -0.5`` before the tied head.
- ``encoder.block[i].layer[0]``: ``SelfAttention.{q,k,v,o}`` (Linear, no bias), ``layer_norm``,
  ``dropout``; ``encoder.block[i].layer[1]``: ``DenseReluDense.{wi,wo}`` (Linear, no bias, ReLU,
  ``dropout``), ``layer_norm``, ``dropout``;
- ``decoder.block[i].layer[0]``: causal ``SelfAttention``; ``layer[1]``: cross-attention
  ``EncDecAttention.{q,k,v,o}`` over the encoder output; ``layer[2]``: ``DenseReluDense``;
- ``encoder.final_layer_norm``, ``decoder.final_layer_norm``; all norms are ``torch.nn.RMSNorm``
  (T5's scale-only LayerNorm, eps 1e-6), applied pre-sublayer.

Simplification: T5's relative position bias is **omitted** — there is no positional information
at all besides the causal mask of the decoder self-attention (the parameter count is therefore
that of HF T5 minus the two ``relative_attention_bias`` tables, 2 * 32 * heads). Attention scores
are not scaled by ``1/sqrt(d_kv)`` (T5 folds that into its initialisation). No padding masks.

Inputs: ``input_ids`` int64 ``[batch, src_len]``, ``decoder_input_ids`` int64
``[batch, tgt_len]``; output logits ``[batch, tgt_len, vocab]``. ``torch.fx.symbolic_trace``-able.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class T5Attention(nn.Module):
    def __init__(self, d_model: int, heads: int, d_kv: int, dropout: float, causal: bool) -> None:
        super().__init__()
        self.heads, self.d_kv, self.inner = heads, d_kv, heads * d_kv
        self.dropout = dropout
        self.causal = causal
        self.q = nn.Linear(d_model, self.inner, bias=False)
        self.k = nn.Linear(d_model, self.inner, bias=False)
        self.v = nn.Linear(d_model, self.inner, bias=False)
        self.o = nn.Linear(self.inner, d_model, bias=False)

    def forward(self, x: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        b, s, t = x.size(0), x.size(1), kv.size(1)
        q = self.q(x).view(b, s, -1, self.d_kv).transpose(1, 2)
        k = self.k(kv).view(b, t, -1, self.d_kv).transpose(1, 2)
        v = self.v(kv).view(b, t, -1, self.d_kv).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=self.causal,
            scale=1.0,
        )
        return self.o(y.transpose(1, 2).reshape(b, s, -1))  # -1: a tensor-parallel shard has fewer heads


class T5LayerSelfAttention(nn.Module):
    def __init__(self, d_model: int, heads: int, d_kv: int, dropout: float, causal: bool) -> None:
        super().__init__()
        self.SelfAttention = T5Attention(d_model, heads, d_kv, dropout, causal)
        self.layer_norm = nn.RMSNorm(d_model, eps=1e-6)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.layer_norm(x)
        return x + self.dropout(self.SelfAttention(h, h))


class T5LayerCrossAttention(nn.Module):
    def __init__(self, d_model: int, heads: int, d_kv: int, dropout: float) -> None:
        super().__init__()
        self.EncDecAttention = T5Attention(d_model, heads, d_kv, dropout, causal=False)
        self.layer_norm = nn.RMSNorm(d_model, eps=1e-6)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, encoder_hidden_states: torch.Tensor) -> torch.Tensor:
        return x + self.dropout(self.EncDecAttention(self.layer_norm(x), encoder_hidden_states))


class T5DenseReluDense(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.wi = nn.Linear(d_model, d_ff, bias=False)
        self.act = nn.ReLU()
        self.dropout = nn.Dropout(dropout)
        self.wo = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wo(self.dropout(self.act(self.wi(x))))


class T5LayerFF(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.DenseReluDense = T5DenseReluDense(d_model, d_ff, dropout)
        self.layer_norm = nn.RMSNorm(d_model, eps=1e-6)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.dropout(self.DenseReluDense(self.layer_norm(x)))


class T5EncoderBlock(nn.Module):
    def __init__(self, d_model: int, heads: int, d_kv: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.layer = nn.ModuleList([
            T5LayerSelfAttention(d_model, heads, d_kv, dropout, causal=False),
            T5LayerFF(d_model, d_ff, dropout),
        ])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer[1](self.layer[0](x))


class T5DecoderBlock(nn.Module):
    def __init__(self, d_model: int, heads: int, d_kv: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.layer = nn.ModuleList([
            T5LayerSelfAttention(d_model, heads, d_kv, dropout, causal=True),
            T5LayerCrossAttention(d_model, heads, d_kv, dropout),
            T5LayerFF(d_model, d_ff, dropout),
        ])

    def forward(self, x: torch.Tensor, encoder_hidden_states: torch.Tensor) -> torch.Tensor:
        x = self.layer[0](x)
        x = self.layer[1](x, encoder_hidden_states)
        return self.layer[2](x)


class T5Encoder(nn.Module):
    def __init__(self, embed_tokens: nn.Embedding, layers: int, d_model: int, heads: int,
                 d_kv: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.embed_tokens = embed_tokens
        self.block = nn.ModuleList(
            T5EncoderBlock(d_model, heads, d_kv, d_ff, dropout) for _ in range(layers)
        )
        self.final_layer_norm = nn.RMSNorm(d_model, eps=1e-6)
        self.dropout = nn.Dropout(dropout)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.dropout(self.embed_tokens(input_ids))
        for block in self.block:
            x = block(x)
        return self.dropout(self.final_layer_norm(x))


class T5Decoder(nn.Module):
    def __init__(self, embed_tokens: nn.Embedding, layers: int, d_model: int, heads: int,
                 d_kv: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.embed_tokens = embed_tokens
        self.block = nn.ModuleList(
            T5DecoderBlock(d_model, heads, d_kv, d_ff, dropout) for _ in range(layers)
        )
        self.final_layer_norm = nn.RMSNorm(d_model, eps=1e-6)
        self.dropout = nn.Dropout(dropout)

    def forward(self, input_ids: torch.Tensor, encoder_hidden_states: torch.Tensor) -> torch.Tensor:
        x = self.dropout(self.embed_tokens(input_ids))
        for block in self.block:
            x = block(x, encoder_hidden_states)
        return self.dropout(self.final_layer_norm(x))


class T5(nn.Module):
    def __init__(self, layers: int, d_model: int, heads: int, d_ff: int, vocab: int,
                 d_kv: int | None = None, dropout: float = 0.0) -> None:
        super().__init__()
        if d_kv is None:
            if d_model % heads:
                raise ValueError(f"d_model ({d_model}) must be a multiple of heads ({heads})")
            d_kv = d_model // heads
        self.d_model = d_model
        self.shared = nn.Embedding(vocab, d_model)
        self.encoder = T5Encoder(self.shared, layers, d_model, heads, d_kv, d_ff, dropout)
        self.decoder = T5Decoder(self.shared, layers, d_model, heads, d_kv, d_ff, dropout)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)
        self.lm_head.weight = self.shared.weight  # tied
        nn.init.normal_(self.shared.weight, std=1.0)

    def forward(self, input_ids: torch.Tensor, decoder_input_ids: torch.Tensor) -> torch.Tensor:
        enc = self.encoder(input_ids)
        dec = self.decoder(decoder_input_ids, enc)
        return self.lm_head(dec * (self.d_model ** -0.5))


def build(
    layers: int = 6,
    d_model: int = 512,
    heads: int = 8,
    d_ff: int = 2048,
    vocab: int = 32128,
    d_kv: int | None = None,
    dropout: float = 0.0,
) -> T5:
    return T5(layers, d_model, heads, d_ff, vocab, d_kv=d_kv, dropout=dropout)


def example_inputs(
    batch: int = 2, src_len: int = 512, tgt_len: int = 128, vocab: int = 32128
) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.randint(0, vocab, (batch, src_len), dtype=torch.int64),
        torch.randint(0, vocab, (batch, tgt_len), dtype=torch.int64),
    )


def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the logits against ``labels`` ``[batch, tgt_len]`` (no shift:
    ``decoder_input_ids`` are the labels shifted right); label ``-100`` is ignored."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=-100)
