"""A plan saved with a UTF-8 byte-order mark, or with old Mac line ends ("\\r" alone), reads as the same
plan saved without the mark and with "\\n": the same tree, the same diagnostics at the same lines and
columns, the same canonical formatting."""
from __future__ import annotations

from pathlib import Path

import pytest

from planlang.lang.fmt import format_text
from planlang.lang.parser import parse
from planlang.lang.source import decode_plan
from planlang.plan.checker import check_text

REPO = Path(__file__).resolve().parents[2]
PLAN = (REPO / "examples/mlp/mlp_2d.plan").read_text(encoding="utf-8")
# a semantic error on a line after comments: PL301 (4 devices, a 2 x 4 mesh) at a known line and column
BROKEN = PLAN.replace("tp = 2 over", "tp = 4 over")

VARIANTS = {
    "bom": lambda t: "\ufeff" + t,
    "cr": lambda t: t.replace("\n", "\r"),
    "crlf": lambda t: t.replace("\n", "\r\n"),
    "bom+cr": lambda t: "\ufeff" + t.replace("\n", "\r"),
}


def _where(diags):
    return [(d.code, d.span.line, d.span.col, d.span.end_line, d.span.end_col) for d in diags]


@pytest.mark.parametrize("variant", VARIANTS)
def test_parses_like_the_plain_file(variant):
    plain, other = parse(PLAN), parse(VARIANTS[variant](PLAN))
    assert other.diagnostics == ()
    assert other.module == plain.module
    assert [c.text.rstrip() for c in other.module.comments] == [c.text for c in plain.module.comments]
    first = other.module.statements[0]  # `use hardware`, after the first comment line
    assert (first.span.line, first.span.col) == (plain.module.statements[0].span.line, 1)


@pytest.mark.parametrize("variant", ["bom", "cr", "bom+cr"])
def test_same_diagnostics_at_the_same_lines_and_columns(variant):
    plain = check_text(BROKEN, "p.plan")
    other = check_text(VARIANTS[variant](BROKEN), "p.plan")
    assert _where(plain.diagnostics) and _where(other.diagnostics) == _where(plain.diagnostics)
    # offsets too: the BOM is not counted, a lone "\r" is one character as "\n" is
    assert [(d.span.start, d.span.end) for d in other.diagnostics] == \
        [(d.span.start, d.span.end) for d in plain.diagnostics]
    # the line shown under the diagnostic is the line itself, not the whole file
    d = other.diagnostics[0]
    assert other.sources["p.plan"].line_text(d.span.line) == plain.sources["p.plan"].line_text(d.span.line)


def test_a_syntax_error_after_cr_line_ends_is_on_its_own_line():
    text = "use hardware\rmesh m of 4 x hardware.cpu {\r    dp = = 4\r}\r"
    (d,) = parse(text).diagnostics
    assert (d.code, d.span.line, d.span.col) == ("PL101", 3, 10)


def test_a_comment_ends_at_a_cr_line_end():
    # a comment once ran to the end of the file, taking every statement after it
    result = parse("# note\ruse hardware\r")
    assert result.diagnostics == () and len(result.module.statements) == 1


@pytest.mark.parametrize("variant", VARIANTS)
def test_formats_to_the_plain_files_canonical_text(variant):
    assert format_text(VARIANTS[variant](PLAN)) == format_text(PLAN)


def test_the_parser_and_decoding_count_in_the_same_text():
    assert parse("\ufeffuse a\ruse b\r").source.text == "use a\nuse b\n"
    assert decode_plan("\ufeffuse a\ruse b\r".encode("utf-8"), "p")[0].text == "use a\nuse b\n"
    source, bad = decode_plan("\ufeffuse x\n".encode("utf-8") + b"\xff\n", "p")
    assert bad == (len("use x\n"), len("use x\n") + 1)
    assert source.position(bad[0]) == (2, 1)
