"""An opaque call run per sample (planlang.model.program.lowering.per_sample_strategy) gets every input with
the batch's leading size split as the batch is, constants included: a mask made from positions and
expanded to the batch (a torch.export constant, as Hugging Face attention masks are) ran whole beside the
local batch and raised a shape error on every rank (HF BERT with attention dropout under dp 2 x tp 2 did,
before its attention had a rule with dropout). And an opaque op run whole over tp is listed for PL367
(T5's attention, whose mask is its learned position bias). The gloo runs: tests/runtime/test_verify_dropout_gloo.py."""
from __future__ import annotations

from pathlib import Path

from planlang.model.capture.load import build_model
from planlang.model.program.lowering import Run
from planlang.plan.complete import complete
from planlang.runtime.apply import load_plan, lower_plan
from tests.zoo.plans import plan_text

MODEL = '''import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        if x.dim() != 3:  # python control flow on the input: torch.fx cannot trace it, torch.export can
            raise ValueError("a batch of sequences")
        b, s, f = x.shape
        pos = torch.arange(s, device=x.device)
        mask = (pos[None, :, None] > 7).expand(b, s, f)  # made from positions, expanded to the batch
        return self.fc(x).masked_fill(mask, 0.0)


def build():
    return Net()


def loss(out, target):
    return ((out - target) ** 2).mean()
'''
PLAN = '''use hardware
model net = "psc_model:build"()
input x : f32[batch = 8, seq = 16, features = 16]
mesh ranks of 2 x hardware.cpu { dp = 2 over hardware.loopback }
budget 1 GiB per device
data x : [dp, _, _]
'''


def _program(path: Path):
    plan = complete(load_plan(str(path)))
    return lower_plan(build_model(plan.model, plan.path), plan)


def test_a_constant_of_the_batch_size_is_split_with_the_batch(tmp_path: Path):
    (tmp_path / "psc_model.py").write_text(MODEL)
    (tmp_path / "p.plan").write_text(PLAN)
    prog = _program(tmp_path / "p.plan")
    runs = [i for i in prog.instructions if isinstance(i, Run) and i.strategy is not None
            and i.strategy.name.startswith("per sample (masked_fill")]
    assert len(runs) == 1, "masked_fill is an opaque call run per sample"
    run = runs[0]
    values = [prog.graph.values[n] for n in run.node.inputs]
    assert [v.kind for v in values][1] == "const"  # the mask, folded by the export
    for value, spec in zip(values, run.strategy.inputs):
        assert "dp" in spec.axes_of(0), f"{value.name} {value.shape} whole: {spec}"


def test_an_op_run_whole_over_tp_is_listed(tmp_path: Path):
    """T5's attention takes its learned relative-position bias (split over tp with the heads) as its mask,
    which the attention rule has no strategy for: it and the `where` building that mask run whole on each
    tp rank, which the program lists (PL367); the batch itself stays split (no PL364)."""
    path = tmp_path / "t5.plan"
    path.write_text(plan_text("t5", "dp2tp2"))
    prog = _program(path)
    assert {(r.target.split(".")[-1], r.axes) for r in prog.replicated} == \
        {("scaled_dot_product_attention", ("tp",)), ("where", ("tp",))}
    assert all(r.gathered_bytes > 0 for r in prog.replicated) and not prog.fallbacks
