"""How `planlang verify` judges (planlang.runtime.verify): each error against max(tol, NOISE_FACTOR ×
one process's own rounding error against float64), and a FAIL that ends in exit 1 after the table, with
no torchrun traceback."""
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from planlang.runtime.verify import NOISE_FACTOR, StepRow, bound, judged

ROOT = Path(__file__).resolve().parents[2]


def test_the_bound_is_tol_or_the_rounding_noise_times_the_factor():
    assert bound(0.0, 1e-5) == 1e-5 and bound(1e-6, 1e-5) == 1e-5
    assert bound(1e-5, 1e-5) == pytest.approx(NOISE_FACTOR * 1e-5)


def test_the_worst_quantity_is_the_one_furthest_above_its_bound():
    # `b` has the larger error but its rounding noise is larger too; `a` is the one that fails
    errors, noise = {"a": 3e-5, "b": 5e-4}, {"a": 1e-7, "b": 1e-4}
    assert judged(errors, noise, 1e-5) == ("a", 3e-5, 1e-5)
    assert judged({}, {}, 1e-5) == ("", 0.0, 1e-5)


def test_a_row_passes_only_when_every_error_is_within_its_bound():
    row = StepRow(0, 1.0, 1.0, 1e-7, 2e-5, "w", 1.47, "bias", 1e-5, 1e-4, 2.0)
    assert row.ok()  # a parameter error of 1.47 where one process's own is 0.2: rounding amplified by Adam
    assert not StepRow(0, 1.0, 1.0, 1e-7, 2e-5, "w", 1.47, "bias", 1e-5, 1e-4, 1e-5).ok()
    assert not StepRow(0, 1.0, 1.1, 0.1, 0.0, "", 0.0, "", 1e-5, 1e-5, 1e-5).ok()


MODEL = textwrap.dedent("""\
    import torch
    from torch import nn


    class Noisy(nn.Module):
        # noise drawn in the forward: other draws under the plan than in one process, so the runs cannot
        # agree (dropout would not do: verify turns it off on both sides, planlang.runtime.no_dropout)
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)

        def forward(self, x):
            h = self.a(x)
            return self.b(h + torch.randn_like(h))


    def build():
        return Noisy()


    def loss(out, y):
        return nn.functional.mse_loss(out, y)
""")
PLAN = textwrap.dedent("""\
    use hardware
    model net = "dropout_model:build"
    input x : f32[batch = 8, features = 8]
    mesh m of 2 x hardware.cpu {
        dp = 2 over hardware.loopback
    }
    data x : [dp, _]
""")


def test_a_fail_exits_1_after_the_table_without_a_torchrun_traceback(tmp_path):
    (tmp_path / "dropout_model.py").write_text(MODEL)
    (tmp_path / "dropout.plan").write_text(PLAN)
    out = subprocess.run([sys.executable, "-m", "planlang.cli", "verify", str(tmp_path / "dropout.plan"), "-q",
                          "--steps", "2"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr[-2000:]
    assert out.stdout.rstrip().splitlines()[-1].startswith("FAIL (marked !)")
    assert " !" in out.stdout
    assert "Traceback" not in out.stderr and "ChildFailedError" not in out.stderr


def test_a_gradient_below_the_floor_is_judged_against_rounding_of_the_models_scale():
    import torch
    from planlang.runtime.verify import GRAD_FLOOR, ROUNDING_FLOOR_CAP, rounding_floor
    total = 2.0
    tiny = torch.full((4,), 1e-9)  # zero in exact arithmetic: rounding only
    unit = torch.finfo(torch.float32).eps / 2
    assert rounding_floor(tiny, total) == pytest.approx(unit / GRAD_FLOOR)
    assert rounding_floor(torch.ones(4), total) == pytest.approx(unit * total / 2.0)  # a large gradient: ~unit
    assert rounding_floor(tiny.bfloat16(), total) == ROUNDING_FLOOR_CAP  # capped: a missing gradient (1) fails
    assert NOISE_FACTOR * ROUNDING_FLOOR_CAP < 1.0


CENTERED = textwrap.dedent("""\
    import torch
    from torch import nn


    class Centered(nn.Module):
        # the features are centred over the batch after `bias`: its gradient is zero in exact arithmetic
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 1)
            self.bias = nn.Parameter(torch.zeros(1))
            self.head = nn.Linear(1, 4)

        def forward(self, x):
            h = self.lin(x) + self.bias
            return self.head(torch.tanh(h - h.mean(0)))


    def build():
        torch.manual_seed(0)
        return Centered()


    def loss(out, y):
        return nn.functional.mse_loss(out, y)
""")


def test_a_gradient_zero_in_exact_arithmetic_passes(tmp_path):
    # before the rounding floor, step 4 failed: `bias`'s gradient (values ±1e-9) 1.5e-5 against 1e-5,
    # one process's own error against float64 being by chance far below the plan's
    from tests.runtime.verify_cli import verify_text
    (tmp_path / "centered.py").write_text(CENTERED)
    table = verify_text(PLAN.replace("dropout_model", "centered").replace("2 x", "4 x").replace("dp = 2", "dp = 4"),
                        tmp_path, "centered", steps=4)
    assert "bias" in table
