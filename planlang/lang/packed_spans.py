"""Spans packed into one int: a big plan has millions of AST nodes, and a `Span` with its offsets is about
200 bytes where its packed form is 36 (planlang.lang.ast stores the packed form and unpacks it when a
node's span is read)."""
from __future__ import annotations

import threading
from typing import Any

from .source import Span

# ------------------------------------------------------------------ packed spans
# A span packed into one int, in one of two forms told apart by the lowest bit:
#   short (1): a span on one line (end_col = col + its length) in the first 16 MiB of a file, at most 16383
#              characters long and starting before column 16384: bits tag 1 | file 12 | start 24 |
#              length 14 | col 14 | line (the rest) -- 36 bytes as a Python int for any plan under 4M lines
#   long (0):  anything: tag 1 | file 32 | end 32 | start 32 | end_col 32 | end_line 32 | col 32 | line
_FIELD = 32  # bits per field of the long form: offsets, lines and columns below 2**32 (a 4 GiB file)
_MASK = (1 << _FIELD) - 1
_FID_S, _START_S, _LEN_S, _COL_S = 12, 24, 14, 14  # field widths of the short form
_LINE_SHIFT_S = 1 + _FID_S + _START_S + _LEN_S + _COL_S
_FILES: list[str] = []  # file names of packed spans, by number (one per distinct file name)
_FILE_IDS: dict[str, int] = {}
_FILES_LOCK = threading.Lock()


def file_id(path: str) -> int:
    """The number of a file name in packed spans."""
    fid = _FILE_IDS.get(path)
    if fid is None:
        with _FILES_LOCK:
            fid = _FILE_IDS.get(path)
            if fid is None:
                fid = _FILE_IDS[path] = len(_FILES)
                _FILES.append(path)
    return fid


def pack_span(fid: int, line: int, col: int, end_line: int, end_col: int, start: int, end: int) -> int:
    """`Span(file, line, col, end_line, end_col, start, end)` as one int (36 or about 56 bytes instead of
    about 200 for a Span and its offsets); `fid` is `file_id(file)`."""
    n = end - start
    if (end_line == line and end_col == col + n and 0 <= n < 1 << _LEN_S and 0 <= col < 1 << _COL_S
            and 0 <= start < 1 << _START_S and fid < 1 << _FID_S and line >= 0):
        return ((((line << _COL_S | col) << _LEN_S | n) << _START_S | start) << _FID_S | fid) << 1 | 1
    return ((((((line << _FIELD | col) << _FIELD | end_line) << _FIELD | end_col) << _FIELD | start)
             << _FIELD | end) << _FIELD | fid) << 1


# What a node's `span=` takes: a `Span`, or the int `pack_span` makes of one (stored as given, read back as a
# `Span`, see `lazy_span_field`). The dataclasses declare `span: Span`, what reading gives; a field read and
# written in two types is more than a frozen dataclass can declare to a type checker, so the packed form is
# passed as this (Any), by the parser's builders only.
SpanArg = Any


def unpack_span(v: int) -> Span:
    if v & 1:
        v >>= 1
        fid = v & ((1 << _FID_S) - 1)
        v >>= _FID_S
        start = v & ((1 << _START_S) - 1)
        v >>= _START_S
        n = v & ((1 << _LEN_S) - 1)
        v >>= _LEN_S
        col = v & ((1 << _COL_S) - 1)
        line = v >> _COL_S
        return Span(_FILES[fid], line, col, line, col + n, start, start + n)
    v >>= 1
    fid = v & _MASK
    v >>= _FIELD
    end = v & _MASK
    v >>= _FIELD
    start = v & _MASK
    v >>= _FIELD
    end_col = v & _MASK
    v >>= _FIELD
    end_line = v & _MASK
    v >>= _FIELD
    return Span(_FILES[fid], v >> _FIELD, v & _MASK, end_line, end_col, start, end)


def as_span(v) -> Span:
    """A span, packed or not, as a `Span`."""
    return unpack_span(v) if v.__class__ is int else v


def span_lines(v) -> tuple[int, int]:
    """(line, end_line) of a span, packed or not, without building a Span."""
    if v.__class__ is int:
        if v & 1:
            line = v >> _LINE_SHIFT_S
            return line, line
        v >>= 1 + 4 * _FIELD
        return v >> 2 * _FIELD, v & _MASK
    return v.line, v.end_line


def span_offsets(v) -> tuple[int, int]:
    """(start, end) character offsets of a span, packed or not, without building a Span."""
    if v.__class__ is int:
        if v & 1:
            v >>= 1 + _FID_S
            start = v & ((1 << _START_S) - 1)
            return start, start + ((v >> _START_S) & ((1 << _LEN_S) - 1))
        v >>= 1 + _FIELD
        return (v >> _FIELD) & _MASK, v & _MASK
    return v.start, v.end


def sub_spans(span: Span | int):
    """For a short packed span: (a, b) -> the packed span of its characters a..b (offsets in it). Paths
    and specs are stored as their text only with such a span (the parser's `ToAst._canonical`)."""
    if not isinstance(span, int) or not span & 1:
        raise ValueError("a path or spec stored as text has a short packed span")
    v = span >> 1
    fid = v & ((1 << _FID_S) - 1)
    v >>= _FID_S
    start = v & ((1 << _START_S) - 1)
    v >>= _START_S + _LEN_S
    col = v & ((1 << _COL_S) - 1)
    line = v >> _COL_S

    def at(a: int, b: int) -> int:
        return pack_span(fid, line, col + a, line, col + b, start + a, start + b)

    return at
