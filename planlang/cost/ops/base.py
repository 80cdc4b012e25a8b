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

from planlang.plan.types import DTYPE_BYTES, Mesh, Spec  # noqa: F401 - DTYPE_BYTES: defined once, in plan.types

from ..comm import CommCost


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


@dataclass(frozen=True)
class OpKind:
    """Everything the toolchain knows about one op kind, declared once, beside its rule.

    `rule` gives its sharding strategies; `saves` the input slots it keeps for backward (parameters are
    counted as parameters, so only their converted copies count) and `saves_output` whether it keeps its
    output; `alias` says its output is a view of input 0 (no bytes of its own); `backward_ratio` is
    backward flops / forward flops (two matmuls per matmul: input and weight gradients; one pass
    otherwise); `follower` marks a unary elementwise op that the intra-op ILP merges into its producer
    (Alpa §5.1). The local implementation (torch) is registered under the same name in
    `planlang.runtime.local_ops`, which refuses to import while any kind here lacks one; both front ends
    (`planlang.model.capture.opgraph`, `planlang.model.capture.export_graph`) refuse to emit a kind missing here.
    """

    name: str
    rule: RuleFn
    saves: tuple[int, ...] = ()
    saves_output: bool = False
    alias: bool = False
    backward_ratio: float = 1.0
    follower: bool = False

    def __str__(self) -> str:
        return self.name


_KINDS: dict[str, OpKind] = {}


def _per_kind(value, kind: str, default):
    """A fact given for every kind of a rule (a value) or per kind (a dict; kinds it omits get `default`)."""
    return value.get(kind, default) if isinstance(value, dict) else value


def rule(*kinds: str, saves=(), saves_output=False, alias=False, backward_ratio=1.0, follower=False):
    """Register a strategy generator for one or more op kinds, with each kind's memory and cost facts
    (`OpKind`); a fact may be one value for all `kinds` or a dict by kind."""

    def deco(fn: RuleFn) -> RuleFn:
        for k in kinds:
            if k in _KINDS:
                raise ValueError(f"op kind {k!r} already has a rule")
            _KINDS[k] = OpKind(k, fn, tuple(_per_kind(saves, k, ())), bool(_per_kind(saves_output, k, False)),
                               bool(_per_kind(alias, k, False)), float(_per_kind(backward_ratio, k, 1.0)),
                               bool(_per_kind(follower, k, False)))
        return fn

    return deco


def registry() -> dict[str, OpKind]:
    """Every known op kind by name."""
    return dict(_KINDS)


class UnknownOp(KeyError):
    pass


def op_kind(kind: str) -> OpKind:
    """The registered facts of `kind` (UnknownOp, naming the known kinds, when there are none)."""
    try:
        return _KINDS[kind]
    except KeyError:
        raise UnknownOp(f"no sharding rule for op kind {kind!r}; known: {', '.join(sorted(_KINDS))}") from None


def strategies(op: OpSpec, mesh: Mesh) -> list[Strategy]:
    """Every valid strategy for `op` on `mesh` (sizes must be known), deduplicated, stable order."""
    seen, out = set(), []
    for s in op_kind(op.kind).rule(op, mesh):
        key = (s.inputs, s.output)
        if key not in seen:
            seen.add(key)
            out.append(s)
    return out
