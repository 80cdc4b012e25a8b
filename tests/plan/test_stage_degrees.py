"""The checker on stages of their own degrees (`stage ... with dp = 4, tp = 1`): PL410 (the devices add up),
PL418 (what the runtime does not run as written) and PL305 under each stage's degrees."""
from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from planlang.plan.checker import check_file, check_text

REPO = Path(__file__).resolve().parents[2]
PLANS = REPO / "tests" / "runtime" / "plans"


def _mesh(order: tuple[str, ...] = ("pp", "dp", "tp")) -> str:
    return ("device gpu { memory = 80 GiB }\nlink nv { bandwidth = 300 GB/s }\n"
            "input idx : i64[batch = BATCH, seq = 16]\n"
            "mesh m of 8 x gpu {\n" + "".join(f"    {a} = 2 over nv\n" for a in order) + "}\n"
            "data idx : [dp, _]\n")


def check(stages: list[str], schedule: str = "1f1b", order: tuple[str, ...] = ("pp", "dp", "tp"),
          batch: int = 16, microbatches: int = 4):
    body = "".join(f"    stage h[{2 * i}:{2 * i + 2}]{w}\n" for i, w in enumerate(stages))
    text = (_mesh(order).replace("BATCH", str(batch))
            + f"pipeline over pp schedule {schedule} microbatches {microbatches} {{\n{body}}}\n")
    return check_text(text, path="t.plan")


def errors(res) -> list[str]:
    return sorted(d.code for d in res.diagnostics if d.severity.name == "ERROR")


def only(res, code: str):
    (d,) = [d for d in res.diagnostics if d.code == code]
    assert errors(res) == [code], [str(x) for x in res.diagnostics]
    return d


@pytest.mark.parametrize("name", ["gpt2_pp2_hetero.plan", "gpt2_pp2_hetero_reverse.plan"])
def test_the_example_heterogeneous_plans_check_clean(name):
    res = check_file(str(PLANS / name))
    assert res.plan is not None and errors(res) == [], [str(d) for d in res.diagnostics]
    assert not {d.code for d in res.diagnostics} & {"PL410", "PL418", "PL305"}


def test_dp4_then_dp2_x_tp2_runs_in_either_order_and_with_tensor_parallelism_in_both():
    for stages in ([" with dp = 4, tp = 1", ""], ["", " with dp = 4, tp = 1"], [" with dp = 1, tp = 4", ""],
                   [" with dp = 4, tp = 1", " with dp = 1, tp = 4"]):
        assert errors(check(stages)) == [], stages


@pytest.mark.parametrize("schedule,stages", [("interleaved chunks 2", 4), ("looped_bfs chunks 2", 4),
                                             ("zbv chunks 2", 4), ("dualpipev chunks 2", 4)])
def test_a_chunked_schedule_with_degrees_is_pl418(schedule, stages):
    """Several stages share a pipeline rank's devices: stages of their own degrees run one per rank. The
    devices add up (counted once per rank), so it is not PL410."""
    res = check([" with dp = 4, tp = 1"] + [""] * (stages - 1), schedule=schedule, batch=32, microbatches=8)
    d = only(res, "PL418")
    assert "stages on each pipeline rank" in d.message and (d.span.line, d.span.col) == (res.plan.pipeline.stages[0].span.line, 5)
    # restating the mesh's sizes is no stage of its own degrees
    assert errors(check([" with dp = 2, tp = 2"] + [""] * (stages - 1), schedule=schedule, batch=32, microbatches=8)) == []


def test_unequal_device_counts_are_pl418_and_counts_that_do_not_add_up_pl410():
    # 2 + 6 = 8 devices: PL410 holds, but pipeline rank 0 has 4 devices, not 2
    d = only(check([" with dp = 2, tp = 1", " with dp = 2, tp = 3"], batch=24), "PL418")
    assert d.message.startswith("stage 0 runs on 2 devices, but each pipeline rank has 4")
    # 2 + 4 = 6 devices on a mesh of 8: PL410, and nothing more
    d = only(check([" with dp = 2, tp = 1", ""]), "PL410")
    assert "2 + 4 = 6 devices, but the mesh has 8" in d.message


def test_a_degree_of_the_pipeline_axis_is_pl410():
    d = only(check([" with pp = 1", ""]), "PL410")
    assert "pipeline axis `pp`" in d.message


def test_the_pipeline_axis_not_first_is_pl418():
    res = check([" with dp = 4, tp = 1", ""], order=("dp", "pp", "tp"))
    d = only(res, "PL418")
    assert "not the mesh's first axis" in d.message and d.span.line == res.plan.pipeline.span.line
    assert "declare `pp` first" in d.help
    # the mesh's own sizes on such a mesh are fine: only stages of their own degrees need pp first
    assert errors(check(["", ""], order=("dp", "pp", "tp"))) == []


def test_positions_holding_different_rows_are_pl418_and_the_data_axis_before_the_tensor_axis_fixes_it():
    """On `pp, tp, dp` with the batch over dp, device 1 of a rank (tp 0, dp 1) holds the second replica's
    first half (chunk 2 of 4) on the mesh's sizes, but chunk 1 under dp = 4."""
    res = check(["", " with dp = 4, tp = 1"], order=("pp", "tp", "dp"))
    d = only(res, "PL418")
    assert d.message.startswith("device 1 of a pipeline rank holds rows 2 of 4 of each microbatch in stage 0 but "
                                "rows 1 in stage 1")
    assert d.span.line == res.plan.pipeline.stages[1].span.line
    assert errors(check(["", " with dp = 4, tp = 1"], order=("pp", "dp", "tp"))) == []


def test_pl418_for_positions_agrees_with_the_rows_each_device_holds():
    """Over both orders of dp and tp and every pair of stage shapes of 4 devices per rank: PL418 exactly
    when some position holds other rows in the two stages (test_stage_meshes.rows_by_position)."""
    from .test_stage_meshes import rows_by_position

    shapes = [(4, 1), (2, 2), (1, 4)]
    seen = set()
    for order in (("pp", "dp", "tp"), ("pp", "tp", "dp")):
        for a, b in itertools.product(shapes, repeat=2):
            stages = [f" with dp = {dp}, tp = {tp}" for dp, tp in (a, b)]
            held = []
            for dp, tp in (a, b):
                size = {"pp": 2, "dp": dp, "tp": tp}
                held.append(rows_by_position(tuple((x, size[x]) for x in order), "pp", ("dp",), 16)[0])
            differ = held[0] != held[1]
            assert (errors(check(stages, order=order)) == ["PL418"]) == differ, (order, a, b)
            assert differ or errors(check(stages, order=order)) == []
            seen.add(differ)
    assert seen == {True, False}


def test_a_batch_a_stages_data_degree_does_not_divide_is_pl305_in_that_stage():
    # 12 rows: 12 % (dp(2) * 2 microbatches) = 0 on the mesh, 12 % (dp(4) * 2) = 4 in stage 0
    res = check([" with dp = 4, tp = 1", ""], batch=12, microbatches=2)
    d = only(res, "PL305")
    assert d.message == "in stage 0 (dp = 4, tp = 1): batch 12 is not divisible by dp(4) * microbatches(2) = 8"
    stage = res.plan.pipeline.stages[0]
    assert any(lab.span == stage.span and lab.message == "stage 0 runs on dp = 4, tp = 1" for lab in d.labels)
    # the same batch under the mesh's sizes in both stages is fine; a multiple of 8 is fine in stage 0
    assert errors(check(["", ""], batch=12, microbatches=2)) == []
    assert errors(check([" with dp = 4, tp = 1", ""], batch=16, microbatches=2)) == []


def test_pl305_is_reported_once_per_distinct_stage_shape():
    res = check([" with dp = 4, tp = 1"] * 2, batch=12, microbatches=2)
    assert [d.message.split(":")[0] for d in res.diagnostics if d.code == "PL305"] == ["in stage 0 (dp = 4, tp = 1)"]


def test_a_batch_that_does_not_share_out_at_a_boundary_is_pl305():
    """A boundary between stages of different degrees passes on an equal share of each microbatch's rows
    per device of the pipeline rank: batch 8 in 4 microbatches leaves 2 rows for 4 devices. The same batch
    with the stages' degrees equal moves nothing and checks."""
    res = check([" with dp = 1, tp = 4", ""], batch=8, microbatches=4)
    d = only(res, "PL305")
    assert "not divisible by the 4 devices of a pipeline rank * microbatches(4) = 16" in d.message
    assert errors(check(["", ""], batch=8, microbatches=4)) == []


def test_data_parallelism_a_stage_cannot_run_on_its_sizes_is_reported_in_that_stage():
    """ZeRO-3 in a pipeline shards each stage over its ZeRO axis alone (PL415): a stage whose own sizes
    split the batch over a second axis is refused there, though the mesh's sizes (cp = 1) run."""
    text = ("device gpu { memory = 80 GiB }\nlink nv { bandwidth = 300 GB/s }\n"
            "mesh m of 8 x gpu {\n    pp = 2 over nv\n    dp = 4 over nv\n    cp = 1 over nv\n}\n"
            "input idx : i64[batch = 32, seq = 128]\ndata idx : [(dp, cp), _]\n"
            "optimizer adamw(lr = 0.001) { zero = 3 over dp }\n"
            "pipeline over pp schedule 1f1b microbatches 2 {\n    stage h[0:6]\n    stage h[6:12] with dp = 2, cp = 2\n}\n")
    d = only(check_text(text, path="t.plan"), "PL415")
    assert d.message.startswith("in stage 1 (dp = 2, cp = 2): ")
    assert errors(check_text(text.replace(" with dp = 2, cp = 2", ""), path="t.plan")) == []
