"""GPT-2 (Radford et al. 2019) with Hugging Face's module names and parameter layouts.

Modules: ``wte`` (token Embedding ``[vocab, hidden]``), ``wpe`` (position Embedding
``[seq, hidden]``), ``drop``, ``h`` (ModuleList of blocks), ``ln_f``, ``lm_head``. Each block
``h[i]`` has ``ln_1``, ``attn`` (``c_attn``, ``c_proj``, ``resid_dropout``), ``ln_2`` and ``mlp``
(``c_fc``, ``act``, ``c_proj``, ``dropout``). ``c_attn``, ``c_proj`` and ``c_fc`` are
:class:`Conv1D` modules: like HF's they store ``weight`` as ``[in, out]`` (the transpose of
``nn.Linear``) and ``bias`` as ``[out]``.

``lm_head`` (``nn.Linear(hidden, vocab, bias=False)``, weight ``[vocab, hidden]``) is *untied* from
``wte`` by default, so the two can sit in different pipeline stages; ``tie_embeddings=True`` ties
them as HF does (one parameter, listed once as ``wte.weight``).

Input ``idx``: int64 ``[batch, seq]`` with ``seq <= build(seq=...)``; output logits
``[batch, seq, vocab]``. Attention is causal, through
``torch.nn.functional.scaled_dot_product_attention(is_causal=True)`` (``attention="fused"``), or
with its scores materialized (``attention="unfused"``) as Megatron-LM ran it in 2021 (Narayanan et al.
2021, §4.2): ``QK^T`` of the pre-scaled queries, the causal mask, a softmax, dropout on the
probabilities and a matmul with ``V`` — the ``b·a·s²`` scores written and read by each step (Megatron's
fused scale-mask-softmax kernel does the mask and the softmax in one pass; here they are two). There is
no padding mask and no KV cache. The forward is ``torch.fx.symbolic_trace``-able.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class Conv1D(nn.Module):
    """HF's GPT-2 ``Conv1D``: a linear layer whose ``weight`` is ``[nx, nf]`` (in, out).

    The argument order is HF's: ``Conv1D(nf, nx)`` maps ``nx`` input features to ``nf`` outputs.
    """

    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.nf = nf
        self.nx = nx
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(x, self.weight) + self.bias

    def extra_repr(self) -> str:
        return f"nf={self.nf}, nx={self.nx}"


ATTENTION = ("fused", "unfused")


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, dropout: float, attention: str = "fused", seq: int = 0) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads})")
        if attention not in ATTENTION:
            raise ValueError(f"attention is one of {ATTENTION}, not {attention!r}")
        self.hidden = hidden
        self.heads = heads
        self.head_dim = hidden // heads
        self.dropout = dropout
        self.c_attn = Conv1D(3 * hidden, hidden)
        self.c_proj = Conv1D(hidden, hidden)
        self.resid_dropout = nn.Dropout(dropout)
        self.unfused = attention == "unfused"
        if self.unfused:
            self.attn_dropout = nn.Dropout(dropout)
            # the causal mask as a bias (-inf above the diagonal): an add, which tensor parallelism splits
            # over the heads like the scores
            self.register_buffer("causal", torch.full((seq, seq), float("-inf")).triu(1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s = x.size(0), x.size(1)
        # shapes follow the weights (-1 heads, chunk in three): a tensor-parallel shard of c_attn, which
        # holds a slice of the heads, runs the same code
        qkv = self.c_attn(x).chunk(3, dim=2)
        q = qkv[0].view(b, s, -1, self.head_dim).transpose(1, 2)
        k = qkv[1].view(b, s, -1, self.head_dim).transpose(1, 2)
        v = qkv[2].view(b, s, -1, self.head_dim).transpose(1, 2)
        if self.unfused:
            scores = torch.matmul(q * (1.0 / math.sqrt(self.head_dim)), k.transpose(-1, -2))
            scores = scores + torch.narrow(torch.narrow(self.causal, 0, 0, s), 1, 0, s).to(scores.dtype)
            y = torch.matmul(self.attn_dropout(torch.softmax(scores, dim=-1)), v)
        else:
            y = F.scaled_dot_product_attention(
                q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
            )
        y = y.transpose(1, 2).reshape(b, s, -1)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, hidden: int, dropout: float) -> None:
        super().__init__()
        self.c_fc = Conv1D(4 * hidden, hidden)
        self.act = nn.GELU(approximate="tanh")
        self.c_proj = Conv1D(hidden, 4 * hidden)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, dropout: float, attention: str = "fused", seq: int = 0) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden, eps=1e-5)
        self.attn = Attention(hidden, heads, dropout, attention, seq)
        self.ln_2 = nn.LayerNorm(hidden, eps=1e-5)
        self.mlp = MLP(hidden, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    def __init__(
        self,
        layers: int,
        hidden: int,
        heads: int,
        vocab: int,
        seq: int,
        dropout: float = 0.0,
        tie_embeddings: bool = False,
        attention: str = "fused",
    ) -> None:
        super().__init__()
        self.layers, self.hidden, self.heads, self.vocab, self.seq = layers, hidden, heads, vocab, seq
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(seq, hidden)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(Block(hidden, heads, dropout, attention, seq) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden, eps=1e-5)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        self._init_weights()
        if tie_embeddings:
            self.lm_head.weight = self.wte.weight

    def _init_weights(self) -> None:
        # GPT-2's scheme: N(0, 0.02) everywhere, residual projections scaled by 1/sqrt(2 * layers).
        for m in (self.wte, self.wpe, self.lm_head):
            nn.init.normal_(m.weight, std=0.02)
        for block in self.h:
            for proj in (block.attn.c_proj, block.mlp.c_proj):
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * self.layers))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def build(
    layers: int = 12,
    hidden: int = 768,
    heads: int = 12,
    vocab: int = 50257,
    seq: int = 1024,
    dropout: float = 0.0,
    tie_embeddings: bool = False,
    attention: str = "fused",
) -> GPT2:
    return GPT2(layers, hidden, heads, vocab, seq, dropout=dropout, tie_embeddings=tie_embeddings,
                attention=attention)


def example_inputs(batch: int = 2, seq: int = 1024, vocab: int = 50257) -> tuple[torch.Tensor]:
    return (torch.randint(0, vocab, (batch, seq), dtype=torch.int64),)


def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy, HF-style: ``labels`` is usually ``idx`` itself; position ``t``
    of ``logits`` is scored against ``labels[:, t + 1]``; label ``-100`` is ignored."""
    shifted = logits[:, :-1, :]
    return F.cross_entropy(
        shifted.reshape(-1, shifted.size(-1)), labels[:, 1:].reshape(-1), ignore_index=-100
    )
