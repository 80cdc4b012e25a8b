"""Constants too large to compute while the op graph is built (planlang.model.capture.lazy_consts): what is
known of a deferred mask tells torch's causal mask from any other exactly as its computed values do, a
deferred constant computes what the folded one did, and a 64k-token causal mask costs no memory."""
from __future__ import annotations

import math
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from planlang.model.capture import lazy_consts
from planlang.model.capture.aten_readers import causal_mask, keeps_all
from planlang.model.capture.export_builder import AtenCall, aten_name
from planlang.model.capture.export_graph import export_op_graph
from planlang.model.capture.lazy_consts import Deferred, fold_call

from .test_export_graph import rel, run_graph

aten = torch.ops.aten
S = 12


def call(target, *args, **kwargs):
    """`target` folded as the graph builder folds it (every result deferred: SMALL is 0)."""
    folded, out = fold_call(target, AtenCall(aten_name(target)), list(args), kwargs)
    assert folded
    return out


def _positions(n: int):
    return call(aten.unsqueeze.default, call(aten.arange.default, n), 0), \
        call(aten.unsqueeze.default, call(aten.arange.default, n), 1)


def masks():
    """Masks built the ways models build them, each (name, deferred mask)."""
    kv, q = _positions(S)  # kv: [1, S] (dim -1 is the key), q: [S, 1]
    out = {"causal": call(aten.le.Tensor, kv, q), "anti": call(aten.ge.Tensor, kv, q),
           "strict": call(aten.lt.Tensor, kv, q), "lt+1": call(aten.lt.Tensor, kv, call(aten.add.Tensor, q, 1))}
    window = call(aten.gt.Tensor, kv, call(aten.sub.Tensor, q, 4))
    out["window"] = call(aten.__and__.Tensor, out["causal"], window)
    out["and-true"] = call(aten.__and__.Tensor, call(aten.new_ones.default, torch.zeros(1), [], dtype=torch.bool),
                           out["causal"])
    out["batched"] = call(aten.expand.default, call(aten.unsqueeze.default, out["causal"], 0), [3, S, S])
    full = call(aten.full.default, [S, S], -math.inf)
    out["additive"] = call(aten.where.self, out["causal"], call(aten.zeros.default, [S, S]), full)
    out["additive-flipped"] = call(aten.masked_fill.Scalar, call(aten.zeros.default, [S, S]),
                                   call(aten.logical_not.default, out["causal"]), -math.inf)
    out["triu"] = call(aten.triu.default, full, 1)  # -inf above the diagonal, 0 on and below it
    out["triu2"] = call(aten.triu.default, full, 2)
    out["ones"] = call(aten.ones.default, [S, S], dtype=torch.bool)
    return out


@pytest.fixture
def small(monkeypatch):
    """How large a constant may be computed while the graph is built, set low for a test."""
    return lambda n: monkeypatch.setattr(lazy_consts, "SMALL", n)


@pytest.mark.parametrize("name", ["causal", "anti", "strict", "lt+1", "window", "and-true", "batched", "additive",
                                  "additive-flipped", "triu", "triu2", "ones"])
def test_deferred_mask_is_read_as_its_values_are(name, small):
    small(0)
    mask = masks()[name]
    assert isinstance(mask, Deferred) and mask.sym is not None, name
    dense = mask.materialize()
    assert dense.shape == mask.shape and dense.dtype == mask.dtype
    assert causal_mask(mask, S, S) == causal_mask(dense, S, S)
    assert keeps_all(mask) == keeps_all(dense)


def test_which_masks_are_causal(small):
    small(0)
    got = {n for n, m in masks().items() if causal_mask(m, S, S)}
    assert got == {"causal", "lt+1", "and-true", "batched", "additive", "additive-flipped", "triu"}
    assert {n for n, m in masks().items() if keeps_all(m)} == {"ones"}


def test_deferred_pickles_and_stays_meta_on_meta(small):
    small(0)
    mask = pickle.loads(pickle.dumps(masks()["window"]))
    assert mask.to("meta").is_meta and mask.to("meta").shape == (S, S)
    kv, q = torch.arange(S)[None], torch.arange(S)[:, None]
    assert torch.equal(mask.to("cpu"), (kv <= q) & (kv > q - 4))


class Banded(nn.Module):
    """Attention under a sliding-window mask built from positions: not torch's causal mask, so the SDPA
    stays an opaque call with the (deferred) mask as a constant input."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 24)
        self.out = nn.Linear(8, 8)

    def forward(self, x):
        q, k, v = self.qkv(x).unflatten(-1, (3, 2, 4)).permute(2, 0, 3, 1, 4)
        pos = torch.arange(x.shape[1], device=x.device)
        mask = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - 3)
        h = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(h.transpose(1, 2).flatten(2)).sum()


def test_a_deferred_mask_computes_the_model(small):
    small(0)
    torch.manual_seed(0)
    model = Banded()
    x = torch.randn(2, 10, 8)
    g = export_op_graph(model, {"x": x.to("meta")})
    (sdpa,) = [n for n in g.nodes if n.op.kind == "opaque" and n.op.attr("target") == "scaled_dot_product_attention"]
    assert any(isinstance(g.consts.get(i), Deferred) for i in sdpa.inputs)
    for k in list(g.consts):
        g.consts[k] = g.consts[k].to("cpu")
    assert rel(run_graph(g, dict(model.named_parameters()), {"x": x}).detach(), model(x).detach()) <= 1e-6


def test_hf_llama_causal_mask_deferred_is_causal_attention(small):
    """Positions (2 x 16) computed, the mask over 2 x 16 x 16 deferred: still torch's causal mask."""
    small(40)
    pytest.importorskip("transformers", reason="the optional `transformers` package is not installed")
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, use_cache=False)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    ids = torch.zeros(2, 16, dtype=torch.int64, device="meta")
    g = export_op_graph(model, {"input_ids": ids})
    (attn,) = [n for n in g.nodes if n.op.kind == "scaled_dot_product_attention"]
    assert attn.op.attr("is_causal") is True


LONG_MODEL = """
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM


def build():
    return LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, vocab_size=64,
                                        max_position_embeddings=65536, use_cache=False))


def loss(output, input_ids):
    return F.cross_entropy(output.logits[:, :-1].flatten(0, 1), input_ids[:, 1:].flatten())
"""
LONG_PLAN = """
use hardware
model llama = "long_llama:build"()
input input_ids : i64[batch = 2, seq = 65536]
mesh cluster of 2 x hardware.cpu {
    dp = 2 over hardware.loopback
}
budget 20 GiB per device
optimizer adamw(lr = 1e-4)
data input_ids : [dp, _]
"""
# the peak RSS of the command, run by a fresh child (RUSAGE_CHILDREN holds the largest child it waited for)
MEASURE = """
import resource, subprocess, sys
done = subprocess.run([sys.executable, "-m", "planlang.cli", "check", "--model", sys.argv[1]],
                      capture_output=True, text=True)
print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, done.stdout + done.stderr)
"""


def test_a_64k_token_causal_mask_costs_no_memory(tmp_path):
    """The causal mask over 2 x 65536 x 65536 positions would be 8 GiB computed; `check --model` of the
    model stays under 1 GiB (torch and transformers imported: about 0.4)."""
    pytest.importorskip("transformers", reason="the optional `transformers` package is not installed")
    (tmp_path / "long_llama.py").write_text(textwrap.dedent(LONG_MODEL))
    (tmp_path / "long.plan").write_text(textwrap.dedent(LONG_PLAN))
    out = subprocess.run([sys.executable, "-c", MEASURE, str(tmp_path / "long.plan")], capture_output=True,
                         text=True, cwd=tmp_path, check=True).stdout
    code, peak_kb, text = out.split(" ", 2)
    assert code == "0", text
    assert int(peak_kb) < 1 << 20, f"peak RSS {int(peak_kb) >> 10} MiB"
