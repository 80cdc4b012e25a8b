"""`shard output of M : SPEC` makes the op that computes M's output compute it in SPEC where a strategy
can (lowering.lower, as the solver's fixed outputs do), and converts it after the op only where none can.
So a Megatron GPT-2 with its head pinned replicated issues exactly parallelize_module's collectives: one
all-reduce per row-parallel layer forward and one per column-parallel input backward (the gloo traffic
tests and bench/runtime_overhead.py's gpt2-tp case measure the same counts)."""
from __future__ import annotations

from planlang.cost.layout import normalize
from planlang.model.program.lowering import Convert, Run, lower
from planlang.model.price.traffic import graph_of, predict_step_traffic
from planlang.plan.checker import check_text
from planlang.plan.complete import complete

PLAN = """use hardware
use patterns.megatron
model gpt2 = "examples.gpt2.model:build"(layers = 2, hidden = 256, heads = 8, vocab = 2048, seq = 64)
input idx : i64[batch = 8, seq = 64]
mesh ranks of 2 x hardware.cpu {
    tp = 2 over hardware.loopback
}
optimizer adamw(lr = 0.001)
for block in h[*] {
    apply megatron.attention(tp) to block.attn
    apply megatron.mlp(tp) to block.mlp
}
"""


# the attention and MLP split by hand, no output pinned (the stdlib's megatron pattern pins them)
HAND = PLAN.split("for block")[0] + """shard h[*].mlp.c_fc.weight : [_, tp]
shard h[*].mlp.c_fc.bias : [tp]
shard h[*].mlp.c_proj.weight : [tp, _]
"""


def _lowered(extra: str = "", base: str = PLAN):
    res = check_text(base + extra, "pins.plan")
    assert not res.errors, [str(d) for d in res.diagnostics]
    plan = complete(res.plan)
    return plan, lower(graph_of(plan), plan)


def _calls(plan, prog) -> dict[tuple[str, str], int]:
    calls: dict[tuple[str, str], int] = {}
    for t in predict_step_traffic(plan, prog).transfers:
        calls[(t.phase, t.kind.value)] = calls.get((t.phase, t.kind.value), 0) + 1
    return calls


def _head(prog) -> Run:
    return next(ins for ins in prog.instructions if isinstance(ins, Run) and ins.node.module == "lm_head")


def test_a_pinned_head_is_computed_replicated_with_megatrons_collectives():
    plan, prog = _lowered("shard output of lm_head : [_, _, _]\n")
    head = _head(prog)
    assert normalize(head.output, prog.mesh) == normalize(prog.layouts[head.node.name], prog.mesh)
    assert not head.output.partial and all(d == () for d in head.output.dims)
    assert not any(isinstance(ins, Convert) and ins.value == head.node.name for ins in prog.instructions)
    # 2 blocks x (attention c_proj + mlp c_proj) forward, x (c_attn + c_fc inputs) backward; no loss sum,
    # no gather, no gradient sum of the head
    assert _calls(plan, prog) == {("forward", "all_reduce"): 4, ("backward", "all_reduce"): 4}
    assert not any(prog.grad_sync.values())


def test_an_open_head_may_be_split_over_the_batch_across_tp():
    plan, prog = _lowered()
    head = _head(prog)
    assert "tp" in head.output.axes_of(0)  # the cost model's choice: half the logits per rank
    calls = _calls(plan, prog)
    # 4 in the blocks, and the loss' count of rows not ignored (cross_entropy's mean; its rows split over tp)
    assert calls[("forward", "all_reduce")] == 5 and calls[("backward", "all_gather")] == 1
    assert prog.grad_sync["lm_head.weight"] == ("tp",)  # tied to wte: summed over tp once per step


def test_a_pin_no_strategy_makes_is_converted_after_the_op():
    # a row-parallel product is a partial sum whatever its input: pinned whole, it is all-reduced after
    plan, prog = _lowered("shard output of h[*].mlp.c_proj : [_, _, _]\n", HAND)
    convs = [ins for ins in prog.instructions if isinstance(ins, Convert)
             and prog.graph.values[ins.value].module.endswith("mlp.c_proj")]
    assert len(convs) == 2 and all(c.src.partial == ("tp",) for c in convs)
