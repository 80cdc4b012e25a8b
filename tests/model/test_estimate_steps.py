"""estimate_steps: each row's step time and parameter bytes from the local model's profile alone are the
ones estimate_plan gives (the solver bounds candidates out by them, planlang.solve.driver), exactly."""
from __future__ import annotations

from pathlib import Path

import pytest

from planlang.model import estimate as E
from planlang.plan.complete import complete
from planlang.plan.checker import check_text

ROOT = Path(__file__).resolve().parents[2]
GPT3D = (ROOT / "examples" / "gpt2" / "gpt2_3d.plan").read_text().replace("layers = 12", "layers = 4").replace(
    "stage h[6:12], ln_f, lm_head", "stage h[2:4], ln_f, lm_head").replace("h[0:6]", "h[0:2]")
VARIANTS = {
    "3d, 1f1b, zero 1, checkpoints": GPT3D,
    "interleaved": GPT3D.replace("schedule 1f1b microbatches 8 {\n    stage wte, wpe, drop, h[0:2]\n"
                                 "    stage h[2:4], ln_f, lm_head\n}",
                                 "schedule interleaved chunks 2 microbatches 8 {\n    stage wte, wpe, drop, h[0]\n"
                                 "    stage h[1]\n    stage h[2]\n    stage h[3], ln_f, lm_head\n}"),
    "zero 3, no pipeline": GPT3D.replace("zero = 1 over dp", "zero = 3 over dp").replace(
        "    pp = 2 over hardware.infiniband_200g\n", "").replace("dp = 2 over", "dp = 4 over").split(
        "# 1F1B")[0] + "checkpoint h[*] every 2\n",
}


@pytest.mark.parametrize("name", list(VARIANTS) + ["bf16", "bert_tp"])
def test_steps_alone_are_the_estimates_steps(name):
    if name in VARIANTS:
        res = check_text(VARIANTS[name], str(ROOT / "examples" / "gpt2" / "variant.plan"))
    else:
        path = {"bf16": "examples/gpt2/gpt2_bf16.plan", "bert_tp": "examples/templates/bert_tp.plan"}[name]
        res = check_text((ROOT / path).read_text(), str(ROOT / path))
    assert not res.errors, res.diagnostics
    plan = complete(res.plan)
    cache: dict = {}
    steps = E.estimate_steps(plan, cache=cache)  # the profile first, as the solver does
    rows = E.estimate_plan(plan, cache=cache)
    assert steps == tuple((r.step_time, r.parameters) for r in rows)
    assert E.estimate_plan(plan, cache={}) == rows  # and the same estimate as without the profile first
