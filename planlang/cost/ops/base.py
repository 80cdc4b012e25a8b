"""Op sharding rules: what layouts an op accepts and produces on a mesh, and what it costs.

An op is described as plain data (`OpSpec`: kind, input shapes and dtypes, attributes) so this layer
needs no torch; `planlang.model` maps fx nodes to OpSpecs, the solver enumerates `strategies(op, mesh)`,
and `planlang.runtime.local_ops` executes a strategy on local shards.

A `Strategy` says: give me inputs in these layouts (`inputs`, one Spec per tensor input, partial sums
allowed where the op is linear in that input), and each device computes its local piece of the output in
layout `output` (possibly partial) after the collectives in `forward`; its backward needs the collectives
in `backward` beyond what converting layouts costs. `flops` and `memory` are per device.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from planlang.plan.types import Mesh, Spec

from ..comm import CommCost

DTYPE_BYTES = {"f64": 8, "f32": 4, "tf32": 4, "bf16": 2, "f16": 2, "fp8": 1, "i64": 8, "i32": 4, "i16": 2,
               "i8": 1, "u8": 1, "bool": 1}


@dataclass(frozen=True)
class OpSpec:
    """One op instance: `kind` (see `registry()`), input shapes/dtypes, output shape, attributes."""

    kind: str
    inputs: tuple[tuple[int, ...], ...]
    output: tuple[int, ...]
    dtype: str = "f32"
    attrs: tuple[tuple[str, object], ...] = ()
    input_dtypes: tuple[str, ...] = ()

    def attr(self, name: str, default=None):
        return dict(self.attrs).get(name, default)

    def __str__(self) -> str:
        ins = ", ".join(str(list(s)) for s in self.inputs)
        return f"{self.kind}({ins}) -> {list(self.output)}"

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES.get(self.dtype, 4)


@dataclass(frozen=True)
class Strategy:
    name: str
    inputs: tuple[Spec, ...]
    output: Spec
    forward: tuple[CommCost, ...] = ()
    backward: tuple[CommCost, ...] = ()
    flops: float = 0.0
    memory: int = 0
    extra: tuple[tuple[str, object], ...] = field(default=(), compare=False)

    def __str__(self) -> str:
        ins = " x ".join(str(s) for s in self.inputs)
        return f"{self.name}: {ins} -> {self.output}"

    @property
    def comm_seconds(self) -> float:
        return sum(c.seconds for c in self.forward) + sum(c.seconds for c in self.backward)


RuleFn = Callable[[OpSpec, Mesh], list[Strategy]]
_RULES: dict[str, RuleFn] = {}


def rule(*kinds: str):
    """Register a strategy generator for one or more op kinds."""

    def deco(fn: RuleFn) -> RuleFn:
        for k in kinds:
            if k in _RULES:
                raise ValueError(f"op kind {k!r} already has a rule")
            _RULES[k] = fn
        return fn

    return deco


def registry() -> dict[str, RuleFn]:
    return dict(_RULES)


class UnknownOp(KeyError):
    pass


def strategies(op: OpSpec, mesh: Mesh) -> list[Strategy]:
    """Every valid strategy for `op` on `mesh` (sizes must be known), deduplicated, stable order."""
    fn = _RULES.get(op.kind)
    if fn is None:
        raise UnknownOp(f"no sharding rule for op kind {op.kind!r}; known: {', '.join(sorted(_RULES))}")
    seen, out = set(), []
    for s in fn(op, mesh):
        key = (s.inputs, s.output)
        if key not in seen:
            seen.add(key)
            out.append(s)
    return out
