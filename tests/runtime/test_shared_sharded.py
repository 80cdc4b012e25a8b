"""A V's rank 0 holds the embedding's stage and the head's: with the weights tied, ZeRO-2/3 would make each stage
an FSDP2 unit with its own copy of the one parameter, and one copy would not train. The runtime refuses it
(planlang.runtime.pipeline.refuse_sharded_shared) and names the fix; the same under ZeRO-1 or a round-robin
schedule is fine."""
from __future__ import annotations

import pytest

from planlang.plan.checker import check_text
from planlang.plan.complete import complete
from planlang.runtime.pipeline import PipelineError, pipeline_layout, refuse_sharded_shared

PLAN = """use hardware
model gpt2 = "examples.gpt2.model:build"(layers = 2, hidden = 64, heads = 4, vocab = 128, seq = 16, tie_embeddings = true)
input idx : i64[batch = 8, seq = 16]
mesh ranks of 4 x hardware.cpu {{
    pp = 2 over hardware.loopback
    dp = 2 over hardware.loopback
}}
optimizer adamw(lr = 0.001) {{ zero = {zero} over dp }}
data idx : [dp, _]
pipeline over pp schedule {schedule} chunks 2 microbatches 4 {{
    stage wte, wpe, drop
    stage h[0]
    stage h[1]
    stage ln_f, lm_head
}}
"""


def _check(zero: int, schedule: str, rank: int) -> None:
    plan = complete(check_text(PLAN.format(zero=zero, schedule=schedule), "v.plan").plan)
    layout = pipeline_layout(plan)
    stage_params = {0: ["wte.weight", "wpe.weight"], 1: ["h.0.attn.c_attn.weight"], 2: ["h.1.attn.c_attn.weight"],
                    3: ["ln_f.weight", "lm_head.weight"]}
    ids = {n: i for i, n in enumerate(n for names in stage_params.values() for n in names)}
    ids["lm_head.weight"] = ids["wte.weight"]  # tied: one object
    refuse_sharded_shared(plan, layout, {s: stage_params[s] for s in layout.stages_of(rank)}, ids)


def test_zero2_under_a_v_with_tied_stages_on_one_rank_is_refused():
    with pytest.raises(PipelineError) as e:
        _check(2, "zbv", 0)
    assert "wte.weight" in e.value.message and "lm_head.weight" in e.value.message and "zero = 1" in e.value.help


@pytest.mark.parametrize("zero,schedule,rank", [(1, "zbv", 0), (2, "zbv", 1), (2, "interleaved", 0),
                                                (3, "dualpipev", 1)])
def test_the_same_tie_elsewhere_is_fine(zero, schedule, rank):
    _check(zero, schedule, rank)
