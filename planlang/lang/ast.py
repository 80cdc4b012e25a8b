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

from dataclasses import field
from typing import Union

from .frozen import value_type
from .source import Span
from .spec_text import read_spec

NO_SPAN = Span("<none>", 0, 0, 0, 0)

# spans packed into one int: planlang.lang.packed_spans
from .packed_spans import (SpanArg, as_span, file_id, pack_span, span_lines,  # noqa: F401 - the AST's span API
                           span_offsets, sub_spans, unpack_span)


@value_type(slots=True)
class Node:
    # keyword-only and left out of equality and repr: a node says what it says wherever it was written
    span: Span = field(default=NO_SPAN, compare=False, repr=False, kw_only=True)


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
@value_type(slots=True)
class Name(Node):
    text: str

    def __str__(self) -> str:
        return self.text


@value_type(slots=True)
class Dotted(Node):
    parts: tuple[Name, ...]

    def __str__(self) -> str:
        return ".".join(p.text for p in self.parts)


@value_type(slots=True)
class Hole(Node):
    def __str__(self) -> str:
        return "?"


@value_type(slots=True)
class Int(Node):
    value: int
    text: str = field(default="", compare=False, repr=False, kw_only=True)  # as written: `1_000`, `1e3`

    def __str__(self) -> str:
        return self.text or str(self.value)


@value_type(slots=True)
class Float(Node):
    value: float
    text: str = field(default="", compare=False, repr=False, kw_only=True)  # as written: `1_000`, `1e3`

    def __str__(self) -> str:
        return self.text or repr(self.value)


@value_type(slots=True)
class Str(Node):
    value: str
    text: str = field(default="", compare=False, repr=False, kw_only=True)  # as written: `1_000`, `1e3`

    def __str__(self) -> str:
        return self.text or '"' + self.value.replace("\\", "\\\\").replace('"', '\\"') + '"'


@value_type(slots=True)
class Unit(Node):
    text: str

    def __str__(self) -> str:
        return self.text


@value_type(slots=True)
class Quantity(Node):
    number: Union[Int, Float]
    unit: Unit

    def __str__(self) -> str:
        return f"{self.number} {self.unit}"


@value_type(slots=True)
class Ref(Node):
    """A reference to a named thing, e.g. `hardware.nvlink3`, `tp`, `true`."""

    name: Dotted

    def __str__(self) -> str:
        return str(self.name)


@value_type(slots=True)
class ListValue(Node):
    items: tuple["Value", ...]

    def __str__(self) -> str:
        return "[" + ", ".join(str(i) for i in self.items) + "]"


Number = Union[Int, Float]
Value = Union[Quantity, Int, Float, Str, Ref, Hole, ListValue]


# ------------------------------------------------------------------ module paths
@value_type(slots=True)
class Index(Node):
    index: int

    def __str__(self) -> str:
        return f"[{self.index}]"


@value_type(slots=True)
class Slice(Node):
    start: int | None
    stop: int | None

    def __str__(self) -> str:
        a = "" if self.start is None else str(self.start)
        b = "" if self.stop is None else str(self.stop)
        return f"[{a}:{b}]"


@value_type(slots=True)
class Star(Node):
    def __str__(self) -> str:
        return "[*]"


Selector = Union[Index, Slice, Star]


@value_type(slots=True)
class Segment(Node):
    """One dotted component: a name or glob (`h`, `*`, `attn*`, `**`; "" for a rooted path) and selectors."""

    name: str
    selectors: tuple[Selector, ...] = ()

    @property
    def is_glob(self) -> bool:
        return "*" in self.name

    def __str__(self) -> str:
        return self.name + "".join(str(s) for s in self.selectors)


@value_type(slots=True)
class Path(Node):
    """A module path. The parser stores a path written as `str(path)` prints it (`h[3].attn`, no spaces,
    on one line) as that text, and `segments` builds the Segment nodes (spans included) from it when first
    read: a big plan has a path per line, and its segments are most of its memory. `path_text` and the
    resolver read the text without building them."""

    segments: tuple[Segment, ...]

    def __str__(self) -> str:
        return path_text(self)


_PATH_SEGMENTS = Path.__dict__["segments"]
_get_segments, _set_segments = _PATH_SEGMENTS.__get__, _PATH_SEGMENTS.__set__


def path_text(path: Path) -> str:
    """`str(path)`: its segments joined with `.`, each a name and its selectors (`h[0:6].mlp`, `[0].w`)."""
    v = _get_segments(path)
    return v if v.__class__ is str else ".".join(str(s) for s in v)


def path_compact(path: Path) -> str | None:
    """The text a parsed path is stored as, or None when it holds Segment nodes."""
    v = _get_segments(path)
    return v if v.__class__ is str else None


def _read_segments(path: Path) -> tuple[Segment, ...]:
    v = _get_segments(path)
    if v.__class__ is not str:
        return v
    segments = _segments_of_text(v, raw_span(path))
    if _get_segments(path) is v:  # kept: later reads give the same nodes
        _set_segments(path, segments)
    return _get_segments(path)


# after the class is made (its slot is the store): setattr, as for `span` in `lazy_span_field`
setattr(Path, "segments", property(_read_segments, _set_segments,
                                   doc="The segments (built from the text when stored so)."))


def _segments_of_text(text: str, span: Span | int) -> tuple[Segment, ...]:
    """The segments of a path written `text` (as `path_text` prints it) whose span is the short packed
    span `span`: the spans the parser gives them, from their offsets in the text."""
    at = sub_spans(span)
    out = []
    pos = 0
    for part in text.split("."):
        k = part.find("[")
        name = part if k < 0 else part[:k]
        sels: list[Selector] = []
        while k >= 0:
            end = part.index("]", k)
            inner, a = part[k + 1:end], pos + k
            if inner == "*":
                sels.append(Star(span=at(a, pos + end + 1)))
            elif ":" in inner:
                lo, hi = inner.split(":")
                sels.append(Slice(int(lo) if lo else None, int(hi) if hi else None, span=at(a, pos + end + 1)))
            else:
                sels.append(Index(int(inner), span=at(a, pos + end + 1)))
            k = part.find("[", end)
        out.append(Segment(name, tuple(sels), span=at(pos, pos + len(part))))
        pos += len(part) + 1
    return tuple(out)


@value_type(slots=True)
class Activation(Node):
    kind: str  # "output" | "input"
    path: Path

    def __str__(self) -> str:
        return f"{self.kind} of {self.path}"


# ------------------------------------------------------------------ sharding specs
@value_type(slots=True)
class Replicated(Node):
    def __str__(self) -> str:
        return "_"


@value_type(slots=True)
class AxisEntry(Node):
    axis: Name

    def __str__(self) -> str:
        return self.axis.text


@value_type(slots=True)
class AxisTuple(Node):
    axes: tuple[Name, ...]

    def __str__(self) -> str:
        return "(" + ", ".join(a.text for a in self.axes) + ")"


SpecEntry = Union[Replicated, AxisEntry, AxisTuple, Hole]


@value_type(slots=True)
class Spec(Node):
    """A sharding spec. Like a `Path`, a spec written as it prints (`[_, (dp, tp)] partial(tp)`, one line)
    is stored by the parser as that text (in `entries`; `partial` is then None), and its nodes are built
    from it when first read. Specs repeat: the text is shared."""

    entries: tuple[SpecEntry, ...]
    partial: tuple[Name, ...] = ()

    def __str__(self) -> str:
        return spec_text(self)


_SPEC_ENTRIES, _SPEC_PARTIAL = Spec.__dict__["entries"], Spec.__dict__["partial"]
_get_entries, _set_entries = _SPEC_ENTRIES.__get__, _SPEC_ENTRIES.__set__
_get_partial, _set_partial = _SPEC_PARTIAL.__get__, _SPEC_PARTIAL.__set__


def spec_text(spec: Spec) -> str:
    """`str(spec)`: `[_, tp]`, `[(dp, tp), ?] partial(tp)`."""
    v = _get_entries(spec)
    if v.__class__ is str:
        return v
    s = "[" + ", ".join(str(e) for e in v) + "]"
    partial = _get_partial(spec)
    if partial:
        s += " partial(" + ", ".join(p.text for p in partial) + ")"
    return s


def spec_compact(spec: Spec) -> str | None:
    """The text a parsed spec is stored as, or None when it holds its nodes."""
    v = _get_entries(spec)
    return v if v.__class__ is str else None


def _built_spec(spec: Spec) -> None:
    v = _get_entries(spec)
    if v.__class__ is str:
        entries, partial = _spec_of_text(v, raw_span(spec))
        if _get_entries(spec) is v:  # kept: later reads give the same nodes
            _set_partial(spec, partial)
            _set_entries(spec, entries)


def _read_entries(spec: Spec) -> tuple:
    _built_spec(spec)
    return _get_entries(spec)


def _read_partial(spec: Spec) -> tuple:
    _built_spec(spec)
    return _get_partial(spec)


setattr(Spec, "entries", property(_read_entries, _set_entries,
                                  doc="The entries (built from the text when stored so)."))
setattr(Spec, "partial", property(_read_partial, _set_partial,
                                  doc="The partial(...) axes (built from the text when stored so)."))


def _spec_of_text(text: str, span: Span | int) -> tuple[tuple, tuple]:
    """(entries, partial) of a spec written `text` (as `spec_text` prints it) whose span is the short
    packed span `span`, with the spans the parser gives them; read by `spec_text.read_spec`."""
    at = sub_spans(span)
    read = read_spec(text)
    entries: list[SpecEntry] = []
    for e in read.entries:
        if e.kind == "replicated":
            entries.append(Replicated(span=at(e.start, e.end)))
        elif e.kind == "hole":
            entries.append(Hole(span=at(e.start, e.end)))
        elif e.kind == "tuple":
            names = tuple(Name(n, span=at(a, b)) for n, (a, b) in zip(e.axes, e.axis_offsets))
            entries.append(AxisTuple(names, span=at(e.start, e.end)))
        else:
            name_span = at(e.start, e.end)
            entries.append(AxisEntry(Name(e.axes[0], span=name_span), span=name_span))
    partial = tuple(Name(n, span=at(a, b)) for n, (a, b) in zip(read.partial, read.partial_offsets))
    return tuple(entries), partial


# ------------------------------------------------------------------ statements
@value_type(slots=True)
class Use(Node):
    target: Union[Dotted, Str]
    alias: Name | None = None


@value_type(slots=True)
class KwArg(Node):
    name: Name
    value: Value


@value_type(slots=True)
class ModelDecl(Node):
    name: Name
    factory: Str
    args: tuple[KwArg, ...] | None = None


@value_type(slots=True)
class DimDecl(Node):
    name: Name
    size: Int


@value_type(slots=True)
class InputDecl(Node):
    name: Name
    dtype: Name
    dims: tuple[DimDecl, ...]


@value_type(slots=True)
class Field(Node):
    key: Dotted
    value: Value
    over: Union[Name, Hole, None] = None


@value_type(slots=True)
class DeviceDecl(Node):
    name: Name
    fields: tuple[Field, ...]


@value_type(slots=True)
class LinkDecl(Node):
    name: Name
    fields: tuple[Field, ...]


@value_type(slots=True)
class AxisDecl(Node):
    name: Name
    size: Union[Int, Hole]
    link: Dotted | None = None


@value_type(slots=True)
class MeshDecl(Node):
    name: Name
    count: Int | None
    device: Dotted
    axes: tuple[AxisDecl, ...]


@value_type(slots=True)
class MeshAlias(Node):
    name: Name
    target: Dotted


@value_type(slots=True)
class BudgetDecl(Node):
    amount: Value
    per_device: bool = False


@value_type(slots=True)
class OptimizerDecl(Node):
    name: Name
    args: tuple[KwArg, ...] | None = None
    fields: tuple[Field, ...] | None = None


@value_type(slots=True)
class DataDecl(Node):
    input: Name
    spec: Union[Spec, Hole]


@value_type(slots=True)
class ShardStmt(Node):
    target: Union[Path, Activation]
    spec: Union[Spec, Hole]


@value_type(slots=True)
class Schedule(Node):
    name: Name
    chunks: Union[Int, Hole, None] = None

    def __str__(self) -> str:
        return self.name.text + ("" if self.chunks is None else f" chunks {self.chunks}")


@value_type(slots=True)
class Degree(Node):
    axis: Name
    size: Union[Int, Hole]


@value_type(slots=True)
class StageDecl(Node):
    paths: tuple[Path, ...]
    degrees: tuple[Degree, ...] = ()


@value_type(slots=True)
class PipelineDecl(Node):
    axis: Union[Name, Hole]
    schedule: Union[Schedule, Hole]
    microbatches: Union[Int, Hole]
    stages: Union[tuple[StageDecl, ...], Hole]


@value_type(slots=True)
class MicrobatchesDecl(Node):
    """`microbatches N` at the top level: a step without a pipeline runs its per-rank batch as N
    microbatches in sequence and sums the gradients once (gradient accumulation)."""

    count: Union[Int, Hole]


@value_type(slots=True)
class CheckpointStmt(Node):
    paths: Union[tuple[Path, ...], Hole]
    every: Union[Int, Hole, Name, None] = None


@value_type(slots=True)
class Param(Node):
    name: Name
    kind: Name


@value_type(slots=True)
class ApplyStmt(Node):
    template: Dotted
    args: tuple[Value, ...] | None
    target: Path


@value_type(slots=True)
class ForStmt(Node):
    var: Name
    selection: Path
    body: tuple["Statement", ...]


@value_type(slots=True)
class TemplateDecl(Node):
    name: Name
    params: tuple[Param, ...]
    body: tuple["Statement", ...]


Statement = Union[
    Use, ModelDecl, InputDecl, DeviceDecl, LinkDecl, MeshDecl, MeshAlias, BudgetDecl, OptimizerDecl,
    DataDecl, ShardStmt, PipelineDecl, MicrobatchesDecl, CheckpointStmt, TemplateDecl, ApplyStmt, ForStmt,
]


@value_type(slots=True)
class Comment(Node):
    text: str  # including the leading '#'


@value_type(slots=True)
class Module(Node):
    """One parsed file."""

    statements: tuple[Statement, ...]
    comments: tuple[Comment, ...] = field(default=(), compare=False, repr=False)
    path: str = field(default="", compare=False)
