"""price_step reads a stage's collectives by phase in one pass (planlang.model.price.step_time._phases),
each microbatch's copy priced once and the repeats summed by numpy's in-order accumulate: every sum must be
the float the plain loop over the whole list gives, bit for bit."""
from __future__ import annotations

import random

from planlang.cost.comm import Collective, collective_time, group
from planlang.model.price import step_time as S
from planlang.model.price.traffic import Transfer
from planlang.plan.checker import check_text
from planlang.plan.complete import complete

PLAN = """use hardware
model m = "examples.gpt2.model:build"(layers = 2, hidden = 64, heads = 4, vocab = 128, seq = 32)
input idx : i64[batch = 8, seq = 32]
mesh ranks of 8 x hardware.a100_80g {
    dp = 2 over hardware.infiniband_200g
    tp = 4 over hardware.nvlink3
}
data idx : [dp, _]
"""
PHASES = ("forward", "loss", "recompute", "backward", "zero_forward", "grad_sync", "zero_backward", "zero_step", "")


def _reference(mesh, ts: list[Transfer]):
    """The sums as price_step made them before: one phase at a time, transfer by transfer."""
    def seconds(phases):
        total = 0.0
        for t in ts:
            if t.phase in phases:
                total += collective_time(t.kind, group(mesh, t.axes), t.full_bytes)
        return total
    return (seconds(S.FORWARD_PHASES), seconds(S.BACKWARD_PHASES), seconds(("zero_step",)),
            tuple(t for t in ts if t.phase == "zero_forward"),
            tuple(t for t in ts if t.phase in ("grad_sync", "zero_backward")))


def test_the_phases_sum_each_copy_as_the_plain_loop_does():
    mesh = complete(check_text(PLAN, "/tmp/phases.plan").plan).mesh
    rng = random.Random(7)
    for trial in range(40):
        micro = [Transfer(rng.choice([Collective.ALL_REDUCE, Collective.ALL_GATHER]), rng.choice([("tp",), ("dp",)]),
                          rng.randrange(1, 10**9), 0.0, rng.choice(PHASES)) for _ in range(rng.randrange(1, 30))]
        tail = [Transfer(Collective.ALL_REDUCE, ("dp",), rng.randrange(1, 10**9), 0.0, rng.choice(PHASES))
                for _ in range(rng.randrange(0, 5))]
        m = rng.choice([1, 2, 7, 64, 512])
        ts = [t for _ in range(m) for t in micro] + tail
        got = S._phases(mesh, ts)
        assert (got.forward, got.backward, got.after, got.gathers, got.sums) == _reference(mesh, ts), trial
        # continuing another stage's sums (plan_traffic's parameter transfers after the lowered program's)
        more = S._phases(mesh, tail, got)
        ref = _reference(mesh, ts + tail)
        assert (more.forward, more.backward, more.after, more.gathers, more.sums) == ref, trial


def test_fold_adds_in_order():
    rng = random.Random(3)
    for _ in range(50):
        xs = [rng.uniform(0, 1) * 10 ** rng.randrange(-9, 3) for _ in range(rng.randrange(1, 200))]
        times, start = rng.randrange(1, 300), rng.uniform(0, 5)
        total = start
        for x in xs * times:
            total += x
        assert S._fold(start, xs, times) == total
