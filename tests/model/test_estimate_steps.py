"""estimate_steps: what each row's step time comes from, from the local model's profile alone, gives the
steps estimate_plan gives with the same lowered program's collectives, exactly, and a lower bound on them
without those (the solver bounds candidates out by it, planlang.solve.driver)."""
from __future__ import annotations

from pathlib import Path

import pytest

from planlang.model.price import estimate as E
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
    from planlang.model.price.step_time import lowered_traffic

    inputs = E.estimate_steps(plan, cache=cache)  # the profile first, as the solver does
    rows = E.estimate_plan(plan, cache=cache)
    try:
        lowered = lowered_traffic(plan)
    except Exception:  # noqa: BLE001 - the estimate prices it from the parameters and says so
        lowered = None
        assert all(any("could not be lowered" in n for n in r.notes) for r in rows)
    assert [st.total for st in inputs.steps(plan, lowered)] == [r.step_time for r in rows]
    assert [st.total for st in inputs.steps(plan, lowered)] == [r.step.total for r in rows]
    bound = inputs.lower_bound(plan)
    assert all(b.total <= r.step_time for b, r in zip(bound, rows))
    if lowered is not None and any(t.transfers for t in lowered):
        assert any(b.total < r.step_time for b, r in zip(bound, rows))  # the collectives cost something
    assert E.estimate_plan(plan, cache={}) == rows  # and the same estimate as without the profile first
