"""The op table's targets (planlang.cost.ops `Targets`, written as names) resolved to torch objects: what
both front ends look a call up in.

`TargetIndex` maps an fx call_function target (the function object), an fx call_method name, a module
class (an exact type) and an ATen overload to the op kind that declares it. A front end lowers a call
by looking its target up here and handing the node to that kind's argument reader (opgraph's
`fx_readers`, export_graph's `aten_readers`); a kind without a reader of its own gets the default one
(every positional argument a tensor input, keyword arguments as attributes), so adding an op whose
call reads that way is one entry of the table.

Beside the table, the few targets that lower to no op of one kind, named here once:

* `FX_IDENTITY`, `ATEN_IDENTITY`: calls that are their input (`x.contiguous()`, `nn.Identity`, ATen's
  alias/clone and same-dtype copies);
* `COMPOSITE`: calls lowered to several ops (`mse_loss` as sub, mul and mean).
"""
from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Any

import torch

from planlang.cost.ops import OpKind, registry

FX_IDENTITY = ("Tensor.contiguous", "torch.nn.Identity")
ATEN_IDENTITY = ("aten.alias.default", "aten.clone.default", "aten.contiguous.default", "aten.to.dtype_layout",
                 "aten.to.device", "aten._to_copy.default")
COMPOSITE = ("torch.nn.functional.mse_loss", "aten.mse_loss.default")


def resolve(name: str) -> Any:
    """The torch object a target name stands for: "aten.gelu.default" (an ATen overload),
    "torch.nn.functional.gelu", "operator.add", "torch.nn.GELU" (the longest importable module prefix,
    then attributes). AttributeError / ImportError for a name this torch lacks."""
    if name.startswith("aten."):
        obj: Any = torch.ops.aten
        for part in name.split(".")[1:]:
            obj = getattr(obj, part)
        return obj
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            obj = getattr(obj, part)
        return obj
    raise ImportError(f"no module in target name {name!r}")


@dataclass(frozen=True, eq=False)  # compared (and cached on) by identity: one per registry state
class TargetIndex:
    """Op kind by target: `functions` (fx call_function target objects), `methods` (fx call_method
    names), `modules` (module classes), `aten` (ATen overloads), and `names` (each target's name)."""

    functions: dict[Any, str]
    methods: dict[str, str]
    modules: dict[type, str]
    aten: dict[Any, str]
    names: dict[str, str]

    def function(self, target: object) -> str | None:
        try:
            return self.functions.get(target)
        except TypeError:  # an unhashable target: no kind has it
            return None

    def module(self, mod: object) -> str | None:
        return self.modules.get(type(mod))


def target_index() -> TargetIndex:
    """The targets of every kind of the op registry (as it is now) resolved; ValueError when two kinds
    declare one target. Computed once per registry state."""
    return _index(tuple(registry().values()))


@functools.lru_cache(maxsize=8)
def _index(kinds: tuple[OpKind, ...]) -> TargetIndex:
    functions: dict[Any, str] = {}
    methods: dict[str, str] = {}
    modules: dict[type, str] = {}
    aten: dict[Any, str] = {}
    names: dict[str, str] = {}
    for k in kinds:
        for name in k.targets.names():
            if name in names:
                raise ValueError(f"target {name} declared by op kinds {names[name]!r} and {k.name!r}")
            names[name] = k.name
        functions.update((resolve(n), k.name) for n in k.targets.functions)
        methods.update((m, k.name) for m in k.targets.methods)
        modules.update((resolve(n), k.name) for n in k.targets.modules)
        aten.update((resolve(n), k.name) for n in k.targets.aten)
    return TargetIndex(functions, methods, modules, aten, names)


def aten_targets(names: tuple[str, ...]) -> frozenset[Any]:
    """The ATen overloads of `names` (ATEN_IDENTITY, ...)."""
    return frozenset(resolve(n) for n in names)
