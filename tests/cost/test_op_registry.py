"""The op registry is one place (planlang.cost.ops.OpKind): every op kind declares its sharding rule and
its memory and cost facts there, its local implementation is registered under the same name (checked
against one process for every strategy on 4 gloo ranks: tests/runtime/test_op_strategies_gloo.py), and
both front ends emit only registered kinds. A kind added to one place and not the others fails here."""
from __future__ import annotations

import pytest
import torch

from planlang.cost.ops import UnknownOp, op_kind, registry
from planlang.model.capture.graph_values import Value, op_spec
from planlang.runtime import local_ops
from tests.runtime.test_op_strategies_gloo import CASES

# kinds that keep nothing for backward: linear in their inputs with constant coefficients (their
# gradients need no saved value)
KEEP_NOTHING = {"add", "sub", "neg", "sum", "mean", "cat", "stack", "roll", "cast"}


def test_every_kind_has_a_rule_and_a_checked_local_implementation():
    kinds = set(registry())
    assert set(local_ops._LOCAL) == kinds
    checked = {c.op.kind for c in CASES}
    assert kinds - checked == set(), "op kinds whose strategies no gloo case executes"
    assert checked - kinds == set(), "gloo cases of kinds without a rule"


def test_a_kind_that_keeps_nothing_for_backward_says_so_by_being_linear():
    """A kind registered without `saves`, `saves_output` or `alias` is one the solver prices as keeping
    nothing: that must be a decision (the list above), not a forgotten fact."""
    keeps_nothing = {k for k, f in registry().items() if not (f.saves or f.saves_output or f.alias)}
    assert keeps_nothing == KEEP_NOTHING


def test_facts_are_read_from_the_registry():
    assert op_kind("linear").saves == (0, 1) and op_kind("linear").backward_ratio == 2.0
    assert op_kind("relu").saves_output and op_kind("relu").follower and not op_kind("relu").saves
    assert op_kind("view").alias and not op_kind("view").follower
    assert str(op_kind("gelu")) == "gelu"


def test_a_front_end_cannot_emit_an_unregistered_kind():
    x = Value("x", (2, 3), "f32", "input")
    assert op_spec("relu", [x], torch.empty(2, 3), None).kind == "relu"
    assert op_spec("opaque", [x], torch.empty(2, 3), {"target": "f"}).kind == "opaque"
    with pytest.raises(UnknownOp, match="frobnicate"):
        op_spec("frobnicate", [x], torch.empty(2, 3), None)
