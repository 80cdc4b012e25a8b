"""planlang.lang.frozen.value_type: the same value semantics as @dataclass(frozen=True) -- equality, hash,
repr, immutability, replace, slots -- with the three methods shared instead of generated per class."""
from __future__ import annotations

import dataclasses
import math
import pickle
from dataclasses import dataclass, field

import pytest

from planlang.lang.frozen import value_type
from planlang.lang.ast import Name, Path, Segment
from planlang.plan.types import Axis, Mesh


@dataclass(frozen=True)
class Ref:
    a: int
    b: tuple = ()
    note: str = field(default="", compare=False)
    hidden: int = field(default=0, repr=False)


@value_type
class Val:
    a: int
    b: tuple = ()
    note: str = field(default="", compare=False)
    hidden: int = field(default=0, repr=False)


@value_type(slots=True)
class One:
    x: float


@value_type
class Empty:
    pass


CASES = [((1,), {}), ((1, (2, 3)), {}), ((1,), {"note": "x"}), ((1,), {"hidden": 5}), ((2, ("a",)), {"note": "y", "hidden": 1})]


@pytest.mark.parametrize("args,kw", CASES)
def test_equality_hash_and_repr_are_the_dataclasses(args, kw):
    ref, val = Ref(*args, **kw), Val(*args, **kw)
    assert repr(val) == repr(ref).replace("Ref(", "Val(", 1)
    for args2, kw2 in CASES:
        assert (Val(*args2, **kw2) == val) == (Ref(*args2, **kw2) == ref)
        if Ref(*args2, **kw2) == ref:
            assert hash(Val(*args2, **kw2)) == hash(val)
    assert val != ref and (val == (1,)) is False  # another class: never equal
    assert dataclasses.replace(val, a=9) == Val(9, *args[1:], **kw) and dataclasses.fields(val) and val.__doc__


def test_frozen_slotted_picklable_and_nan_equals_itself():
    v = One(1.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.x = 2.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        Val(1).a = 2  # type: ignore[misc]
    assert not hasattr(v, "__dict__") and pickle.loads(pickle.dumps(v)) == v
    nan = One(math.nan)
    assert nan == nan and {nan: 1}[nan] == 1  # a tuple compares its items by identity first, as dataclass's do
    assert Empty() == Empty() and hash(Empty()) == hash(Empty()) and repr(Empty()) == "Empty()"


def test_the_syntax_tree_and_plan_types_compare_without_spans():
    from planlang.lang.source import Span

    a, b = Name("tp", span=Span("a.plan", 1, 1, 1, 3)), Name("tp", span=Span("b.plan", 9, 9, 9, 11))
    assert a == b and hash(a) == hash(b) and repr(a) == "Name(text='tp')" and a != Name("dp")
    assert Path((Segment("h"),)) == Path((Segment("h"),)) != Path((Segment("w"),))
    mesh = Mesh("m", None, (Axis("dp", 2), Axis("tp", 4)))
    assert mesh == Mesh("m", None, (Axis("dp", 2), Axis("tp", 4))) != Mesh("m", None, (Axis("dp", 4), Axis("tp", 2)))
    assert len({mesh, Mesh("m", None, (Axis("dp", 2), Axis("tp", 4)))}) == 1
