"""A generic strategy engine for ops described by an einsum-like equation over letters (torch-free).

An `Equation` names every dim of every tensor with a letter: `"bsk,nk,n->bsn"` is a linear layer with a
bias, `"bij,bjk->bik"` a batched matmul, `"abc,c->abc"` a broadcasting add. A strategy assigns each mesh
axis of size > 1 to at most one letter (or to none):

* a letter kept in the output: every tensor holding that letter is split on it by the axis, and so is
  the output (data/model parallelism);
* a contracted letter (in inputs only): the inputs are split on it and the output is a partial sum over
  the axis (row-parallel matmul, vocab-parallel embedding);
* several axes on one letter split it in mesh order (major to minor); a letter in `unshardable` never
  takes an axis; every split letter must divide by the product of its axes' sizes.

An axis can instead be a *partial pass-through* for inputs the op is linear in: mode `"one"` (the op is
linear in each of `linear` separately, e.g. matmul, mul): exactly one of them is partial over the axis,
the others are replicated on it, and the output is partial; mode `"all"` (e.g. add, cat): every input in
`linear` is partial and so is the output. An `affine` input (the bias of linear/addmm/conv) is partial
over every axis the output is partial over, so that summing the pieces adds it exactly once (converting
a replicated bias to that layout is layout.py's free `to_partial`).

Per strategy: `flops` = the op's global flops divided by the sizes of the axes that split a letter (an
axis left replicated or used as pass-through duplicates the work); `memory` = bytes of the local output;
`backward` = the all-reduces of input gradients the strategy leaves partial: an input not split by an
axis that splits some letter it lacks (a replicated weight with batch-split activations), or a
replicated input next to a pass-through partial one, gets a local gradient that is a partial sum over
that axis.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from planlang.plan.types import Mesh, Spec

from ..comm import Collective, CommCost, price
from .base import DTYPE_BYTES, OpSpec, Strategy

INT_DTYPES = frozenset({"i64", "i32", "i16", "i8", "u8", "bool"})


@dataclass(frozen=True)
class Equation:
    inputs: tuple[str, ...]
    output: str
    unshardable: frozenset[str] = frozenset()
    passthrough: str = "none"  # "none" | "one" | "all"
    linear: tuple[int, ...] = ()  # inputs that may be partial (pass-through)
    affine: tuple[int, ...] = ()  # bias-like inputs: partial wherever the output is

    @classmethod
    def parse(cls, eq: str, **kw) -> "Equation":
        lhs, rhs = eq.replace(" ", "").split("->")
        ins = tuple(lhs.split(","))
        kw["unshardable"] = frozenset(kw.get("unshardable", ()))
        return cls(ins, rhs, **kw)

    def __str__(self) -> str:
        return ",".join(self.inputs) + "->" + self.output

    @property
    def letters(self) -> list[str]:
        seen: list[str] = []
        for t in self.inputs + (self.output,):
            for c in t:
                if c not in seen:
                    seen.append(c)
        return seen

    @property
    def contracted(self) -> set[str]:
        return {c for t in self.inputs for c in t} - set(self.output)


class EquationError(ValueError):
    pass


def letter_sizes(eq: Equation, op: OpSpec) -> dict[str, int]:
    tensors = list(zip(eq.inputs, op.inputs)) + [(eq.output, op.output)]
    if len(eq.inputs) != len(op.inputs):
        raise EquationError(f"{op}: equation {eq} expects {len(eq.inputs)} inputs")
    sizes: dict[str, int] = {}
    for letters, shape in tensors:
        if len(letters) != len(shape):
            raise EquationError(f"{op}: {letters!r} does not match shape {list(shape)}")
        for c, n in zip(letters, shape):
            if sizes.setdefault(c, n) != n:
                raise EquationError(f"{op}: letter {c!r} has sizes {sizes[c]} and {n}")
    return sizes


def mesh_axes(mesh: Mesh) -> list[tuple[str, int]]:
    out = []
    for a in mesh.axes:
        if not isinstance(a.size, int):
            raise ValueError(f"mesh axis {a.name!r} has no size yet (a hole); solve the plan first")
        if a.size > 1:
            out.append((a.name, a.size))
    return out


def input_dtype(op: OpSpec, i: int) -> str:
    return op.input_dtypes[i] if i < len(op.input_dtypes) and op.input_dtypes[i] else op.dtype


def is_float_input(op: OpSpec, i: int) -> bool:
    return input_dtype(op, i) not in INT_DTYPES


def local_numel(shape, spec: Spec, mesh: Mesh) -> int:
    n = 1
    for i, s in enumerate(shape):
        n *= s // (spec.shard_factor(i, mesh) or 1)
    return n


def grad_allreduces(op: OpSpec, mesh: Mesh, specs: tuple[Spec, ...], partial_axes: dict[int, list[str]]
                    ) -> tuple[CommCost, ...]:
    """All-reduces of input gradients over `partial_axes[i]` (axes where input i's local gradient is a
    partial sum), priced on the local gradient's bytes. An input with no elements (an empty key/value
    cache that cat skips) has no gradient to sum."""
    out = []
    for i, axes in sorted(partial_axes.items()):
        axes = [a for a in mesh.names if a in axes and a not in specs[i].partial]
        if not axes or not is_float_input(op, i) or 0 in op.inputs[i]:
            continue
        nbytes = local_numel(op.inputs[i], specs[i], mesh) * DTYPE_BYTES.get(input_dtype(op, i), 4)
        out.append(price(Collective.ALL_REDUCE, mesh, tuple(axes), nbytes))
    return tuple(out)


def einsum_strategies(op: OpSpec, mesh: Mesh, eq: Equation, global_flops: float,
                      forward=None) -> list[Strategy]:
    """Every strategy of `eq` on `mesh` (see module docstring). `forward(assign)` may add op-internal
    collectives for an assignment {axis: letter | ('P', i) | 'P' | None}."""
    sizes = letter_sizes(eq, op)
    axes = mesh_axes(mesh)
    contracted = eq.contracted
    shardable = [c for c in eq.letters if c not in eq.unshardable]
    choices: list[object] = [None, *shardable]
    if eq.passthrough == "one":
        choices += [("P", i) for i in eq.linear if is_float_input(op, i)]
    elif eq.passthrough == "all" and eq.linear:
        choices.append("P")
    out: list[Strategy] = []
    for assign in itertools.product(choices, repeat=len(axes)):
        per_letter: dict[str, list[str]] = {c: [] for c in eq.letters}
        for (a, _), ch in zip(axes, assign):
            if isinstance(ch, str) and ch != "P":
                per_letter[ch].append(a)
        size_of = dict(axes)
        if any(sizes[c] % math.prod(size_of[a] for a in per_letter[c]) for c in eq.letters):
            continue
        out_partial = [a for (a, _), ch in zip(axes, assign)
                       if ch == "P" or isinstance(ch, tuple) or (isinstance(ch, str) and ch in contracted)]
        in_partial: dict[int, list[str]] = {i: [] for i in range(len(eq.inputs))}
        for (a, _), ch in zip(axes, assign):
            if isinstance(ch, tuple):
                in_partial[ch[1]].append(a)
            elif ch == "P":
                for i in eq.linear:
                    in_partial[i].append(a)
        for i in eq.affine:
            in_partial[i] = list(out_partial)

        def spec(letters: str, partial: list[str]) -> Spec:
            return Spec(tuple(tuple(per_letter[c]) for c in letters), tuple(partial))

        in_specs = tuple(spec(t, in_partial[i]) for i, t in enumerate(eq.inputs))
        out_spec = spec(eq.output, out_partial)
        split = math.prod(s for (a, s), ch in zip(axes, assign) if isinstance(ch, str) and ch != "P")
        grad_partial: dict[int, list[str]] = {}
        for i, t in enumerate(eq.inputs):
            g = []
            for (a, _), ch in zip(axes, assign):
                if isinstance(ch, str) and ch != "P" and ch not in t:
                    g.append(a)
                elif isinstance(ch, tuple) and ch[1] != i:
                    g.append(a)
            grad_partial[i] = g
        amap = {a: ch for (a, _), ch in zip(axes, assign)}
        name = " ".join(f"{a}:{_choice_str(ch, eq)}" for a, ch in amap.items() if ch is not None) or "replicate"
        out.append(Strategy(
            name=name,
            inputs=in_specs,
            output=out_spec,
            forward=tuple(forward(amap)) if forward else (),
            backward=grad_allreduces(op, mesh, in_specs, grad_partial),
            flops=global_flops / split,
            memory=local_numel(op.output, out_spec, mesh) * op.itemsize,
            extra=(("equation", str(eq)), ("assign", tuple(amap.items())),
                   # input i's local gradient is a partial sum over these axes (the runtime reduces it)
                   ("grad_partial", tuple((i, tuple(a for a in mesh.names if a in g and a not in in_specs[i].partial))
                                          for i, g in sorted(grad_partial.items())
                                          if is_float_input(op, i) and 0 not in op.inputs[i]))),
        ))
    return out


def _choice_str(ch, eq: Equation) -> str:
    if isinstance(ch, tuple):
        return f"partial(in{ch[1]})"
    if ch == "P":
        return "partial(all)"
    return ch


LOWER = "abcdefghijklmnopqrstuvwxyz"
UPPER = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def letters_for(rank: int, skip: str = "") -> str:
    return "".join(c for c in LOWER if c not in skip)[:rank]


def broadcast_equation(shapes: tuple[tuple[int, ...], ...], out: tuple[int, ...]) -> tuple[list[str], str, set[str]]:
    """Letters for elementwise inputs broadcast (right-aligned) against `out`: a dim of size 1 facing a
    larger output dim gets its own unshardable letter."""
    out_letters = letters_for(len(out))
    fresh = iter(UPPER)
    unshard: set[str] = set()
    ins = []
    for shp in shapes:
        off = len(out) - len(shp)
        if off < 0:
            raise EquationError(f"input {list(shp)} has more dims than output {list(out)}")
        s = ""
        for j, n in enumerate(shp):
            if n == out[off + j]:
                s += out_letters[off + j]
            elif n == 1:
                c = next(fresh)
                unshard.add(c)
                s += c
            else:
                raise EquationError(f"input {list(shp)} does not broadcast to {list(out)}")
        ins.append(s)
    return ins, out_letters, unshard
