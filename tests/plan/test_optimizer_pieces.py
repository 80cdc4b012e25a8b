"""PL508 for an optimizer whose update of a matrix reads the whole matrix (Adafactor's row and column
means) when a parameter is split over its last two dims: each rank would step its piece with the piece's
statistics (HF GPT-2 dp2 x tp2 under adafactor passed check, then verify found parameter error 5e-4 after
one step; found by bench/mutants.py)."""
from planlang.plan.checker import check_text

PLAN = """\
use hardware
model mlp = "examples.mlp.model:build"(in_features = 16, hidden = 32, out_features = 8)
input x : f32[batch = 8, features = 16]
mesh ranks of 4 x hardware.cpu {{
    dp = 2 over hardware.loopback
    tp = 2 over hardware.loopback
}}
budget 1 GiB per device
optimizer {optimizer}(lr = 0.01)
data x : [dp, _]
shard fc1.weight : {spec}
"""


def codes(optimizer: str, spec: str) -> list[str]:
    return [d.code for d in check_text(PLAN.format(optimizer=optimizer, spec=spec), "p.plan").diagnostics]


def test_adafactor_on_a_split_matrix_is_pl508():
    assert codes("adafactor", "[tp, _]") == ["PL508"]
    assert codes("adafactor", "[_, tp]") == ["PL508"]


def test_whole_matrices_and_elementwise_optimizers_are_clean():
    assert codes("adafactor", "[_, _]") == []
    assert codes("adamw", "[tp, _]") == []
