"""textDocument/formatting: `planlang fmt` for the open document, as one edit (or none)."""
from __future__ import annotations

from lsprotocol import types as L

from planlang.lang.fmt import FormatError, format_text

from .positions import UTF16, LineIndex


def format_edits(text: str, path: str = "<plan>", encoding: str = UTF16) -> list[L.TextEdit]:
    """One edit replacing the whole text with its canonical form; none when it is already canonical or
    does not parse (a syntax error is reported as a diagnostic, never by mangling the text)."""
    try:
        new = format_text(text, path)
    except FormatError:
        return []
    if new == text:
        return []
    index = LineIndex(text, encoding)
    return [L.TextEdit(L.Range(L.Position(0, 0), index.end()), new)]
