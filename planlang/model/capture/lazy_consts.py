"""Constants of an exported graph too large to compute while the graph is built.

torch.export records the attention mask a Hugging Face model builds (`arange`, `index`, comparisons,
`&`, `expand`) as ops on constants; planlang.model.capture.export_builder folds those into `const`
Values. Computed for real, a causal mask over `batch x seq x seq` elements is 512 MiB at 8 x 8192 and
32 GiB at 8 x 65536: more than the rest of `check --model` together. So a folded node whose result
would hold more than `SMALL` elements (or that reads such a node) is not computed: it becomes a
`Deferred` — its shape and dtype (run on meta), the call that computes it (the runtime's executor calls
`to(device)` when it runs the program, and only then) and, where the ops allow, what its elements are
without computing them (`sym`): an integer affine function of the element's coordinates (`Aff`), a
predicate `L <= 0` on one (`Le`), conjunctions, selections and constants. That is enough to tell
torch's causal mask (`j <= i` for query i and key j) from any other mask exactly, at any length
(`causal`, `keeps_all`), which is what the SDPA reader needs of it.

A small constant (positions: `batch x seq`) stays a real tensor; `fit` reads its `sym` off its values
(a constant, or an affine function of its coordinates checked element by element).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Union

import torch

#: the most elements a constant computed while the graph is built may hold (4 MiB of int32): positions
#: and per-row masks are smaller, a mask over query x key positions larger from a few thousand tokens
SMALL = 1 << 20
#: the most elements of a real constant `fit` reads (a constant lifted from the model may be larger)
_FIT_LIMIT = 1 << 24


@dataclass(frozen=True)
class Aff:
    """`const + sum(coef * index along dim)` for an element; a dim is counted from the right (-1: the last),
    as broadcasting aligns dims; a size-1 dim has no coefficient."""

    coefs: tuple[tuple[int, Union[int, float]], ...]
    const: Union[int, float]

    def plus(self, other: "Aff", sign: int = 1) -> "Aff":
        merged = dict(self.coefs)
        for d, c in other.coefs:
            merged[d] = merged.get(d, 0) + sign * c
        return Aff(tuple(sorted((d, c) for d, c in merged.items() if c)), self.const + sign * other.const)

    def scaled(self, k: Union[int, float]) -> "Aff":
        return Aff(tuple((d, c * k) for d, c in self.coefs if c * k), self.const * k)

    @property
    def integral(self) -> bool:
        return isinstance(self.const, int) and all(isinstance(c, int) for _, c in self.coefs)


@dataclass(frozen=True)
class Const:
    value: Union[bool, int, float]


@dataclass(frozen=True)
class Le:
    """True where the integer affine `expr` is <= 0."""

    expr: Aff


@dataclass(frozen=True)
class And:
    parts: tuple["Sym", ...]


@dataclass(frozen=True)
class Select:
    """`then` where `cond` holds, else `other` (torch.where, masked_fill)."""

    cond: "Sym"
    then: "Sym"
    other: "Sym"


Sym = Union[Aff, Const, Le, And, Select]


# ------------------------------------------------------------------------------ the values
class Deferred:
    """A constant not computed while the graph is built (see the module docstring): `call(*args,
    **kwargs)` computes it, an argument itself possibly a Deferred. Picklable when `call` is (the
    builder passes an AtenCall), as the program is broadcast to every rank."""

    def __init__(self, call: Callable, args: Any, kwargs: dict, shape: torch.Size, dtype: torch.dtype,
                 sym: Sym | None) -> None:
        self.call, self.args, self.kwargs = call, args, kwargs
        self.shape, self.dtype, self.sym = torch.Size(shape), dtype, sym

    device = torch.device("cpu")

    def numel(self) -> int:
        return math.prod(self.shape)

    def dim(self) -> int:
        return len(self.shape)

    def meta(self) -> torch.Tensor:
        return torch.empty(self.shape, dtype=self.dtype, device="meta")

    def materialize(self) -> torch.Tensor:
        """Compute it (what the runtime does when it runs the program on real devices)."""
        return self.call(*_mapped(self.args, _real), **_mapped(self.kwargs, _real))

    def to(self, device: Any) -> torch.Tensor:
        """On `device`: on meta (the program run for its memory) nothing is computed."""
        if torch.device(device).type == "meta":
            return self.meta()
        return self.materialize().to(device)

    def __repr__(self) -> str:
        return f"Deferred({getattr(self.call, '__name__', self.call)}, {list(self.shape)}, {self.dtype})"


def _real(v: Any) -> Any:
    return v.materialize() if isinstance(v, Deferred) else v


def _meta(v: Any) -> Any:
    if isinstance(v, Deferred):
        return v.meta()
    if isinstance(v, torch.Tensor):
        return v.to("meta")
    return torch.device("meta") if isinstance(v, torch.device) else v


def _mapped(a: Any, f: Callable[[Any], Any]) -> Any:
    if isinstance(a, (list, tuple)):
        return type(a)(_mapped(x, f) for x in a)
    if isinstance(a, dict):
        return {k: _mapped(v, f) for k, v in a.items()}
    return f(a)


def _leaves(a: Any) -> list:
    if isinstance(a, (list, tuple)):
        return [x for y in a for x in _leaves(y)]
    if isinstance(a, dict):
        return [x for y in a.values() for x in _leaves(y)]
    return [a]


def fold_call(target: Any, call: Callable, args: Any, kwargs: dict) -> tuple[bool, Any]:
    """Fold one call on constants: (True, its value) — a real value when small and computed from real
    values, else a Deferred — or (False, None) when it cannot be folded here (the caller lowers it as an
    op). `target` is the ATen overload (what `sym` reads), `call` its picklable stand-in."""
    leaves = _leaves((args, kwargs))
    lazy = any(isinstance(v, Deferred) for v in leaves)
    try:
        shaped = target(*_mapped(args, _meta), **_mapped(kwargs, _meta))
    except Exception:  # noqa: BLE001 - meta cannot run it (a data-dependent op): real values only
        shaped = None
    if isinstance(shaped, torch.Tensor) and (lazy or shaped.numel() > SMALL):
        return True, Deferred(call, args, kwargs, shaped.shape, shaped.dtype, symbolic(target, args, kwargs, shaped))
    if lazy:  # a value read off a Deferred's shape (an assert's None, a size) or nothing
        if shaped is None or any(isinstance(v, torch.Tensor) for v in _leaves(shaped)):
            return False, None
        return True, shaped
    try:
        return True, target(*args, **kwargs)
    except Exception:  # noqa: BLE001 - not evaluable here: lower it as an op instead
        return False, None


# ------------------------------------------------------------------------------ what the elements are
def fit(t: torch.Tensor) -> Sym | None:
    """The `sym` of a real tensor: one value everywhere (Const), or, for integers, an affine function of
    the coordinates (checked on every element); None otherwise."""
    if t.numel() == 0 or t.numel() > _FIT_LIMIT:
        return None
    first = t.reshape(-1)[0]
    if bool((t == first).all()):
        return Const(first.item())
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        return None
    coefs, expected = [], torch.full(t.shape, int(first.item()), dtype=torch.int64)
    for d, n in enumerate(t.shape):
        if n == 1:
            continue
        at = [0] * t.dim()
        at[d] = 1
        c = int(t[tuple(at)].item()) - int(first.item())
        if c:
            coefs.append((d - t.dim(), c))
            shape = [1] * t.dim()
            shape[d] = n
            expected = expected + c * torch.arange(n).reshape(shape)
    if not bool((expected == t.to(torch.int64)).all()):
        return None
    return Aff(tuple(sorted(coefs)), int(first.item()))


def _sym(v: Any) -> Sym | None:
    if isinstance(v, Deferred):
        return v.sym
    if isinstance(v, torch.Tensor):
        return fit(v)
    if isinstance(v, (bool, int, float)):
        return Const(v)
    return None


def _aff(s: Sym | None) -> Aff | None:
    if isinstance(s, Aff):
        return s
    if isinstance(s, Const) and not isinstance(s.value, bool):
        return Aff((), s.value)
    return None


def _pred(s: Sym | None) -> bool:
    return isinstance(s, (Le, And)) or isinstance(s, Const) and isinstance(s.value, bool)


def _le(diff: Aff) -> Sym:
    if not diff.coefs:
        return Const(bool(diff.const <= 0))
    return Le(diff)


def compare(op: str, a: Sym | None, b: Sym | None) -> Sym | None:
    """`a op b` elementwise (op: le, lt, ge, gt, eq) on integer affine values."""
    x, y = _aff(a), _aff(b)
    if x is None or y is None:
        return None
    diff = x.plus(y, -1)
    if not diff.coefs:
        return Const(bool({"le": diff.const <= 0, "lt": diff.const < 0, "ge": diff.const >= 0,
                           "gt": diff.const > 0, "eq": diff.const == 0, "ne": diff.const != 0}[op]))
    if not diff.integral:
        return None
    one = Aff((), 1)
    if op == "le":
        return _le(diff)
    if op == "lt":
        return _le(diff.plus(one))
    if op == "ge":
        return _le(diff.scaled(-1))
    if op == "gt":
        return _le(diff.scaled(-1).plus(one))
    if op == "eq":
        return conj(_le(diff), _le(diff.scaled(-1)))
    return None


def conj(a: Sym | None, b: Sym | None) -> Sym | None:
    if not (_pred(a) and _pred(b)):
        return None
    for x, y in ((a, b), (b, a)):
        if isinstance(x, Const):
            return y if x.value else x
    parts: list[Sym] = []
    for x in (a, b):
        if isinstance(x, And):
            parts.extend(x.parts)
        elif x is not None:
            parts.append(x)
    return And(tuple(parts))


def negate(a: Sym | None) -> Sym | None:
    if isinstance(a, Const) and isinstance(a.value, bool):
        return Const(not a.value)
    if isinstance(a, Le):  # not (L <= 0) is L >= 1 for integers: -L + 1 <= 0
        return _le(a.expr.scaled(-1).plus(Aff((), 1)))
    return None


def select(cond: Sym | None, then: Sym | None, other: Sym | None) -> Sym | None:
    if cond is None or not _pred(cond) or then is None or other is None:
        return None
    if isinstance(cond, Const):
        return then if cond.value else other
    return Select(cond, then, other)


def _shift(s: Sym | None, at: int, ndim: int) -> Sym | None:
    """`s` of a tensor of `ndim` dims with a size-1 dim inserted at (non-negative) position `at`."""
    def dim(d: int) -> int:
        return d if ndim + d >= at else d - 1

    if isinstance(s, Aff):
        return Aff(tuple(sorted((dim(d), c) for d, c in s.coefs)), s.const)
    if isinstance(s, Le):
        return Le(Aff(tuple(sorted((dim(d), c) for d, c in s.expr.coefs)), s.expr.const))
    if isinstance(s, And):
        parts = [p for p in (_shift(p, at, ndim) for p in s.parts) if p is not None]
        return And(tuple(parts)) if len(parts) == len(s.parts) else None
    if isinstance(s, Select):
        c, t, o = (_shift(x, at, ndim) for x in (s.cond, s.then, s.other))
        return None if c is None or t is None or o is None else Select(c, t, o)
    return s


_COMPARE = {"le": "le", "lt": "lt", "ge": "ge", "gt": "gt", "eq": "eq", "ne": "ne"}
_SAME = {"alias", "clone", "detach", "lift_fresh", "lift_fresh_copy", "expand", "contiguous"}
_CASTS = {"to", "_to_copy", "type_as"}
_FILLS = {"full", "ones", "zeros", "new_ones", "new_zeros", "new_full", "full_like", "ones_like", "zeros_like"}


def symbolic(target: Any, args: Any, kwargs: dict, out: torch.Tensor) -> Sym | None:
    """What the elements of `target(*args, **kwargs)` are (`out`: its meta value), or None where this
    module does not know (the Deferred is then only computed, never read)."""
    name = getattr(getattr(target, "overloadpacket", target), "__name__", str(target)).removeprefix("__")
    name = name.removesuffix("__").removesuffix("_")
    xs = [_sym(a) for a in args]
    if name in _COMPARE and len(xs) == 2:
        return compare(_COMPARE[name], xs[0], xs[1])
    if name in ("and", "bitwise_and", "logical_and") and len(xs) == 2:
        return conj(xs[0], xs[1])
    if name in ("logical_not", "bitwise_not"):
        return negate(xs[0])
    if name in ("add", "sub") and len(xs) == 2 and kwargs.get("alpha", 1) == 1:
        a, b = _aff(xs[0]), _aff(xs[1])
        return a.plus(b, 1 if name == "add" else -1) if a is not None and b is not None else None
    if name == "mul" and len(xs) == 2:
        a, b = _aff(xs[0]), _aff(xs[1])
        if a is not None and b is not None and (not a.coefs or not b.coefs):
            return b.scaled(a.const) if not a.coefs else a.scaled(b.const)
        return None
    if name == "where" and len(xs) == 3:
        return select(xs[0], xs[1], xs[2])
    if name == "masked_fill" and len(xs) >= 2:
        return select(xs[1], _sym(args[2]) if len(args) > 2 else None, xs[0])
    if name == "unsqueeze" and xs:
        ndim = out.dim() - 1
        at = args[1] if args[1] >= 0 else args[1] + ndim + 1
        return _shift(xs[0], at, ndim)
    if name == "arange":
        nums = [a for a in args if isinstance(a, (int, float)) and not isinstance(a, bool)]
        start, step = (0, 1) if len(nums) == 1 else (nums[0], nums[2] if len(nums) > 2 else 1)
        return Aff(((-1, step),) if step else (), start) if nums and all(isinstance(n, int) for n in nums) else None
    if name == "index" and len(args) == 2 and isinstance(args[1], (list, tuple)):
        return _index(xs[0], [_sym(i) if i is not None else None for i in args[1]], len(_shape(args[0])))
    if name in _SAME and xs:
        return xs[0]
    if name in _CASTS and xs:
        s = xs[0]
        if out.dtype == torch.bool:
            return s if _pred(s) else None
        if isinstance(s, Const):
            return Const(float(s.value) if out.dtype.is_floating_point else int(s.value))
        return s if isinstance(s, Aff) and (out.dtype.is_floating_point or s.integral) else None
    if name in _FILLS:
        value: object = {"ones": 1, "zeros": 0, "new_ones": 1, "new_zeros": 0, "ones_like": 1, "zeros_like": 0}.get(name)
        if value is None:
            value = args[-1] if args and isinstance(args[-1], (bool, int, float)) else kwargs.get("fill_value")
        if not isinstance(value, (bool, int, float)):
            return None
        return Const(bool(value) if out.dtype == torch.bool else float(value) if out.dtype.is_floating_point
                     else int(value))
    if name in ("triu", "tril") and xs and out.dim() >= 2:
        k = args[1] if len(args) > 1 else kwargs.get("diagonal", 0)
        j_minus_i = Aff(((-2, -1), (-1, 1)), -k)  # j - i - k
        zero = Const(False if out.dtype == torch.bool else 0.0 if out.dtype.is_floating_point else 0)
        keep = _le(j_minus_i.scaled(-1)) if name == "triu" else _le(j_minus_i)  # triu: j - i >= k
        return select(keep, xs[0], zero)
    return None


def _shape(v: Any) -> tuple[int, ...]:
    return tuple(v.shape) if isinstance(v, (torch.Tensor, Deferred)) else ()


def _index(x: Sym | None, indices: list[Sym | None], ndim: int) -> Sym | None:
    """`x[i0, i1, ...]` with an index tensor for every dim of x: its value at the element each index
    names (indices broadcast together, aligned as the result is)."""
    if len(indices) != ndim or any(i is None for i in indices):
        return None
    if isinstance(x, Const):
        return x
    a = _aff(x)
    if a is None or not a.integral:
        return None
    out = Aff((), a.const)
    coef = dict(a.coefs)
    for k, i in enumerate(indices):
        c = coef.get(k - ndim, 0)
        if not c:
            continue
        ia = _aff(i)
        if ia is None:
            return None
        out = out.plus(ia.scaled(c))
    return out


# ------------------------------------------------------------------------------ what the SDPA reader asks
def _only_causal(pred: Sym | None) -> bool:
    """Whether the predicate is `j <= i` (i: dim -2, j: dim -1) and nothing else."""
    parts = pred.parts if isinstance(pred, And) else (pred,)
    rest = [p for p in parts if not (isinstance(p, Const) and p.value is True)]
    if len(rest) != 1 or not isinstance(rest[0], Le):
        return False
    e = rest[0].expr
    c = dict(e.coefs).get(-1, 0)
    # c * (j - i) + k <= 0 is j - i <= 0 over the integers iff -c < k <= 0
    return c > 0 and dict(e.coefs) == {-1: c, -2: -c} and isinstance(e.const, int) and -c < e.const <= 0


def causal(sym: Sym | None, dtype: torch.dtype) -> bool:
    """Whether a mask (bool: keep; float: added) whose elements are `sym` is torch's causal mask."""
    if dtype == torch.bool:
        return _only_causal(sym)
    if dtype.is_floating_point and isinstance(sym, Select):
        zero, neg = Const(0.0), Const(-math.inf)
        if _num(sym.then) == zero and _num(sym.other) == neg:
            return _only_causal(sym.cond)
        if _num(sym.then) == neg and _num(sym.other) == zero:
            return _only_causal(negate(sym.cond))
    return False


def keeps_all(sym: Sym | None, dtype: torch.dtype) -> bool:
    """Whether a mask whose elements are `sym` masks nothing."""
    if not isinstance(sym, Const):
        return False
    return sym.value is True if dtype == torch.bool else dtype.is_floating_point and sym.value == 0


def _num(s: Sym) -> Sym:
    return Const(float(s.value)) if isinstance(s, Const) and not isinstance(s.value, bool) else s
