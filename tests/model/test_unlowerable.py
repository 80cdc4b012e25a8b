"""A fact `check --model` cannot compute is a coded error (PL369), never a silent pass: a plan the runtime's
lowering cannot lower (every rank would raise at launch), a loss no target fits, an estimate that fails.
`model/checks.py: lowering_facts` used to catch every exception and return None."""
from __future__ import annotations

import textwrap

import pytest

pytest.importorskip("torch")

import planlang.model.validation as checks  # noqa: E402
import planlang.model.program.pricer as pricer  # noqa: E402
from planlang.model.validation import check_with_model  # noqa: E402

MODEL = textwrap.dedent("""\
    import torch.nn.functional as F
    from torch import nn


    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(16, 16)
            self.b = nn.Linear(16, 8)

        def forward(self, x):
            return self.b(self.a(x).relu())


    class Unbound(nn.Module):
        # unbind's pieces are not tensors to the op graph: planlang cannot build its graph (today)
        def __init__(self):
            super().__init__()
            self.kv = nn.Linear(16, 32)

        def forward(self, x):
            k, v = self.kv(x).view(x.shape[0], 2, 16).unbind(1)
            return k.transpose(0, 1).sum() + v.sum()


    class TwoTargets(Two):
        def loss(self, out, target, weight):  # two targets: planlang makes one
            return (F.mse_loss(out, target, reduction="none") * weight).mean()


    def two():
        return Two()


    def unbound():
        return Unbound()


    def two_targets():
        return TwoTargets()
""")
PLAN = textwrap.dedent("""\
    use hardware
    model net = "unlowerable_models:{factory}"
    input x : f32[batch = 4, features = 16]
    mesh m of 2 x hardware.cpu {{
        {axis} = 2 over hardware.loopback
    }}
    budget 1 GiB per device
    {rest}
""")


def diags(tmp_path, factory: str, axis: str = "dp", rest: str = "data x : [dp, _]"):
    (tmp_path / "unlowerable_models.py").write_text(MODEL)
    p = tmp_path / "p.plan"
    p.write_text(PLAN.format(factory=factory, axis=axis, rest=textwrap.indent(rest, "    ").strip()))
    res = check_with_model(str(p))
    return [(d.code, d.span.line, d.message, d.help, [lab.span.line for lab in d.labels]) for d in res.diagnostics]


def test_a_model_whose_op_graph_cannot_be_built_is_pl369_at_the_model_line(tmp_path):
    got = [d for d in diags(tmp_path, "unbound") if d[0] == "PL369"]
    assert len(got) == 1, got
    code, line, msg, help, _ = got[0]
    assert line == 2 and "the plan cannot be lowered" in msg and "UnsupportedGraph" in msg and "not a tensor" in msg
    assert "rewrite" in help


TP = "shard a.weight : [tp, _]\nshard a.bias : [tp]\nshard b.weight : [_, tp]"


def test_an_op_the_lowering_refuses_is_pl369_at_the_shard_of_its_module(tmp_path, monkeypatch):
    # a strategy rule that raises for `b`'s linear (as the attention rule did for multi-query attention's
    # broadcast key/value heads: "letter 'h' has sizes 4 and 1"); a tensor-parallel plan without data axes,
    # which check did not lower at all
    real = pricer.strategies

    def refusing(op, mesh):
        if op.kind == "linear" and (8, 16) in op.inputs:
            raise ValueError(f"{op.kind}{list(op.inputs)}: letter 'o' has sizes 8 and 1")
        return real(op, mesh)

    monkeypatch.setattr(pricer, "strategies", refusing)
    got = [d for d in diags(tmp_path, "two", axis="tp", rest=TP) if d[0] == "PL369"]
    assert len(got) == 1, got
    code, line, msg, help, labels = got[0]
    assert line == 10, got  # `shard b.weight : [_, tp]`: the statement over the failing op's module
    assert "`linear` in `b` fails" in msg and "ValueError" in msg and "letter 'o' has sizes 8 and 1" in msg
    assert 2 in labels  # and the model line
    assert "split this op's inputs another way" in help
    monkeypatch.setattr(pricer, "strategies", real)
    assert not [d for d in diags(tmp_path, "two", axis="tp", rest=TP) if d[0] == "PL369"]


def test_a_loss_no_target_fits_is_pl369(tmp_path):
    got = [d for d in diags(tmp_path, "two_targets") if d[0] == "PL369"]
    assert len(got) == 1, got
    assert got[0][1] == 2 and "the `loss` method of TwoTargets accepts none of the targets" in got[0][2]


def test_an_estimate_that_fails_is_pl369_at_the_budget(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise KeyError("no cost for this op")

    monkeypatch.setattr(checks, "estimate_plan", broken)
    got = [d for d in diags(tmp_path, "two") if d[0] == "PL369"]
    assert len(got) == 1, got
    assert got[0][1] == 7 and "memory cannot be estimated" in got[0][2] and "no cost for this op" in got[0][2]
