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
from typing import Any, Callable

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
class Targets:
    """The torch calls the front ends lower to one op kind, by name (this layer imports no torch; the
    model layer resolves the names: planlang.model.capture.targets). `functions`: fx call_function
    targets by dotted path ("torch.nn.functional.gelu", "operator.add"); `methods`: fx call_method names
    ("relu" for `x.relu()`); `modules`: module classes an fx call_module runs, matched by exact type
    ("torch.nn.GELU"); `aten`: the ATen overloads torch.export records ("aten.gelu.default"). A target
    names one kind in the whole registry (tests/cost/test_op_table.py)."""

    functions: tuple[str, ...] = ()
    methods: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    aten: tuple[str, ...] = ()

    def names(self) -> tuple[str, ...]:
        """Every target, methods as "Tensor.<name>" (so that a method and a function never share a name)."""
        return self.functions + tuple(f"Tensor.{m}" for m in self.methods) + self.modules + self.aten


def on(*functions: str, methods: tuple[str, ...] = (), modules: tuple[str, ...] = (),
       aten: tuple[str, ...] = ()) -> Targets:
    """`Targets` written as a call: on("torch.relu", methods=("relu",), aten=("aten.relu.default",))."""
    return Targets(tuple(functions), tuple(methods), tuple(modules), tuple(aten))


# (the input that is the weight, the weight dim that becomes the output's last dim, the bias input)
Product = tuple[int, int, int | None]


@dataclass(frozen=True)
class OpKind:
    """Everything the toolchain knows about one op kind, declared once, beside its rule: one entry of the
    op table.

    `rule` gives its sharding strategies; `targets` the torch calls that lower to it (`Targets`); `saves`
    the input slots it keeps for backward (parameters are counted as parameters, so only their converted
    copies count) and `saves_output` whether it keeps its output; `alias` says its output is a view of
    input 0 (no bytes of its own); `backward_ratio` is backward flops / forward flops (two matmuls per
    matmul: input and weight gradients; one pass otherwise); `follower` marks a unary elementwise op that
    the intra-op ILP merges into its producer (Alpa §5.1); `product` marks a linear product whose weight
    a fused projection may store per head (planlang.model.program.head_blocks); `random` an op that draws
    random numbers (the executor gives it a fresh `seed` attr every step), or a function saying which
    instances do (`draws`); `identity` says when an
    instance is the identity (a dropout in eval or with p = 0: it runs nothing and keeps nothing).

    The local implementation (torch) is registered under the same name in `planlang.runtime.local_ops`,
    which refuses to import while any kind here lacks one; both front ends
    (`planlang.model.capture.opgraph`, `planlang.model.capture.export_graph`) lower a kind's targets by
    looking them up here and refuse to emit a kind missing here.
    """

    name: str
    rule: RuleFn
    saves: tuple[int, ...] = ()
    saves_output: bool = False
    alias: bool = False
    backward_ratio: float = 1.0
    follower: bool = False
    targets: Targets = Targets()
    product: Product | None = None
    random: bool | Callable[[OpSpec], bool] = False
    identity: Callable[[OpSpec], bool] | None = None

    def __str__(self) -> str:
        return self.name

    def draws(self, op: OpSpec) -> bool:
        """Whether this instance draws random numbers (the executor seeds it per step): `random`, or for
        a kind whose instances differ (attention with or without `dropout_p`) its answer for `op`; never
        an instance that is the identity."""
        r = self.random
        return bool(r(op) if callable(r) else r) and not self.is_identity(op)

    @property
    def saves_nothing(self) -> bool:
        """Whether its autograd keeps no tensor for backward (sums, differences, views, casts ...)."""
        return not self.saves and not self.saves_output

    def is_identity(self, op: OpSpec) -> bool:
        return self.identity is not None and self.identity(op)


_KINDS: dict[str, OpKind] = {}


def _per_kind(value: Any, kind: str, default: Any) -> Any:
    """A fact given for every kind of a rule (a value) or per kind (a dict; kinds it omits get `default`)."""
    return value.get(kind, default) if isinstance(value, dict) else value


def rule(*kinds: str, saves: Any = (), saves_output: Any = False, alias: Any = False, backward_ratio: Any = 1.0,
         follower: Any = False, targets: Any = None, product: Any = None,
         random: bool | Callable[[OpSpec], bool] = False,
         identity: Callable[[OpSpec], bool] | None = None) -> Callable[[RuleFn], RuleFn]:
    """Register a strategy generator for one or more op kinds, with each kind's targets and memory and
    cost facts (`OpKind`); a fact may be one value for all `kinds` or a dict by kind."""

    def deco(fn: RuleFn) -> RuleFn:
        for k in kinds:
            if k in _KINDS:
                raise ValueError(f"op kind {k!r} already has a rule")
            _KINDS[k] = OpKind(k, fn, tuple(_per_kind(saves, k, ())), bool(_per_kind(saves_output, k, False)),
                               bool(_per_kind(alias, k, False)), float(_per_kind(backward_ratio, k, 1.0)),
                               bool(_per_kind(follower, k, False)), _per_kind(targets, k, None) or Targets(),
                               _per_kind(product, k, None), random, identity)
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
