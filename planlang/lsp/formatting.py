"""textDocument/formatting and rangeFormatting: `planlang fmt` for the open document."""
from __future__ import annotations

import difflib
import re

from lsprotocol import types as L

from planlang.lang.fmt import FormatError, format_text

from .positions import UTF16, LineIndex


def format_edits(text: str, path: str = "<plan>", encoding: str = UTF16) -> list[L.TextEdit]:
    """One edit replacing the whole text with its canonical form; none when it is already canonical or
    does not parse (a syntax error is reported as a diagnostic, never by mangling the text)."""
    new = _formatted(text, path)
    if new is None:
        return []
    return [L.TextEdit(L.Range(L.Position(0, 0), LineIndex(text, encoding).end()), new)]


def range_format_edits(text: str, rng: L.Range, path: str = "<plan>", encoding: str = UTF16) -> list[L.TextEdit]:
    """textDocument/rangeFormatting: the changes `planlang fmt` makes to the whole text that touch the
    lines of `rng`, as whole-line edits (the formatter works on whole statements: a change that begins
    or ends outside the range is taken whole). None when the text is canonical there or does not parse."""
    new = _formatted(text, path)
    if new is None:
        return []
    index = LineIndex(text, encoding)
    old_lines, new_lines = _lines(text), _lines(new)
    first, last = rng.start.line, rng.end.line
    if rng.end.character == 0 and last > first:
        last -= 1  # a selection ending at a line's start does not take that line
    out = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        touched = (i1 <= last and first < max(i2, i1 + 1)) if i2 > i1 else first <= i1 <= last + 1
        if not touched:
            continue
        start = index.starts[i1] if i1 < len(index.starts) else len(text)
        end = index.starts[i2] if i2 < len(index.starts) else len(text)
        out.append(L.TextEdit(index.offset_range(start, end), "".join(new_lines[j1:j2])))
    return out


LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n|$)")


def _lines(s: str) -> list[str]:
    """The lines of `s` with their ends, split where LineIndex splits (only at "\\n", "\\r\\n", "\\r")."""
    return [m.group(0) for m in LINE.finditer(s) if m.group(0)]


def _formatted(text: str, path: str) -> str | None:
    """The canonical form of `text`; None when it is canonical already or does not parse."""
    try:
        new = format_text(text, path)
    except FormatError:
        return None
    return None if new == text else new
