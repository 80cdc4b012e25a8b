"""Positions: planlang spans (1-based line and column, in code points) <-> LSP positions.

LSP positions are 0-based lines and 0-based columns counted in the code units of the negotiated
position encoding: UTF-16 by default (a character outside the Basic Multilingual Plane, such as an
emoji in a comment, counts 2), or UTF-8 / UTF-32 when the client asks for them. Lines end at "\\n",
"\\r\\n" or "\\r" (the protocol's three line ends); a line end is no column: a position is never counted
past the line's last character, and one past it is clamped back to it (as the protocol says).
"""
from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field

from lsprotocol import types as L

from planlang.lang.source import Span

UTF16, UTF8, UTF32 = "utf-16", "utf-8", "utf-32"
LINE_END = re.compile(r"\r\n|\r|\n")


def code_units(ch: str, encoding: str = UTF16) -> int:
    """How many code units one character takes in `encoding`."""
    if encoding == UTF32:
        return 1
    if encoding == UTF8:
        return len(ch.encode("utf-8"))
    return 2 if ord(ch) > 0xFFFF else 1


def units_len(s: str, encoding: str = UTF16) -> int:
    if encoding == UTF32:
        return len(s)
    if encoding == UTF8:
        return len(s.encode("utf-8"))
    if s.isascii():
        return len(s)
    return len(s.encode("utf-16-le", "surrogatepass")) // 2  # in C: a generator over the characters was 30x slower


@dataclass(frozen=True)
class LineIndex:
    """A document's text with line starts, converting between offsets, spans and LSP positions."""

    text: str
    encoding: str = UTF16
    starts: tuple[int, ...] = field(init=False, repr=False)
    ends: tuple[int, ...] = field(init=False, repr=False)  # where each line's text ends (its line end starts)

    def __post_init__(self):
        starts, ends = [0], []
        for m in LINE_END.finditer(self.text):
            ends.append(m.start())
            starts.append(m.end())
        ends.append(len(self.text))
        object.__setattr__(self, "starts", tuple(starts))
        object.__setattr__(self, "ends", tuple(ends))

    def line(self, index: int) -> str:
        """The text of 0-based line `index`, without its line ending."""
        if index < 0 or index >= len(self.starts):
            return ""
        return self.text[self.starts[index]:self.ends[index]]

    # ------------------------------------------------------------------ to LSP
    def position(self, offset: int) -> L.Position:
        """The LSP position of a character offset."""
        offset = max(0, min(offset, len(self.text)))
        line = bisect.bisect_right(self.starts, offset) - 1
        return L.Position(line, units_len(self.text[self.starts[line]:min(offset, self.ends[line])], self.encoding))

    def position_of(self, line: int, col: int) -> L.Position:
        """The LSP position of a 1-based line and 1-based code-point column (as spans hold them)."""
        if line < 1:
            return L.Position(0, 0)
        if line > len(self.starts):
            return self.position(len(self.text))
        text = self.line(line - 1)
        return L.Position(line - 1, units_len(text[:max(0, col - 1)], self.encoding))

    def range(self, span: Span) -> L.Range:
        """The LSP range of a span (from its lines and columns, which every span has)."""
        start = self.position_of(span.line, span.col)
        end = self.position_of(span.end_line, span.end_col) if span.end_line >= 1 else start
        if (end.line, end.character) < (start.line, start.character):
            end = start
        return L.Range(start, end)

    def offset_range(self, start: int, end: int) -> L.Range:
        return L.Range(self.position(start), self.position(end))

    # ------------------------------------------------------------------ from LSP
    def offset(self, pos: L.Position) -> int:
        """The character offset of an LSP position (clamped to the line's end and the text)."""
        if pos.line >= len(self.starts):
            return len(self.text)
        text = self.line(pos.line)
        units, col = 0, 0
        while col < len(text) and units < pos.character:
            units += code_units(text[col], self.encoding)
            col += 1
        return self.starts[pos.line] + col

    def end(self) -> L.Position:
        return self.position(len(self.text))
