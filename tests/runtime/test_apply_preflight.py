"""Checks without processes: `verify.preflight` (what apply refuses, found before torchrun starts) and
`planlang lower` for pipeline plans."""
from __future__ import annotations

from pathlib import Path

import pytest

from planlang.runtime.apply import PlanError
from planlang.runtime.verify import preflight
from tests.runtime.apply_worker import PIPELINE, PIPELINE_3D, PIPELINE_TP, ZERO

PLANS = Path(__file__).parent / "plans"


@pytest.mark.parametrize("config", ZERO + PIPELINE + PIPELINE_TP + PIPELINE_3D)
def test_runnable_plans_pass(config):
    preflight(PLANS / f"{config}.plan")


def test_zero_over_a_non_data_axis_is_refused(tmp_path):
    text = (PLANS / "gpt2_dp2_tp2_zero1.plan").read_text().replace("zero = 1 over dp", "zero = 1 over tp")
    (tmp_path / "p.plan").write_text(text)
    with pytest.raises(PlanError, match=r"error\[PL504\] ZeRO over `tp`, which splits no input's batch"):
        preflight(tmp_path / "p.plan")


def _variant(tmp_path, config: str, old: str, new: str):
    text = (PLANS / f"{config}.plan").read_text()
    assert old in text
    (tmp_path / "p.plan").write_text(text.replace(old, new))
    return tmp_path / "p.plan"


def test_pipeline_schedule_rules_are_checked_before_launch(tmp_path):
    plan = _variant(tmp_path, "gpt2_pp4_1f1b", "microbatches 4", "microbatches 2")
    with pytest.raises(PlanError, match=r"PL416\] 1f1b needs at least as many microbatches as stages \(2 < 4\)"):
        preflight(plan)


def test_lower_prints_the_stages_a_pipeline_rank_holds():
    from planlang.runtime.apply import load_plan
    from planlang.runtime.launch import lower_source

    plan = load_plan(PLANS / "gpt2_pp2_dp2_zero1.plan")  # mesh pp=2 x dp=2: ranks 2, 3 have pp=1
    last = lower_source(plan, 3)
    assert "rank 3 (pp=1, dp=1)" in last and "holds stages [1]" in last
    assert "self.lm_head(" in last and "self.wte(" not in last
    first = lower_source(plan, 0)
    assert "holds stages [0]" in first and "self.wte(" in first and "self.lm_head(" not in first


def test_lower_prints_a_stage_of_its_own_degrees_on_its_sizes():
    """`planlang lower --rank R` on stages of their own degrees: rank R's stage's program, lowered on the
    stage's sizes with R's coordinates in them (stage 0 dp4, stage 1 dp2 x tp2), as apply runs it."""
    from planlang.runtime.apply import load_plan
    from planlang.runtime.launch import lower_source

    plan = load_plan(PLANS / "gpt2_pp2_hetero.plan")
    first, second = lower_source(plan, 3), lower_source(plan, 5)
    assert "rank 3 (pp=0, dp=3, tp=0)" in first and "cluster[pp=1, dp=4, tp=1]" in first
    assert "def stage_0(" in first and "def stage_1(" not in first
    assert "rank 5 (pp=1, dp=0, tp=1)" in second and "cluster[pp=1, dp=2, tp=2]" in second
    assert "def stage_1(" in second and "partial(tp)" in second  # its tensor-parallel boundary as received
