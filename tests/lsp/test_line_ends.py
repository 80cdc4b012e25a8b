"""A plan with "\r\n" or "\r" line ends (the protocol's other two) gets the same diagnostics, tokens,
completions and hovers, at the same LSP lines and characters, as the same plan with "\n"."""
from __future__ import annotations

import pytest
from lsprotocol import types as L

from planlang.lsp.analysis import analyze
from planlang.lsp.completion import completion
from planlang.lsp.diagnostics import to_lsp
from planlang.lsp.hover import hover
from planlang.lsp.positions import UTF8, UTF16, LineIndex
from planlang.lsp.tokens import semantic_tokens

from .conftest import MLP, at

PATH = str(MLP.parent / "line_ends.plan")
PLAN = MLP.read_text(encoding="utf-8")
ENDS = {"crlf": "\r\n", "cr": "\r"}


def _with(text: str, end: str) -> str:
    return text.replace("\n", end)


def _where(diags):
    return [(d.code, d.range.start.line, d.range.start.character, d.range.end.line, d.range.end.character)
            for d in diags]


@pytest.mark.parametrize("end", ENDS)
def test_semantic_errors_on_the_same_lines(end):
    broken = PLAN.replace("tp = 2 over", "tp = 4 over")  # PL301 over the mesh block, lines 8 to 11
    plain = _where(to_lsp(analyze(broken, PATH)))
    assert plain and plain[0][:2] == ("PL301", 8)
    assert _where(to_lsp(analyze(_with(broken, ENDS[end]), PATH))) == plain


@pytest.mark.parametrize("end", ENDS)
@pytest.mark.parametrize("encoding, character", [(UTF16, 12), (UTF8, 14)])
def test_a_syntax_error_after_an_astral_character(end, encoding, character):
    """`9` stands after "😀" (2 UTF-16 code units, 4 UTF-8 bytes): at code point 11 of line 2."""
    broken = PLAN.replace("use hardware\n", 'use hardware\nuse "😀" as 9\n')
    for text in (broken, _with(broken, ENDS[end])):
        (d,) = to_lsp(analyze(text, PATH), encoding=encoding)
        assert _where([d]) == [(d.code, 2, character, 2, character + 1)] and d.code.startswith("PL1")


@pytest.mark.parametrize("end", ENDS)
def test_semantic_tokens_are_the_same(end):
    """Line by line, the same tokens: a comment on a "\r\n" line stops before its "\r"."""
    plain = semantic_tokens(analyze(PLAN, PATH)).data
    assert len(plain) > 100
    assert semantic_tokens(analyze(_with(PLAN, ENDS[end]), PATH)).data == plain


@pytest.mark.parametrize("end", ENDS)
def test_completion_in_a_spec_and_its_edit_range(end):
    text = _with(PLAN.replace("shard fc1.bias      : [tp]", "shard fc1.bias      : [t"), ENDS[end])
    a = analyze(text, PATH)
    off = at(a.text, "shard fc1.bias      : [t", len("shard fc1.bias      : [t"))
    res = completion(a, off)
    assert {"dp", "tp", "_"} <= {i.label for i in res.items}
    rng = res.items[0].text_edit.range  # replaces the `t` typed, on the line the client sees it on
    plain_line = PLAN.split("\n").index("shard fc1.bias      : [tp]")
    assert (rng.start.line, rng.start.character, rng.end.character) == (plain_line, 23, 24)
    assert text[LineIndex(text).offset(rng.start):LineIndex(text).offset(rng.end)] == "t"


@pytest.mark.parametrize("end", ENDS)
def test_hover_on_a_code_in_a_comment(end):
    text = _with(PLAN.replace("use hardware\n", "use hardware  # plan: ignore[PL301]\n"), ENDS[end])
    a = analyze(text, PATH)
    h = hover(a, at(a.text, "PL301", 2))
    assert h is not None and "PL301" in str(h.contents)
    assert h.range == L.Range(L.Position(1, 29), L.Position(1, 34))
