"""The typed syntax tree: small frozen dataclasses, each with the span it came from.

Spans never take part in equality (``compare=False``), so two trees parsed from differently
formatted text compare equal when they say the same thing — the formatter's round-trip property.
Literal text (``text``) is kept for faithful printing but is not compared either.

Memory: a big plan has millions of nodes, so nodes have ``__slots__``, and the parser gives each one its
span packed into one int (`pack_span`); ``node.span`` unpacks it into a `Span` when it is read. Code that
copies spans from node to node (the resolver) can pass the packed form on with `raw_span`. Both forms are
accepted wherever a span is: ``Name("x", span=Span(...))`` works as before.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Union

from .source import Span

NO_SPAN = Span("<none>", 0, 0, 0, 0)

# ------------------------------------------------------------------ packed spans
_FIELD = 32  # bits per field: offsets, lines and columns below 2**32 (a 4 GiB file)
_MASK = (1 << _FIELD) - 1
_FILES: list[str] = []  # file names of packed spans, by number (one per distinct file name)
_FILE_IDS: dict[str, int] = {}
_FILES_LOCK = threading.Lock()


def file_id(path: str) -> int:
    """The number of a file name in packed spans."""
    fid = _FILE_IDS.get(path)
    if fid is None:
        with _FILES_LOCK:
            fid = _FILE_IDS.get(path)
            if fid is None:
                fid = _FILE_IDS[path] = len(_FILES)
                _FILES.append(path)
    return fid


def pack_span(fid: int, line: int, col: int, end_line: int, end_col: int, start: int, end: int) -> int:
    """`Span(file, line, col, end_line, end_col, start, end)` as one int (about 50 bytes instead of about
    200 for a Span and its offsets); `fid` is `file_id(file)`."""
    return (((((line << _FIELD | col) << _FIELD | end_line) << _FIELD | end_col) << _FIELD | start)
            << _FIELD | end) << _FIELD | fid


def unpack_span(v: int) -> Span:
    fid = v & _MASK
    v >>= _FIELD
    end = v & _MASK
    v >>= _FIELD
    start = v & _MASK
    v >>= _FIELD
    end_col = v & _MASK
    v >>= _FIELD
    end_line = v & _MASK
    v >>= _FIELD
    return Span(_FILES[fid], v >> _FIELD, v & _MASK, end_line, end_col, start, end)


def as_span(v) -> Span:
    """A span, packed or not, as a `Span`."""
    return unpack_span(v) if v.__class__ is int else v


def span_lines(v) -> tuple[int, int]:
    """(line, end_line) of a span, packed or not, without building a Span."""
    if v.__class__ is int:
        v >>= 4 * _FIELD
        return v >> 2 * _FIELD, v & _MASK
    return v.line, v.end_line


def span_offsets(v) -> tuple[int, int]:
    """(start, end) character offsets of a span, packed or not, without building a Span."""
    if v.__class__ is int:
        v >>= _FIELD
        return (v >> _FIELD) & _MASK, v & _MASK
    return v.start, v.end


def _span():
    return field(default=NO_SPAN, compare=False, repr=False, kw_only=True)


def _text():
    return field(default="", compare=False, repr=False, kw_only=True)


@dataclass(frozen=True, slots=True)
class Node:
    span: Span = _span()


def lazy_span_field(cls, name: str = "span", many: bool = False) -> None:
    """Make the slot `name` of the slotted dataclass `cls` (a span, or with `many` a tuple of spans) hold
    packed spans as well as `Span`s: reading the attribute gives `Span`s, `raw_span` the stored value."""
    slot = cls.__dict__[name]
    get = slot.__get__
    if many:
        def read(obj):
            return tuple(unpack_span(v) if v.__class__ is int else v for v in get(obj))
    else:
        def read(obj):
            v = get(obj)
            return unpack_span(v) if v.__class__ is int else v
    setattr(cls, name, property(read, slot.__set__, doc=f"`{name}` as `Span`s (stored packed or not)."))
    _RAW[cls, name] = get


_RAW: dict = {}  # (class, attribute) -> the slot's getter: the stored value
lazy_span_field(Node)


def raw_span(obj, name: str = "span", _node=Node, _get=_RAW[Node, "span"]) -> "Span | int":
    """A span as stored, a `Span` or an int from `pack_span`: pass it on as `span=` unchanged, without
    building a `Span` (for `Node`s and the plan's types that store spans packed)."""
    if name == "span" and isinstance(obj, _node):
        return _get(obj)
    for klass in type(obj).__mro__:
        get = _RAW.get((klass, name))
        if get is not None:
            return get(obj)
    return getattr(obj, name)


# ------------------------------------------------------------------ names and values
@dataclass(frozen=True, slots=True)
class Name(Node):
    text: str

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True, slots=True)
class Dotted(Node):
    parts: tuple[Name, ...]

    def __str__(self) -> str:
        return ".".join(p.text for p in self.parts)


@dataclass(frozen=True, slots=True)
class Hole(Node):
    def __str__(self) -> str:
        return "?"


@dataclass(frozen=True, slots=True)
class Int(Node):
    value: int
    text: str = _text()

    def __str__(self) -> str:
        return self.text or str(self.value)


@dataclass(frozen=True, slots=True)
class Float(Node):
    value: float
    text: str = _text()

    def __str__(self) -> str:
        return self.text or repr(self.value)


@dataclass(frozen=True, slots=True)
class Str(Node):
    value: str
    text: str = _text()

    def __str__(self) -> str:
        return self.text or '"' + self.value.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True, slots=True)
class Unit(Node):
    text: str

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True, slots=True)
class Quantity(Node):
    number: Union[Int, Float]
    unit: Unit

    def __str__(self) -> str:
        return f"{self.number} {self.unit}"


@dataclass(frozen=True, slots=True)
class Ref(Node):
    """A reference to a named thing, e.g. `hardware.nvlink3`, `tp`, `true`."""

    name: Dotted

    def __str__(self) -> str:
        return str(self.name)


@dataclass(frozen=True, slots=True)
class ListValue(Node):
    items: tuple["Value", ...]

    def __str__(self) -> str:
        return "[" + ", ".join(str(i) for i in self.items) + "]"


Number = Union[Int, Float]
Value = Union[Quantity, Int, Float, Str, Ref, Hole, ListValue]


# ------------------------------------------------------------------ module paths
@dataclass(frozen=True, slots=True)
class Index(Node):
    index: int

    def __str__(self) -> str:
        return f"[{self.index}]"


@dataclass(frozen=True, slots=True)
class Slice(Node):
    start: int | None
    stop: int | None

    def __str__(self) -> str:
        a = "" if self.start is None else str(self.start)
        b = "" if self.stop is None else str(self.stop)
        return f"[{a}:{b}]"


@dataclass(frozen=True, slots=True)
class Star(Node):
    def __str__(self) -> str:
        return "[*]"


Selector = Union[Index, Slice, Star]


@dataclass(frozen=True, slots=True)
class Segment(Node):
    """One dotted component: a name or glob (`h`, `*`, `attn*`, `**`; "" for a rooted path) and selectors."""

    name: str
    selectors: tuple[Selector, ...] = ()

    @property
    def is_glob(self) -> bool:
        return "*" in self.name

    def __str__(self) -> str:
        return self.name + "".join(str(s) for s in self.selectors)


@dataclass(frozen=True, slots=True)
class Path(Node):
    segments: tuple[Segment, ...]

    def __str__(self) -> str:
        return ".".join(str(s) for s in self.segments)


@dataclass(frozen=True, slots=True)
class Activation(Node):
    kind: str  # "output" | "input"
    path: Path

    def __str__(self) -> str:
        return f"{self.kind} of {self.path}"


# ------------------------------------------------------------------ sharding specs
@dataclass(frozen=True, slots=True)
class Replicated(Node):
    def __str__(self) -> str:
        return "_"


@dataclass(frozen=True, slots=True)
class AxisEntry(Node):
    axis: Name

    def __str__(self) -> str:
        return self.axis.text


@dataclass(frozen=True, slots=True)
class AxisTuple(Node):
    axes: tuple[Name, ...]

    def __str__(self) -> str:
        return "(" + ", ".join(a.text for a in self.axes) + ")"


SpecEntry = Union[Replicated, AxisEntry, AxisTuple, Hole]


@dataclass(frozen=True, slots=True)
class Spec(Node):
    entries: tuple[SpecEntry, ...]
    partial: tuple[Name, ...] = ()

    def __str__(self) -> str:
        s = "[" + ", ".join(str(e) for e in self.entries) + "]"
        if self.partial:
            s += " partial(" + ", ".join(p.text for p in self.partial) + ")"
        return s


# ------------------------------------------------------------------ statements
@dataclass(frozen=True, slots=True)
class Use(Node):
    target: Union[Dotted, Str]
    alias: Name | None = None


@dataclass(frozen=True, slots=True)
class KwArg(Node):
    name: Name
    value: Value


@dataclass(frozen=True, slots=True)
class ModelDecl(Node):
    name: Name
    factory: Str
    args: tuple[KwArg, ...] | None = None


@dataclass(frozen=True, slots=True)
class DimDecl(Node):
    name: Name
    size: Int


@dataclass(frozen=True, slots=True)
class InputDecl(Node):
    name: Name
    dtype: Name
    dims: tuple[DimDecl, ...]


@dataclass(frozen=True, slots=True)
class Field(Node):
    key: Dotted
    value: Value
    over: Union[Name, Hole, None] = None


@dataclass(frozen=True, slots=True)
class DeviceDecl(Node):
    name: Name
    fields: tuple[Field, ...]


@dataclass(frozen=True, slots=True)
class LinkDecl(Node):
    name: Name
    fields: tuple[Field, ...]


@dataclass(frozen=True, slots=True)
class AxisDecl(Node):
    name: Name
    size: Union[Int, Hole]
    link: Dotted | None = None


@dataclass(frozen=True, slots=True)
class MeshDecl(Node):
    name: Name
    count: Int | None
    device: Dotted
    axes: tuple[AxisDecl, ...]


@dataclass(frozen=True, slots=True)
class MeshAlias(Node):
    name: Name
    target: Dotted


@dataclass(frozen=True, slots=True)
class BudgetDecl(Node):
    amount: Value
    per_device: bool = False


@dataclass(frozen=True, slots=True)
class OptimizerDecl(Node):
    name: Name
    args: tuple[KwArg, ...] | None = None
    fields: tuple[Field, ...] | None = None


@dataclass(frozen=True, slots=True)
class DataDecl(Node):
    input: Name
    spec: Union[Spec, Hole]


@dataclass(frozen=True, slots=True)
class ShardStmt(Node):
    target: Union[Path, Activation]
    spec: Union[Spec, Hole]


@dataclass(frozen=True, slots=True)
class Schedule(Node):
    name: Name
    chunks: Union[Int, Hole, None] = None

    def __str__(self) -> str:
        return self.name.text + ("" if self.chunks is None else f" chunks {self.chunks}")


@dataclass(frozen=True, slots=True)
class Degree(Node):
    axis: Name
    size: Union[Int, Hole]


@dataclass(frozen=True, slots=True)
class StageDecl(Node):
    paths: tuple[Path, ...]
    degrees: tuple[Degree, ...] = ()


@dataclass(frozen=True, slots=True)
class PipelineDecl(Node):
    axis: Union[Name, Hole]
    schedule: Union[Schedule, Hole]
    microbatches: Union[Int, Hole]
    stages: Union[tuple[StageDecl, ...], Hole]


@dataclass(frozen=True, slots=True)
class CheckpointStmt(Node):
    paths: Union[tuple[Path, ...], Hole]
    every: Union[Int, Hole, Name, None] = None


@dataclass(frozen=True, slots=True)
class Param(Node):
    name: Name
    kind: Name


@dataclass(frozen=True, slots=True)
class ApplyStmt(Node):
    template: Dotted
    args: tuple[Value, ...] | None
    target: Path


@dataclass(frozen=True, slots=True)
class ForStmt(Node):
    var: Name
    selection: Path
    body: tuple["Statement", ...]


@dataclass(frozen=True, slots=True)
class TemplateDecl(Node):
    name: Name
    params: tuple[Param, ...]
    body: tuple["Statement", ...]


Statement = Union[
    Use, ModelDecl, InputDecl, DeviceDecl, LinkDecl, MeshDecl, MeshAlias, BudgetDecl, OptimizerDecl,
    DataDecl, ShardStmt, PipelineDecl, CheckpointStmt, TemplateDecl, ApplyStmt, ForStmt,
]


@dataclass(frozen=True, slots=True)
class Comment(Node):
    text: str  # including the leading '#'


@dataclass(frozen=True, slots=True)
class Module(Node):
    """One parsed file."""

    statements: tuple[Statement, ...]
    comments: tuple[Comment, ...] = field(default=(), compare=False, repr=False)
    path: str = field(default="", compare=False)
