"""Both front ends lower a call by looking its target up in the op table (planlang.cost.ops `Targets`,
resolved by planlang.model.capture.targets): every target resolves in this torch, names one kind, and an
op added to the table is lowered by both front ends with no other edit."""
from __future__ import annotations

import torch
from torch import nn

from planlang.cost.ops import OpKind, base, on, registry
from planlang.cost.ops.rules import cast_rule
from planlang.model.capture import aten_readers, fx_readers
from planlang.model.capture.export_graph import export_op_graph
from planlang.model.capture.opgraph import op_graph
from planlang.model.capture.targets import ATEN_IDENTITY, COMPOSITE, FX_IDENTITY, resolve, target_index


def test_every_target_resolves_and_names_one_kind():
    index = target_index()  # resolves every name; ValueError if two kinds declare one
    names = list(index.names) + list(FX_IDENTITY + ATEN_IDENTITY + COMPOSITE)
    assert len(names) == len(set(names))
    kind_of: dict[object, str] = {}
    for name, kind in index.names.items():
        if not name.startswith("Tensor."):
            assert kind_of.setdefault(resolve(name), kind) == kind, f"{name} is also {kind_of[resolve(name)]}'s"
    for name in FX_IDENTITY + ATEN_IDENTITY + COMPOSITE:
        if not name.startswith("Tensor."):
            assert resolve(name) not in kind_of, name


def test_readers_read_kinds_and_targets_of_the_table():
    kinds, index = set(registry()), target_index()
    assert set(fx_readers.READERS) <= kinds and set(fx_readers.MODULE_READERS) <= kinds
    assert set(aten_readers.READERS) <= kinds
    assert set(aten_readers.TARGET_READERS) <= {n for n in index.names if n.startswith("aten.")}
    assert set(fx_readers.COMPOSITE_READERS) | set(aten_readers.COMPOSITE_READERS) == set(COMPOSITE)


class _Erf(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return torch.erf(self.lin(x))


def test_adding_an_op_is_one_entry(monkeypatch):
    """A kind registered in a copy of the table with its targets (and a rule) is what both front ends
    emit for its calls; without it the call is opaque."""
    inputs = {"x": torch.randn(4, 8)}
    assert [n.op.kind for n in op_graph(_Erf(), inputs).nodes] == ["linear", "opaque"]
    erf = OpKind("erf", cast_rule, follower=True, targets=on("torch.erf", aten=("aten.erf.default",)))
    monkeypatch.setattr(base, "_KINDS", {**base._KINDS, "erf": erf})
    g = op_graph(_Erf(), inputs)
    assert [n.op.kind for n in g.nodes] == ["linear", "erf"]
    assert g.nodes[1].inputs == (g.nodes[0].name,)
    exported = export_op_graph(_Erf(), inputs)
    assert [n.op.kind for n in exported.nodes] == ["linear", "erf"]
