"""planlang.plan.complete: a plan without holes as a CompletePlan whose fields are concrete."""
import dataclasses
import textwrap

import pytest

from planlang.plan import types as T
from planlang.plan.checker import check_text
from planlang.plan.complete import (
    CompleteAxis, CompleteCheckpointGroup, CompleteDataSpec, CompleteMesh, CompleteOptimizer, CompletePipeline,
    CompletePlan, CompleteSchedule, CompleteShardRule, CompleteStage, IncompletePlan, complete,
)

PLAN = textwrap.dedent("""\
    device gpu { memory = 80 GiB }
    link nv { bandwidth = 300 GB/s }
    model m = "examples.gpt2.model:build"(layers = 4, hidden = 64, heads = 4, vocab = 128, seq = 16)
    input idx : i64[batch = 8, seq = 16]
    mesh ranks of 8 x gpu {
        pp = 2 over nv
        dp = DP over nv
        tp = 2 over nv
    }
    budget 40 GiB per device
    optimizer adamw(lr = 0.001) { zero = ZERO over dp }
    data idx : DATA
    shard wte.weight : [tp, _]
    shard lm_head.weight : SPEC
    pipeline over pp schedule interleaved chunks 2 microbatches MICRO {
        stage wte, wpe, drop, h[0]
        stage h[1]
        stage h[2]
        stage h[3], ln_f, lm_head
    }
    checkpoint h[0:4] every EVERY
""")

FILLED = dict(DP="2", ZERO="1", DATA="[dp, _]", SPEC="[tp, _]", MICRO="4", EVERY="2")


def _text(**values) -> str:
    text = PLAN
    for k, v in (FILLED | values).items():
        text = text.replace(k, v)
    return text


def _plan(**values) -> T.Plan:
    res = check_text(_text(**values), "p.plan")
    errors = [str(d) for d in res.diagnostics if d.severity.value == "error"]
    assert res.plan is not None and not errors, errors
    return res.plan


def test_a_plan_without_holes_converts_with_concrete_fields():
    c = complete(_plan())
    assert isinstance(c, CompletePlan) and isinstance(c, T.Plan)
    assert isinstance(c.mesh, CompleteMesh) and all(isinstance(a, CompleteAxis) for a in c.mesh.axes)
    assert c.mesh.shape == (2, 2, 2) and c.mesh.size == 8 and all(type(a.size) is int for a in c.mesh.axes)
    assert isinstance(c.optimizer, CompleteOptimizer) and (c.optimizer.zero_stage, c.optimizer.zero_axis) == (1, "dp")
    assert all(isinstance(d, CompleteDataSpec) and type(d.spec) is T.Spec and not d.spec.has_holes for d in c.data)
    assert all(isinstance(r, CompleteShardRule) and type(r.spec) is T.Spec and not r.spec.has_holes
               for r in c.shards)
    p = c.pipeline
    assert isinstance(p, CompletePipeline) and (p.axis, p.microbatches) == ("pp", 4)
    assert isinstance(p.schedule, CompleteSchedule) and (p.schedule.kind, p.schedule.chunks) == ("interleaved", 2)
    assert len(p.stages) == 4 and all(isinstance(st, CompleteStage) for st in p.stages)
    assert [type(g) for g in c.checkpoints] == [CompleteCheckpointGroup] and c.checkpoints[0].every == 2
    assert c.checkpoint_hole is None and c.holes() == []
    assert complete(c) is c  # already complete: the same value


def _fields(value) -> dict:
    """Every field, spans and other compare=False ones included, nested dataclasses as dicts of theirs."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _fields(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple):
        return tuple(_fields(v) for v in value)
    return value


def test_the_round_trip_keeps_every_field():
    plan = _plan()
    c = complete(plan)
    assert _fields(c) == _fields(plan)
    # spans and origins (compare=False) are kept too, and the specs are the plan's own values
    assert c.mesh.axes[1].span == plan.mesh.axes[1].span and c.pipeline.span == plan.pipeline.span
    assert [r.spec for r in c.shards] == [r.spec for r in plan.shards]
    assert str(c.pipeline) == str(plan.pipeline) and str(c.optimizer) == str(plan.optimizer)
    # a complete plan is still a plan: the plan layer's readers take it unchanged
    from planlang.plan.data import data_axes
    assert data_axes(c) == data_axes(plan) == ("dp",)


def test_a_plan_without_a_mesh_or_pipeline_converts():
    res = check_text('model m = "examples.mlp:build"()\ninput x : f32[batch = 4, f = 8]\n', "q.plan")
    assert res.plan is not None and not res.errors
    c = complete(res.plan)
    assert c.mesh is None and c.pipeline is None and c.optimizer is None


def test_a_plan_with_holes_raises_naming_each_hole_and_where():
    plan = _plan(DP="?", ZERO="?", SPEC="?", MICRO="?", EVERY="?")
    holes = plan.holes()
    assert len(holes) == 5
    with pytest.raises(IncompletePlan) as err:
        complete(plan)
    assert err.value.holes == holes
    msg = str(err.value)
    assert msg.startswith("p.plan has 5 holes (`?`): ") and msg.endswith("run `planlang solve p.plan` first")
    lines = _text(DP="?", ZERO="?", SPEC="?", MICRO="?", EVERY="?").splitlines()
    for h in holes:
        assert f"{h.what} at p.plan:{h.span.line}:{h.span.col}" in msg
        assert lines[h.span.line - 1][h.span.col - 1] == "?"  # each location is the `?` itself


def test_a_hole_inside_a_spec_is_named():
    plan = _plan(DATA="[?, _]")
    with pytest.raises(IncompletePlan) as err:
        complete(plan)
    (hole,) = err.value.holes
    assert hole.what == "spec entry"
    assert (hole.span.line, hole.span.col) == (PLAN.splitlines().index("data idx : DATA") + 1, len("data idx : [") + 1)
    assert str(hole.span) in str(err.value)
