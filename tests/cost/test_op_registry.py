"""Every op kind has everything the toolchain needs: a sharding rule (planlang.cost.ops), a local
implementation checked against one process for every strategy on 4 gloo ranks (the cases of
tests/runtime/test_op_strategies_gloo.py), and the solver's memory tables know whether it keeps inputs
for backward. A kind added to one place and not the others fails here."""
from __future__ import annotations

from planlang.cost.ops import registry
from planlang.solve.intra_op import ALIASES, SAVES, SAVES_OUTPUT
from tests.runtime.test_op_strategies_gloo import CASES

# kinds that keep nothing for backward: linear in their inputs with constant coefficients (their
# gradients need no saved value)
KEEP_NOTHING = {"add", "sub", "neg", "sum", "mean", "cat"}


def test_every_kind_has_a_rule_and_a_checked_local_implementation():
    kinds = set(registry())
    checked = {c.op.kind for c in CASES}
    assert kinds - checked == set(), "op kinds whose strategies no gloo case executes"
    assert checked - kinds == set(), "gloo cases of kinds without a rule"


def test_every_kind_is_in_the_solvers_memory_tables():
    unknown = set(registry()) - set(SAVES) - SAVES_OUTPUT - ALIASES - KEEP_NOTHING
    assert unknown == set(), f"op kinds the solver does not know the saved bytes of: {sorted(unknown)}"
