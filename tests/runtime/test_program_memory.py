"""planlang.runtime.program_memory: the estimate of a plan without a pipeline comes from rank 0's lowered
program run on meta under a fake process group (what the planlang runtime executes), and says so; plans
it cannot run keep the simulation of the model's code, and say why. Accuracy against measured memory is
bench/zoo_memory.py's and bench/memory_accuracy.py's (MemTracker on gloo ranks)."""
from __future__ import annotations

import torch.distributed as dist

from planlang.model.price.estimate import estimate_plan
from planlang.plan.checker import check_text
from planlang.plan.complete import complete
from planlang.runtime.program_memory import ProgramMemory, measure, reason_not_measured

PLAN = """use hardware
use patterns.megatron
model gpt2 = "examples.gpt2.model:build"(layers = 2, hidden = 64, heads = 4, vocab = 128, seq = 16)
input idx : i64[batch = 8, seq = 16]
mesh ranks of 4 x hardware.cpu {{ {mesh} }}
budget 1 GiB per device
optimizer adamw(lr = 0.001){zero}
data idx : [dp, _]
{rest}
"""
TP = PLAN.format(mesh="dp = 2 over hardware.loopback; tp = 2 over hardware.loopback", zero="",
                 rest="for block in h[*] {\n    apply megatron.attention(tp) to block.attn\n    apply megatron.mlp(tp) to block.mlp\n}")
ZERO3 = PLAN.format(mesh="dp = 4 over hardware.loopback", zero=" {\n    zero = 3 over dp\n}", rest="")
PP = PLAN.format(mesh="pp = 2 over hardware.loopback; dp = 2 over hardware.loopback", zero="",
                 rest="pipeline over pp schedule 1f1b microbatches 2 {\n    stage wte, wpe, drop, h[0]\n"
                      "    stage h[1], ln_f, lm_head\n}")


def _plan(text: str):
    res = check_text(text, "p.plan")
    assert not res.errors, [str(d) for d in res.diagnostics]
    return complete(res.plan)


def test_a_tensor_parallel_plan_is_priced_from_its_program():
    plan = _plan(TP)
    got = measure(plan)
    assert isinstance(got, ProgramMemory), got
    assert not dist.is_initialized()  # the fake process group is gone again
    (row,) = estimate_plan(plan, program=measure)
    assert row.peak == got.peak and row.activations == got.activations
    assert any("lowered program" in n for n in row.notes)
    # the step adds the activations and more on top of the parameters and optimizer state it keeps
    assert got.peak > got.parameters + got.kept + got.activations > got.parameters
    assert row.parameters == got.parameters  # the analytic local shards are the program's
    assert measure(plan) == got  # deterministic


def test_plans_the_program_cannot_run_on_meta_say_why():
    for text, why in ((ZERO3, "FSDP2"), (PP, "pipeline")):
        plan = _plan(text)
        assert why in reason_not_measured(plan)
        (row, *_) = estimate_plan(plan, program=measure)
        assert any(n.startswith("activations simulated from the model's code") and why in n for n in row.notes)
