"""The loss is found where docs/byom.md says, in one place (planlang.model.capture.load.loss_function): the factory
module's `loss(output, *targets)`, else the model's method `loss(self, output, *targets)`. A method used to
be ignored: check, estimate and verify summed the output (verify printed PASS comparing the wrong loss) and
`pm.step(x, y)` under `planlang run` failed with "expected 1 tensors (x), got 2". A model with neither and a
non-scalar output trains the output's sum, as documented, and `apply` says so (PL370)."""
from __future__ import annotations

import copy
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")


from planlang.model.validation import check_with_model  # noqa: E402
from planlang.model.price.estimate import estimate_plan  # noqa: E402
from planlang.model.capture.load import build_model, model_loss, plan_loss  # noqa: E402
from planlang.runtime.apply import apply, load_plan  # noqa: E402
from tests.runtime.one_process import one_process_group  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

MODEL = textwrap.dedent("""\
    import torch
    import torch.nn.functional as F
    from torch import nn


    class Net(nn.Module):
        def __init__(self, width=8, out=4):
            super().__init__()
            self.fc = nn.Linear(width, out)
            self.offset = 1000.0  # a setting the loss reads off the model: nothing like the output's sum

        def forward(self, x):
            return self.fc(x)


    class WithLoss(Net):
        def loss(self, out, target):
            return F.mse_loss(out, target) + self.offset


    class WideLoss(Net):
        def loss(self, out, target):  # a large intermediate: the estimate's activations show the loss
            return torch.cat([out] * 512, dim=-1).exp().mean() + F.mse_loss(out, target)


    class NamedLoss(Net):
        def __init__(self):
            super().__init__()
            self.loss = nn.MSELoss()  # a submodule that happens to be called `loss`: not a loss method


    def plain():
        return Net()


    def with_loss():
        return WithLoss()


    def wide_loss():
        return WideLoss(width=8, out=64)


    def named_loss():
        return NamedLoss()
""")
PLAN = textwrap.dedent("""\
    use hardware
    model net = "{module}:{factory}"
    input x : f32[batch = 8, features = 8]
    mesh m of {n} x hardware.cpu {{
        dp = {n} over hardware.loopback
    }}
    budget 1 GiB per device
    data x : [dp, _]
""")


def _plan(tmp_path, factory: str, n: int = 2, module: str = "loss_method_model", text: str = MODEL) -> str:
    (tmp_path / f"{module}.py").write_text(text)
    p = tmp_path / f"{factory}_{n}.plan"
    p.write_text(PLAN.format(module=module, factory=factory, n=n))
    return str(p)


def test_the_loss_method_is_found_bound_to_the_model(tmp_path):
    plan = load_plan(_plan(tmp_path, "with_loss"))
    model = build_model(plan.model, plan.path)
    loss = plan_loss(plan, model)
    assert loss.__self__ is model and loss.__func__ is type(model).loss
    unbound = plan_loss(plan)  # callers without an instance: one built on meta
    assert type(unbound.__self__).__name__ == "WithLoss"
    out, target = torch.ones(2, 4), torch.zeros(2, 4)
    assert float(unbound(out, target)) == pytest.approx(1001.0)
    assert plan_loss(load_plan(_plan(tmp_path, "plain"))) is None
    assert plan_loss(load_plan(_plan(tmp_path, "named_loss"))) is None


def test_the_module_function_comes_before_the_method(tmp_path):
    text = MODEL + "\n\ndef loss(out, target):\n    return (out - target).abs().mean()\n"
    plan = load_plan(_plan(tmp_path, "with_loss", module="loss_method_both", text=text))
    model = build_model(plan.model, plan.path)
    assert plan_loss(plan, model).__name__ == "loss" and not hasattr(plan_loss(plan, model), "__self__")


def test_check_lowers_the_step_with_the_method_and_its_target(tmp_path):
    from planlang.model.validation import _lowered

    path = _plan(tmp_path, "with_loss")
    assert not check_with_model(path).errors
    plan = load_plan(path)
    prog = _lowered(build_model(plan.model, plan.path), plan)
    inputs = [v for v in prog.graph.values.values() if v.kind == "input"]
    assert len(inputs) == 2 and inputs[1].shape == (8, 4)  # x, then the target the method takes


def test_estimate_prices_the_method(tmp_path):
    plan = load_plan(_plan(tmp_path, "wide_loss"))
    assert model_loss(plan.model, plan.path) is not None  # what the estimate traces the step with
    wide = estimate_plan(plan)[0]
    assert wide.activations > 512 * 1024, wide  # 4 samples x 64 x 512 floats of the loss's own, per rank


@pytest.fixture
def world_of_one():
    with one_process_group():
        yield


def test_a_step_takes_the_inputs_and_the_methods_targets(tmp_path, world_of_one, capsys):
    plan = load_plan(_plan(tmp_path, "with_loss", n=1))
    torch.manual_seed(0)
    model = build_model(plan.model, plan.path, device="cpu")
    same = copy.deepcopy(model)
    pm = apply(model, plan)
    x, y = torch.randn(8, 8), torch.randn(8, 4)
    loss = pm.step(x, y)  # was: "expected 1 tensors (x), got 2"
    assert float(loss.detach()) == pytest.approx(float(same.loss(same(x), y).detach()), rel=1e-6)
    assert "PL370" not in capsys.readouterr().err


def test_apply_says_when_the_outputs_sum_is_the_loss(tmp_path, world_of_one, capsys):
    plan = load_plan(_plan(tmp_path, "plain", n=1))
    apply(build_model(plan.model, plan.path, device="cpu"), plan)
    err = capsys.readouterr().err
    assert "note[PL370]" in err and "sum of its output [8, 4]" in err


def test_verify_on_two_gloo_ranks_compares_the_methods_loss(tmp_path):
    path = _plan(tmp_path, "with_loss")
    out = subprocess.run([sys.executable, "-m", "planlang.cli", "verify", path, "-q", "--steps", "2"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    rows = [line.split() for line in out.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert len(rows) == 2, out.stdout
    for row in rows:  # step, loss under the plan, loss in one process: mse + 1000, not the output's sum
        assert 1000 < float(row[1]) < 1100 and 1000 < float(row[2]) < 1100, out.stdout
    assert out.stdout.rstrip().splitlines()[-1].startswith("PASS"), out.stdout
