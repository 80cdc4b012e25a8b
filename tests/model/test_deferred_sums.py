"""The lowering moves the data-parallel sum of GPT-2's position-embedding gradient from a blocking
all-reduce in backward to the parameter's once-per-step bucket (lowering._defer_to_parameters), and only
where that is exact and sends no more: the lookup's inputs replicated, the table no larger than what it
looks up. The numerics of the deferred plans are checked against one process by the gloo tests
(tests/runtime: verify parity and predicted == measured traffic on GPT-2 dp plans)."""
from __future__ import annotations

from planlang.model.program.lowering import Run, lower
from planlang.model.price.traffic import graph_of
from planlang.plan.checker import check_text
from planlang.plan.complete import complete

PLAN = """use hardware
model gpt2 = "examples.gpt2.model:build"(layers = 1, hidden = 64, heads = 4, vocab = 128, seq = 16)
input idx : i64[batch = 8, seq = SEQ]
mesh ranks of 4 x hardware.cpu {
    dp = 4 over hardware.loopback
}
optimizer adamw(lr = 0.001)
data idx : [dp, _]
"""


def _lowered(seq: int):
    res = check_text(PLAN.replace("SEQ", str(seq)), "deferred.plan")
    assert not res.errors, [str(d) for d in res.diagnostics]
    plan = complete(res.plan)
    return lower(graph_of(plan), plan)


def _summed_in_backward(prog) -> list[str]:
    return [ins.args[i] for ins in prog.instructions if isinstance(ins, Run) for i, _ in ins.grad_reduce]


def test_the_position_embedding_gradient_is_summed_in_the_bucket():
    prog = _lowered(16)  # the lookup reads the whole table: its output is as large as the table
    assert _summed_in_backward(prog) == []
    assert prog.grad_sync["wpe.weight"] == ("dp",)
    assert prog.grad_sync["wte.weight"] == ("dp",)


def test_a_table_larger_than_its_lookup_keeps_the_sum_at_the_use():
    prog = _lowered(4)  # 4 of the table's 16 rows: summing the table would send four times the bytes
    assert len(_summed_in_backward(prog)) == 1
    assert prog.grad_sync.get("wpe.weight", ()) == ()
