"""The one reader of a sharding spec's text, as the grammar (`planlang/grammar/planlang.lark`) writes one:

    spec:     "[" [entry ("," entry)* ","?] "]" [partial]
    entry:    name                           an axis:             [dp, _]
            | "(" name ("," name)* ","? ")"  axes, major→minor:   [(dp, tp), _]
            | "_"                            replicated
            | "?"                            a hole for the solver
    partial:  "partial" "(" name ("," name)* ","? ")"

The `partial(...)` clause follows the closing bracket — `[tp, _] partial(tp)` — it is not an entry
(`[tp, _, partial(tp)]` is refused: `partial` there would be an axis named `partial`, then `(`).
A name is an identifier (`[A-Za-z_][A-Za-z0-9_]*`); soft keywords (`partial`, `x`, `over`, …) are names
as in the grammar. `_` alone is the replicated entry where an entry starts, and a name inside `( )` or
`partial( )`, where the parser's contextual lexer only looks for names.

`read_spec(text)` reads such a text: spaces, tabs and newlines may stand between tokens, and trailing
commas are allowed. Comments (`#`) and line continuations (`\\`) are not: this reads a spec on its own,
not a plan; the parser hands it only texts `is_canonical` accepts. Anything else raises ValueError.
The result keeps each entry's and each name's offsets in `text`, for the AST's spans
(`planlang.lang.ast` builds its `Spec` nodes from it) and is cached per text (specs repeat).

`is_canonical(text)`: whether `text` is exactly what `planlang.lang.ast.spec_text` prints for the spec it
reads — `[e, e, ...]` with single spaces after commas, then optionally ` partial(a, ...)` — so the
parser may store a spec as its text and build the nodes later. No layer above `lang` is imported.
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Literal

from .frozen import value_type

EntryKind = Literal["axis", "tuple", "replicated", "hole"]


@value_type(slots=True)
class EntryText:
    """One entry of a spec: `kind`; its axis names, major to minor (() for `_` and `?`; one for an
    `axis`, one or more for a `tuple`); its offsets in the text (`start`..`end`, parentheses included);
    each name's (start, end)."""

    kind: EntryKind
    axes: tuple[str, ...]
    start: int
    end: int
    axis_offsets: tuple[tuple[int, int], ...] = ()


@value_type(slots=True)
class SpecText:
    """A spec read from its text: its entries, the axes of its `partial(...)` clause (() without one)
    and their (start, end) offsets."""

    entries: tuple[EntryText, ...]
    partial: tuple[str, ...] = ()
    partial_offsets: tuple[tuple[int, int], ...] = ()

    @property
    def has_hole(self) -> bool:
        return any(e.kind == "hole" for e in self.entries)

    def axes(self) -> tuple[tuple[str, ...], ...] | None:
        """Each entry's axes (() for `_`), or None when an entry is a hole `?`."""
        return None if self.has_hole else tuple(e.axes for e in self.entries)

    def names(self) -> frozenset[str]:
        """Every axis name the spec uses, `partial(...)` included."""
        return frozenset(a for e in self.entries for a in e.axes) | frozenset(self.partial)


_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
# a token: a name (group 1) or any other single character but white space (group 2); `finditer` steps over
# the white space between them
_TOKEN = re.compile(rf"({_NAME})|([^ \t\f\r\n])")

_ENTRY = rf"(?:_|\?|{_NAME}|\({_NAME}(?:, {_NAME})*\))"
_CANONICAL = re.compile(rf"\[(?:{_ENTRY}(?:, {_ENTRY})*)?\](?: partial\({_NAME}(?:, {_NAME})*\))?")


def is_canonical(text: str) -> bool:
    """Whether the whole of `text` is a spec written as `ast.spec_text` prints it (see the module)."""
    return _CANONICAL.fullmatch(text) is not None


class _Reader:
    """The tokens of a spec text, read left to right: (text, start, end, is_name)."""

    __slots__ = ("text", "toks", "i")

    def __init__(self, text: str):
        self.text = text
        self.toks = [(m.group(), m.start(), m.end(), m.lastindex == 1) for m in _TOKEN.finditer(text)]
        self.i = 0

    def peek(self) -> str | None:
        return self.toks[self.i][0] if self.i < len(self.toks) else None

    def take(self, want: str | None = None) -> tuple[str, int, int, bool]:
        if self.i >= len(self.toks):
            raise ValueError(f"spec `{self.text}` ends early" + (f": `{want}` expected" if want else ""))
        tok = self.toks[self.i]
        if want is not None and tok[0] != want:
            raise ValueError(f"`{want}` expected at offset {tok[1]} of spec `{self.text}`, not `{tok[0]}`")
        self.i += 1
        return tok

    def names(self) -> tuple[tuple[str, ...], tuple[tuple[int, int], ...], int]:
        """`name ("," name)* ","? ")"` after a `(`: the names, their offsets, the end of the `)`."""
        names, offsets = [], []
        while True:
            word, a, b, is_name = self.take()
            if not is_name:
                raise ValueError(f"an axis name expected at offset {a} of spec `{self.text}`, not `{word}`")
            names.append(word)
            offsets.append((a, b))
            sep = self.take()
            if sep[0] == ")":
                return tuple(names), tuple(offsets), sep[2]
            if sep[0] != ",":
                raise ValueError(f"`,` or `)` expected at offset {sep[1]} of spec `{self.text}`, not `{sep[0]}`")
            if self.peek() == ")":
                return tuple(names), tuple(offsets), self.take()[2]


@lru_cache(maxsize=4096)
def read_spec(text: str) -> SpecText:
    """The spec `text` writes (see the module for what is accepted); ValueError when it writes none."""
    r = _Reader(text)
    r.take("[")
    entries: list[EntryText] = []
    while r.peek() != "]":
        word, a, b, is_name = r.take()
        if word == "(":
            axes, offsets, end = r.names()
            entries.append(EntryText("tuple", axes, a, end, offsets))
        elif word == "_":
            entries.append(EntryText("replicated", (), a, b))
        elif word == "?":
            entries.append(EntryText("hole", (), a, b))
        elif is_name:
            entries.append(EntryText("axis", (word,), a, b, ((a, b),)))
        else:
            raise ValueError(f"a spec entry expected at offset {a} of spec `{text}`, not `{word}`")
        if r.peek() != "]":
            r.take(",")
    r.take("]")
    partial: tuple[str, ...] = ()
    partial_offsets: tuple[tuple[int, int], ...] = ()
    if r.peek() is not None:
        r.take("partial")
        r.take("(")
        partial, partial_offsets, _ = r.names()
    if r.peek() is not None:
        tok = r.take()
        raise ValueError(f"nothing expected after the spec, at offset {tok[1]} of `{text}`: `{tok[0]}`")
    return SpecText(tuple(entries), partial, partial_offsets)
