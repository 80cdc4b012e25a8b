"""Module selections: `h[*].mlp`, `h[0:6]`, `layers.*.attn`, `**.bias`, `[0].weight`.

A selection is a pattern over the dotted names of `model.named_modules()` / `named_parameters()`,
where container children are written with brackets (`h[3]` for `h.3`). Matching is pure string work,
so the language layers can use it without torch.
"""
from __future__ import annotations

import fnmatch
import re
from dataclasses import field
from typing import Callable

from planlang.lang.frozen import value_type
from planlang.lang import ast as A
from planlang.lang.source import Span

_NO_SPAN = A.NO_SPAN
# a span as stored (packed or a `Span`), passed on as `span=` unchanged: what `span=` takes is `A.SpanArg`
# (`A.lazy_span_field` reads it back as the `Span` the field is typed with)
_raw_span: Callable[[object], A.SpanArg] = A.raw_span


@value_type(slots=True)
class Sel:
    """One selector on a segment: ("index", i), ("slice", start, stop) or ("star",)."""

    kind: str
    a: int | None = None
    b: int | None = None

    def __str__(self) -> str:
        if self.kind == "index":
            return f"[{self.a}]"
        if self.kind == "star":
            return "[*]"
        return f"[{'' if self.a is None else self.a}:{'' if self.b is None else self.b}]"

    def admits(self, i: int) -> bool:
        if self.kind == "star":
            return True
        if self.kind == "index":
            return i == self.a
        return (self.a is None or i >= self.a) and (self.b is None or i < self.b)


@value_type(slots=True)
class SelSegment:
    name: str  # "" for a rooted selector-only segment; may contain * globs; "**" matches any depth
    sels: tuple[Sel, ...] = ()
    _hash: int = field(default=0, init=False, repr=False, compare=False)  # selections are dict keys

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.name, self.sels)))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self):  # rebuilt, not restored: str hashes differ between processes
        return SelSegment, (self.name, self.sels)

    def __str__(self) -> str:
        return self.name + "".join(str(s) for s in self.sels)


def _segment(seg: A.Segment) -> SelSegment:
    sels = []
    for s in seg.selectors:
        if isinstance(s, A.Index):
            sels.append(Sel("index", s.index))
        elif isinstance(s, A.Slice):
            sels.append(Sel("slice", s.start, s.stop))
        else:
            sels.append(Sel("star"))
    return SelSegment(seg.name, tuple(sels))


@value_type(slots=True)
class Selection:
    segments: tuple[SelSegment, ...]
    span: Span = field(default=_NO_SPAN, compare=False, repr=False)

    def __str__(self) -> str:
        return ".".join(str(s) for s in self.segments)

    @staticmethod
    def from_path(path: A.Path, shared: dict | None = None) -> "Selection":
        """The selection a path writes. With `shared` (a dict kept across calls), equal segments are one
        SelSegment: a big plan names `attn` or `h[3]` over and over."""
        if shared is None:
            return Selection(tuple(_segment(seg) for seg in path.segments), span=_raw_span(path))
        text = A.path_compact(path)
        if text is not None:  # a parsed path kept as text: its segments are not built
            segs = []
            for part in text.split("."):
                out = shared.get(part)
                if out is None:
                    out = shared[part] = Selection.parse(part).segments[0]
                segs.append(out)
            return Selection(tuple(segs), span=_raw_span(path))
        segs = []
        for seg in path.segments:
            key = (seg.name, seg.selectors)  # AST equality: the selectors' values, not their spans
            out = shared.get(key)
            if out is None:
                out = shared[key] = _segment(seg)
            segs.append(out)
        return Selection(tuple(segs), span=_raw_span(path))

    @staticmethod
    def parse(text: str) -> "Selection":
        """Build a selection from its text form (`h[0:2].mlp`), for tests and tools."""
        segs = []
        for part in _split_dots(text):
            m = re.match(r"^([A-Za-z0-9_*]*)((?:\[[^\]]*\])*)$", part)
            if not m:
                raise ValueError(f"not a selection: {text!r}")
            sels = []
            for inner in re.findall(r"\[([^\]]*)\]", m.group(2)):
                if inner == "*":
                    sels.append(Sel("star"))
                elif ":" in inner:
                    a, b = inner.split(":", 1)
                    sels.append(Sel("slice", int(a) if a else None, int(b) if b else None))
                else:
                    sels.append(Sel("index", int(inner)))
            segs.append(SelSegment(m.group(1), tuple(sels)))
        return Selection(tuple(segs))

    def prefixed(self, prefix: "Selection") -> "Selection":
        return Selection(prefix.segments + self.segments, span=_raw_span(self))

    def replace_head(self, var: str, value: "Selection") -> "Selection | None":
        """If the first segment is the loop variable `var` (without selectors), substitute `value`."""
        if self.segments and self.segments[0].name == var and not self.segments[0].sels:
            return Selection(value.segments + self.segments[1:], span=_raw_span(self))
        return None

    @property
    def is_pattern(self) -> bool:
        return any("*" in s.name or any(x.kind != "index" for x in s.sels) for s in self.segments)

    # ------------------------------------------------------------------ matching
    def tokens(self) -> list[tuple[str, object]]:
        """The selection as a flat token list: ("name", glob) and ("sel", Sel)."""
        out: list[tuple[str, object]] = []
        for seg in self.segments:
            if seg.name:
                out.append(("name", seg.name))
            for s in seg.sels:
                out.append(("sel", s))
        return out

    def matches(self, qualified_name: str) -> bool:
        """Does the selection match a dotted torch name such as `h.3.mlp.c_fc`?"""
        return _match(self.tokens(), qualified_name.split(".") if qualified_name else [])

    def select(self, names) -> list[str]:
        """The names (in the given order) that the selection matches."""
        toks = self.tokens()
        return [n for n in names if _match(toks, n.split(".") if n else [])]


A.lazy_span_field(Selection)


def to_plan_name(name: str) -> str:
    """`h.0.attn` -> `h[0].attn` (how plans write container children)."""
    out = []
    for part in name.split("."):
        if part.isdigit():
            out.append(f"[{part}]")
        else:
            out.append(("." if out else "") + part)
    return "".join(out)


def _split_dots(text: str) -> list[str]:
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "." and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def _match(toks, parts: list[str]) -> bool:
    if not toks:
        return not parts
    kind, val = toks[0]
    if kind == "name" and val == "**":
        return any(_match(toks[1:], parts[i:]) for i in range(len(parts) + 1))
    if not parts:
        return False
    head = parts[0]
    if kind == "name":
        ok = fnmatch.fnmatchcase(head, val) if "*" in val else head == val
        return ok and _match(toks[1:], parts[1:])
    if not head.isdigit():
        return False
    return val.admits(int(head)) and _match(toks[1:], parts[1:])


def index_range(sel: Selection) -> tuple[str, int, int | None] | None:
    """For a selection `prefix[a:b]` / `prefix[i]` (last selector on a literal path), the container
    prefix and the half-open index range; None when the selection is not of that shape."""
    if not sel.segments:
        return None
    last = sel.segments[-1]
    if not last.sels or len(last.sels) != 1:
        return None
    if any("*" in s.name or s.sels for s in sel.segments[:-1]) or "*" in last.name:
        return None
    s = last.sels[0]
    prefix = ".".join([str(x) for x in sel.segments[:-1]] + [last.name]).strip(".")
    if s.kind == "index":
        if s.a is None:  # never: an index selector is built with its index (`Sel("index", i)`)
            return None
        return prefix, s.a, s.a + 1
    if s.kind == "slice":
        return prefix, s.a if s.a is not None else 0, s.b
    return prefix, 0, None


def stage_targets(modules, params) -> list[str]:
    """What a pipeline `stage` names: the model's modules, and the parameters of the root module itself
    (a learned position table or a scale the root's own forward reads), which no submodule holds. Such
    a parameter lives in the stage that names it."""
    return [*modules, *(p for p in params if "." not in p)]


def covered_modules(sels, names: list[str]) -> set[str]:
    """The modules of `names` that `sels` select, and all their descendants (what a stage or a
    checkpoint group holds)."""
    picked: set[str] = set()
    for s in sels:
        picked |= set(s.select(names))
    return {m for m in names if m in picked or any(m.startswith(p + ".") for p in picked)}
