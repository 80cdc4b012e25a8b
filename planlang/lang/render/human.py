"""The human format: rustc/Elm-style messages with source excerpts.

    error[PL301]: mesh has 2 * 2 * 4 = 16 devices but 8 are declared
      --> examples/gpt2/gpt2_3d.plan:6:6
       |
     6 | mesh cluster of 8 x hardware.a100_80g {
       |      ^^^^^^^ 16 devices
     7 |     pp = 2 over hardware.infiniband_200g
       |     ------ this axis
       |
       = help: make the axis sizes multiply to 8, or change the device count

The primary span is underlined with ``^`` (its message is that of the first label whose span equals
the primary span, if any); other labels with ``-``. Labels in another file get their own ``-->``
block. A multi-line span is underlined from its start column to the end of its first line. Tabs are
shown as four spaces and the underlines follow. Characters that print nothing or pass for another
(controls, NUL, BOM, zero-width and bidi characters, other Cc/Cf, spaces but U+0020) are shown escaped
(``\u200b``), in source lines and in messages alike, and underlined at the width of the escape. A line
longer than `MAX_LINE` columns is shown as a window of `MAX_LINE` columns around the underlined part,
with ``...`` where it is cut. Colour is plain ANSI escapes, only when asked for. A diagnostic with a
mechanical fix ends with ``= fix: ...`` (what `planlang lint --fix` does; unsafe ones say so).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._common import ELLIPSIS, display_text, escape_text, severity_name, sorted_diagnostics, text_width, window

_RESET = "\x1b[0m"
_SEVERITY_STYLE = {"error": "\x1b[1;31m", "warning": "\x1b[1;33m", "note": "\x1b[1;36m"}
_GUTTER_STYLE = "\x1b[1;34m"
_SECONDARY_STYLE = "\x1b[1;34m"
_BOLD = "\x1b[1m"


class _Palette:
    def __init__(self, color: bool):
        self.color = color

    def paint(self, text: str, style: str) -> str:
        if not self.color or not style or not text:
            return text
        return f"{style}{text}{_RESET}"


@dataclass
class _Mark:
    """One underline on one displayed line (display columns, 0-based)."""

    start: int
    width: int
    char: str
    message: str
    style: str
    primary: bool


@dataclass
class _Annotation:
    span: Any
    message: str
    primary: bool


def _column(text: str, lo: int, hi: int, i: int, end: bool) -> int:
    """The display column (0-based) of character offset `i` of `text` on a row that shows `text[lo:hi]`
    (with an ellipsis on each side that is cut). An offset in a cut part maps onto its ellipsis; one
    past the end of the line to the columns after it."""
    n = len(text)
    head = len(ELLIPSIS) if lo > 0 else 0
    if i < lo:
        return 0
    if i <= hi:
        return head + text_width(text[lo:i])
    inner = head + text_width(text[lo:hi])
    if hi < n:
        return inner + len(ELLIPSIS) if end else inner
    return inner + (i - n)


def _mark_for(span: Any, line_text: str, message: str, style: str, primary: bool,
              shown: tuple[int, int] | None = None) -> _Mark:
    n = len(line_text)
    lo, hi = shown if shown is not None else (0, n)
    begin = max(span.col - 1, 0)
    if span.end_line > span.line:
        end = max(n, begin + 1)  # to the end of the first line
    else:
        end = max(span.end_col - 1, begin)
    start = _column(line_text, lo, hi, begin, end=False)
    stop = _column(line_text, lo, hi, end, end=True)
    return _Mark(start, max(stop - start, 1), "^" if primary else "-", escape_text(message, newlines=True),
                 style, primary)


def _excerpt(text: str, lo: int, hi: int) -> str:
    """`text[lo:hi]` as shown: tabs expanded, invisible characters escaped, an ellipsis where cut."""
    return (ELLIPSIS if lo > 0 else "") + display_text(text[lo:hi]) + (ELLIPSIS if hi < len(text) else "")


def _compose(items: list[tuple[int, str, str]], pal: _Palette) -> str:
    """Place (column, text, style) pieces on one row, padding with spaces."""
    out: list[str] = []
    pos = 0
    for col, text, style in sorted(items, key=lambda it: it[0]):
        if col > pos:
            out.append(" " * (col - pos))
            pos = col
        out.append(pal.paint(text, style))
        pos += len(text)
    return "".join(out)


def _mark_rows(marks: list[_Mark], pal: _Palette) -> list[str]:
    """The underline rows beneath one source line."""
    marks = sorted(marks, key=lambda m: (m.start, not m.primary))
    overlapping = any(b.start < a.start + a.width for a, b in zip(marks, marks[1:]))
    if overlapping:
        rows = []
        for m in marks:
            items = [(m.start, m.char * m.width, m.style)]
            if m.message:
                items.append((m.start + m.width + 1, m.message, m.style))
            rows.append(_compose(items, pal))
        return rows

    last = marks[-1]
    first_row = [(m.start, m.char * m.width, m.style) for m in marks]
    if last.message:
        first_row.append((last.start + last.width + 1, last.message, last.style))
    rows = [_compose(first_row, pal)]
    pending = [m for m in marks[:-1] if m.message]
    if pending:
        rows.append(_compose([(m.start, "|", m.style) for m in pending], pal))
        for i in range(len(pending) - 1, -1, -1):
            m = pending[i]
            items = [(p.start, "|", p.style) for p in pending[:i]]
            items.append((m.start, m.message, m.style))
            rows.append(_compose(items, pal))
    return rows


class _Writer:
    def __init__(self, width: int, pal: _Palette):
        self.width = width
        self.pal = pal
        self.lines: list[str] = []

    def gutter(self, number: int | None = None) -> str:
        label = str(number).rjust(self.width) if number is not None else " " * self.width
        return self.pal.paint(f" {label} |", _GUTTER_STYLE)

    def blank(self) -> None:
        self.lines.append(self.gutter())

    def row(self, number: int | None, text: str) -> None:
        self.lines.append(self.gutter(number) + (" " + text if text else ""))

    def arrow(self, file: str, line: int, col: int) -> None:
        self.lines.append(" " * (self.width + 1) + self.pal.paint("-->", _GUTTER_STYLE) + f" {escape_text(file, newlines=True)}:{line}:{col}")

    def equals(self, kind: str, text: str, sep: str = ": ") -> None:
        indent = " " * (self.width + 2)
        head = f"{kind}{sep}"
        first, *rest = text.split("\n")
        self.lines.append(indent + self.pal.paint("=", _GUTTER_STYLE) + " " + self.pal.paint(head.rstrip(), _BOLD) + " " + first)
        cont = " " * (len(indent) + 2 + len(head))
        self.lines.extend(cont + r for r in rest)


def _source_block(w: _Writer, src: Any, annotations: list[_Annotation], sev_style: str, pal: _Palette) -> None:
    by_line: dict[int, list[_Annotation]] = {}
    for a in annotations:
        by_line.setdefault(a.span.line, []).append(a)
    w.blank()
    prev: int | None = None
    for number in sorted(by_line):
        if prev is not None:
            gap = number - prev
            if gap == 2:
                between = src.line_text(prev + 1)
                w.row(prev + 1, _excerpt(between, *window(between, 0)))
            elif gap > 2:
                w.lines.append(pal.paint("...", _GUTTER_STYLE))
        text = src.line_text(number)
        anns = by_line[number]
        focus = next((a for a in anns if a.primary), min(anns, key=lambda a: a.span.col))
        shown = window(text, focus.span.col - 1)
        w.row(number, _excerpt(text, *shown))
        marks = [
            _mark_for(a.span, text, a.message, sev_style if a.primary else _SECONDARY_STYLE, a.primary, shown)
            for a in anns
        ]
        for r in _mark_rows(marks, pal):
            w.row(None, r)
        prev = number


def _missing_block(w: _Writer, annotations: list[_Annotation]) -> None:
    labelled = [a for a in annotations if a.message]
    if labelled:
        w.blank()
        for a in labelled:
            w.equals("at", f"{a.span.line}:{a.span.col}: {escape_text(a.message, newlines=True)}", sep=" ")


def format_one(diag: Any, sources: Mapping[str, Any], pal: _Palette) -> str:
    sev = severity_name(diag)
    sev_style = _SEVERITY_STYLE.get(sev, _BOLD)
    primary_span = diag.span

    primary_message = ""
    secondary: list[Any] = []
    taken = False
    for label in diag.labels:
        if not taken and label.span == primary_span:
            primary_message = label.message
            taken = True
        else:
            secondary.append(label)

    # Group annotations by file: the primary's file first, then the others as they first appear.
    groups: dict[str, list[_Annotation]] = {primary_span.file: [_Annotation(primary_span, primary_message, True)]}
    for label in secondary:
        groups.setdefault(label.span.file, []).append(_Annotation(label.span, label.message, False))

    shown_lines = [a.span.line for f, anns in groups.items() if f in sources for a in anns]
    width = max((len(str(n)) for n in shown_lines), default=1)
    w = _Writer(width, pal)

    header = pal.paint(f"{sev}[{diag.code}]", sev_style) + pal.paint(f": {escape_text(diag.message, newlines=True)}", _BOLD)
    w.lines.append(header)

    for i, (file, anns) in enumerate(groups.items()):
        if i:
            w.blank()
        anchor = anns[0].span if i == 0 else min((a.span for a in anns), key=lambda s: (s.line, s.col))
        w.arrow(file, anchor.line, anchor.col)
        src = sources.get(file)
        if src is not None:
            _source_block(w, src, anns, sev_style, pal)
        else:
            _missing_block(w, anns)

    fix = getattr(diag, "fix", None)
    if diag.help or diag.notes or fix is not None:
        w.blank()
        if diag.help:
            w.equals("help", escape_text(diag.help))
        for note in diag.notes:
            w.equals("note", escape_text(note))
        if fix is not None:  # what `planlang lint --fix` does about it
            w.equals("fix", escape_text(fix.message) + ("" if fix.safe else " (unsafe: `--unsafe-fixes`)"))
    return "\n".join(w.lines) + "\n"


def render(diagnostics: list[Any], sources: Mapping[str, Any], color: bool = False) -> str:
    pal = _Palette(color)
    return "\n".join(format_one(d, sources, pal) for d in sorted_diagnostics(diagnostics))
