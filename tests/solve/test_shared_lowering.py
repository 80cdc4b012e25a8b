"""Candidates that differ only in their pipeline's schedule share one lowered program (planlang.solve.pricing.
_same_program): the program of one microbatch, cut into the stages, and its collectives read the stages and
the microbatches, never the schedule. Lowered afresh, each candidate gives the collectives the search kept."""
from __future__ import annotations

from dataclasses import replace

from planlang.model.price.step_time import lowered_traffic
from planlang.plan.checker import check_resolution
from planlang.plan.complete import CompleteSchedule, complete
from planlang.plan.resolve import Resolver
from planlang.solve import pricing
from planlang.solve.facts import model_facts

PLAN = '''use hardware
use patterns.megatron
model gpt2 = "examples.gpt2.model:build"(layers = 4, hidden = 64, heads = 4, vocab = 128, seq = 32)
input idx : i64[batch = 32, seq = 32]
mesh cluster of 8 x hardware.a100_80g {
    pp = 2 over hardware.infiniband_200g
    dp = 2 over hardware.nvlink3
    tp = 2 over hardware.nvlink3
}
optimizer adamw(lr = 0.0006)
data idx : [dp, _]
pipeline over pp schedule 1f1b microbatches 4 {
    stage wte, wpe, drop, h[0], h[1]
    stage h[2], h[3], ln_f, lm_head
}
for block in h[*] {
    apply megatron.attention(tp) to block.attn
}
'''


def test_gpipe_and_1f1b_over_the_same_stages_are_lowered_once(tmp_path):
    path = tmp_path / "pp_tp.plan"
    path.write_text(PLAN)
    res = check_resolution(Resolver().resolve_file(str(path)), str(path))
    assert not res.errors and res.plan is not None
    one = complete(res.plan)
    assert one.pipeline is not None and len(one.pipeline.stages) == 2
    other = replace(one, pipeline=replace(one.pipeline, schedule=CompleteSchedule("gpipe")))
    facts = model_facts(one)
    first = pricing.lowered(one, facts)
    assert first.traffic is not None and not first.note  # a tensor-parallel pipeline: its program's collectives
    assert pricing.lowered(other, facts) is first  # not lowered again
    for plan in (one, other):
        fresh = lowered_traffic(plan, None, facts.layers.module)
        assert fresh is not None and pricing.CandidateTraffic(tuple(fresh)) == first
    # the microbatches are read: another count is another program
    more = replace(one, pipeline=replace(one.pipeline, microbatches=8))
    assert pricing.lowered(more, facts) is not first
