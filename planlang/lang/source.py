"""Source files and spans: where every AST node and diagnostic points."""
from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from functools import cached_property

from .frozen import value_type


@dataclass(frozen=True, order=True)
class Span:
    """A half-open region of one file. Lines and columns are 1-based; `end_col` is exclusive."""

    file: str
    line: int
    col: int
    end_line: int
    end_col: int
    start: int = field(default=0, compare=False)  # character offsets, for editors and slicing
    end: int = field(default=0, compare=False)

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"

    def cover(self, other: "Span") -> "Span":
        """The smallest span holding both (same file)."""
        a, b = (self, other) if (self.line, self.col) <= (other.line, other.col) else (other, self)
        end = self if (self.end_line, self.end_col) >= (other.end_line, other.end_col) else other
        return Span(a.file, a.line, a.col, end.end_line, end.end_col, a.start, end.end)


@value_type
class SourceFile:
    """The text of one plan file with a line index (the parser's is the file's `plan_text`)."""

    path: str
    text: str

    @cached_property
    def _line_starts(self) -> list[int]:
        starts = [0]
        for i, ch in enumerate(self.text):
            if ch == "\n":
                starts.append(i + 1)
        return starts

    def line_text(self, line: int) -> str:
        starts = self._line_starts
        if line < 1 or line > len(starts):
            return ""
        begin = starts[line - 1]
        end = starts[line] - 1 if line < len(starts) else len(self.text)
        return self.text[begin:end].rstrip("\r")

    @property
    def line_count(self) -> int:
        return len(self._line_starts)

    def position(self, offset: int) -> tuple[int, int]:
        """1-based (line, column) of a character offset."""
        offset = max(0, min(offset, len(self.text)))
        idx = bisect.bisect_right(self._line_starts, offset) - 1
        return idx + 1, offset - self._line_starts[idx] + 1

    def offset(self, line: int, col: int) -> int:
        starts = self._line_starts
        line = max(1, min(line, len(starts)))
        return starts[line - 1] + col - 1

    def span(self, start: int, end: int) -> Span:
        line, col = self.position(start)
        end_line, end_col = self.position(end)
        return Span(self.path, line, col, end_line, end_col, start, end)


BOM = "\ufeff"
_LONE_CR = re.compile(r"\r(?!\n)")


def plan_text(text: str) -> str:
    """The text a plan's spans count in. A leading byte-order mark is dropped (editors hide it, so a
    column counted past it would be one off on line 1), and a "\\r" that ends a line alone (old Mac
    line ends, still written by some editors) becomes "\\n": one character for one, so every later
    offset is unchanged. "\\r\\n" stays as it is (the grammar reads it as one line end)."""
    if text.startswith(BOM):
        text = text[len(BOM):]
    return lone_cr_as_lf(text)


def lone_cr_as_lf(text: str) -> str:
    """`text` with each "\\r" that ends a line alone made "\\n": the same length, every offset the same,
    and the same lines wherever lines end at "\\n", "\\r\\n" or "\\r" (as the language server protocol
    counts them)."""
    return _LONE_CR.sub("\n", text) if "\r" in text else text


def decode_plan(data: bytes, path: str) -> tuple[SourceFile, "tuple[int, int] | None"]:
    """The file's text (as `plan_text` reads it), and the (start, end) character offsets of its first
    undecodable bytes when it is not UTF-8 (the text then has U+FFFD in their place, so a diagnostic can
    point at them)."""
    try:
        return SourceFile(path, plan_text(data.decode("utf-8"))), None
    except UnicodeDecodeError as err:
        before = data[:err.start].decode("utf-8")
        text = data.decode("utf-8", errors="replace")
        start = len(plan_text(before))  # less the byte-order mark, when the file has one
        return SourceFile(path, plan_text(text)), (start, start + 1)
