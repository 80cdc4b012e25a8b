"""The estimate of a step that accumulates gradients (a top-level `microbatches N`, no pipeline): one
microbatch's activations on the device at a time, the same flops, the program's collectives once per
microbatch and the gradient sums once per step (planlang.model.price.accumulation)."""
import functools
from collections import Counter

import pytest

from planlang.model.price.estimate import estimate_plan, estimate_steps
from planlang.model.price.step_time import lowered_traffic
from planlang.plan.checker import check_text
from planlang.plan.complete import complete

PLAN = """\
use hardware
model gpt2 = "examples.gpt2.model:build"(layers = 2, hidden = 64, heads = 4, vocab = 128, seq = 32)
input idx : i64[batch = 32, seq = 32]
mesh ranks of 4 x hardware.a100_80g {
    dp = 2 over hardware.nvlink3
    tp = 2 over hardware.nvlink3
}
optimizer adamw(lr = 0.001)
data idx : [dp, _]
MICRO
shard h[*].mlp.c_fc.weight   : [_, tp]
shard h[*].mlp.c_fc.bias     : [tp]
shard h[*].mlp.c_proj.weight : [tp, _]
"""


@functools.lru_cache(maxsize=None)
def plan(n: int):
    res = check_text(PLAN.replace("MICRO", f"microbatches {n}"), path="tests/model/accumulate.plan")
    assert not [d for d in res.diagnostics if d.severity.value == "error"], res.diagnostics
    return complete(res.plan)


@functools.lru_cache(maxsize=None)
def row(n: int):
    (r,) = estimate_plan(plan(n))
    return r


def test_activations_are_one_microbatchs():
    a1, a2, a4 = (row(n).activations for n in (1, 2, 4))
    assert a1 > a2 > a4 > 0
    # a microbatch of half the samples saves half the activations (within what does not scale: a
    # bias, the loss' scalars)
    assert a2 == pytest.approx(a1 / 2, rel=0.05) and a4 == pytest.approx(a1 / 4, rel=0.05)
    assert row(4).peak < row(2).peak < row(1).peak
    # parameters, gradients (accumulated across microbatches) and optimizer state do not change
    assert {(r.parameters, r.gradients, r.optimizer, r.buffers) for r in map(row, (1, 2, 4))} == \
        {(row(1).parameters, row(1).gradients, row(1).optimizer, row(1).buffers)}


def test_same_flops_and_the_weights_read_again_per_microbatch():
    work = [estimate_steps(plan(n)).work[0] for n in (1, 2, 4)]
    assert {(w.forward_flops, w.backward_flops) for w in work} == {(work[0].forward_flops, work[0].backward_flops)}
    # the memory-bound ops' bytes: the activations' once per step whatever the split; the parameters
    # each op reads (layer norms' weights, bias adds, their gradients) once per microbatch
    moved = [w.forward_bytes + w.backward_bytes for w in work]
    assert moved[0] < moved[1] < moved[2] < 1.5 * moved[0]
    c = [row(n).step.compute for n in (1, 2, 4)]
    assert c[0] < c[1] < c[2]  # a100_80g declares its memory bandwidth: the bytes are priced


def test_gradients_summed_once_the_rest_per_microbatch():
    (t1,), (t4,) = lowered_traffic(plan(1)), lowered_traffic(plan(4))

    def phase(t, name):
        return [x for x in t.transfers if x.phase == name]

    assert [x.full_bytes for x in phase(t4, "grad_sync")] == [x.full_bytes for x in phase(t1, "grad_sync")]
    assert phase(t1, "grad_sync")  # dp sums something
    assert len(phase(t4, "loss")) == 4 * len(phase(t1, "loss")) > 0
    # the tensor-parallel collectives of forward and backward: each microbatch's, on a quarter of the
    # activations, four times (the data-parallel layout of the position embedding's output, which has no
    # batch dim, is the lowering's choice at each batch size, so only the tp axis is compared)
    def tp(t, n):
        return Counter((x.phase, x.kind, x.full_bytes * n) for x in t.transfers
                       if x.phase in ("forward", "backward") and x.axes == ("tp",))

    assert tp(t1, 1) and tp(t4, 4) == Counter({k: 4 * v for k, v in tp(t1, 1).items()})


def test_batch_norm_with_accumulation_is_reported(tmp_path):
    """Each microbatch of an accumulating step runs through the model on its own, so BatchNorm's
    statistics are per microbatch: PL466 at the statement (none with `microbatches 1`)."""
    from planlang.model.validation import check_with_model

    def plan(n: int) -> str:
        return ('use hardware\nmodel cnn = "examples.zoo.cnn:resnet"()\n'
                "input images : f32[batch = 8, c = 3, h = 16, w = 16]\n"
                "mesh cluster of 2 x hardware.cpu {\n    dp = 2 over hardware.loopback\n}\n"
                "budget 1 GiB per device\noptimizer sgd(lr = 0.1)\ndata images : [dp, _, _, _]\n"
                f"microbatches {n}\n")

    (tmp_path / "two.plan").write_text(plan(2))
    (tmp_path / "one.plan").write_text(plan(1))
    (found,) = check_with_model(str(tmp_path / "two.plan")).diagnostics
    assert found.code == "PL466" and found.span.line == 10 and "each of the 2 microbatches" in found.message
    assert "`microbatches 1`" in found.help
    assert [d.code for d in check_with_model(str(tmp_path / "one.plan")).diagnostics] == []


def test_zero3_holds_the_unsharded_gradients_between_microbatches():
    """Under ZeRO-3 the gradients are reduce-scattered once, after the last microbatch: until then each
    rank holds its unsharded gradients (FSDP2 without gradient sync). With activations too small to
    matter (4 tokens a sample), a second microbatch raises the peak by about those gradients."""
    def zero3(n: int):
        text = PLAN.replace("MICRO", f"microbatches {n}").replace("seq = 32", "seq = 4").replace(
            "batch = 32", "batch = 8").replace("hidden = 64", "hidden = 256").replace(
            "optimizer adamw(lr = 0.001)", "optimizer adamw(lr = 0.001) { zero = 3 over dp }")
        (r,) = estimate_plan(complete(check_text(text, path="tests/model/accumulate_zero3.plan").plan))
        return r

    one, two = zero3(1), zero3(2)
    unsharded = 2 * one.parameters  # f32 shards over dp(2): the rank's unsharded gradients
    assert two.activations < one.activations
    assert two.peak - one.peak == pytest.approx(unsharded, rel=0.2), (two.peak - one.peak, unsharded)
