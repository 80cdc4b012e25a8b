"""What check must say before the runtime refuses, for plans without `data` statements (found by
bench/mutants.py): PL504 when ZeRO's axis splits no batch (with no `data` statement the batch is split over
no axis, and `planlang.apply` refuses ZeRO there), and PL305 when a pipeline's microbatches do not divide
the batch of an input no `data` statement splits."""
from planlang.plan.checker import check_text

PLAN = """\
use hardware
model mlp = "examples.mlp.model:build"(in_features = 16, hidden = 32, out_features = 8)
input x : f32[batch = 8, features = 16]
mesh ranks of 2 x hardware.cpu { dp = 2 over hardware.loopback }
budget 1 GiB per device
optimizer adamw(lr = 0.001) { zero = 1 over dp }
"""


def codes(text: str) -> list[str]:
    return [d.code for d in check_text(text, "zero.plan").diagnostics]


def test_zero_over_an_axis_with_no_data_statement_is_pl504():
    assert codes(PLAN) == ["PL504"]


def test_zero_over_the_data_axis_is_clean():
    assert codes(PLAN + "data x : [dp, _]\n") == []


PIPELINE = """\
use hardware
model gpt2 = "examples.gpt2.model:build"(layers = 4, hidden = 64, heads = 4, vocab = 128, seq = 16)
input idx : i64[batch = {batch}, seq = 16]
mesh ranks of 4 x hardware.cpu {{ pp = 4 over hardware.loopback }}
budget 1 GiB per device
pipeline over pp schedule 1f1b microbatches 4 {{
    stage wte, wpe, drop, h[0]
    stage h[1]
    stage h[2]
    stage h[3], ln_f, lm_head
}}
"""


def test_a_batch_no_data_statement_splits_still_divides_by_microbatches():
    # the runtime refused batch 1 in 4 microbatches after check had accepted it (bench/mutants.py)
    assert codes(PIPELINE.format(batch=1)) == ["PL305"]
    assert codes(PIPELINE.format(batch=8)) == []
