"""A pipeline stage's memory and compute as the estimator composes them (pure: no step is run).

Each figure is derived here from the model's own parameter shapes and the plan's sizes, not read back from
the estimator: the gradient buckets of a pp x dp x tp stage (its local parameters in the `params` dtype),
the receive buffers (the activations of a stage's microbatches in flight and one gradient, in the dtype
activations cross in: planlang.runtime.recv_buffers), the optimizer state under ZeRO-1 and ZeRO-2, identical stages priced identically,
and no negative bubble."""
from __future__ import annotations

import math

import pytest

from planlang.model.capture.load import build_model
from planlang.model.capture.profile import ModuleProfile, Profile
from planlang.model.price.estimate import estimate_plan, stage_work
from planlang.plan.checker import check_text
from planlang.plan.complete import complete

H, HEADS, VOCAB, SEQ, BATCH, MICRO = 64, 4, 128, 16, 16, 4


def _plan(zero: int = 1, precision: str = "bf16", dp: int = 2, pp: int = 4, micro: int = MICRO, stages=None):
    stages = stages or ["wte, wpe, drop, h[0]", "h[1]", "h[2]", "h[3], ln_f, lm_head"]
    prec = f"\n    precision = {precision}" if precision != "f32" else ""
    text = f"""use hardware
use patterns.megatron
model gpt = "examples.gpt2.model:build"(layers = 4, hidden = {H}, heads = {HEADS}, vocab = {VOCAB}, seq = {SEQ})
input idx : i64[batch = {BATCH}, seq = {SEQ}]
mesh ranks of {pp * dp * 2} x hardware.cpu {{
    pp = {pp} over hardware.loopback
    dp = {dp} over hardware.loopback
    tp = 2 over hardware.loopback
}}
optimizer adamw(lr = 0.001) {{
    zero = {zero} over dp{prec}
}}
data idx : [dp, _]
pipeline over pp schedule 1f1b microbatches {micro} {{
""" + "".join(f"    stage {s}\n" for s in stages) + """}
for block in h[*] {
    apply megatron.attention(tp) to block.attn
    apply megatron.mlp(tp) to block.mlp
}
"""
    res = check_text(text, "stage_memory.plan")
    assert not res.errors, [str(d) for d in res.diagnostics]
    return complete(res.plan)


def _block_elements() -> int:
    """Elements of one transformer block on one tp rank: the Megatron split halves every weight and
    column-parallel bias; the row-parallel biases and the layer norms stay whole."""
    model = build_model(_plan().model, None)
    whole = {"ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias", "attn.c_proj.bias", "mlp.c_proj.bias"}
    return sum(p.numel() if n in whole else p.numel() // 2 for n, p in model.h[1].named_parameters())


@pytest.fixture(scope="module")
def bf16_zero1():
    return estimate_plan(_plan(zero=1))


def test_identical_stages_are_priced_and_held_identically(bf16_zero1):
    s1, s2 = bf16_zero1[1], bf16_zero1[2]
    for k in ("parameters", "gradients", "optimizer", "grad_buckets", "transient"):
        assert getattr(s1, k) == getattr(s2, k), k
    # received activations: those of the microbatches in flight, one more on stage 1 (1F1B: p - s)
    one = (BATCH // (2 * MICRO)) * SEQ * H * 2
    assert s1.buffers - s2.buffers == one
    assert s1.step is not None and s2.step is not None
    assert s1.step.compute == s2.step.compute and s1.stage_times == s2.stage_times


def test_a_stage_s_gradients_are_its_buckets_in_the_params_dtype(bf16_zero1):
    """pp x dp x tp under ZeRO-1 sums gradients in persistent buckets (planlang.runtime.grad_sync) whose
    slices the gradients are: the stage's local parameters in bf16, once, named as buckets."""
    n = _block_elements()
    mid = bf16_zero1[1]
    assert mid.parameters == 2 * n
    assert mid.grad_buckets == 2 * n and mid.gradients == 0
    # the receive buffers, bf16 [batch / (dp x microbatches), seq, hidden] each: on stage s of p = 4 the
    # activations of its min(p - s, m) microbatches in flight, and one gradient from the next stage
    one = (BATCH // (2 * MICRO)) * SEQ * H * 2
    assert mid.buffers == mid.grad_buckets + (4 - 1) * one + one
    first, last = bf16_zero1[0], bf16_zero1[-1]
    assert first.buffers - first.grad_buckets == one  # no activation to receive
    assert last.buffers - last.grad_buckets == 1 * one  # one microbatch in flight, no gradient to receive


def test_receive_buffers_follow_the_activation_dtype():
    f32 = estimate_plan(_plan(zero=1, precision="f32"))[1]
    bf16 = estimate_plan(_plan(zero=1))[1]
    assert f32.buffers - f32.grad_buckets == 2 * (bf16.buffers - bf16.grad_buckets)


def test_optimizer_state_per_zero_stage():
    """ZeRO-1 (ZeroRedundancyOptimizer: whole tensors to the emptiest rank) and ZeRO-2 (FSDP2: every tensor
    sliced) over dp 2 of AdamW's two f32 moments, bf16 parameters: ZeRO-1 adds the whole f32 master copy
    MasterWeights keeps on every rank; under ZeRO-2 the f32 shards are that copy."""
    n = _block_elements()
    model = build_model(_plan().model, None)
    sizes = sorted((p.numel() if name.endswith(("ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias",
                                                "attn.c_proj.bias", "mlp.c_proj.bias")) else p.numel() // 2)
                   for name, p in model.h[1].named_parameters())
    load, state = [0, 0], [0, 0]
    for e in reversed(sizes):  # largest first, each to the rank holding fewer elements
        r = load.index(min(load))
        load[r] += e
        state[r] += 2 * 4 * e + 4  # two f32 moments and the step counter
    zero1 = estimate_plan(_plan(zero=1))[1]
    assert zero1.optimizer == max(state) + 4 * n
    zero2 = estimate_plan(_plan(zero=2))[1]
    tensors = len(sizes)
    assert zero2.optimizer == (2 * 4 * n + 4 * tensors) // 2
    assert zero2.grad_buckets == 0  # FSDP2 reduce-scatters: no buckets
    assert zero2.gradients == 4 * n // 2  # its gradient shards in the master dtype


def test_stage_work_is_the_sum_of_the_stage_s_own_ops():
    """Flops by module, not by a share of the saved activations: two stages of equal ops and different
    saved bytes do equal work; the root's ops (the loss) count on the last stage."""
    mods = {"": ModuleProfile("", "GPT", fwd_flops=5, bwd_flops=7),
            "a": ModuleProfile("a", "Block", fwd_flops=100, bwd_flops=200, saved_bytes=10),
            "a.x": ModuleProfile("a.x", "Linear", fwd_flops=1, bwd_flops=2, saved_bytes=1000),
            "b": ModuleProfile("b", "Block", fwd_flops=101, bwd_flops=202, saved_bytes=5)}
    prof = Profile(mods, total_fwd_flops=207, total_bwd_flops=411)
    stage_of = {"a": 0, "a.x": 0, "b": 1}
    assert stage_work(prof, stage_of, 0, 3).forward_flops == 303
    assert stage_work(prof, stage_of, 1, 3).forward_flops == (101 + 5) * 3
    assert stage_work(prof, stage_of, 1, 1).backward_flops == 202 + 7
    assert stage_work(prof, stage_of, None, 2).forward_flops == 414


def test_no_negative_bubble():
    one = estimate_plan(_plan(pp=1, stages=["wte, wpe, drop, h[0:4], ln_f, lm_head"]))
    assert [r.step.bubble for r in one if r.step is not None] == [0.0]
    rows = estimate_plan(_plan())
    assert all(r.step is not None and r.step.bubble >= 0.0 for r in rows)
    assert any(r.step is not None and r.step.bubble > 0.0 for r in rows)
    assert not math.isnan(rows[0].step_time)



def test_a_bucketed_stage_holds_its_gradients_in_the_buckets_only():
    """A pipeline stage's sums (planlang.runtime.grad_sync, started in the last backward) copy each
    gradient into its persistent bucket as the first backward produces it: the gradients are counted once,
    in the buckets (`buffers`), with one gradient of its own at a time beside them (measured:
    bench/pipeline_memory.py, gpt2_3d_cpu -1.5 / -3.9 %, where counting them beside the buckets was
    +23 %)."""
    rows = estimate_plan(_plan(zero=1, precision="f32"))
    for row in rows:
        assert row.grad_buckets > 0 and row.gradients == 0
        beyond = row.peak - (row.parameters + row.optimizer + row.buffers)
        assert row.activations <= beyond < row.activations + row.grad_buckets


def test_receive_buffers_are_those_of_the_microbatches_in_flight():
    """planlang.runtime.recv_buffers.InFlightStage holds a stage's received activations for its
    microbatches in flight (1F1B: min(p - s, m), whatever m is) and one gradient at a time
    (tests/runtime/test_recv_buffers_gloo.py counts them on gloo): the same global batch in twice the
    microbatches holds half the bytes (each microbatch half the size, as many in flight)."""
    few, many = estimate_plan(_plan(micro=4)), estimate_plan(_plan(micro=8))
    recv = [r.buffers - r.grad_buckets for r in few], [r.buffers - r.grad_buckets for r in many]
    assert all(r > 0 for r in recv[0]) and recv[1] == [r // 2 for r in recv[0]]
    assert not any("receive buffer" in n for r in few + many for n in r.notes)
