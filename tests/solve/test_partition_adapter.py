"""Adapters from a plan's model to the partition kernels and back to `stage` lines, on examples/gpt2
(a small config). Coverage and order are checked by the model-aware checker rule (PL460/461/462) and
again by hand from the selections; balance against enumeration of every cut of the layer sequence."""
from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from planlang.model.checks import pipeline_stages as pipeline_rule
from planlang.model.capture.profile import profile_model
from planlang.model.capture.trace import probe_modules
from planlang.plan.checker import CheckContext
from planlang.plan.resolve import resolve_text
from planlang.plan.selection import Selection
from planlang.solve.partition import PartitionError
from planlang.solve.pipeline_layers import layer_sequence, model_tree, selections, stage_selections, tree_selections
from planlang.solve.pipeline_stages import (
    StageChoice, balanced_stages, capture_partition, memory_stages, plan_layers, solve_stages,
    throughput_stages_for_plan, to_stages, tree_stages,
)
from planlang.solve.tree_partition import TreePartition

PLAN = """
use hardware
model gpt2 = "examples.gpt2.model:build"(layers = 12, hidden = 64, heads = 4, vocab = 1000, seq = 64{tie})
input idx : i64[batch = 16, seq = 64]
mesh cluster of 8 x hardware.a100_80g {{
    pp = {pp} over hardware.infiniband_200g
    dp = 2 over hardware.nvlink3
    tp = {tp} over hardware.nvlink3
}}
budget 40 GiB per device
optimizer adamw(lr = 0.0006)
data idx : [dp, _]
pipeline over pp schedule {schedule} microbatches 8 {{ ? }}
"""
LAYERS = ["wte", "wpe", "drop"] + [f"h.{i}" for i in range(12)] + ["ln_f", "lm_head"]


def make_plan(pp: int, tie: bool = False, schedule: str = "1f1b"):
    text = PLAN.format(pp=pp, tp=8 // (2 * pp), tie=", tie_embeddings = true" if tie else "", schedule=schedule)
    res = resolve_text(text, "examples/gpt2/partition_test.plan")
    assert res.plan is not None and not res.diagnostics, [str(d) for d in res.diagnostics]
    return res.plan


@pytest.fixture(scope="module")
def gpt2():
    plan = make_plan(2)
    parts = plan_layers(plan)  # one microbatch (batch / microbatches) on meta, profiled once
    return plan, parts.module, parts.facts, parts.profile, parts


def assert_valid_stages(plan, facts, choices, k):
    """The checker's pipeline rule finds nothing, and by hand: every leaf module in exactly one stage,
    stage indices never decreasing along execution order."""
    assert len(choices) == k
    staged = dataclasses.replace(plan, pipeline=dataclasses.replace(plan.pipeline, stages=to_stages(choices)))
    diags = list(pipeline_rule(CheckContext(staged, {}, {}, {"model": facts})))
    assert not diags, [d.message for d in diags]
    names = facts.all_modules
    leaves = [m for m in facts.order if not any(o.startswith(m + ".") for o in facts.order)]
    where = {}
    for i, c in enumerate(choices):
        for text in c.modules:
            for hit in Selection.parse(text).select(names):
                for m in leaves:
                    if m == hit or m.startswith(hit + "."):
                        assert m not in where, f"{m} in stages {where[m]} and {i}"
                        where[m] = i
    assert set(where) == set(leaves)
    assert [where[m] for m in leaves] == sorted(where[m] for m in leaves)


def test_layer_sequence_expands_the_block_list(gpt2):
    plan, module, facts, prof, parts = gpt2
    seq = parts.layers
    assert seq.names == LAYERS
    # costs come from the profile: a layer's flops are its subtree's forward + backward flops
    for layer in seq.layers:
        agg = prof.subtree(layer.name)
        assert layer.flops == agg.fwd_flops + agg.bwd_flops and layer.param_bytes == agg.param_bytes
    assert sum(seq.costs("flops")) == prof.total_fwd_flops + prof.total_bwd_flops
    assert sum(seq.costs("params")) == prof.param_bytes
    assert str(seq).startswith("17 layers: wte, wpe, drop, h[0]")


@pytest.mark.parametrize("k", [2, 4])
def test_balanced_stages_cover_every_module_in_order_and_balance_flops(gpt2, k):
    plan, module, facts, prof, parts = gpt2
    plan = make_plan(k)
    choices = balanced_stages(plan, parts=parts)
    assert_valid_stages(plan, facts, choices, k)
    # balance: stage flops from the profile, by the selections; the largest equals the best of all cuts
    flops = {n: prof.subtree(n).fwd_flops + prof.subtree(n).bwd_flops for n in LAYERS}
    per_stage = [sum(flops[n] for n in LAYERS if any(Selection.parse(t).matches(n) for t in c.modules))
                 for c in choices]
    best = min(max(sum(flops[n] for n in LAYERS[a:b]) for a, b in zip(cut, cut[1:]))
               for cut in ((0, *c, len(LAYERS)) for c in itertools.combinations(range(1, len(LAYERS)), k - 1)))
    assert max(per_stage) == best
    assert max(per_stage) <= 1.5 * sum(per_stage) / k
    if k == 2:
        assert [str(c) for c in choices] == ["stage wte, wpe, drop, h[0:7]", "stage h[7:12], ln_f, lm_head"]


def test_memory_stages_capture(gpt2):
    plan, module, facts, prof, parts = gpt2
    choices = memory_stages(plan, parts=parts)
    assert_valid_stages(plan, facts, choices, 2)
    # every stage names its degrees on the non-pipeline axes; the devices add up to the mesh (PL410)
    assert all(dict(c.degrees).keys() == {"dp", "tp"} for c in choices)
    assert sum(dict(c.degrees)["dp"] * dict(c.degrees)["tp"] for c in choices) == 8
    assert all("predicted peak" in c.note for c in choices)


@pytest.mark.parametrize("pp", [2, 4])
def test_capture_partition_is_the_least_predicted_peak_of_every_cut(gpt2, pp):
    """CAPTURE's layer groups on the mesh's own degrees: against every cut of the layer sequence into pp
    stages, priced by §III-B3's predictor written out here (AdamW: states 4 W; 1F1B: stage i holds
    min(pp - i, m) microbatches; per device W / tp, A / (dp tp))."""
    plan, module, facts, prof, parts = gpt2
    plan = make_plan(pp)
    layers = parts.layers
    W, A = layers.costs("params"), layers.costs("activations")
    tp, dp, m = 8 // (2 * pp), 2, 8

    def peak(bounds):
        return max(4 * sum(W[a:b]) / tp + min(pp - i, m) * sum(A[a:b]) / (dp * tp)
                   for i, (a, b) in enumerate(zip(bounds, bounds[1:])))

    n = len(W)
    best = min(peak((0, *cut, n)) for cut in itertools.combinations(range(1, n), pp - 1))
    choices = capture_partition(plan, parts=parts)
    assert len(choices) == pp and all(not c.degrees for c in choices)  # the mesh's degrees (PL418)
    bounds = [0]
    for c in choices:  # each stage's layers, in order: the cut the search chose
        bounds.append(bounds[-1] + sum(any(Selection.parse(s).matches(name) for s in c.modules)
                                       for name in layers.names))
    assert bounds[-1] == n and stage_selections(layers, bounds) == [list(c.modules) for c in choices]
    assert peak(bounds) == pytest.approx(best)
    # a memory-balanced cut differs from the flops-balanced one here: 1F1B's first stage holds pp
    # microbatches, the last one
    assert [str(c) for c in choices] != [str(c) for c in balanced_stages(plan, parts=parts)]


def test_throughput_stages(gpt2):
    plan, module, facts, prof, parts = gpt2
    plan4 = make_plan(4)
    choices = throughput_stages_for_plan(plan4, parts=parts)
    assert_valid_stages(plan4, facts, choices, 4)
    assert sum(dict(c.degrees)["dp"] * dict(c.degrees)["tp"] for c in choices) == 8


def test_tree_stages(gpt2):
    plan, module, facts, prof, parts = gpt2
    choices = tree_stages(plan, parts=parts)
    assert_valid_stages(plan, facts, choices, 2)


def test_selections_fold_container_runs():
    assert selections(["wte", "h.0", "h.1", "h.2", "ln_f"]) == ["wte", "h[0:3]", "ln_f"]
    assert selections(["h.5", "h.7", "enc.layer.0", "enc.layer.1"]) == ["h[5]", "h[7]", "enc.layer[0:2]"]
    assert stage_selections(LAYERS, (0, 9, 17)) == [["wte", "wpe", "drop", "h[0:6]"], ["h[6:12]", "ln_f", "lm_head"]]
    with pytest.raises(PartitionError, match="non-empty"):
        stage_selections(LAYERS, (0, 0, 17))
    assert str(StageChoice(("h[0:2]",), (("dp", 2), ("tp", 1)))) == "stage h[0:2] with dp = 2, tp = 1"


def test_tied_embeddings_are_a_clear_error():
    with pytest.raises(PartitionError, match="one parameter.*tie_embeddings=False"):
        balanced_stages(make_plan(2, tie=True))


class NotAChain(torch.nn.Module):
    """`a` runs part of its work after `b`: no contiguous cut of [a, b] follows the execution."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.ModuleDict({"x": torch.nn.Linear(4, 4), "y": torch.nn.Linear(4, 4)})
        self.b = torch.nn.Linear(4, 4)
        self.c = torch.nn.Module()
        self.c.p = torch.nn.Linear(4, 4)
        self.c.q = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.c.q(self.b(self.c.p(x)))


def test_not_a_chain_is_a_clear_error():
    with torch.device("meta"):
        model = NotAChain()
    inputs = {"x": torch.zeros(2, 4, device="meta")}
    with pytest.raises(PartitionError, match="do not run as a chain.*tree partition"):
        layer_sequence(model, inputs)


def test_interleaved_and_method_dispatch(gpt2):
    plan, module, facts, prof, parts = gpt2
    inter = make_plan(2, schedule="interleaved chunks 2")
    choices = solve_stages(inter, "balanced", parts=parts)  # pp 2 x 2 chunks = 4 stages
    assert_valid_stages(inter, facts, choices, 4)
    with pytest.raises(PartitionError, match="share a device"):
        solve_stages(inter, "memory", parts=parts)
    with pytest.raises(PartitionError, match="use one of balanced, memory"):
        solve_stages(plan, "fastest")


def test_tree_stages_refuse_a_model_whose_execution_leaves_its_tree():
    with torch.device("meta"):
        model = NotAChain()
    inputs = {"x": torch.zeros(2, 4, device="meta")}
    facts = probe_modules(model, inputs)
    tree = model_tree(model, facts, profile_model(model, inputs))
    assert [c.name for c in tree.children] == ["c", "b"]  # children in order of first call
    # c (both its linears) on stage 0 and b on stage 1 is in tree order, but c.q runs after b
    part = TreePartition((("", 0), ("c", 0), ("c.p", 0), ("c.q", 0), ("b", 1)), (0.0, 0.0))
    assert tree_selections(part, model, 2) == [["c"], ["b"]]
    with pytest.raises(PartitionError, match="runs after .* out of order"):
        tree_selections(part, model, 2, facts)


def test_tree_stages_keep_tied_parameters_together():
    plan = make_plan(2, tie=True)
    with pytest.raises(PartitionError, match="one parameter"):
        tree_stages(plan)
