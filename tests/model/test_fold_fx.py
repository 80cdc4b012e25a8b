"""The op graph of a model torch.fx traces, traced cut to a few of its N identical blocks and expanded
(planlang.model.capture.fold_fx, issue #29), is the whole model's trace, node for node: the same values,
ops, outputs and constants, so the same flops and bytes wherever they are priced. Models whose cut does not
show the whole graph are traced whole, saying why."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from examples.gpt2.model import build
from planlang.cost.ops.base import strategies
from planlang.model.capture.fold import Fold, FoldError, find_fold, truncated
from planlang.model.capture.fold_fx import expand_fx, fx_folded_op_graph
from planlang.model.capture.fold_graph import folded_op_graph, op_graph_of
from planlang.model.capture.opgraph import OpGraph, op_graph, propagate, trace
from planlang.plan.types import Axis, Link, Mesh

MESH = Mesh("m", None, (Axis("tp", 2, Link("nv", 300e9, 2e-6)),))


def _loss(out, target):
    return F.cross_entropy(out.flatten(0, 1), target.flatten())


def _gpt(layers: int = 7, device: str = "meta", **kw) -> nn.Module:
    with torch.device(device):
        return build(layers=layers, hidden=32, heads=4, vocab=64, seq=16, **kw)


def _ids(device: str = "meta", batch: int = 2) -> torch.Tensor:
    return torch.zeros(batch, 16, dtype=torch.int64, device=device)


def _prices(g: OpGraph) -> list[tuple]:
    """Each op's strategies on a 2-way mesh as the intra-op ILP prices them: flops, memory, collectives."""
    return [(n.name, [(s.name, s.flops, s.memory, s.comm_seconds) for s in strategies(n.op, MESH)])
            for n in g.nodes if n.op.kind != "opaque"]


def assert_same(a: OpGraph, b: OpGraph) -> None:
    assert list(a.values.items()) == list(b.values.items())
    assert a.nodes == b.nodes  # names, modules, op specs (kind, shapes, dtypes, attributes), inputs
    assert [repr(x.call) for x in a.nodes] == [repr(y.call) for y in b.nodes]
    assert a.outputs == b.outputs
    assert list(a.consts) == list(b.consts)
    assert [(t.dtype, tuple(t.shape)) for t in a.consts.values()] == \
        [(t.dtype, tuple(t.shape)) for t in b.consts.values()]
    assert repr(a.output_tree) == repr(b.output_tree)


@pytest.mark.parametrize("k", [3, 4])
def test_the_expanded_gpt_is_the_whole_trace(k):
    model = _gpt()
    fold = find_fold(model)
    assert fold == Fold("h", 7)
    ids = _ids()
    whole = op_graph(model, {"idx": ids}, _loss, (ids.clone(),))
    got = folded_op_graph(model, {"idx": ids}, _loss, fold, (ids.clone(),), k=k)
    assert_same(got, whole)
    assert sum(n.name.startswith("matmul") for n in got.nodes) == 4 * 7  # four Conv1D per block
    assert _prices(got) == _prices(whole)
    assert len(model.h) == 7  # whole again


def test_without_a_loss_tied_weights_and_a_real_model():
    # no loss: the model is the traced root (no `model.` prefix); tied weights are named by their first
    # alias; real tensors are shape-propagated under fake tensors
    for model in (_gpt(), _gpt(tie_embeddings=True), _gpt(device="cpu")):
        ids = _ids(next(model.parameters()).device.type)
        graph, why = op_graph_of(model, {"idx": ids}, None, (), find_fold(model))
        assert why is None
        assert_same(graph, op_graph(model, {"idx": ids}))


def test_a_large_cut_expands_with_its_counters_moved():
    # 40 blocks: node counters reach past the cut's (add_41 ...) and module paths get two digits
    model = _gpt(layers=40)
    ids = _ids()
    got = fx_folded_op_graph(model, {"idx": ids}, _loss, Fold("h", 40), (ids.clone(),), 3)
    assert_same(got, op_graph(model, {"idx": ids}, _loss, (ids.clone(),)))


class _Indexed(nn.Module):
    def __init__(self, idx: int) -> None:
        super().__init__()
        self.layer_idx = idx  # a block's own index: find_fold takes the blocks as alike
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        x = self.lin(x)
        return x * 2 if self.layer_idx == 1 else x / 2  # but block 1 traces to another op


class _Stack(nn.Module):
    def __init__(self, block=_Indexed) -> None:
        super().__init__()
        self.layers = nn.ModuleList(block(i) for i in range(6))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class _Block(nn.Module):
    def __init__(self, idx: int) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x, first=None):
        return self.lin(x).relu() if first is None else self.lin(x) + first


class _Dense(_Stack):
    """Every block reads the first block's output too: a block reads more than the block before."""

    def __init__(self) -> None:
        super().__init__(_Block)

    def forward(self, x):
        first = x = self.layers[0](x)
        for layer in self.layers[1:]:
            x = layer(x, first)
        return x


@pytest.mark.parametrize("model,why", [(_Stack(), "is not"), (_Dense(), "reads")])
def test_a_cut_that_does_not_show_the_whole_graph_is_traced_whole(model, why):
    fold = find_fold(model)
    assert fold is not None
    x = torch.zeros(2, 8, device="meta")
    with pytest.raises(FoldError, match=why):
        fx_folded_op_graph(model, {"x": x}, None, fold, (), 3)
    graph, said = op_graph_of(model, {"x": x}, None, (), fold)
    assert said is not None and why in said
    assert len(model.layers) == 6
    assert_same(graph, op_graph(model, {"x": x}))


def test_the_expansion_names_nodes_as_the_trace_does():
    """expand_fx's graph is the whole model's traced graph itself: names, targets, arguments, module stacks."""
    model = _gpt(layers=9)
    ids = _ids()
    fold = find_fold(model)
    whole = trace(model, _loss, 1)
    with truncated(model, fold, 3):
        cut = trace(model, _loss, 1)
    propagate(cut, [ids, ids.clone()])
    got = expand_fx(cut.graph, fold, 3, "model")

    def form(g):
        return [(n.op, n.name, str(n.target), str(n.args), str(n.kwargs),
                 [(k, v[0]) for k, v in (n.meta.get("nn_module_stack") or {}).items()]) for n in g.nodes]
    assert form(got) == form(whole.graph)
    with pytest.raises(FoldError):
        expand_fx(cut.graph, fold, 9, "model")  # a cut keeping every block repeats none
