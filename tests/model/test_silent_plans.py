"""Plans `check --model` accepted and the runtime then ran as something else, or refused (issue 27, "No
silent wrong numbers"): overlapping shard patterns (PL310), an activation spec whose implicit data axes
do not divide the batch (PL362), and sharded weights the lowering gathers every step (PL366)."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from planlang.model.validation import check_with_model
from planlang.model.capture.load import build_model
from planlang.model.price.weight_gathers import weight_gathers
from planlang.plan.complete import complete
from planlang.runtime.apply import PlanError, lower_plan

REPO = Path(__file__).resolve().parents[2]
MLP_2D = (REPO / "examples" / "mlp" / "mlp_2d.plan").read_text()


def diags(path):
    return [(d.code, d.span.line, d.message) for d in check_with_model(str(path)).diagnostics]


def mlp_plan(tmp_path, *edits: tuple[str, str]) -> Path:
    text = MLP_2D
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    p = tmp_path / "mlp.plan"
    p.write_text(text)
    return p


# ------------------------------------------------------------------------------ overlapping patterns
def test_a_glob_overlapping_a_parameter_with_another_spec_is_pl310_in_check_model(tmp_path):
    """examples/mlp's parameters are fc1.weight, fc1.bias, fc2.weight, fc2.bias (`planlang inspect`):
    `fc*.weight` selects fc2.weight too, which the next statement shards the other way. The runtime
    took the later one and all_to_all'd fc2.weight every step; now neither may silently win."""
    p = mlp_plan(tmp_path, ("shard fc1.weight    : [tp, _]", "shard fc*.weight : [tp, _]"))
    out = subprocess.run([sys.executable, "-m", "planlang.cli", "check", "--model", str(p)], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr
    assert ("error[PL310]: `fc2.weight` is sharded twice: [tp, _] by `shard fc*.weight : [tp, _]` (line 23) and "
            "[_, tp] by `shard fc2.weight : [_, tp]`") in out.stdout, out.stdout
    assert f"{p}:29:1" in out.stdout  # at the later statement


# ------------------------------------------------------------------------------ implicit data axes
def test_an_activation_spec_whose_implicit_data_axes_do_not_divide_the_batch_is_pl362(tmp_path):
    """`[tp, _]` on an activation under `data x : [dp, _]` is `[(dp, tp), _]` (docs/language.md §14.1):
    a batch of 2 does not split 4 ways. check --model said nothing; every rank then raised "no strategy of
    `gelu` at act fits the layouts [dp, tp]"."""
    p = mlp_plan(tmp_path, ("batch = 64", "batch = 2"),
                 ("shard output of act : [dp, tp]", "shard output of act : [tp, _]"))
    got = [d for d in diags(p) if d[0] == "PL362"]
    assert len(got) == 1, got
    code, line, msg = got[0]
    assert line == 26  # `shard output of act : [tp, _]`
    assert "`output of act` [2, 4096]: dim 0 is 2, not divisible by dp(2) * tp(2) = 4" in msg
    assert "[tp, _] is laid out as [(dp, tp), _]" in msg
    # the runtime's own refusal names the statement, not the op after it
    plan = complete(check_with_model(str(p)).plan)
    with pytest.raises(PlanError, match=r"shard output of act : \[tp, _\]`: the output of `act` \[2, 4096\]"):
        lower_plan(build_model(plan.model, plan.path), plan)


def test_the_same_spec_with_a_batch_that_divides_checks_clean_and_lowers(tmp_path):
    p = mlp_plan(tmp_path, ("batch = 64", "batch = 4"),
                 ("shard output of act : [dp, tp]", "shard output of act : [tp, _]"))
    assert [d for d in diags(p) if d[0] in ("PL362", "PL369")] == []
    plan = complete(check_with_model(str(p)).plan)
    prog = lower_plan(build_model(plan.model, plan.path), plan)
    act = next(ins for ins in prog.instructions if getattr(ins, "node", None) and ins.node.module == "act")
    assert act.output.axes_of(0) == ("dp", "tp")


def test_batch_2_with_the_data_axes_left_implicit_and_tp_on_the_features_is_clean(tmp_path):
    p = mlp_plan(tmp_path, ("batch = 64", "batch = 2"),
                 ("shard output of act : [dp, tp]", "shard output of act : [_, tp]"),
                 ("shard output of fc1 : [dp, tp]", "shard output of fc1 : [_, tp]"))
    assert [d for d in diags(p) if d[0] in ("PL362", "PL369")] == []


# ------------------------------------------------------------------------------ gathered weights
GATED = '''\
import torch.nn.functional as F
from torch import nn


class Gated(nn.Module):
    """A gated MLP whose `up` holds the gate's and the up projection's rows in one weight, cut in forward."""

    def __init__(self, d=16, h=32):
        super().__init__()
        self.up = nn.Linear(d, 2 * h)
        self.down = nn.Linear(h, d)

    def forward(self, x):
        gate_w, up_w = self.up.weight.chunk(2, dim=0)
        gate_b, up_b = self.up.bias.chunk(2, dim=0)
        return self.down(F.silu(F.linear(x, gate_w, gate_b)) * F.linear(x, up_w, up_b))


def build():
    return Gated()
'''

GATED_PLAN = """\
use hardware
model m = "gated_up:build"()
input x : f32[batch = 8, features = 16]
mesh ranks of 4 x hardware.cpu {{
    dp = 2 over hardware.loopback
    tp = 2 over hardware.loopback
}}
budget 1 GiB per device
optimizer adamw(lr = 0.001)
data x : [dp, _]
{shards}"""


def gated(tmp_path, shards: str) -> Path:
    (tmp_path / "gated_up.py").write_text(GATED)
    p = tmp_path / "gated.plan"
    p.write_text(GATED_PLAN.format(shards=textwrap.dedent(shards)))
    return p


def test_a_sharded_weight_cut_in_forward_is_gathered_every_step_pl366(tmp_path):
    p = gated(tmp_path, "shard up.weight : [tp, _]\nshard up.bias : [tp]\nshard down.weight : [_, tp]\n")
    got = [d for d in check_with_model(str(p)).diagnostics if d.code == "PL366"]
    assert [(d.span.line, d.severity.value) for d in got] == [(11, "warning"), (12, "warning")], got
    msg = got[0].message
    assert msg.startswith("`up.weight` [64, 16], stored as [tp, _], is all-gathered back to whole every step for "
                          "`split`"), msg
    # 64 x 16 f32 gathered over tp = 2: each rank sends its half, 2 KiB, as `planlang lower --traffic` counts
    assert "(all_gather(tp, dim 0): 2 KiB per rank per step)" in msg
    assert "leave it replicated" in got[0].help and "`split` has a strategy" in got[0].help
    plan = complete(check_with_model(str(p)).plan)
    found = weight_gathers(lower_plan(build_model(plan.model, plan.path), plan), plan)
    assert [(g.param, g.op, g.whole, g.bytes) for g in found] == [("up.weight", "split", True, 2048.0),
                                                                  ("up.bias", "split", True, 128.0)]


def test_weights_used_as_stored_are_not_pl366(tmp_path):
    p = gated(tmp_path, "shard down.weight : [_, tp]\n")  # up replicated: the cut needs nothing
    assert [d for d in check_with_model(str(p)).diagnostics if d.code == "PL366"] == []
    assert [d for d in diags(mlp_plan(tmp_path)) if d[0] == "PL366"] == []  # Megatron's MLP: no gather


SCAN = '''\
import torch
from torch import nn


class Scan(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(32, 16))

    def forward(self, x):
        return x @ torch.cumsum(self.w, dim=0).t()  # a scan along the dim the plan splits


def build():
    return Scan()
'''


def test_a_sharded_weight_read_by_an_op_without_a_rule_names_the_op_pl366(tmp_path):
    (tmp_path / "scan_w.py").write_text(SCAN)
    p = tmp_path / "scan.plan"
    p.write_text(GATED_PLAN.format(shards="shard w : [tp, _]\n").replace('"gated_up:build"', '"scan_w:build"'))
    got = [d for d in check_with_model(str(p)).diagnostics if d.code == "PL366"]
    assert len(got) == 1 and got[0].span.line == 11, got
    assert "`w` [32, 16], stored as [tp, _], is all-gathered back to whole every step for `cumsum`" in got[0].message
    assert "(all_gather(tp, dim 0): 1 KiB per rank per step)" in got[0].message
    assert "leave it replicated" in got[0].help
