"""A weight tied across pipeline ranks (GPT-2's wte and lm_head) under ZeRO-2/3: FSDP2 wraps each stage
and replaces its parameters, which used to untie the copies before the pipeline looked for them, so the
tied gradient was never summed over pp (wte.weight's gradient off by 0.79). One launch of 4 gloo ranks:
ZeRO-3 with 1F1B, and ZeRO-2 in f16 with interleaved 1F1B and checkpointing."""
from __future__ import annotations

import pytest

from tests.runtime import apply_worker

PLANS = ("gpt2_pp2_dp2_zero3_tied", "gpt2_pp2_dp2_zero2_tied_f16")


@pytest.mark.parametrize("config", PLANS)
def test_the_tied_gradient_is_whole_under_zero(config):
    r = apply_worker.launch(PLANS, apply_worker.WORLD)[0][config]
    assert "error" not in r, r.get("error")
    apply_worker.assert_within_bounds(r["rows"])
    assert r["report"]["model"] == "PipelinedModel" and r["report"]["fsdp_axes"] == ["dp"]
