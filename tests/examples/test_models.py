"""The bundled example models (examples/<name>/model.py): build on CPU and on the meta device,
output shapes, parameter counts of the default configs against closed forms, module names, and
torch.fx.symbolic_trace equivalence on small configs."""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
import torch.fx

# `examples` is a top-level package of the repository, not installed with planlang. This folder
# has no __init__.py on purpose: as a package under the rootless `tests/` it would be imported as
# `examples` and shadow the real one (for planlang's model loader too).
ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# --------------------------------------------------------------------------------------------
# closed-form parameter counts of the default configs


def mlp_params(i=1024, h=4096, o=1024):
    return (i * h + h) + (h * o + o)


def gpt2_params(L=12, h=768, V=50257, S=1024, tied=False):
    block = 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + 2 * h + (h * 4 * h + 4 * h) + (4 * h * h + h)
    assert block == 12 * h * h + 13 * h
    head = 0 if tied else V * h
    return V * h + S * h + L * block + 2 * h + head


def bert_params(L=12, h=768, I=3072, V=30522, S=512, types=2):
    embeddings = V * h + S * h + types * h + 2 * h
    layer = 4 * (h * h + h) + 2 * h + (h * I + I) + (I * h + h) + 2 * h
    pooler = h * h + h
    cls = h * V + V
    return embeddings + L * layer + pooler + cls


def t5_params(L=6, d=512, ff=2048, V=32128):
    # d_kv * heads == d_model; no biases; RMSNorm has a weight only; lm_head tied to shared
    enc_block = 4 * d * d + 2 * d * ff + 2 * d
    dec_block = 8 * d * d + 2 * d * ff + 3 * d
    return V * d + L * enc_block + L * dec_block + 2 * d


def resnet_params(blocks=(2, 2, 2, 2), w=64, C=1000):
    total = 3 * w * 7 * 7 + 2 * w  # conv1, bn1
    inp = w
    for i, n in enumerate(blocks):
        p = w * 2**i
        total += inp * p * 9 + 2 * p + p * p * 9 + 2 * p  # first block
        if i > 0 or inp != p:
            total += inp * p + 2 * p  # downsample conv 1x1 + bn
        total += (n - 1) * (2 * (p * p * 9) + 4 * p)
        inp = p
    return total + inp * C + C


def moe_params(h=512, E=8, f=2048):
    return 2 * h + h * E + E * ((h * f + f) + (f * h + h))


def ncf_params(U=1_000_000, I=100_000, k=64, mlp=(256, 128, 64)):
    emb = (U + I) * k + (U + I) * (mlp[0] // 2)
    layers = sum(a * b + b for a, b in zip(mlp, mlp[1:]))
    return emb + layers + (k + mlp[-1]) + 1


def test_closed_forms_match_published_counts():
    assert gpt2_params(tied=True) == 124_439_808  # HF gpt2
    assert gpt2_params() == 124_439_808 + 38_597_376 == 163_037_184
    assert bert_params() - (30522 * 768 + 30522) == 109_482_240  # HF bert-base-uncased BertModel
    assert t5_params() + 2 * 32 * 8 == 60_506_624  # HF t5-small, less 2 relative-bias tables
    assert resnet_params() == 11_689_512  # torchvision resnet18


# --------------------------------------------------------------------------------------------
# the models


@dataclass
class Spec:
    name: str
    small: dict[str, Any]
    inputs: dict[str, Any]
    out_shape: tuple[int, ...]
    default_params: int
    closed_form: int
    outputs: Callable[[Any], tuple[torch.Tensor, ...]] = field(default=lambda o: (o,))
    targets: Callable[[Any], tuple] = field(default=lambda o, x: (torch.randn_like(o),))
    # parameters (by name prefix) that the loss helper does not reach
    outside_loss: tuple[str, ...] = ()


SPECS = [
    Spec("mlp", dict(in_features=16, hidden=32, out_features=8), dict(batch=4, in_features=16),
         (4, 8), 8_393_728, mlp_params()),
    Spec("gpt2", dict(layers=2, hidden=32, heads=4, vocab=97, seq=16), dict(batch=2, seq=12, vocab=97),
         (2, 12, 97), 163_037_184, gpt2_params(),
         targets=lambda o, x: (x[0],)),
    Spec("bert", dict(layers=2, hidden=32, heads=4, intermediate=64, vocab=97, seq=16),
         dict(batch=2, seq=12, vocab=97), (2, 12, 97), 132_953_658, bert_params(),
         outputs=lambda o: o,
         targets=lambda o, x: (x[0],),
         outside_loss=("pooler.",)),  # the MLM loss does not use the pooled output
    Spec("t5", dict(layers=2, d_model=32, heads=4, d_ff=64, vocab=97),
         dict(batch=2, src_len=10, tgt_len=7, vocab=97), (2, 7, 97), 60_506_112, t5_params(),
         targets=lambda o, x: (x[1],)),
    Spec("resnet", dict(blocks=(1, 1, 1, 1), width=8, num_classes=10), dict(batch=2, size=32),
         (2, 10), 11_689_512, resnet_params(),
         targets=lambda o, x: (torch.randint(0, 10, (2,)),)),
    Spec("moe", dict(hidden=16, experts=4, ffn=32, top_k=2), dict(batch=2, seq=5, hidden=16),
         (2, 5, 16), 16_802_816, moe_params()),
    Spec("ncf", dict(users=50, items=30, factors=8, mlp_layers=(16, 8, 4)),
         dict(batch=6, users=50, items=30), (6,), 211_241_281, ncf_params(),
         targets=lambda o, x: (torch.randint(0, 2, (6,)),)),
]
IDS = [s.name for s in SPECS]


def load(name: str):
    return importlib.import_module(f"examples.{name}.model")


def small_model(spec: Spec) -> tuple[torch.nn.Module, tuple]:
    mod = load(spec.name)
    torch.manual_seed(0)
    model = mod.build(**spec.small).eval()
    return model, tuple(mod.example_inputs(**spec.inputs))


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_cpu_forward_shape(spec: Spec):
    model, inputs = small_model(spec)
    with torch.no_grad():
        out = spec.outputs(model(*inputs))[0]
    assert tuple(out.shape) == spec.out_shape
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_loss_helper_backward(spec: Spec):
    mod = load(spec.name)
    model, inputs = small_model(spec)
    model.train()
    out = model(*inputs)
    loss = mod.loss(out, *spec.targets(spec.outputs(out)[0], inputs))
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    # every parameter takes part in the loss (no unused parameters for DDP), but the exceptions
    for name, p in model.named_parameters():
        assert (p.grad is None) == name.startswith(spec.outside_loss), name


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_meta_default_config(spec: Spec):
    with torch.device("meta"):
        model = load(spec.name).build()
    assert all(p.is_meta for p in model.parameters())
    assert all(b.is_meta for b in model.buffers())
    n = sum(p.numel() for p in model.parameters())
    assert n == spec.closed_form == spec.default_params


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_symbolic_trace_matches_eager(spec: Spec):
    model, inputs = small_model(spec)
    traced = torch.fx.symbolic_trace(model)
    assert isinstance(traced, torch.fx.GraphModule)
    with torch.no_grad():
        eager = spec.outputs(model(*inputs))
        got = spec.outputs(traced(*inputs))
    assert len(eager) == len(got)
    for a, b in zip(got, eager):
        torch.testing.assert_close(a, b)


# --------------------------------------------------------------------------------------------
# module names and layouts


def test_mlp_children():
    model = load("mlp").build(in_features=16, hidden=32, out_features=8)
    assert [n for n, _ in model.named_children()] == ["fc1", "act", "fc2"]
    assert isinstance(model.fc1, torch.nn.Linear) and isinstance(model.act, torch.nn.GELU)


def test_gpt2_names_and_layouts():
    gpt2 = load("gpt2")
    with torch.device("meta"):
        model = gpt2.build()
    params = dict(model.named_parameters())
    assert tuple(params["h.0.attn.c_attn.weight"].shape) == (768, 3 * 768)
    assert tuple(params["h.0.attn.c_attn.bias"].shape) == (3 * 768,)
    assert tuple(params["h.11.mlp.c_fc.weight"].shape) == (768, 4 * 768)
    assert tuple(params["h.11.mlp.c_proj.weight"].shape) == (4 * 768, 768)
    assert tuple(params["lm_head.weight"].shape) == (50257, 768)
    assert tuple(params["wpe.weight"].shape) == (1024, 768)
    assert "lm_head.bias" not in params
    assert model.lm_head.weight is not model.wte.weight
    assert isinstance(model.h[0].attn.c_attn, gpt2.Conv1D)
    assert model.h[0].mlp.act.approximate == "tanh"
    for name in ("wte", "wpe", "drop", "h", "ln_f", "lm_head", "h.3.ln_1", "h.3.attn.c_proj",
                 "h.3.ln_2", "h.3.mlp.dropout"):
        model.get_submodule(name)


def test_gpt2_tied_embeddings():
    with torch.device("meta"):
        model = load("gpt2").build(tie_embeddings=True)
    assert model.lm_head.weight is model.wte.weight
    assert sum(p.numel() for p in model.parameters()) == gpt2_params(tied=True) == 124_439_808


def test_gpt2_conv1d_is_transposed_linear():
    gpt2 = load("gpt2")
    conv = gpt2.Conv1D(6, 4)
    x = torch.randn(3, 4)
    torch.testing.assert_close(conv(x), torch.nn.functional.linear(x, conv.weight.t(), conv.bias))


def test_bert_names():
    with torch.device("meta"):
        model = load("bert").build()
    names = dict(model.named_parameters())
    for name in (
        "embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
        "embeddings.token_type_embeddings.weight", "embeddings.LayerNorm.weight",
        "encoder.layer.11.attention.self.query.weight", "encoder.layer.0.attention.self.key.bias",
        "encoder.layer.0.attention.self.value.weight", "encoder.layer.0.attention.output.dense.weight",
        "encoder.layer.0.attention.output.LayerNorm.bias", "encoder.layer.0.intermediate.dense.weight",
        "encoder.layer.0.output.dense.weight", "encoder.layer.0.output.LayerNorm.weight",
        "pooler.dense.weight", "cls.weight", "cls.bias",
    ):
        assert name in names, name
    assert tuple(names["encoder.layer.0.intermediate.dense.weight"].shape) == (3072, 768)
    assert tuple(names["cls.weight"].shape) == (30522, 768)
    assert len(model.encoder.layer) == 12


def test_t5_tied_embedding_is_one_parameter():
    with torch.device("meta"):
        model = load("t5").build()
    assert model.encoder.embed_tokens is model.shared
    assert model.decoder.embed_tokens is model.shared
    assert model.lm_head.weight is model.shared.weight
    names = [n for n, _ in model.named_parameters()]
    assert len(names) == len(set(names))
    embedding_like = [n for n in names if "embed" in n or "shared" in n or "lm_head" in n]
    assert embedding_like == ["shared.weight"]
    for name in (
        "encoder.block.0.layer.0.SelfAttention.q.weight", "encoder.block.5.layer.0.SelfAttention.o.weight",
        "encoder.block.0.layer.1.DenseReluDense.wi.weight", "encoder.block.0.layer.1.DenseReluDense.wo.weight",
        "decoder.block.0.layer.0.SelfAttention.k.weight", "decoder.block.0.layer.1.EncDecAttention.v.weight",
        "decoder.block.0.layer.2.DenseReluDense.wi.weight", "encoder.final_layer_norm.weight",
        "decoder.final_layer_norm.weight",
    ):
        assert name in names, name
    assert isinstance(model.encoder.final_layer_norm, torch.nn.RMSNorm)


def test_t5_trace_keeps_tie():
    model, inputs = small_model(SPECS[IDS.index("t5")])
    traced = torch.fx.symbolic_trace(model)
    assert traced.lm_head.weight is traced.shared.weight


def test_resnet_names():
    model = load("resnet").build(blocks=(1, 1, 1, 1), width=8, num_classes=10)
    children = [n for n, _ in model.named_children()]
    for name in ("conv1", "bn1", "relu", "layer1", "layer2", "layer3", "layer4", "avgpool", "fc"):
        assert name in children
    assert model.layer1[0].downsample is None
    assert isinstance(model.layer2[0].downsample, torch.nn.Sequential)
    for name in ("conv1", "bn1", "conv2", "bn2"):
        model.get_submodule(f"layer3.0.{name}")


def test_moe_gates_are_topk_and_normalised():
    moe = load("moe")
    torch.manual_seed(0)
    model = moe.build(hidden=16, experts=6, ffn=32, top_k=2).eval()
    (x,) = moe.example_inputs(batch=3, seq=4, hidden=16)
    gates = model.gates(model.ln(x))
    assert gates.shape == (3, 4, 6)
    assert ((gates > 0).sum(-1) == 2).all()
    torch.testing.assert_close(gates.sum(-1), torch.ones(3, 4))
    # the dense dispatch equals a per-token sparse loop over the chosen experts
    h = model.ln(x)
    ref = torch.zeros_like(x)
    for e, expert in enumerate(model.experts):
        ref += gates[..., e : e + 1] * expert(h)
    torch.testing.assert_close(model(x), x + ref)
    assert [n for n, _ in model.experts[0].named_children()] == ["fc1", "act", "fc2"]


def test_ncf_names():
    model = load("ncf").build(users=50, items=30, factors=8, mlp_layers=(16, 8, 4))
    children = [n for n, _ in model.named_children()]
    assert children == ["user_embedding", "item_embedding", "mlp_user_embedding",
                        "mlp_item_embedding", "mlp", "predict"]
    assert model.mlp_user_embedding.weight.shape == (50, 8)
    assert model.predict.in_features == 8 + 4


# --------------------------------------------------------------------------------------------
# Hugging Face GPT-2 (optional transformers)


def test_hf_gpt2_import_error_without_transformers(monkeypatch):
    mod = load("hf_gpt2")  # the module itself imports without transformers
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError, match=r"pip install -e \.\[hf\]"):
        mod.build(layers=1, hidden=8, heads=2, vocab=11, seq=4)


def test_hf_gpt2():
    pytest.importorskip("transformers")
    mod = load("hf_gpt2")
    torch.manual_seed(0)
    model = mod.build(layers=2, hidden=32, heads=4, vocab=97, seq=16).eval()
    (ids,) = mod.example_inputs(batch=2, seq=12, vocab=97)
    with torch.no_grad():
        out = model(ids)
    assert tuple(out.logits.shape) == (2, 12, 97)
    assert torch.isfinite(mod.loss(out, ids))
    names = dict(model.named_parameters())
    assert tuple(names["transformer.h.0.attn.c_attn.weight"].shape) == (32, 96)
    # HF models do not trace with plain torch.fx.symbolic_trace; torch.export captures the graph
    exported = torch.export.export(model, (ids,))
    got = exported.module()(ids)
    got = got["logits"] if isinstance(got, dict) else getattr(got, "logits", got)
    torch.testing.assert_close(got, out.logits)

    with torch.device("meta"):
        big = mod.build()
    assert big.lm_head.weight is big.transformer.wte.weight
    assert sum(p.numel() for p in big.parameters()) == gpt2_params(tied=True) == 124_439_808
