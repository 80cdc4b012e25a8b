"""The op table (planlang.cost.ops): one `OpKind` per op kind holds its sharding rule, the torch and ATen
targets the front ends lower to it, and its memory and cost facts; the tables that used to restate it
(traffic's kinds that save nothing, head_blocks' products, the executor's dropout) now read it."""
from __future__ import annotations

from collections import Counter

from planlang.cost.ops import OpKind, OpSpec, registry


def test_every_kind_the_table_declares_has_a_rule():
    for name, kind in registry().items():
        assert isinstance(kind, OpKind) and kind.name == name
        assert callable(kind.rule), name


def test_a_target_names_exactly_one_kind():
    counts = Counter(t for kind in registry().values() for t in kind.targets.names())
    assert [t for t, n in counts.items() if n > 1] == []


def test_targets_are_written_as_names_of_their_kind_of_call():
    for kind in registry().values():
        t = kind.targets
        assert all(n.startswith("aten.") and n.count(".") == 2 for n in t.aten), kind
        assert not any(n.startswith("aten.") for n in t.functions + t.modules), kind
        assert all("." in n for n in t.functions + t.modules), kind  # a dotted path: module, then name
        assert all("." not in m for m in t.methods), kind  # a Tensor method's name


def test_only_kinds_no_call_maps_onto_have_no_targets():
    # unflatten and getitem are made by hand (tests, hand-built strategies), never by a front end
    assert {k for k, f in registry().items() if not f.targets.names()} == {"unflatten", "getitem"}


def test_facts_the_other_layers_read():
    table = registry()
    assert {k for k, f in table.items() if f.product} == {"linear", "addmm", "matmul"}
    assert table["linear"].product == (1, 0, 2) and table["matmul"].product == (1, -1, None)
    assert {k for k, f in table.items() if f.random} == {"dropout", "scaled_dot_product_attention"}
    attention = table["scaled_dot_product_attention"]  # random where it drops attention weights
    shape = ((1, 2, 4, 8),) * 3
    assert attention.draws(OpSpec("scaled_dot_product_attention", shape, shape[0], attrs=(("dropout_p", 0.1),)))
    assert not attention.draws(OpSpec("scaled_dot_product_attention", shape, shape[0]))
    assert not attention.is_identity(OpSpec("scaled_dot_product_attention", shape, shape[0], attrs=(("dropout_p", 0.1),)))
    drop = table["dropout"]
    assert drop.draws(OpSpec("dropout", ((2,),), (2,), attrs=(("p", 0.1), ("training", True))))
    assert not drop.draws(OpSpec("dropout", ((2,),), (2,), attrs=(("p", 0.1), ("training", False))))
    assert drop.is_identity(OpSpec("dropout", ((2,),), (2,), attrs=(("p", 0.0), ("training", True))))
    assert drop.is_identity(OpSpec("dropout", ((2,),), (2,), attrs=(("p", 0.1), ("training", False))))
    assert not drop.is_identity(OpSpec("dropout", ((2,),), (2,), attrs=(("p", 0.1), ("training", True))))
    assert not table["relu"].is_identity(OpSpec("relu", ((2,),), (2,)))
    saves_nothing = {k for k, f in table.items() if f.saves_nothing}
    assert {"add", "view", "cat", "cast", "expand"} <= saves_nothing and not {"mul", "relu", "dropout"} & saves_nothing
