"""Spans and offsets <-> LSP positions, in every position encoding, against the definition of the
encodings (code units counted with Python's own codecs)."""
from lsprotocol import types as L

from planlang.lang.source import SourceFile, plan_text
from planlang.lsp.positions import UTF8, UTF16, UTF32, LineIndex

TEXT = 'mesh m of 4 x d {  # 😀 ünï\r\n    dp = 4\r}\nshard "é😀" : [dp]\n'  # "\\r\\n", "\\r" and "\\n" line ends


def _units(s: str, enc: str) -> int:
    if enc == UTF32:
        return len(s)
    codec = "utf-16-le" if enc == UTF16 else "utf-8"
    return len(s.encode(codec)) // (2 if enc == UTF16 else 1)


def _lines(text: str) -> list[tuple[int, str]]:
    """(start offset, text without its line end) of each line, split by Python's `splitlines` (which ends
    lines at "\\r\\n", "\\r" and "\\n", as the protocol does, and at others this text does not hold)."""
    out, at = [], 0
    for chunk in text.splitlines(keepends=True) + ([""] if text.endswith(("\n", "\r")) else []):
        out.append((at, chunk.rstrip("\r\n")))
        at += len(chunk)
    return out


def test_position_counts_code_units_of_the_line_prefix():
    lines = _lines(TEXT)
    for enc in (UTF8, UTF16, UTF32):
        index = LineIndex(TEXT, enc)
        for offset in range(len(TEXT) + 1):
            line = max(i for i, (start, _) in enumerate(lines) if start <= offset)
            start, content = lines[line]
            # an offset inside a line end (between "\\r" and "\\n") is the line's end: no column past it
            expected = L.Position(line, _units(content[:offset - start], enc))
            assert index.position(offset) == expected, (enc, offset)


def test_every_line_end_ends_a_line():
    index = LineIndex(TEXT)
    assert [index.line(i) for i in range(len(index.starts))] == [ln for _, ln in _lines(TEXT)] != []
    assert index.position(TEXT.index("dp")) == L.Position(1, 4)
    assert index.position(TEXT.index("}")) == L.Position(2, 0)  # after a lone "\\r"
    assert index.position(TEXT.index("\r\n") + 1) == index.position(TEXT.index("\r\n"))  # inside "\\r\\n"


def test_offset_inverts_position_on_character_boundaries():
    for enc in (UTF8, UTF16, UTF32):
        index = LineIndex(TEXT, enc)
        for offset in range(len(TEXT) + 1):
            if TEXT[offset - 1:offset + 1] == "\r\n":
                continue  # inside a CRLF: not a column a client can address
            assert index.offset(index.position(offset)) == offset, (enc, offset)


def test_offset_clamps_past_line_end_and_past_the_text():
    index = LineIndex("ab\ncd")
    assert index.offset(L.Position(0, 99)) == 2
    assert index.offset(L.Position(7, 0)) == 5


def test_span_range_agrees_with_offsets_for_every_span():
    """A span's lines/columns (what diagnostics carry) and its offsets give the same LSP range."""
    src = SourceFile("p.plan", plan_text(TEXT))  # lines and columns as the parser counts them
    for enc in (UTF16, UTF8):
        index = LineIndex(TEXT, enc)
        for a in range(0, len(TEXT), 3):
            for b in range(a, min(len(TEXT), a + 9)):
                if "\r" in TEXT[a - 1:a + 1] or "\r" in TEXT[b - 1:b + 1]:
                    continue
                span = src.span(a, b)
                assert index.range(span) == index.offset_range(a, b)


def test_astral_character_counts_two_in_utf16():
    index = LineIndex("# 😀x", UTF16)
    assert index.position(3) == L.Position(0, 4)  # "x" after the emoji
    assert LineIndex("# 😀x", UTF32).position(3) == L.Position(0, 3)
    assert LineIndex("# 😀x", UTF8).position(3) == L.Position(0, 6)
