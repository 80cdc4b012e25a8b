"""`value_type`: a frozen dataclass whose `__repr__`, `__eq__` and `__hash__` are shared by every class.

`@dataclass` writes each method of each class as source text and compiles it (`exec`) when the class is
made: the ~90 value types on a check's path (the syntax tree's, the plan's, the diagnostics') cost ~0.023
CPU-s of every `planlang check` that way (Python 3.11, gpt2_3d, least of 15: 0.140 with `@dataclass`,
0.117 with `value_type`; callgrind 702 M -> 585 M instructions). The three methods below do what the generated
ones do -- compare and hash the fields with `compare=True` as a tuple, same class only; print
`Name(field=value!r, ...)` with the fields with `repr=True` -- from a per-class `operator.attrgetter`, made
once per class and run in C. The dataclass itself (fields, `__init__`, frozen `__setattr__`, slots,
`replace`, `fields`, `asdict`, pattern matching) is the standard library's, unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Any, Callable, TypeVar, dataclass_transform

T = TypeVar("T", bound=type)


def _no_fields(obj: object) -> tuple:
    return ()


def _getter(names: tuple[str, ...]) -> Callable[[Any], tuple]:
    """The fields `names` of an object as a tuple, as the generated methods compare and hash them (a tuple
    compares its items by identity first: a field holding NaN equals itself)."""
    if not names:
        return _no_fields
    return attrgetter(*names) if len(names) > 1 else attrgetter(names[0], names[0])  # one field: still a tuple


def _eq(self, other):
    if other.__class__ is not self.__class__:
        return NotImplemented
    key = self.__class__.__value_key__
    return key(self) == key(other)


def _hash(self):
    return hash(self.__class__.__value_key__(self))


def _repr(self):
    cls = self.__class__
    return f"{cls.__qualname__}({', '.join(f'{n}={getattr(self, n)!r}' for n in cls.__value_repr__)})"


@dataclass_transform(frozen_default=True, field_specifiers=(field,))  # type checkers: a frozen dataclass
def value_type(cls: T | None = None, /, *, slots: bool = False) -> Any:
    """`@dataclass(frozen=True, slots=slots)`, with the shared `__repr__`, `__eq__` and `__hash__` (a method
    the class defines itself is kept, as `@dataclass` keeps it)."""

    def wrap(klass: T) -> T:
        own = set(klass.__dict__)
        if not klass.__dict__.get("__doc__"):
            # @dataclass would build one from inspect.signature (~0.1 ms a class): the field names do
            klass.__doc__ = f"{klass.__name__}({', '.join(klass.__dict__.get('__annotations__', {}))})"
        made: Any = dataclass(frozen=True, slots=slots, repr=False, eq=False)(klass)
        compared = tuple(f.name for f in fields(made) if f.compare)
        made.__value_key__ = _getter(compared)
        made.__value_repr__ = tuple(f.name for f in fields(made) if f.repr)
        for name, method in (("__eq__", _eq), ("__hash__", _hash), ("__repr__", _repr)):
            if name not in own:
                setattr(made, name, method)
        return made

    return wrap if cls is None else wrap(cls)
