"""bench/plan_quality.py's pipeline partitioner rows: on a configuration with a pipeline, the best grid plan
with one is re-cut by every stage method `planlang solve` has, each plan checks clean and is priced; a
configuration without a pipeline has no such rows; the summary lists rows some configurations lack."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.plan_configs.configs import MAP, MMR  # noqa: E402
from bench.plan_configs.plans import Layout, plan_text  # noqa: E402
from bench.plan_quality import Outcome, pipeline_layout, stage_rows, summary  # noqa: E402

from planlang.plan.checker import check_text  # noqa: E402
from planlang.solve.space import STAGE_METHODS  # noqa: E402


def _grid_point(layout: str, step: float, fits: bool = True) -> Outcome:
    return Outcome("Megatron grid", layout, 1, step, fits)


def test_stage_hole_and_stage_lines_check():
    beta = MAP[1]
    path = str(ROOT / "bench" / "plan_configs" / f"{beta.slug}.plan")
    hole = check_text(plan_text(beta, Layout(1, 1, 2), "x", stages=()), path)
    assert hole.errors == 0 and len(hole.plan.holes()) == 1  # the stages, all else written
    lines = ["stage wte, wpe, drop, h[0:3]", "stage h[3], ln_f, lm_head"]
    cut = check_text(plan_text(beta, Layout(1, 1, 2), "x", stages=lines), path)
    assert cut.errors == 0 and not cut.plan.holes() and len(cut.plan.pipeline.stages) == 2


def test_partitioner_rows_on_a_pipeline_configuration():
    beta = MAP[1]  # 2 devices: the grid's layouts are dp2, tp2 and pp2; only pp2 has a pipeline
    from bench.plan_configs.plans import grid

    layouts = grid(beta)
    points = [_grid_point(str(lay), 1.0 + i) for i, lay in enumerate(layouts)]
    lay, _ = pipeline_layout(beta, points)
    assert lay.pp == 2
    rows = stage_rows(beta, points, None)
    names = [r.strategy for r in rows]
    assert names == ["stages: equal blocks"] + [f"stages: {m}" for m in STAGE_METHODS]
    for r in rows[1:]:
        assert r.peak is not None and r.step is not None and r.layout == str(lay), r
        assert r.note.startswith("cut ") and r.note.count(" | ") == lay.pp - 1


def test_no_rows_without_a_pipeline_and_summary_takes_the_union():
    one_layer = MMR[0]
    assert stage_rows(one_layer, [_grid_point("dp=2 tp=1 pp=1", 1.0)], None) == []
    ref = Outcome("Megatron grid (best)", "-", 10, 1.0, True)
    text = summary([(one_layer, [ref]), (MAP[1], [ref, Outcome("stages: alpa", "-", 5, 2.0, True)])])
    line = next(ln for ln in text.splitlines() if ln.startswith("stages: alpa"))
    assert line.split()[2:4] == ["1", "1"] and "0.50..0.50" in line and "2.00..2.00" in line
