"""Helpers shared by the renderers: ordering, severity names, counting, display widths."""
from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from typing import Any


def severity_name(diag: Any) -> str:
    """'error' | 'warning' | 'note' for a diagnostic (accepts the enum or a plain string)."""
    sev = diag.severity
    return str(getattr(sev, "value", sev))


def sort_key(diag: Any) -> tuple:
    s = diag.span
    return (s.file, s.line, s.col, diag.code)


def sorted_diagnostics(diagnostics: Iterable[Any]) -> list[Any]:
    """Diagnostics in rendering order: (file, line, column, code); stable for ties."""
    return sorted(diagnostics, key=sort_key)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def summary_line(diagnostics: Iterable[Any]) -> str:
    """'2 errors, 1 warning, 3 notes' (zero counts left out), or 'no problems'."""
    counts = {"error": 0, "warning": 0, "note": 0}
    for d in diagnostics:
        name = severity_name(d)
        counts[name] = counts.get(name, 0) + 1
    parts = [_plural(n, word) for word, n in counts.items() if n]
    return ", ".join(parts) if parts else "no problems"


def to_posix(path: str) -> str:
    return path.replace("\\", "/")


# ---- display widths (human renderer) ----------------------------------------------------------

TAB_WIDTH = 4


def char_width(ch: str) -> int:
    if ch == "\t":
        return TAB_WIDTH
    if ch < "\u0300":  # ASCII and Latin: the common case, no table look-up
        return 1

    if unicodedata.combining(ch):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def text_width(text: str) -> int:
    return sum(char_width(ch) for ch in text)


def expand_tabs(text: str) -> str:
    """Each tab becomes TAB_WIDTH spaces (not tab stops), matching `char_width`."""
    return text.replace("\t", " " * TAB_WIDTH)
