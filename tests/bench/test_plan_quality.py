"""bench/plan_quality.py's plan generation: every baseline and partial plan of every paper configuration
checks clean, the grid is the full set of valid factorizations, layouts say why they do not apply, and the
closed-form parameter counts match the factories (and the papers' stated sizes)."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.plan_configs.configs import CAPTURE, CONFIGS, MAP, MMR  # noqa: E402
from bench.plan_configs.plans import (Layout, NotApplicable, baseline, grid, parameter_count,  # noqa: E402
                                      partial_text, plan_text, why_not)

from planlang.plan.checker import check_text  # noqa: E402


def _plans(cfg):
    out = [(f"grid {lay}", plan_text(cfg, lay, "grid")) for lay in grid(cfg)]
    for name in ("dp", "zero2", "pipeline"):
        try:
            lay = baseline(cfg, name)
        except NotApplicable:
            continue
        out.append((f"{name} {lay}", plan_text(cfg, lay, name)))
    return out


def _check(text, cfg):
    res = check_text(text, str(ROOT / "bench" / "plan_configs" / f"{cfg.slug}.plan"))
    return res, [f"{d.code} {d.message}" for d in res.diagnostics]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.slug)
def test_every_generated_plan_checks_clean(cfg):
    plans = _plans(cfg)
    assert plans, cfg.slug
    for name, text in plans:
        res, diags = _check(text, cfg)
        assert diags == [] and res.warnings == 0, f"{name}: {diags}"
        assert not res.plan.holes(), name
        sizes = {a.name: a.size for a in res.plan.mesh.axes}
        assert math.prod(sizes.values()) == cfg.devices, name
    res, diags = _check(partial_text(cfg), cfg)
    assert res.errors == 0 and res.warnings == 0, diags
    assert res.plan.holes(), "the partial plan leaves choices to the solver"


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.slug)
def test_grid_is_every_valid_factorization(cfg):
    n = cfg.devices
    brute = {Layout(dp, tp, pp) for dp in range(1, n + 1) for tp in range(1, n + 1) for pp in range(1, n + 1)
             if dp * tp * pp == n and why_not(cfg, Layout(dp, tp, pp)) is None}
    assert set(grid(cfg)) == brute
    assert len(grid(cfg)) == len(brute)  # no duplicates


def test_inapplicable_baselines_say_why():
    bert_large_4 = next(c for c in MMR if c.label == "BERT-Large" and c.devices == 4)
    with pytest.raises(NotApplicable, match="batch 2"):
        baseline(bert_large_4, "dp")
    with pytest.raises(NotApplicable, match="1 layer"):
        baseline(bert_large_4, "pipeline")
    delta = next(c for c in MAP if c.devices == 8)
    lay = baseline(delta, "pipeline")  # 4 layers on 8 devices: 4 stages, 2 replicas
    assert (lay.pp, lay.dp, lay.tp) == (4, 2, 1)
    assert baseline(delta, "zero2").zero == 2


def test_pipeline_stages_cover_the_blocks_in_equal_runs():
    cfg = CAPTURE[0]
    res, _ = _check(plan_text(cfg, Layout(2, 2, 4), "grid"), cfg)
    stages = res.plan.pipeline.stages
    assert len(stages) == 4
    text = "\n".join(str(s) for s in stages)
    for i in range(4):
        assert f"h[{8 * i}:{8 * (i + 1)}]" in text


# the papers' sizes: map Table 3 "#params(billion)"; capture Table I (2.6B / 6.7B counted with a tied head)
@pytest.mark.parametrize("cfg,billions", [(MAP[0], 0.409), (MAP[1], 1.221), (MAP[2], 4.053), (MAP[3], 14.550)],
                         ids=lambda x: getattr(x, "slug", str(x)))
def test_map_sizes_match_table_3(cfg, billions):
    assert parameter_count(cfg) / 1e9 == pytest.approx(billions, abs=0.002)


def test_capture_sizes_match_table_1_with_a_tied_head():
    for cfg, billions in zip(CAPTURE, (2.6, 6.7)):
        tied = parameter_count(cfg) - cfg.vocab * cfg.hidden
        assert tied / 1e9 == pytest.approx(billions, rel=0.03)


@pytest.mark.parametrize("cfg", [MMR[0], MAP[0]], ids=lambda c: c.slug)
def test_parameter_count_matches_the_factory(cfg):
    from planlang.model.capture.load import build_model

    res, _ = _check(plan_text(cfg, grid(cfg)[0], "grid"), cfg)
    model = build_model(res.plan.model, res.plan.path)
    assert sum(p.numel() for p in model.parameters()) == parameter_count(cfg)


def test_compare_prices_both_folders_with_this_estimator(tmp_path):
    # --compare: the same chosen plan in both folders is "same"; a folder without the plan is said so
    from bench.plan_quality import compare, ours_plan_name

    cfg = next(c for c in MMR if c.label == "BERT-Large" and c.devices == 2)
    before, after = tmp_path / "before", tmp_path / "after"
    for d in (before, after):
        d.mkdir()
        (d / ours_plan_name(cfg, "time")).write_text(plan_text(cfg, Layout(1, 2, 1), "grid"))
    (before / ours_plan_name(cfg, "memory")).write_text(plan_text(cfg, Layout(1, 2, 1), "grid"))
    lines = compare(before, after, [cfg]).splitlines()
    time_line = next(ln for ln in lines if " time " in ln)
    assert time_line.endswith("same") and "1.0000" in time_line
    assert "not compared" in next(ln for ln in lines if " memory " in ln)
    assert lines[-1] == "3 configuration x objective pairs: 2 not compared, 1 same"


def test_committed_partial_plans_are_current():
    # bench/plan_configs/partial/ holds the solver inputs the bench writes; they must match the generator
    folder = ROOT / "bench" / "plan_configs" / "partial"
    written = {p.stem for p in folder.glob("*.plan")}
    assert written == {c.slug for c in CONFIGS}
    for cfg in CONFIGS:
        assert (folder / f"{cfg.slug}.plan").read_text() == partial_text(cfg), cfg.slug
