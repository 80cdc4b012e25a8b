"""The step-time model prices a step's gradient sums bucket by bucket, cut as the runtime cuts them
(planlang.cost.buckets), so that all but the last bucket hide behind backward (docs/step_time.md, S):
before, a plan's sums were one transfer per axes group, and a data-parallel-only plan had its whole
all-reduce exposed."""
from __future__ import annotations

import pytest

from planlang.cost.buckets import cut_buckets, launch_order
from planlang.cost.comm import collective_time, group
from planlang.model.capture.load import build_model
from planlang.model.price.estimate import estimate_steps
from planlang.model.price.step_time import lowered_traffic
from planlang.model.price.traffic import gradient_sums, graph_of
from planlang.model.program.lowering import lower
from planlang.plan.checker import check_text
from planlang.plan.complete import complete

PLAN = """use hardware
model gpt2 = "examples.gpt2.model:build"(layers = 4, hidden = 256, heads = 4, vocab = 8192, seq = 64)
input idx : i64[batch = 2048, seq = 64]
mesh ranks of 4 x hardware.a100_80g {
    dp = 4 over hardware.infiniband_200g
}
optimizer adamw(lr = 0.001)
data idx : [dp, _]
"""


@pytest.fixture(scope="module")
def plan():
    res = check_text(PLAN, "buckets.plan")
    assert not res.errors, [str(d) for d in res.diagnostics]
    return complete(res.plan)


def test_sums_are_the_runtimes_buckets_in_launch_order(plan):
    prog = lower(graph_of(plan), plan)
    sums = gradient_sums(plan, prog)
    model = build_model(plan.model, plan.path)
    rows = [(n, p.numel() * p.element_size(), ("dp",)) for n, p in model.named_parameters()]
    want = [b.nbytes for b in launch_order(cut_buckets(rows))]
    assert len(want) >= 2  # a first small bucket, then up to 25 MB ones
    assert [t.full_bytes for t in sums] == want
    assert all(t.phase == "grad_sync" and t.axes == ("dp",) for t in sums)


def test_only_the_last_bucket_is_exposed(plan):
    traffic = lowered_traffic(plan)
    (row,) = estimate_steps(plan).steps(plan, traffic)
    sums = [t for t in traffic[0].transfers if t.phase == "grad_sync"]
    g = group(plan.mesh, ("dp",))
    seconds = [collective_time(t.kind, g, t.full_bytes) for t in sums]
    assert row.exposed == pytest.approx(seconds[-1])  # backward is long enough to hide the rest
    assert row.overlapped == pytest.approx(sum(seconds) - seconds[-1])
    assert len(seconds) >= 2 and row.exposed < sum(seconds)  # (one transfer for all exposed all of it)
