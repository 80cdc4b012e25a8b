"""A tiny model package for the model-layer tests (importable as tests.model.tinynet)."""
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.ln = nn.LayerNorm(hidden)
        self.fc = nn.Linear(hidden, 4 * hidden)
        self.act = nn.GELU()
        self.proj = nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        return x + self.proj(self.act(self.fc(self.ln(x))))


class TinyNet(nn.Module):
    def __init__(self, vocab: int = 96, hidden: int = 32, layers: int = 4, tie: bool = False):
        super().__init__()
        self.emb = nn.Embedding(vocab, hidden)
        self.h = nn.ModuleList([Block(hidden) for _ in range(layers)])
        self.head = nn.Linear(hidden, vocab, bias=False)
        if tie:
            self.head.weight = self.emb.weight

    def forward(self, idx):
        x = self.emb(idx)
        for b in self.h:
            x = b(x)
        return self.head(x)


def build(**kw):
    return TinyNet(**kw)


def broken(**kw):
    raise RuntimeError("boom")
