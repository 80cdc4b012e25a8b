"""Stages of their own degrees, without processes (planlang.runtime.stage_rows, heterogeneous): every value
crossing a boundary between stages of different degrees has a conversion from each stage's program layout
to the plain layout it crosses in and back (a stage with a data axis of one device included), tied
parameters whose pieces differ between stages (ZeRO-2/3 over data axes of different sizes) are refused,
and `microbatch_major` orders a replica's rows as the boundaries move them."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from planlang.cost.layout import conversion_path
from planlang.model.capture.load import build_model, plan_loss
from planlang.model.program.pipeline_program import cut_program, microbatch_plan
from planlang.plan.complete import plan_mesh, plan_model
from planlang.plan.stage_meshes import stage_plan
from planlang.runtime.apply import load_plan
from planlang.runtime.heterogeneous import _same_tied_pieces
from planlang.runtime.pipeline import PipelineError
from planlang.runtime.plan_lowering import lower_plan
from planlang.runtime.stage_rows import boundary_rows, microbatch_major

PLANS = Path(__file__).parent / "plans"
BASE = (PLANS / "gpt2_pp2_hetero.plan").read_text()


def _lowered(tmp_path: Path, text: str):
    path = tmp_path / "p.plan"
    path.write_text(text)
    plan = load_plan(path)
    model = build_model(plan_model(plan), plan.path, device="meta")
    loss = plan_loss(plan, model)
    plans = [stage_plan(plan, s) for s in range(len(plan.pipeline.stages))]
    progs = [lower_plan(model, microbatch_plan(p), loss) for p in plans]
    return plans, progs, [cut_program(pr, p) for pr, p in zip(progs, plans)]


@pytest.mark.parametrize("first, second", [("with dp = 4, tp = 1", ""), ("", "with dp = 4, tp = 1"),
                                           ("with dp = 1, tp = 4", "with dp = 4, tp = 1"),
                                           ("with dp = 4, tp = 1", "with dp = 1, tp = 4")])
def test_every_boundary_value_converts_both_ways(tmp_path, first, second):
    text = BASE.replace("h[0:2] with dp = 4, tp = 1", f"h[0:2] {first}").replace(
        "stage h[2:4], ln_f, lm_head", f"stage h[2:4], ln_f, lm_head {second}")
    plans, progs, cuts = _lowered(tmp_path, text)
    rows = boundary_rows(plans, progs, cuts)
    moved = 0
    for s, r in enumerate(rows):
        assert r is not None  # the two stages' shapes differ: both sides convert
        mesh = plan_mesh(plans[s])
        for mv in r.inputs + r.outputs:
            assert mv is not None
            # a data axis of one device splits nothing: the crossing layout never names it
            assert all(mesh.size_of(a) > 1 for d in mv.crossing.dims for a in d), mv
            src, dst = (mv.crossing, mv.layout) if mv in r.inputs else (mv.layout, mv.crossing)
            conversion_path(mv.shape, src, dst, mesh)  # raises NoPath when there is none
            moved += mv.batched
    assert moved == 2  # the residual stream, by rows, on both sides


def test_a_tied_parameter_sharded_by_zero_over_data_axes_of_different_sizes_is_refused(tmp_path):
    tied = BASE.replace("seq = 16)", "seq = 16, tie_embeddings = true)")
    _same_tied_pieces(*_lowered(tmp_path, tied))  # ZeRO-1: each stage holds the tied wte whole
    with pytest.raises(PipelineError, match=r"`wte.weight` is read by stages of different degrees .* sharded over "
                                            r"dp\(4\) by ZeRO-3 in stage 0"):
        _same_tied_pieces(*_lowered(tmp_path, tied.replace("zero = 1 over dp", "zero = 3 over dp")))


def test_microbatch_major_puts_each_microbatch_as_the_shares_concatenated():
    shares, m, rows = 2, 3, 4  # two devices' shares of 3 microbatches of 4 rows each
    t = torch.arange(shares * m * rows)
    got = microbatch_major(t, shares, m)
    for i, micro in enumerate(got.chunk(m)):  # the schedule's cut into microbatches
        expected = torch.cat([t[k * m * rows + i * rows:k * m * rows + (i + 1) * rows] for k in range(shares)])
        assert torch.equal(micro, expected)
    assert microbatch_major(t, 1, m) is t
