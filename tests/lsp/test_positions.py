"""Spans and offsets <-> LSP positions, in every position encoding, against the definition of the
encodings (code units counted with Python's own codecs)."""
from lsprotocol import types as L

from planlang.lang.source import SourceFile
from planlang.lsp.positions import UTF8, UTF16, UTF32, LineIndex

TEXT = 'mesh m of 4 x d {  # 😀 ünï\r\n    dp = 4\n}\nshard "é😀" : [dp]\n'


def _units(s: str, enc: str) -> int:
    if enc == UTF32:
        return len(s)
    codec = "utf-16-le" if enc == UTF16 else "utf-8"
    return len(s.encode(codec)) // (2 if enc == UTF16 else 1)


def test_position_counts_code_units_of_the_line_prefix():
    for enc in (UTF8, UTF16, UTF32):
        index = LineIndex(TEXT, enc)
        for offset in range(len(TEXT) + 1):
            line = TEXT.count("\n", 0, offset)
            line_start = TEXT.rfind("\n", 0, offset) + 1
            assert index.position(offset) == L.Position(line, _units(TEXT[line_start:offset], enc)), (enc, offset)


def test_offset_inverts_position_on_character_boundaries():
    for enc in (UTF8, UTF16, UTF32):
        index = LineIndex(TEXT, enc)
        for offset in range(len(TEXT) + 1):
            if TEXT[offset - 1:offset] == "\r":
                continue  # inside a CRLF: not a column a client can address
            assert index.offset(index.position(offset)) == offset, (enc, offset)


def test_offset_clamps_past_line_end_and_past_the_text():
    index = LineIndex("ab\ncd")
    assert index.offset(L.Position(0, 99)) == 2
    assert index.offset(L.Position(7, 0)) == 5


def test_span_range_agrees_with_offsets_for_every_span():
    """A span's lines/columns (what diagnostics carry) and its offsets give the same LSP range."""
    src = SourceFile("p.plan", TEXT)
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
