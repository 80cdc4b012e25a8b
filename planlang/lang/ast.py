"""The typed syntax tree: small frozen dataclasses, each with the span it came from.

Spans never take part in equality (``compare=False``), so two trees parsed from differently
formatted text compare equal when they say the same thing — the formatter's round-trip property.
Literal text (``text``) is kept for faithful printing but is not compared either.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from .source import Span

NO_SPAN = Span("<none>", 0, 0, 0, 0)


def _span():
    return field(default=NO_SPAN, compare=False, repr=False, kw_only=True)


def _text():
    return field(default="", compare=False, repr=False, kw_only=True)


@dataclass(frozen=True)
class Node:
    span: Span = _span()


# ------------------------------------------------------------------ names and values
@dataclass(frozen=True)
class Name(Node):
    text: str

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Dotted(Node):
    parts: tuple[Name, ...]

    def __str__(self) -> str:
        return ".".join(p.text for p in self.parts)


@dataclass(frozen=True)
class Hole(Node):
    def __str__(self) -> str:
        return "?"


@dataclass(frozen=True)
class Int(Node):
    value: int
    text: str = _text()

    def __str__(self) -> str:
        return self.text or str(self.value)


@dataclass(frozen=True)
class Float(Node):
    value: float
    text: str = _text()

    def __str__(self) -> str:
        return self.text or repr(self.value)


@dataclass(frozen=True)
class Str(Node):
    value: str
    text: str = _text()

    def __str__(self) -> str:
        return self.text or '"' + self.value.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class Unit(Node):
    text: str

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Quantity(Node):
    number: Union[Int, Float]
    unit: Unit

    def __str__(self) -> str:
        return f"{self.number} {self.unit}"


@dataclass(frozen=True)
class Ref(Node):
    """A reference to a named thing, e.g. `hardware.nvlink3`, `tp`, `true`."""

    name: Dotted

    def __str__(self) -> str:
        return str(self.name)


@dataclass(frozen=True)
class ListValue(Node):
    items: tuple["Value", ...]

    def __str__(self) -> str:
        return "[" + ", ".join(str(i) for i in self.items) + "]"


Number = Union[Int, Float]
Value = Union[Quantity, Int, Float, Str, Ref, Hole, ListValue]


# ------------------------------------------------------------------ module paths
@dataclass(frozen=True)
class Index(Node):
    index: int

    def __str__(self) -> str:
        return f"[{self.index}]"


@dataclass(frozen=True)
class Slice(Node):
    start: int | None
    stop: int | None

    def __str__(self) -> str:
        a = "" if self.start is None else str(self.start)
        b = "" if self.stop is None else str(self.stop)
        return f"[{a}:{b}]"


@dataclass(frozen=True)
class Star(Node):
    def __str__(self) -> str:
        return "[*]"


Selector = Union[Index, Slice, Star]


@dataclass(frozen=True)
class Segment(Node):
    """One dotted component: a name or glob (`h`, `*`, `attn*`, `**`; "" for a rooted path) and selectors."""

    name: str
    selectors: tuple[Selector, ...] = ()

    @property
    def is_glob(self) -> bool:
        return "*" in self.name

    def __str__(self) -> str:
        return self.name + "".join(str(s) for s in self.selectors)


@dataclass(frozen=True)
class Path(Node):
    segments: tuple[Segment, ...]

    def __str__(self) -> str:
        return ".".join(str(s) for s in self.segments)


@dataclass(frozen=True)
class Activation(Node):
    kind: str  # "output" | "input"
    path: Path

    def __str__(self) -> str:
        return f"{self.kind} of {self.path}"


# ------------------------------------------------------------------ sharding specs
@dataclass(frozen=True)
class Replicated(Node):
    def __str__(self) -> str:
        return "_"


@dataclass(frozen=True)
class AxisEntry(Node):
    axis: Name

    def __str__(self) -> str:
        return self.axis.text


@dataclass(frozen=True)
class AxisTuple(Node):
    axes: tuple[Name, ...]

    def __str__(self) -> str:
        return "(" + ", ".join(a.text for a in self.axes) + ")"


SpecEntry = Union[Replicated, AxisEntry, AxisTuple, Hole]


@dataclass(frozen=True)
class Spec(Node):
    entries: tuple[SpecEntry, ...]
    partial: tuple[Name, ...] = ()

    def __str__(self) -> str:
        s = "[" + ", ".join(str(e) for e in self.entries) + "]"
        if self.partial:
            s += " partial(" + ", ".join(p.text for p in self.partial) + ")"
        return s


# ------------------------------------------------------------------ statements
@dataclass(frozen=True)
class Use(Node):
    target: Union[Dotted, Str]
    alias: Name | None = None


@dataclass(frozen=True)
class KwArg(Node):
    name: Name
    value: Value


@dataclass(frozen=True)
class ModelDecl(Node):
    name: Name
    factory: Str
    args: tuple[KwArg, ...] | None = None


@dataclass(frozen=True)
class DimDecl(Node):
    name: Name
    size: Int


@dataclass(frozen=True)
class InputDecl(Node):
    name: Name
    dtype: Name
    dims: tuple[DimDecl, ...]


@dataclass(frozen=True)
class Field(Node):
    key: Dotted
    value: Value
    over: Union[Name, Hole, None] = None


@dataclass(frozen=True)
class DeviceDecl(Node):
    name: Name
    fields: tuple[Field, ...]


@dataclass(frozen=True)
class LinkDecl(Node):
    name: Name
    fields: tuple[Field, ...]


@dataclass(frozen=True)
class AxisDecl(Node):
    name: Name
    size: Union[Int, Hole]
    link: Dotted | None = None


@dataclass(frozen=True)
class MeshDecl(Node):
    name: Name
    count: Int | None
    device: Dotted
    axes: tuple[AxisDecl, ...]


@dataclass(frozen=True)
class MeshAlias(Node):
    name: Name
    target: Dotted


@dataclass(frozen=True)
class BudgetDecl(Node):
    amount: Value
    per_device: bool = False


@dataclass(frozen=True)
class OptimizerDecl(Node):
    name: Name
    args: tuple[KwArg, ...] | None = None
    fields: tuple[Field, ...] | None = None


@dataclass(frozen=True)
class DataDecl(Node):
    input: Name
    spec: Union[Spec, Hole]


@dataclass(frozen=True)
class ShardStmt(Node):
    target: Union[Path, Activation]
    spec: Union[Spec, Hole]


@dataclass(frozen=True)
class Schedule(Node):
    name: Name
    chunks: Union[Int, Hole, None] = None

    def __str__(self) -> str:
        return self.name.text + ("" if self.chunks is None else f" chunks {self.chunks}")


@dataclass(frozen=True)
class Degree(Node):
    axis: Name
    size: Union[Int, Hole]


@dataclass(frozen=True)
class StageDecl(Node):
    paths: tuple[Path, ...]
    degrees: tuple[Degree, ...] = ()


@dataclass(frozen=True)
class PipelineDecl(Node):
    axis: Union[Name, Hole]
    schedule: Union[Schedule, Hole]
    microbatches: Union[Int, Hole]
    stages: Union[tuple[StageDecl, ...], Hole]


@dataclass(frozen=True)
class CheckpointStmt(Node):
    paths: Union[tuple[Path, ...], Hole]
    every: Union[Int, Hole, Name, None] = None


@dataclass(frozen=True)
class Param(Node):
    name: Name
    kind: Name


@dataclass(frozen=True)
class ApplyStmt(Node):
    template: Dotted
    args: tuple[Value, ...] | None
    target: Path


@dataclass(frozen=True)
class ForStmt(Node):
    var: Name
    selection: Path
    body: tuple["Statement", ...]


@dataclass(frozen=True)
class TemplateDecl(Node):
    name: Name
    params: tuple[Param, ...]
    body: tuple["Statement", ...]


Statement = Union[
    Use, ModelDecl, InputDecl, DeviceDecl, LinkDecl, MeshDecl, MeshAlias, BudgetDecl, OptimizerDecl,
    DataDecl, ShardStmt, PipelineDecl, CheckpointStmt, TemplateDecl, ApplyStmt, ForStmt,
]


@dataclass(frozen=True)
class Comment(Node):
    text: str  # including the leading '#'


@dataclass(frozen=True)
class Module(Node):
    """One parsed file."""

    statements: tuple[Statement, ...]
    comments: tuple[Comment, ...] = field(default=(), compare=False, repr=False)
    path: str = field(default="", compare=False)
