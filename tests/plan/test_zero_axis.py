"""PL504 when ZeRO's axis splits no batch, including a plan with no `data` statement at all (the batch is
then split over no axis, and `planlang.apply` refuses ZeRO there: the check must say so first; found by
bench/mutants.py's implicit class)."""
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
