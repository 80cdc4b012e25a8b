"""Symbolic profiler: flops equal closed forms; saved activations are what autograd keeps; inspect snapshot."""
import os
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from planlang.model.inspect import inspect_model, parse_input, render_text
from planlang.model.capture.profile import profile_model
from planlang.plan.types import ModelRef

GOLDEN = Path(__file__).parent / "golden"


def meta(*shape, dtype=torch.float32, grad=False):
    return torch.zeros(*shape, dtype=dtype, device="meta", requires_grad=grad)


def test_linear_flops_closed_form():
    b, k, n = 8, 64, 32
    with torch.device("meta"):
        m = nn.Sequential(nn.Linear(k, n))
    p = profile_model(m, {"x": meta(b, k, grad=True)})
    assert p.modules["0"].fwd_flops == 2 * b * k * n
    assert p.modules["0"].bwd_flops == 2 * (2 * b * k * n)  # grad input + grad weight


class MatMul(nn.Module):
    def forward(self, a, b):
        return a @ b


def test_matmul_flops_closed_form():
    p = profile_model(MatMul(), {"a": meta(5, 7, 11, grad=True), "b": meta(5, 11, 13, grad=True)})
    assert p.total_fwd_flops == 2 * 5 * 7 * 11 * 13
    assert p.total_bwd_flops == 2 * 2 * 5 * 7 * 11 * 13


class Attn(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


def test_attention_flops_closed_form():
    b, h, s, d = 2, 4, 16, 8
    p = profile_model(Attn(), {"q": meta(b, h, s, d, grad=True), "k": meta(b, h, s, d, grad=True),
                               "v": meta(b, h, s, d, grad=True)})
    # forward: QK^T and PV, two batched matmuls of 2*b*h*s*s*d each
    assert p.total_fwd_flops == 2 * (2 * b * h * s * s * d)
    # fused backward (what devices run): recompute QK^T, then dV, dP, dQ, dK — five such matmuls
    assert p.total_bwd_flops == 5 * (2 * b * h * s * s * d)


def test_saved_activations_are_deduplicated_and_exclude_parameters():
    with torch.device("meta"):
        m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    p = profile_model(m, {"x": meta(8, 16)})
    # Linear 0 saves its input x (8x16 f32); ReLU saves its output (8x32); Linear 2 saves its input —
    # the same tensor as ReLU's output, so it is not counted again. Weights are not activations.
    assert p.total_saved_bytes == 8 * 16 * 4 + 8 * 32 * 4
    assert p.param_bytes == (16 * 32 + 32 + 32 * 4 + 4) * 4


def test_inspect_snapshot():
    info = inspect_model(ModelRef("n", "tests.model.tinynet:build", (("hidden", 64), ("layers", 2))),
                         (parse_input("idx:i64[batch=4,seq=8]"),))
    text = render_text(info)
    golden = GOLDEN / "inspect_tinynet.txt"
    if os.environ.get("PLANLANG_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text()


class NormAct(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(64)
        self.fc = nn.Linear(64, 256)
        self.act = nn.GELU()

    def forward(self, x):
        return self.act(self.fc(self.ln(x)).view(8, 16, 16, 16).transpose(1, 2))


def test_memory_bound_ops_count_the_bytes_they_read_and_write_and_views_count_none():
    with torch.device("meta"):
        m = NormAct()
    p = profile_model(m, {"x": meta(8, 16, 64)})
    act = 8 * 16 * 256 * 4  # f32 bytes of the GELU's input (a view of fc's output) and of its output
    # layer norm: reads x, weight, bias; writes y, mean, rstd (one f32 per row each)
    assert p.modules["ln"].fwd_bytes == 2 * 8 * 16 * 64 * 4 + 2 * 64 * 4 + 2 * 8 * 16 * 4
    assert p.modules["fc"].fwd_bytes == 0  # a matmul: flops, not bytes (its bias add is addmm's)
    assert p.modules["act"].fwd_bytes == 2 * act  # the view and transpose before it moved nothing
    assert p.modules["act"].bwd_bytes == 3 * act  # gelu_backward: grad out and input read, grad in written
    assert p.total_fwd_bytes == sum(mp.fwd_bytes for mp in p.modules.values())


class Lookup(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50000, 32)

    def forward(self, idx):
        return self.emb(idx)


def test_an_embedding_moves_the_rows_it_gathers_not_its_table():
    with torch.device("meta"):
        m = Lookup()
    p = profile_model(m, {"idx": meta(4, 10, dtype=torch.int64)})
    rows = 4 * 10 * 32 * 4
    assert p.modules["emb"].fwd_bytes == 2 * rows + 4 * 10 * 8
