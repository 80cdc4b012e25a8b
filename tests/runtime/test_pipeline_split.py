"""Cutting models into pipeline stages (single process): stages compose to the model, keep its parameter
names and objects, and bad stage lists fail with the checker's codes; the plan's pipeline is checked
against the pipeline axis before anything runs."""
from __future__ import annotations

import math
import re

import pytest
import torch
from torch import nn

from examples.gpt2.model import build as gpt2
from planlang.plan.resolve import resolve_text
from planlang.runtime.apply import PlanError, load_plan
from planlang.runtime.pipeline import pipeline_layout, plan_loss
from planlang.model.program.stages import StageSplitError, param_fqns, split_model, split_stages, stage_values
from tests.runtime.pipeline_worker import SkipNet

GPT2_2 = [["wte", "wpe", "drop", "h[0:2]"], ["h[2:4]", "ln_f", "lm_head"]]


def _gpt2(**kw):
    torch.manual_seed(0)
    return gpt2(layers=4, hidden=32, heads=4, vocab=64, seq=8, **kw)


def _chain(stages, *inputs):
    out = inputs
    for s in stages:
        out = s(*out)
    return out


def _idx():
    return torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("stages", [
    GPT2_2,
    [["wte", "wpe", "drop", "h[0]"], ["h[1]"], ["h[2]"], ["h[3]", "ln_f", "lm_head"]],
    # a cut inside a block: the block's residual additions are placed by data flow
    [["wte", "wpe", "drop", "h[0]", "h[1].ln_1", "h[1].attn"], ["h[1].ln_2", "h[1].mlp", "h[2:4]", "ln_f", "lm_head"]],
])
def test_stages_compose_to_the_model_forward_and_backward(stages):
    model = _gpt2()
    parts = split_model(model, stages)
    assert len(parts) == len(stages)
    idx = _idx()
    ref = model(idx)
    out = _chain(parts, idx)
    assert torch.equal(out, ref)
    grads_ref = torch.autograd.grad(ref.square().mean(), list(model.parameters()))
    grads = torch.autograd.grad(out.square().mean(), list(model.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(grads, grads_ref))


def test_parameters_keep_their_names_and_objects():
    model = _gpt2()
    parts = split_model(model, GPT2_2)
    names = [n for p in parts for n, _ in p.named_parameters()]
    assert sorted(names) == sorted(n for n, _ in model.named_parameters())  # each exactly once
    assert {n for n, _ in parts[0].named_parameters()} >= {"wte.weight", "h.1.mlp.c_proj.bias"}
    for p in parts:
        assert param_fqns(p) == {n: n for n, _ in p.named_parameters()}
        for n, t in p.named_parameters():
            assert t is model.get_parameter(n)


def test_inside_block_cut_carries_the_residual():
    model = _gpt2()
    vals = stage_values(model, [["wte", "wpe", "drop", "h[0]", "h[1].ln_1", "h[1].attn"],
                                ["h[1].ln_2", "h[1].mlp", "h[2:4]", "ln_f", "lm_head"]])
    assert vals[0].inputs == ("idx",)
    assert len(vals[0].outputs) == 1 and vals[1].inputs == vals[0].outputs  # the sum x + attn(ln_1(x))
    assert vals[0].outputs[0].startswith("add")


def test_values_skip_stages_and_inputs_reach_late_stages():
    model = SkipNet()
    stages = [["a"], ["b"], ["c", "e"], ["d", "emb"]]
    vals = stage_values(model, stages)
    assert vals[0].inputs == ("x", "idx")
    assert "tanh" in vals[1].outputs and "tanh" in vals[2].outputs  # h passes through stages 1 and 2
    assert "idx" in vals[2].inputs and "x" not in vals[3].inputs
    x, idx = torch.randn(3, 16), torch.tensor([1, 2, 3])
    assert torch.equal(_chain(split_model(model, stages), x, idx), model(x, idx))


def test_split_stages_reads_the_plan():
    res = resolve_text(
        'use hardware\nmodel g = "examples.gpt2.model:build"(layers = 4, hidden = 32, heads = 4, vocab = 64, seq = 8)\n'
        "input idx : i64[batch = 2, seq = 8]\n"
        "mesh m of 2 x hardware.cpu {\n    pp = 2 over hardware.loopback\n}\n"
        "pipeline over pp schedule 1f1b microbatches 2 {\n    stage wte, wpe, drop, h[0:2]\n"
        "    stage h[2:4], ln_f, lm_head\n}\n", "t.plan")
    model = _gpt2()
    idx = _idx()
    assert torch.equal(_chain(split_stages(model, res.plan), idx), model(idx))


# ------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("stages, code, words", [
    ([["wte", "wpe", "drop", "h[0:2]"], ["h[2:4]", "lm_head"]], "PL460", "ln_f"),
    ([["h[2:4]", "ln_f", "lm_head"], ["wte", "wpe", "drop", "h[0:2]"]], "PL462", "runs after"),
    ([["wte", "wpe", "drop", "h[0:3]"], ["h[2:4]", "ln_f", "lm_head"]], "PL461", "h[2]"),
    ([["wte", "wpe", "drop", "h"], ["h[3]", "ln_f", "lm_head"]], "PL461", "h[3]"),
    ([["wte", "wpe", "drop", "h[0:2]"], ["h[2:4]", "ln_final", "lm_head"]], "PL360", "ln_final"),
    ([["wte", "wpe", "drop", "h[0:2]", "h[3]"], ["h[2]", "ln_f", "lm_head"]], "PL462", "h[3]"),
])
def test_bad_stage_lists_name_cause_and_code(stages, code, words):
    with pytest.raises(StageSplitError) as err:
        split_model(_gpt2(), stages)
    assert err.value.code == code and words in err.value.message and err.value.help


def test_tied_parameter_across_stages_is_held_by_both_stages():
    """A weight tied across stages (GPT-2's wte and lm_head) is in both stage modules, which compose to
    the model; planlang.runtime.pipeline sums the copies' gradients over the pipeline axis (PL463 says so)."""
    from planlang.runtime.pipeline import tied_parameters

    model = _gpt2(tie_embeddings=True)
    first, second = split_model(model, GPT2_2)
    idx = _idx()
    assert torch.equal(second(*first(idx)), model(idx))
    assert dict(first.named_parameters())["wte.weight"] is dict(second.named_parameters())["lm_head.weight"]
    (tie,) = tied_parameters(model, [first, second])
    assert set(tie.names) == {"wte.weight", "lm_head.weight"}
    (only,) = split_model(model, [["wte", "wpe", "drop", "h", "ln_f", "lm_head"]])
    assert torch.equal(only(idx), model(idx))
    assert tied_parameters(model, [only]) == []


class _Untraceable(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        h = self.a(x)
        if h.sum() > 0:  # data-dependent control flow between the stages' modules
            h = -h
        return self.b(h)


class _SizeAcross(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        h = self.a(x)
        return self.b(h) * h.size(1)  # an int computed from stage 0's output, used in stage 1


def test_untraceable_glue_is_reported():
    with pytest.raises(StageSplitError, match="cannot trace") as err:
        split_model(_Untraceable(), [["a"], ["b"]])
    assert "select the module" in err.value.help


def test_a_python_value_crossing_a_boundary_is_reported_when_it_runs():
    first, second = split_model(_SizeAcross(), [["a"], ["b"]])
    with pytest.raises(StageSplitError, match="send tensors only") as err:
        first(torch.randn(2, 4))
    assert "size" in err.value.message


# ------------------------------------------------------------------------------ the plan's pipeline
def _plan(pipeline: str, mesh: str = "pp = 2 over hardware.loopback", data: str = ""):
    devices = math.prod(int(n) for n in re.findall(r"= (\d+) over", mesh))  # the mesh's devices, as PL301 asks
    text = ("use hardware\nmodel g = "
            '"examples.gpt2.model:build"(layers = 4, hidden = 32, heads = 4, vocab = 64, seq = 8)\n'
            f"input idx : i64[batch = 8, seq = 8]\nmesh m of {devices} x hardware.cpu {{\n    {mesh}\n}}\n{data}\n"
            f"{pipeline}\n")
    return resolve_text(text, "t.plan").plan


FOUR = "{\n    stage wte, wpe, drop, h[0]\n    stage h[1]\n    stage h[2]\n    stage h[3], ln_f, lm_head\n}"
TWO = "{\n    stage wte, wpe, drop, h[0:2]\n    stage h[2:4], ln_f, lm_head\n}"


def test_layout_of_each_schedule():
    lay = pipeline_layout(load_plan(_plan("pipeline over pp schedule interleaved chunks 2 microbatches 4 " + FOUR)))
    assert (lay.num_stages, lay.stages_per_rank, lay.stages_of(0), lay.stages_of(1)) == (4, 2, [0, 2], [1, 3])
    lay = pipeline_layout(load_plan(_plan("pipeline over pp schedule 1f1b microbatches 2 " + TWO)))
    assert lay.stages_of(1) == [1] and lay.microbatches == 2


# the pipeline runtime runs what the checker accepts: a schedule that does not fit the pipeline axis is
# refused with the checker's code when the plan loads (the runtime restates none of these rules)
@pytest.mark.parametrize("pipeline, code, words", [
    ("pipeline over pp schedule 1f1b microbatches 4 " + FOUR, "PL401", "4 stages but pp(2) = 2 are needed"),
    ("pipeline over pp schedule gpipe microbatches 4 " + FOUR, "PL401", "4 stages but pp(2) = 2 are needed"),
    ("pipeline over pp schedule 1f1b microbatches 1 " + TWO, "PL416", "at least as many microbatches"),
    ("pipeline over pp schedule interleaved chunks 3 microbatches 4 " + FOUR, "PL401", "pp(2) * chunks(3) = 6"),
    ("pipeline over pp schedule interleaved chunks 2 microbatches 5 " + FOUR, "PL402", "5 % 2 = 1"),
])
def test_layout_errors_are_the_checkers(pipeline, code, words):
    with pytest.raises(PlanError, match=re.escape(f"error[{code}]")) as err:
        load_plan(_plan(pipeline))
    assert words in str(err.value) and "help:" in str(err.value)


def test_a_pipeline_with_holes_is_refused_before_the_runtime():
    # the runtime takes a CompletePlan: holes stop at load_plan (planlang.plan.complete), named with their place
    with pytest.raises(PlanError, match=re.escape("holes (`?`): microbatches at t.plan:")):
        load_plan(_plan("pipeline over pp schedule 1f1b microbatches ? " + TWO))


def test_data_axes_and_loss_follow_the_plan():
    plan = _plan("pipeline over pp schedule 1f1b microbatches 2 " + TWO,
                 mesh="dp = 2 over hardware.loopback\n    pp = 2 over hardware.loopback", data="data idx : [dp, _]")
    assert load_plan(plan).dims.data == ("dp",)
    assert load_plan(_plan("pipeline over pp schedule 1f1b microbatches 2 " + TWO)).dims.data == ()
    from examples.gpt2 import model as gpt2_module

    assert plan_loss(plan) is gpt2_module.loss
