"""Linearization (map Algorithm 2) and the chain of a model, measured on the meta device."""
from __future__ import annotations

import math

import pytest
import torch

from examples.gpt2.model import build, loss as gpt2_loss
from planlang.lang.parser import parse
from planlang.model.capture.profile import profile_model
from planlang.model.capture.simulate import simulate_step
from planlang.model.capture.trace import trace_graph
from planlang.solve.linearize import (GraphNode, chain_for_graph, chain_for_modules, group_modules,
                                      checkpoint_lines, common_nodes, graph_nodes, linearize, plan_path)
from planlang.solve.rotor import (InfeasibleBudget, discretise, min_peak, simulate, solve, solve_groups,
                                  top_level_groups)


def node(name, *args, op="call_function", floating=True, **kw):
    return GraphNode(name, op, tuple(args), floating, **kw)


def inp(name, floating=True):
    return GraphNode(name, "placeholder", (), floating)


# ---------------------------------------------------------------------------------------------------------
# Algorithm 2 on small graphs


def test_residual_block_is_one_group():
    nodes = [inp("x"), node("a", "x"), node("b", "a"), node("c", "b"), node("add", "a", "c"), node("d", "add"),
             node("out", "d", op="output")]
    # a is read again by the residual add: nothing can be cut until add has run
    assert linearize(nodes) == [("a",), ("b", "c", "add"), ("d",)]


def test_common_mask_does_not_glue_layers():
    # a float mask input, transformed once and read by every layer
    layers = [node("m", "mask")]
    prev = "x"
    for i in range(3):
        layers.append(node(f"l{i}", prev, "m", has_params=True))
        prev = f"l{i}"
    nodes = [inp("x"), inp("mask"), *layers, node("out", prev, op="output")]
    # not known to be common: m stays pending until the last layer, which glues the layers into one group
    assert linearize(nodes) == [("m",), ("l0", "l1", "l2")]
    # seeded as a common input (map §5.2.3): m is common too (Lemma 5.4) and each layer is a group
    assert "m" in common_nodes(nodes, seeds=["mask"])
    assert linearize(nodes, seeds=["mask"]) == [("m", "l0"), ("l1",), ("l2",)]
    # an integer mask needs no seed
    nodes[1] = inp("mask", floating=False)
    assert linearize(nodes) == [("m", "l0"), ("l1",), ("l2",)]


def test_lemma_5_4_propagation():
    nodes = [inp("ids", floating=False), node("w", op="get_attr", has_params=True),
             node("emb", "ids", "w"), node("pos", floating=False), node("pe", "pos"),
             node("size", "emb", floating=False), node("mix", "emb", "pe")]
    common = common_nodes(nodes)
    assert {"ids", "w", "pos", "pe", "size"} <= common       # non-float, get_attr, made from commons only
    assert "emb" not in common                              # reads a parameter: differentiable
    assert "mix" not in common


def test_inplace_and_communication_stay_with_their_producer():
    plain = [inp("x"), node("conv", "x"), node("relu", "conv"), node("f", "relu")]
    assert linearize(plain) == [("conv",), ("relu",), ("f",)]
    inplace = [inp("x"), node("conv", "x"), node("relu_", "conv", inplace=True), node("f", "relu_")]
    assert linearize(inplace) == [("conv", "relu_"), ("f",)]
    comm = [inp("x"), node("mm", "x"), node("all_reduce", "mm", comm=True), node("wait", "all_reduce", comm=True),
            node("g", "wait")]
    assert linearize(comm) == [("mm", "all_reduce", "wait"), ("g",)]


# ---------------------------------------------------------------------------------------------------------
# GPT-2 (small config, meta device)


LAYERS = 6


@pytest.fixture(scope="module")
def gpt2():
    with torch.device("meta"):
        model = build(layers=LAYERS, hidden=64, heads=4, vocab=256, seq=32)
    inputs = {"idx": torch.zeros(2, 32, dtype=torch.int64, device="meta")}
    return model, inputs


def _loss(out, inputs):
    return gpt2_loss(out, inputs["idx"])


@pytest.fixture(scope="module")
def gpt2_chain(gpt2):
    model, inputs = gpt2
    return chain_for_modules(model, inputs, [f"h.{i}" for i in range(LAYERS)], throughput=1e12, loss=_loss)


def test_gpt2_chain_has_one_stage_per_block_plus_the_ends(gpt2, gpt2_chain):
    model, inputs = gpt2
    names = [s.name for s in gpt2_chain.stages]
    assert names == ["(before h.0)"] + [f"h.{i}" for i in range(LAYERS)] + ["(after h.5)", "loss"]
    assert gpt2_chain.chain.length == LAYERS + 2
    assert gpt2_chain.stages[0].modules == ("wte", "wpe", "drop")
    assert gpt2_chain.stages[-2].modules == ("ln_f", "lm_head")
    # identical blocks measure identically; every block passes a [2, 32, 64] f32 activation on
    blocks = gpt2_chain.stages[1:LAYERS + 1]
    assert len({(s.fwd_flops, s.bwd_flops, s.x, s.xbar, s.ftmp, s.btmp) for s in blocks}) == 1
    assert blocks[0].x == 2 * 32 * 64 * 4 and blocks[0].fwd_flops > 0 and blocks[0].bwd_flops > 0
    # the loss's input is the logits [2, 32, 256] f32
    assert gpt2_chain.stages[-1].x == 2 * 32 * 256 * 4
    # the stages' flops add up to the model profile's (an independent attribution by module hooks)
    prof = profile_model(model, inputs, _loss)
    assert sum(s.fwd_flops for s in gpt2_chain.stages) == prof.total_fwd_flops
    assert sum(s.bwd_flops for s in gpt2_chain.stages) == prof.total_bwd_flops


def test_gpt2_chain_memory_against_the_simulated_step(gpt2, gpt2_chain):
    # the chain's peak without checkpointing vs planlang.model.capture.simulate's eager step (every tensor's life
    # followed; model inputs not counted, parameter gradients excluded here as in the chain). The chain is
    # conservative: it holds the logits through the loss (rotor's abar includes the stage output), which
    # eager frees once cross-entropy has saved its log-softmax.
    model, inputs = gpt2
    chain = gpt2_chain.chain
    peak = solve(chain, 1e12, 1000).peak - chain.x[0]
    step = simulate_step(model, inputs, _loss)
    eager = max(step.forward_peak, step.backward_peak - step.grads)
    assert eager <= peak <= eager + chain.x[-1] + 0.02 * eager


def test_gpt2_decreasing_budgets(gpt2_chain):
    chain = gpt2_chain.chain
    everything = solve(chain, 1e12, 1000)  # room for anything: no recomputation
    assert everything.recomputed == 0
    top = everything.peak
    unit = top / 400  # one slot size for every budget: one discretisation
    with pytest.raises(InfeasibleBudget) as err:
        solve(chain, top / 10, slot_size=unit)
    least = err.value.minimum  # the least budget on this discretisation
    assert math.isclose(least, min_peak(discretise(chain, unit)) * unit)
    assert math.isclose(err.value.exact, min_peak(chain)) and min_peak(chain) <= least
    last_time, last_peak, last_bytes = 0.0, math.inf, math.inf
    recomputed = set()
    expressible: list[bool] = []
    for k in range(21):
        budget = least + (top - least) * (1 - k / 20)
        s = solve(chain, budget, slot_size=unit)
        sim = simulate(s.ops, chain)
        assert sim.valid and math.isclose(sim.peak, s.peak) and s.peak <= budget
        assert math.isclose(sim.makespan, s.makespan, rel_tol=1e-9)
        assert s.makespan >= last_time * (1 - 1e-12)
        assert s.peak_slots <= last_peak and s.peak <= last_bytes
        last_time, last_peak, last_bytes = s.makespan, s.peak_slots, s.peak
        recomputed.add(s.recomputed)
        try:  # what a plan can express: never faster than rotor, sometimes infeasible where rotor is not
            g = solve_groups(chain, budget, slot_size=unit, checkpointable=gpt2_chain.checkpointable)
        except InfeasibleBudget:
            expressible.append(False)
        else:
            expressible.append(True)
            assert g.schedule.makespan >= s.makespan * (1 - 1e-12) and g.schedule.peak <= budget
    assert len(recomputed) >= 4  # the sweep really trades time for memory
    assert expressible[0] and sum(expressible) >= 10
    with pytest.raises(InfeasibleBudget) as err:
        solve(chain, least - unit, slot_size=unit)
    assert err.value.minimum == least


def test_gpt2_groups_as_plan_lines(gpt2_chain):
    chain = gpt2_chain.chain
    with pytest.raises(InfeasibleBudget) as err:
        solve_groups(chain, min_peak(chain) / 2, 500, checkpointable=gpt2_chain.checkpointable)
    budget = err.value.exact * 1.05  # tight: something must be checkpointed
    g = solve_groups(chain, budget, 500, checkpointable=gpt2_chain.checkpointable)
    assert g.groups
    mods = group_modules(g.groups, gpt2_chain)
    lines = checkpoint_lines(mods)
    assert len(lines) == len(g.groups)
    result = parse("\n".join(lines) + "\n")
    assert not result.diagnostics
    # the rotor schedule's own top-level groups are expressible too
    r = solve(chain, budget, 500)
    assert checkpoint_lines(group_modules(top_level_groups(r.ops, chain.length), gpt2_chain))


def test_gpt2_graph_linearization(gpt2):
    model, inputs = gpt2
    facts = trace_graph(model, inputs)
    groups = linearize(graph_nodes(facts))
    # the residual adds cut each block in two (attention half, MLP half); the ends add a few groups
    blocks = [g for g in groups if any(n.startswith("h_") for n in g)]
    assert len(blocks) == 2 * LAYERS
    assert all(g[-1].startswith("add") for g in blocks)
    lc = chain_for_graph(model, inputs, throughput=1e12, loss=_loss, facts=facts)
    assert len(lc.stages) == len(groups) + 1
    prof = profile_model(model, inputs, _loss)
    assert sum(s.fwd_flops for s in lc.stages) == prof.total_fwd_flops
    assert sum(s.bwd_flops for s in lc.stages) == prof.total_bwd_flops
    # the two halves of a block keep what the block keeps
    mod_chain = chain_for_modules(model, inputs, ["h.0"], throughput=1e12, loss=_loss)
    h0 = [s for s in lc.stages if s.modules and s.modules[0].startswith("h.0.")]
    assert sum(s.xbar for s in h0) == mod_chain.stages[1].xbar


def test_checkpoint_lines_and_paths():
    assert plan_path("h.0.attn") == "h[0].attn"
    assert checkpoint_lines([("h.2", "h.3", "h.4")]) == ["checkpoint h[2:5]"]
    assert checkpoint_lines([("wte", "wpe", "drop", "h.0", "h.1")]) == ["checkpoint wte, wpe, drop, h[0:2]"]
    assert checkpoint_lines([("h.3",), ("h.0.attn", "h.0.mlp")]) == ["checkpoint h[3]",
                                                                     "checkpoint h[0].attn, h[0].mlp"]


def test_bad_stage_lists(gpt2):
    model, inputs = gpt2
    with pytest.raises(ValueError, match="no module 'h.9'"):
        chain_for_modules(model, inputs, ["h.9"], throughput=1e12)
    with pytest.raises(ValueError, match="inside 'h.0'"):
        chain_for_modules(model, inputs, ["h.0", "h.0.mlp"], throughput=1e12)
    with pytest.raises(ValueError, match="execution order"):
        chain_for_modules(model, inputs, ["h.1", "h.0"], throughput=1e12)
    with pytest.raises(ValueError, match="flop/s"):
        chain_for_modules(model, inputs, ["h.0"], throughput=0)


def test_sequential_needs_no_end_stages():
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    inputs = {"x": torch.zeros(4, 16, device="meta")}
    lc = chain_for_modules(model, inputs, ["0", "1", "2"], throughput=1e9)
    assert [s.name for s in lc.stages] == ["0", "1", "2", "loss"]
    assert [s.x for s in lc.stages] == [4 * 16 * 4, 4 * 32 * 4, 4 * 32 * 4, 4 * 8 * 4]
    assert [s.fwd_flops for s in lc.stages[:3]] == [2 * 4 * 16 * 32, 0, 2 * 4 * 32 * 8]
    assert lc.chain.length == 3 and lc.checkpointable == (True, True, True)
