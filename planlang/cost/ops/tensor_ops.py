"""`@rule` registrations of ops that rearrange or contract whole tensors (torch-free): stack, roll and
einsum. Input conventions (as in rules.py):

    stack    x1, x2, ... (one shape)      attr dim (of the output)             -> x's shape with n at dim
    roll     x                            attrs shifts, dims (tuples, same length; every dim given)
    index_select   x, index[K] (integer)  attr dim                             -> x's shape with K at dim
    einsum   x1, x2, ...                  attr equation ("bthd,bshd->bhts"; explicit output, no repeated
                                          letter within one operand, "..." expanded by `einsum_equation`)
"""
from __future__ import annotations

import math

from planlang.plan.types import Mesh

from .base import OpSpec, Strategy, on, rule
from .einsum import UPPER, Equation, EquationError, einsum_strategies, letter_sizes, letters_for

numel = math.prod


@rule("stack", targets=on("torch.stack", aten=("aten.stack.default",)))
def stack_rule(op: OpSpec, mesh: Mesh) -> list[Strategy]:
    """Every input keeps its layout on the output's other dims; the new dim (n long) is whole. Linear in
    each input separately, but a pass-through partial must cover all of them (the output mixes them
    only along the new dim), hence mode "all" as cat."""
    rank = len(op.output)
    d = op.attr("dim", 0) % rank
    base = letters_for(rank, skip="z")
    xl = base[:d] + base[d + 1:]  # x[..] -> out[.., n, ..]: out's letter at d is new
    out = base[:d] + "z" + base[d + 1:]
    eq = Equation((xl,) * len(op.inputs), out, frozenset("z"), passthrough="all",
                  linear=tuple(range(len(op.inputs))))
    return einsum_strategies(op, mesh, eq, 0.0)


@rule("roll", targets=on("torch.roll", methods=("roll",), aten=("aten.roll.default",)))
def roll_rule(op: OpSpec, mesh: Mesh) -> list[Strategy]:
    """Rolled dims whole (an element moves across any split of them); the others keep any split, which
    makes a roll along the sequence or spatial dims per sample. Linear (a permutation of elements)."""
    x = op.inputs[0]
    xl = letters_for(len(x))
    rolled = {xl[d % len(x)] for d in op.attr("dims", ())}
    eq = Equation((xl,), xl, frozenset(rolled), passthrough="one", linear=(0,))
    return einsum_strategies(op, mesh, eq, 0.0)


# x[..., idx, ...] with one 1-d index is an index_select (torch.export)
@rule("index_select", saves=(1,), targets=on(aten=("aten.index_select.default", "aten.index.Tensor")))
def index_select_rule(op: OpSpec, mesh: Mesh) -> list[Strategy]:
    """The indexed dim whole, and the index whole (the rows it picks may be anywhere); the other dims
    keep any split, so picking heads or channels is per sample. Linear in x."""
    x = op.inputs[0]
    d = op.attr("dim", 0) % len(x)
    xl = letters_for(len(x), skip="z")
    out = xl[:d] + "z" + xl[d + 1:]
    eq = Equation((xl, "z"), out, frozenset({xl[d], "z"}), passthrough="one", linear=(0,))
    return einsum_strategies(op, mesh, eq, 0.0)


def einsum_equation(equation: str, shapes: tuple[tuple[int, ...], ...]) -> Equation:
    """The `Equation` of a torch.einsum over operands of `shapes`: "..." becomes upper-case letters
    (right-aligned, as torch aligns them), and the shapes must give every letter one size.
    EquationError for what this rule does not express (implicit output, a letter repeated within one
    operand: a diagonal, an ellipsis dim broadcast from 1)."""
    eq = equation.replace(" ", "")
    if "->" not in eq:
        raise EquationError(f"einsum {equation!r}: implicit output (no '->')")
    lhs, rhs = eq.split("->")
    ins = lhs.split(",")
    if len(ins) != len(shapes):
        raise EquationError(f"einsum {equation!r}: {len(ins)} operands in the equation, {len(shapes)} given")
    used = set(eq) - set(".,->")
    fresh = [c for c in UPPER if c not in used]
    nell = max((len(s) - len(t.replace("...", "")) for t, s in zip(ins, shapes) if "..." in t), default=0)
    ell = "".join(fresh[:nell])

    def expand(t: str, rank: int | None) -> str:
        if "..." not in t:
            return t
        k = nell if rank is None else rank - len(t.replace("...", ""))
        return t.replace("...", ell[nell - k:])

    ins = [expand(t, len(s)) for t, s in zip(ins, shapes)]
    out = expand(rhs, None)
    for t in ins + [out]:
        if len(set(t)) != len(t):
            raise EquationError(f"einsum {equation!r}: a letter repeated within one operand")
    if not set(out) <= set("".join(ins)):
        raise EquationError(f"einsum {equation!r}: an output letter no operand has")
    return Equation(tuple(ins), out, passthrough="one", linear=tuple(range(len(ins))))


def einsum_fits(equation: str, shapes: tuple[tuple[int, ...], ...], out: tuple[int, ...]) -> bool:
    """Whether the einsum rule describes this call (front ends keep any other einsum an opaque call)."""
    try:
        eq = einsum_equation(equation, shapes)
        letter_sizes(eq, OpSpec("einsum", tuple(shapes), tuple(out)))
    except EquationError:
        return False
    return True


@rule("einsum", saves=(0, 1), backward_ratio=2.0, targets=on("torch.einsum", aten=("aten.einsum.default",)))
def einsum_rule(op: OpSpec, mesh: Mesh) -> list[Strategy]:
    """Any letter may be split: a letter kept in the output splits every tensor holding it (the batch
    of hand-written attention "bthd,bshd->bhts" is per sample; heads split are head parallelism), a
    contracted letter splits the operands holding it and leaves the output a partial sum (a row-parallel
    contraction). Linear in each operand: one may be partial, the output then is."""
    eq = einsum_equation(op.attr("equation"), op.inputs)
    sizes = letter_sizes(eq, op)
    # a contraction's multiply-adds: one per point of the letters' product space (2 flops with 2+ operands)
    flops = (2.0 if len(op.inputs) > 1 else 1.0) * numel(sizes.values())
    return einsum_strategies(op, mesh, eq, flops)
