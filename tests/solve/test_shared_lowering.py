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


def _complete(tmp_path, text: str):
    path = tmp_path / "pp_tp.plan"  # one path, as a solve's candidates have (the op graph is traced per path)
    path.write_text(text)
    res = check_resolution(Resolver().resolve_file(str(path)), str(path))
    assert not res.errors and res.plan is not None
    return complete(res.plan)


def test_candidates_that_differ_in_what_the_lowering_does_not_read_share_its_program(tmp_path):
    # checkpoint groups and the stages are read by the cut and the collectives, not by the lowering
    # (planlang.model.program.shared_lowering): one program for the three, each its own collectives
    one = _complete(tmp_path, PLAN)
    ckpt = _complete(tmp_path, PLAN + "checkpoint h[*] every 1\n")
    cut = _complete(tmp_path, PLAN.replace(", h[1]\n    stage h[2]", "\n    stage h[1], h[2]"))
    assert len(cut.pipeline.stages) == 2 and cut.pipeline.stages != one.pipeline.stages
    facts = model_facts(one)
    got = [pricing.lowered(plan, facts) for plan in (one, ckpt, cut)]
    assert (facts.programs.misses, facts.programs.hits) == (1, 2)
    for plan, low in zip((one, ckpt, cut), got):
        fresh = lowered_traffic(plan, None, facts.layers.module)  # outside the scope: lowered afresh
        assert fresh is not None and pricing.CandidateTraffic(tuple(fresh)) == low
    assert got[1] != got[0] != got[2]  # recomputation and the cut change the collectives
    # another microbatch count is another graph: lowered again
    pricing.lowered(replace(one, pipeline=replace(one.pipeline, microbatches=8)), facts)
    assert facts.programs.misses == 2
