"""The op graph of a model of N identical blocks exported cut to three and expanded
(planlang.model.capture.fold_graph, issue #29) is the whole model's, node for node, and lowers to the same
program; `check --model` says the same with and without it. The reference is the whole model's export."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

pytest.importorskip("transformers", reason="the zoo's Hugging Face models need transformers")

from planlang.model import validation  # noqa: E402
from planlang.model.capture.fold import Fold, FoldError, find_fold  # noqa: E402
from planlang.model.capture.fold_graph import folded_op_graph, op_graph_of  # noqa: E402
from planlang.model.capture.lazy_consts import Deferred  # noqa: E402
from planlang.model.capture.opgraph import OpGraph, op_graph  # noqa: E402
from planlang.model.price.block_fold import plan_fold  # noqa: E402
from tests.zoo.plans import plan_text  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LAYERS = {"llama": "num_hidden_layers", "qwen2": "num_hidden_layers", "mistral": "num_hidden_layers",
          "gpt2": "n_layer"}


def _model(name: str, layers: int = 7) -> nn.Module:
    from examples.zoo import causal_lm

    with torch.device("meta"):
        return getattr(causal_lm, name)(**{LAYERS[name]: layers})


def _step(model: nn.Module):
    from examples.zoo.causal_lm import loss

    ids = torch.zeros(2, 16, dtype=torch.int64, device="meta")
    return {"input_ids": ids}, loss, (ids.clone(),)


def _const(t) -> tuple:
    if isinstance(t, Deferred):
        return ("deferred", str(t.call), tuple(t.shape), t.dtype, t.sym,
                tuple(_const(a) if isinstance(a, (torch.Tensor, Deferred)) else a for a in t.args))
    return ("tensor", t.dtype, tuple(t.shape), t.device.type, t.tolist() if t.device.type != "meta" else None)


def assert_same(a: OpGraph, b: OpGraph) -> None:
    """Every value (in insertion order), node (with its opaque call), output and constant alike."""
    assert list(a.values.items()) == list(b.values.items())
    assert len(a.nodes) == len(b.nodes)
    for x, y in zip(a.nodes, b.nodes):
        assert x == y
        assert repr(x.call) == repr(y.call)
    assert a.outputs == b.outputs
    assert list(a.consts) == list(b.consts)
    assert [_const(t) for t in a.consts.values()] == [_const(t) for t in b.consts.values()]


@pytest.mark.parametrize("name", ["llama", "qwen2", "mistral", "gpt2"])
def test_the_expanded_graph_is_the_whole_models(name):
    model = _model(name)
    inputs, loss, targets = _step(model)
    fold = find_fold(model)
    assert fold is not None and fold.count == 7
    whole = op_graph(model, inputs, loss, targets)
    assert_same(folded_op_graph(model, inputs, loss, fold, targets), whole)
    # a cut keeping four blocks (two interior ones checked against the first) expands the same
    assert_same(folded_op_graph(model, inputs, loss, fold, targets, k=4), whole)
    # the model is whole again afterwards
    assert len(model.get_submodule(fold.container)) == 7


def test_a_model_fx_traces_is_expanded_from_its_fx_trace():
    from examples.gpt2.model import build

    with torch.device("meta"):
        model = build(layers=6, hidden=32, heads=4, vocab=64, seq=16)
    fold = find_fold(model)
    assert fold == Fold("h", 6)
    idx = torch.zeros(2, 16, dtype=torch.int64, device="meta")
    graph, why = op_graph_of(model, {"idx": idx}, None, (), fold)
    assert why is None  # expanded (planlang.model.capture.fold_fx; tests/model/test_fold_fx.py)
    assert_same(graph, op_graph(model, {"idx": idx}))


class _Twice(nn.Module):
    """Runs its first layer twice: the cut model's blocks do not each run once."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(6))

    def forward(self, x):
        if x.shape[0] > 0:  # symbolic tracing refuses a branch on a size, torch.export takes it
            x = x + 1
        x = self.layers[0](x)
        for layer in self.layers:
            x = layer(x)
        return x


def test_a_model_that_does_not_run_its_blocks_in_turn_is_built_whole():
    model = _Twice()
    fold = find_fold(model)
    x = torch.randn(2, 8)
    with pytest.raises(FoldError):
        folded_op_graph(model, {"x": x}, None, fold)
    graph, why = op_graph_of(model, {"x": x}, None, (), fold)
    assert why is not None
    assert len(model.layers) == 6
    assert_same(graph, op_graph(model, {"x": x}))


# ------------------------------------------------------------------------------ through `check --model`
def _plan(tmp_path, name: str, layout: str) -> str:
    blocks = "transformer.h" if name == "gpt2" else "model.layers"
    text = plan_text(name, {"zero3ckpt": "zero3", "tp_first2": "dp2tp2"}.get(layout, layout))
    text = text.replace(f'"examples.zoo.causal_lm:{name}"()', f'"examples.zoo.causal_lm:{name}"({LAYERS[name]} = 7)')
    if layout == "zero3ckpt":
        text += f"checkpoint {blocks}[*]\n"
    if layout == "tp_first2":  # blocks treated unlike (plan_fold: no): the graph is the model's, not the plan's
        text = text.replace(f"for layer in {blocks}[*]", f"for layer in {blocks}[0:2]")
    if layout == "pp2tp2":  # the stages hold 3 and 4 of the 7 blocks
        text = text.replace(f"{blocks}[0]\n", f"{blocks}[0:3]\n").replace(f"{blocks}[1],", f"{blocks}[3:7],")
    path = tmp_path / f"{name}_{layout}.plan"
    path.write_text(text)
    return str(path)


def _program(prog) -> tuple:
    return ([str(i) for i in prog.instructions], sorted((k, str(v)) for k, v in prog.layouts.items()),
            sorted(prog.grad_sync.items()), sorted((k, str(v)) for k, v in prog.param_specs.items()),
            [str(f) for f in prog.fallbacks], prog.checkpoint_groups, prog.loss, sorted(prog.blocked))


@pytest.mark.parametrize("name,layout", [("llama", "dp4"), ("llama", "dp2tp2"), ("llama", "zero3ckpt"),
                                         ("qwen2", "dp2tp2"), ("mistral", "zero3ckpt"), ("gpt2", "dp2tp2"),
                                         ("llama", "pp2tp2"), ("llama", "tp_first2")])
def test_check_model_says_the_same_with_the_expanded_graph(tmp_path, monkeypatch, name, layout):
    monkeypatch.chdir(ROOT)
    path = _plan(tmp_path, name, layout)
    calls = []
    real = validation.op_graph_of

    def spy(*args, **kw):
        graph, why = real(*args, **kw)
        calls.append(why)
        return graph, why

    monkeypatch.setattr(validation, "op_graph_of", spy)
    folded = validation.validate_file(path)
    assert calls == [None]  # expanded
    monkeypatch.setattr(validation, "find_fold", lambda model: None)
    whole = validation.validate_file(path)
    assert calls == [None, "no list of identical blocks"]
    assert folded.check.diagnostics == whole.check.diagnostics
    assert folded.program is not None and whole.program is not None
    assert_same(folded.program.graph, whole.program.graph)
    assert _program(folded.program) == _program(whole.program)
    assert folded.estimate == whole.estimate
    if layout == "tp_first2":
        assert folded.complete is not None
        assert plan_fold(folded.complete, folded.facts, Fold("model.layers", 7))[0] is None
