"""The torch.export fallback of the op graph (planlang.model.capture.export_graph): models symbolic tracing
refuses get the same OpSpecs the fx path makes, and the graph, run op by op in one process with the
runtime's local ops, computes the model's loss and gradients."""
from __future__ import annotations

import math
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

from planlang.cost.ops.base import Strategy
from planlang.model.capture.export_graph import AtenCall, causal_mask
from planlang.model.capture.opgraph import OpGraph, TensorArg, UnsupportedGraph, op_graph, trace
from planlang.plan.types import Mesh, Spec
from planlang.runtime.local_ops import run_local

B, S, VOCAB, HIDDEN, HEADS, LAYERS = 4, 16, 128, 64, 4, 2


# ------------------------------------------------------------------------------ a one-process interpreter
def _replicated(op) -> Strategy:
    return Strategy("replicate", tuple(Spec(tuple(() for _ in s)) for s in op.inputs),
                    Spec(tuple(() for _ in op.output)))


def run_graph(g: OpGraph, params: dict[str, torch.Tensor], feeds: dict[str, torch.Tensor]) -> torch.Tensor:
    """Every op on whole tensors: rules' ops through planlang.runtime.local_ops, opaque ones as called."""
    mesh = Mesh("one", None, ())
    env: dict[str, torch.Tensor] = {}
    for v in g.values.values():
        if v.kind == "param":
            env[v.name] = params[v.ref]
        elif v.kind == "input":
            env[v.name] = feeds[v.name]
        elif v.kind == "const":
            env[v.name] = g.consts[v.name]
    for n in g.nodes:
        xs = [env[i] for i in n.inputs]
        if n.op.kind == "opaque":
            def sub(a):
                return xs[a.index] if isinstance(a, TensorArg) else a
            call = n.call
            env[n.name] = call.target(*fx.node.map_aggregate(call.args, sub),
                                      **fx.node.map_aggregate(dict(call.kwargs), sub))
        else:
            env[n.name] = run_local(n.op, _replicated(n.op), xs, {}, mesh, None)
    return env[g.outputs[0]]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


# ------------------------------------------------------------------------------ Hugging Face GPT-2
@pytest.fixture(scope="module")
def hf():
    """The tiny HF GPT-2 (CPU, seeded), its loss and its op graph for input_ids [B, S]."""
    pytest.importorskip("transformers", reason="the optional `transformers` package is not installed "
                        "(pip install -e .[hf])")
    from examples.hf_gpt2.model import build, loss

    torch.manual_seed(0)
    model = build(layers=LAYERS, hidden=HIDDEN, heads=HEADS, vocab=VOCAB, seq=S)
    meta = torch.zeros(B, S, dtype=torch.int64, device="meta")
    g = op_graph(model, {"input_ids": meta}, loss, (meta.clone(),))
    return model, loss, g


def test_hf_gpt2_needs_the_export_fallback(hf):
    model, loss, _ = hf
    with pytest.raises(UnsupportedGraph, match="symbolic_trace"):
        trace(model, loss, 1)


def test_hf_gpt2_conv1d_linears_are_addmm(hf):
    model, _, g = hf
    addmm = [n for n in g.nodes if n.op.kind == "addmm"]
    conv = {f"transformer.h.{i}.{m}": model.get_submodule(f"transformer.h.{i}.{m}")
            for i in range(LAYERS) for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")}
    assert sorted(n.module for n in addmm) == sorted(conv)
    for n in addmm:
        w = conv[n.module].weight  # Conv1D: [in, out], y = x @ W + b
        bias, x, weight = (g.values[i] for i in n.inputs)
        assert (bias.kind, bias.ref) == ("param", f"{n.module}.bias")
        assert (weight.kind, weight.ref) == ("param", f"{n.module}.weight")
        assert n.op.inputs == ((w.shape[1],), (B * S, w.shape[0]), tuple(w.shape))
        assert n.op.output == (B * S, w.shape[1])
        assert x.kind == "op"
    # the module's output is [batch, seq, out] (what `shard output of c_fc : [_, _, tp]` pins)
    outs = g.module_outputs()
    assert g.values[outs["transformer.h.0.mlp.c_fc"]].shape == (B, S, 4 * HIDDEN)


def test_hf_gpt2_tied_lm_head_is_one_parameter(hf):
    model, _, g = hf
    (head,) = [n for n in g.nodes if n.op.kind == "linear"]
    assert head.module == "lm_head"
    w = g.values[head.inputs[1]]
    # HF ties lm_head.weight to transformer.wte.weight: one Value, named as named_parameters() names it
    assert (w.kind, w.ref) == ("param", "transformer.wte.weight")
    assert "lm_head.weight" not in {v.ref for v in g.params()}
    assert {v.ref for v in g.params()} == {n for n, _ in model.named_parameters()}
    (emb, pos) = [n for n in g.nodes if n.op.kind == "embedding"]
    assert g.values[emb.inputs[1]].ref == "transformer.wte.weight"
    assert g.values[emb.inputs[0]].kind == "op" and g.values[pos.inputs[0]].kind == "const"


def test_hf_gpt2_attention_is_causal_sdpa(hf):
    _, _, g = hf
    sdpa = [n for n in g.nodes if n.op.kind == "scaled_dot_product_attention"]
    assert len(sdpa) == LAYERS
    d = HIDDEN // HEADS
    for n in sdpa:
        # HF builds a [B, 1, S, S] boolean mask from position ids; folded and recognised as causal
        assert n.op.inputs == ((B, HEADS, S, d),) * 3
        assert n.op.attr("is_causal") is True
        assert n.op.attr("scale") == pytest.approx(1 / math.sqrt(d))
        assert n.module.endswith(".attn")
    assert not [n for n in g.nodes if n.op.kind == "opaque"]
    assert all(v.shape[-2:] != (S, S) for v in g.values.values() if v.kind == "const")
    (ce,) = [n for n in g.nodes if n.op.kind == "cross_entropy"]
    assert ce.op.inputs == ((B * (S - 1), VOCAB), (B * (S - 1),)) and ce.op.attr("reduction") == "mean"
    assert g.outputs == (ce.name,)
    assert [v.name for v in g.values.values() if v.kind == "input"] == ["input_ids", "target"]


def test_hf_gpt2_graph_computes_the_model(hf):
    model, loss, g = hf
    g = pickle.loads(pickle.dumps(g))  # the program is broadcast to every rank
    ids = torch.randint(0, VOCAB, (B, S), generator=torch.Generator().manual_seed(1))
    params = dict(model.named_parameters(remove_duplicate=False))
    model.zero_grad()
    ref = loss(model(ids), ids)
    ref.backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    out = run_graph(g, params, {"input_ids": ids, "target": ids})
    out.backward()
    assert rel(out.detach(), ref.detach()) <= 1e-6
    for n, p in model.named_parameters():
        assert rel(p.grad, ref_grads[n]) <= 1e-5, n


def test_hf_llama_graph_computes_the_model():
    """A second HF family: Llama computes its rotary cos/sin inside a no-grad block (a higher-order op
    in the exported graph, inlined and folded into constants), RMSNorm from pow/mean/rsqrt and rotary
    `expand`s, every op with a rule; the graph computes the model's loss and gradients."""
    pytest.importorskip("transformers", reason="the optional `transformers` package is not installed")
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=1,
                      num_attention_heads=HEADS, num_key_value_heads=HEADS, max_position_embeddings=S,
                      use_cache=False)
    model = LlamaForCausalLM(cfg)

    def loss(out, labels):
        logits = out.logits[:, :-1, :]
        return F.cross_entropy(logits.reshape(-1, VOCAB), labels[:, 1:].reshape(-1))

    ids = torch.randint(0, VOCAB, (2, S), generator=torch.Generator().manual_seed(2))
    g = op_graph(model, {"input_ids": ids.to("meta")}, loss, (ids.to("meta"),))
    kinds = [n.op.kind for n in g.nodes]
    assert kinds.count("scaled_dot_product_attention") == 1 and kinds.count("linear") == 8  # q k v o, 3 MLP, head
    assert [n.op.attr("target") for n in g.nodes if n.op.kind == "opaque"] == []  # rsqrt, expand: rules
    ref = loss(model(ids), ids)
    ref.backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    out = run_graph(g, dict(model.named_parameters()), {"input_ids": ids, "target": ids})
    out.backward()
    assert rel(out.detach(), ref.detach()) <= 1e-6
    for n, p in model.named_parameters():
        assert rel(p.grad, ref_grads[n]) <= 1e-5, n


# ------------------------------------------------------------------------------ without transformers
class ShapeBranch(nn.Module):
    """Python control flow on a size (symbolic tracing refuses it, export specialises it) and an op
    without a rule (cumsum)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        h = self.fc(x)
        if h.size(0) > 1:
            h = torch.cumsum(h, dim=0) * 0.5
        return self.out(F.gelu(h).pow(2))


def test_export_fallback_on_shape_control_flow():
    torch.manual_seed(0)
    model = ShapeBranch()
    x = torch.randn(4, 8)
    y = torch.randint(0, 3, (4,))
    g = op_graph(model, {"x": x.to("meta")}, F.cross_entropy, (y.to("meta"),))
    kinds = [n.op.kind for n in g.nodes]
    assert kinds == ["linear", "opaque", "mul", "gelu", "mul", "linear", "cross_entropy"]
    (cum,) = [n for n in g.nodes if n.op.kind == "opaque"]
    assert isinstance(cum.call.target, AtenCall) and cum.op.attr("target") == "cumsum"
    assert [g.values[i].ref for i in g.nodes[0].inputs[1:]] == ["fc.weight", "fc.bias"]
    g = pickle.loads(pickle.dumps(g))
    ref = F.cross_entropy(model(x), y)
    ref.backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    out = run_graph(g, dict(model.named_parameters()), {"x": x, "target": y})
    out.backward()
    assert rel(out.detach(), ref.detach()) <= 1e-6
    for n, p in model.named_parameters():
        assert rel(p.grad, ref_grads[n]) <= 1e-6, n


class NoGradBlocks(nn.Module):
    """`torch.no_grad()` blocks (higher-order ops in the exported graph): one over a buffer (folded into a
    constant), one over an activation (no gradient may flow through it)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.out = nn.Linear(8, 3)
        self.register_buffer("freq", torch.linspace(0.0, 1.0, 8))

    def forward(self, x):
        with torch.no_grad():
            s = self.freq.exp()
        h = self.fc(x)
        if h.dim() > 1:  # refuses symbolic tracing
            with torch.no_grad():
                peak = h.abs().amax()
            h = h / peak + s
        return self.out(h)


def test_no_grad_blocks_are_inlined_and_detached():
    torch.manual_seed(0)
    model = NoGradBlocks()
    x, y = torch.randn(4, 8), torch.randint(0, 3, (4,))
    g = op_graph(model, {"x": x.to("meta")}, F.cross_entropy, (y.to("meta"),))
    consts = [v for v in g.values.values() if v.kind == "const"]
    assert [v.shape for v in consts] == [(8,)]  # exp(freq), computed once
    assert torch.equal(g.consts[consts[0].name], model.freq.exp())
    assert [n.op.attr("target") for n in g.nodes if n.op.kind == "opaque"] == ["abs", "detach"]
    ref = F.cross_entropy(model(x), y)
    ref.backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    out = run_graph(g, dict(model.named_parameters()), {"x": x, "target": y})
    out.backward()
    assert rel(out.detach(), ref.detach()) <= 1e-6
    for n, p in model.named_parameters():
        assert rel(p.grad, ref_grads[n]) <= 1e-6, n


class DataBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x) if x.sum() > 0 else x  # on the data: neither tracer can capture it


def test_untraceable_model_reports_both_tracers():
    with pytest.raises(UnsupportedGraph, match="symbolic_trace failed.*torch.export failed on DataBranch"):
        op_graph(DataBranch(), {"x": torch.zeros(2, 4, device="meta")})


def test_fx_traceable_models_keep_the_fx_path():
    # module-call nodes are named after their module on the fx path, ATen ops on the export path
    g = op_graph(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), {"x": torch.zeros(2, 4, device="meta")})
    assert [n.name for n in g.nodes] == ["_0", "_1"]


def test_causal_mask_recognition():
    s = 5
    keep = torch.ones(s, s, dtype=torch.bool).tril()
    assert causal_mask(keep.expand(3, 1, s, s), s, s)
    additive = torch.zeros(s, s).masked_fill(~keep, float("-inf"))
    assert causal_mask(additive[None, None], s, s)
    padded = keep.expand(2, 1, s, s).clone()
    padded[1, :, :, 0] = False  # sequence 1 has a padding token first
    assert not causal_mask(padded, s, s)
    assert not causal_mask(torch.ones(1, 1, s, s, dtype=torch.bool), s, s)
    assert not causal_mask(keep.T.contiguous(), s, s)


def test_aten_call_pickles_and_runs():
    call = pickle.loads(pickle.dumps(AtenCall("aten::diff.default")))
    assert torch.equal(call(torch.tensor([1, 4, 9])), torch.tensor([3, 5]))
    top = AtenCall("aten::topk.default", 1)
    assert torch.equal(top(torch.tensor([1.0, 7.0, 3.0]), 2), torch.tensor([1, 2]))
    assert top.__name__ == "topk[1]"


def test_an_opaque_call_of_a_torch_dispatch_wrapper_pickles():
    """Rank 0 sends the lowered program to the other ranks: F.max_pool2d (a boolean_dispatch closure that
    pickle cannot name) goes by its public name and comes back as the same function."""
    import pickle

    from planlang.model.capture.graph_values import OpaqueCall

    call = OpaqueCall("call_function", F.max_pool2d, (2,), (("stride", 2),))
    back = pickle.loads(pickle.dumps(call))
    assert back.target is F.max_pool2d and back.args == (2,) and back.kwargs == (("stride", 2),)


def test_the_export_records_no_stack_traces_and_restores_the_setting():
    """export_step exports with torch.fx.config.do_not_emit_stack_traces on (nothing reads them) and leaves
    the setting as it was."""
    import torch.fx.config

    from planlang.model.capture.export_graph import export_step

    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    for before in (False, True):
        torch.fx.config.do_not_emit_stack_traces = before
        try:
            ep, _ = export_step(model, {"x": torch.zeros(2, 8)}, None, ())
            assert torch.fx.config.do_not_emit_stack_traces is before
        finally:
            torch.fx.config.do_not_emit_stack_traces = False
        assert not any(n.meta.get("stack_trace") for n in ep.graph.nodes)
