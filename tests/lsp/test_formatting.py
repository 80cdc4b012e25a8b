"""Formatting edits (planlang.lsp.formatting)."""
from planlang.lang.fmt import format_text
from planlang.lsp.formatting import format_edits
from planlang.lsp.positions import LineIndex

MESSY = "use hardware\nmesh m of 4 x hardware.cpu {dp=2;tp=2}\nshard fc1.weight:[tp,_]   # col  😀\n"


def _apply(text, edits):
    index = LineIndex(text)
    for e in sorted(edits, key=lambda e: (e.range.start.line, e.range.start.character), reverse=True):
        text = text[:index.offset(e.range.start)] + e.new_text + text[index.offset(e.range.end):]
    return text


def test_edits_give_the_formatter_output():
    edits = format_edits(MESSY, "m.plan")
    assert len(edits) == 1
    assert _apply(MESSY, edits) == format_text(MESSY, "m.plan")


def test_canonical_text_needs_no_edit():
    assert format_edits(format_text(MESSY), "m.plan") == []


def test_syntax_error_gives_no_edits():
    assert format_edits("mesh m of 4 x d {\n    dp = \n", "m.plan") == []
