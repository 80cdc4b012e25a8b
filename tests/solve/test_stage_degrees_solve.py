"""`stage ... with dp = ?, tp = ?`: the solver lays each stage over its pipeline rank's devices with degrees
of its own (issue #31, planlang.plan.stage_meshes), against brute force: every combination of the stages'
ways to factor their four devices is priced by the one step-time model, and the solved plan is the fastest
of them that checks. Pure (no processes): the plans are priced on meta."""
from __future__ import annotations

import itertools
from pathlib import Path

from planlang.plan.checker import check_text
from planlang.solve.driver import solve

PLAN = '''use hardware
use patterns.megatron
model gpt2 = "examples.gpt2.model:build"(layers = 4, hidden = 64, heads = 4, vocab = 128, seq = 16)
input idx : i64[batch = 16, seq = 16]
mesh cluster of 8 x hardware.a100_80g {
    pp = 2 over hardware.infiniband_200g
    dp = 2 over hardware.nvlink3
    tp = 2 over hardware.nvlink3
}
data idx : [dp, _]
pipeline over pp schedule 1f1b microbatches 2 {
    stage wte, wpe, drop, h[0:2] with dp = D0, tp = T0
    stage h[2:4], ln_f, lm_head with dp = D1, tp = T1
}
for block in h[*] {
    apply megatron.attention(tp) to block.attn
    apply megatron.mlp(tp) to block.mlp
}
'''
WAYS = [(1, 4), (2, 2), (4, 1)]  # (dp, tp) of a pipeline rank's 4 devices


def _plan(d0: object, t0: object, d1: object, t1: object) -> str:
    return PLAN.replace("D0", str(d0)).replace("T0", str(t0)).replace("D1", str(d1)).replace("T1", str(t1))


def test_stage_degree_holes_take_the_fastest_combination(tmp_path: Path):
    holes = tmp_path / "holes.plan"
    holes.write_text(_plan("?", "?", "?", "?"))
    res = solve(str(holes), prune=False)
    chosen = [line.strip() for line in res.text.splitlines() if line.strip().startswith("stage ")]
    # brute force: each combination written out whole and solved (no hole left: priced as it is)
    steps = {}
    for (d0, t0), (d1, t1) in itertools.product(WAYS, WAYS):
        text = _plan(d0, t0, d1, t1)
        if check_text(text, "p.plan").errors:
            continue  # e.g. batch 16 over dp4 x 2 microbatches leaves 2 rows; all of these check
        path = tmp_path / f"d{d0}{t0}{d1}{t1}.plan"
        path.write_text(text)
        steps[(d0, t0, d1, t1)] = solve(str(path)).best.step_time
    assert len(steps) == 9
    best = min(steps, key=steps.get)
    assert chosen == [f"stage wte, wpe, drop, h[0:2] with dp = {best[0]}, tp = {best[1]}",
                      f"stage h[2:4], ln_f, lm_head with dp = {best[2]}, tp = {best[3]}"], (chosen, steps)
    assert res.best.step_time == steps[best]
    # the stages' own degrees matter to the price: not every combination costs the same
    assert len({round(s, 12) for s in steps.values()}) > 1
