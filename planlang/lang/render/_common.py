"""Helpers shared by the renderers: ordering, severity names, counting, display widths, escapes."""
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


# ---- display (human renderer) -----------------------------------------------------------------

TAB_WIDTH = 4
MAX_LINE = 120  # display columns of one source line an excerpt shows; a longer line is cut to a window
CONTEXT = 40  # columns kept before the first mark when a line is cut
ELLIPSIS = "..."

# Shown as escapes, never raw: controls (Cc, but tab), format characters (Cf: BOM, zero-width, bidi
# controls), line/paragraph separators, surrogates, private-use and unassigned code points, and every
# space but U+0020 (no-break, ideographic, ... spaces look like a space and are not one).
_ESCAPED_CATEGORIES = frozenset(("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"))


def escape_char(ch: str) -> str | None:
    """`\\u200b` for a character that must not be shown raw, else None (tab: see `display_char`)."""
    if " " <= ch < "\x7f" or ch == "\t":
        return None
    if unicodedata.category(ch) not in _ESCAPED_CATEGORIES:
        return None
    o = ord(ch)
    if o < 0x100:
        return f"\\x{o:02x}"
    return f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def display_char(ch: str) -> str:
    """How a source character is shown: tabs as TAB_WIDTH spaces, invisible characters escaped."""
    if ch == "\t":
        return " " * TAB_WIDTH
    return escape_char(ch) or ch


def char_width(ch: str) -> int:
    if ch == "\t":
        return TAB_WIDTH
    if " " <= ch < "\u0300" and not "\x7f" <= ch <= "\xa0" and ch != "\xad":  # the common case, no look-up
        return 1
    escaped = escape_char(ch)
    if escaped is not None:
        return len(escaped)
    if unicodedata.combining(ch):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def _plain(text: str) -> bool:
    return text.isascii() and (text.isprintable() or not text)


def text_width(text: str) -> int:
    if _plain(text):
        return len(text)
    return sum(char_width(ch) for ch in text)


def display_text(text: str) -> str:
    """`text` as an excerpt shows it (see `display_char`); its length in columns is `text_width(text)`."""
    if _plain(text):
        return text
    return "".join(display_char(ch) for ch in text)


def expand_tabs(text: str) -> str:
    """Each tab becomes TAB_WIDTH spaces (not tab stops), matching `char_width`."""
    return text.replace("\t", " " * TAB_WIDTH)


def escape_text(text: str, newlines: bool = False) -> str:
    """A message with the characters `escape_char` escapes escaped (a message may quote source text,
    which can hold any), so that it cannot move the cursor, colour the terminal or reorder what follows.
    Tabs and newlines stay, unless `newlines` (one-line formats: a newline is shown as `\\n`)."""
    if text.isascii() and text.isprintable():
        return text
    out = []
    for ch in text:
        if ch == "\n":
            out.append("\\n" if newlines else ch)
        else:
            out.append(escape_char(ch) or ch)
    return "".join(out)


def window(text: str, focus: int, width: int = MAX_LINE, before: int = CONTEXT) -> tuple[int, int]:
    """The character range [lo, hi) of `text` to show: all of it when it fits in `width` columns, else
    at most `width` columns starting about `before` columns ahead of character `focus`. A character
    counts at least one column here, so that a run of combining marks (no width) is cut too."""
    n = len(text)
    if n <= width and text_width(text) <= width:
        return 0, n

    def cost(ch: str) -> int:
        return max(char_width(ch), 1)

    focus = max(0, min(focus, n))
    lo, w = focus, 0
    while lo > 0 and w + cost(text[lo - 1]) <= before:
        lo -= 1
        w += cost(text[lo])
    hi, w = lo, 0
    while hi < n and w + cost(text[hi]) <= width:
        w += cost(text[hi])
        hi += 1
    while lo > 0 and w + cost(text[lo - 1]) <= width:  # at the end of the line: widen to the left
        lo -= 1
        w += cost(text[lo])
    return lo, hi
