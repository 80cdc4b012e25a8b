"""The Pygments lexer (planlang.lang.pygments_lexer.PlanLexer) and the docs renderer that uses it."""
from __future__ import annotations

import html
import re
import subprocess
import sys

import pytest
from pygments.lexers import get_lexer_by_name, get_lexer_for_filename
from pygments.token import Error, Keyword, Name, Number

from planlang.lang import pygments_lexer as pl
from planlang.plan import resolve, types
from planlang.plan.units import UNITS

from .grammar_facts import (
    ROOT, grammar_keywords, keyword_positions, parseable_corpus, plan_corpus, utf8_text, word_starts,
)

KEYWORD_TYPES = (Keyword.Type, Keyword.Constant, Keyword.Pseudo)  # dtypes, true/false/none, holes


def _tokens(text):
    return list(pl.PlanLexer().get_tokens_unprocessed(text))


def _keyword_starts(text):
    out = set()
    for pos, ttype, value in _tokens(text):
        if ttype in Keyword and not any(ttype in t for t in KEYWORD_TYPES) and value.strip():
            line = text.count("\n", 0, pos) + 1
            out.add((line, pos - (text.rfind("\n", 0, pos) + 1)))
    return out


def test_registered_with_pygments():
    """The pyproject entry point makes the lexer findable by name, alias and file name."""
    for alias in ("plan", "planlang"):
        assert type(get_lexer_by_name(alias)) is pl.PlanLexer
    assert type(get_lexer_for_filename("gpt2_3d.plan")) is pl.PlanLexer
    assert pl.PlanLexer.name == "planlang" and pl.PlanLexer.filenames == ["*.plan"]


def test_imports_no_torch():
    code = ("import sys; from pygments.lexers import get_lexer_by_name; get_lexer_by_name('plan'); "
            "import planlang.lang.pygments_lexer; assert 'torch' not in sys.modules, 'torch imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("name,text", plan_corpus(), ids=[n for n, _ in plan_corpus()])
def test_examples_stdlib_and_docs_lex_without_errors(name, text):
    tokens = _tokens(text)
    assert "".join(v for _, _, v in tokens) == text  # round trip
    errors = [(text.count("\n", 0, p) + 1, v) for p, t, v in tokens if t in Error]
    assert errors == [], f"{name}: Error tokens at {errors}"


def test_keywords_where_the_parser_sees_keywords():
    """On every parseable plan, Keyword tokens stand exactly where the parser reads keywords."""
    corpus = parseable_corpus()
    assert len(corpus) > 50
    for name, text in corpus:
        words = word_starts(text)
        marked = {p for p in _keyword_starts(text) if p in words}
        expected = {(line, col) for line, col, _w in keyword_positions(text)}
        lines = text.split("\n")
        assert marked == expected, (
            f"{name}: marked but not a keyword: {[(l, lines[l - 1]) for l, c in sorted(marked - expected)]}; "
            f"keyword but not marked: {[(l, lines[l - 1]) for l, c in sorted(expected - marked)]}")


def test_every_text_round_trips_even_when_invalid():
    files = sorted((ROOT / "tests" / "lang" / "corpus").rglob("*.plan")) + sorted(
        (ROOT / "editors" / "vscode" / "tests").glob("*.plan"))
    assert files
    for f in files:
        text = utf8_text(f)  # a file that is not UTF-8 (PL105) is no text to lex
        if text is not None:
            assert "".join(v for _, _, v in _tokens(text)) == text, f


def test_lists_match_the_grammar_and_the_checker():
    assert set(pl.KEYWORDS) == grammar_keywords()
    assert set(pl.DTYPES) == set(resolve.DTYPES)
    assert pl.SCHEDULES == types.SCHEDULES
    assert pl.OPTIMIZERS == types.OPTIMIZERS
    assert pl.PARAM_KINDS == resolve.PARAM_KINDS
    unit = re.compile(pl.UNIT_PATTERN)
    assert all(unit.fullmatch(u) for u in UNITS), [u for u in UNITS if not unit.fullmatch(u)]
    for not_a_unit in ("kB", "Gib", "gb", "KiBps", "TFLOP", "mus", "GB/"):
        assert not unit.fullmatch(not_a_unit), not_a_unit


def _types_of(text):
    return [(t, v) for _, t, v in _tokens(text) if v.strip()]


def test_token_types_of_values():
    assert (Number.Integer, "80") in _types_of("budget 80 GiB per device")
    assert (pl.Unit, "GiB") in _types_of("budget 80 GiB per device")
    assert (pl.Unit, "GB/s") in _types_of("link l { bandwidth = 300GB/s }")
    assert (Number.Float, "3e-4") in _types_of('model m = "a:b"(lr = 3e-4)')
    assert (pl.Hole, "?") in _types_of("shard w : [_, ?]")
    assert (pl.Replicated, "_") in _types_of("shard w : [_, ?]")
    assert (Keyword.Type, "bf16") in _types_of("input x : bf16[n = 1]")
    assert (Keyword.Type, "bf16") in _types_of("device d { flops.bf16 = 1 TFLOPS }")
    assert (Name.Constant, "1f1b") in _types_of("pipeline over pp schedule 1f1b microbatches 4 { ? }")
    assert (Name.Builtin, "adamw") in _types_of("optimizer adamw")
    assert (Keyword.Type, "axis") in _types_of("template t(a: axis) { shard w : [a] }")
    assert (Error, "-") in _types_of("budget -40 GiB")  # no negative numbers (PL102)


def test_soft_keywords_as_names_are_names():
    types_ = _types_of("shard bert.layer[*].attention.output.dense.weight : [_, tp]")
    assert (Name, "output") in types_ and (Keyword, "output") not in types_
    types_ = _types_of("for x in h[*] { shard x.mlp.weight : [_, tp] }")
    assert (Keyword, "x") not in types_ and (Keyword, "in") in types_


def test_suppression_comments_are_marked():
    types_ = _types_of("budget 80 GB  # plan: ignore[PL253] decimal on purpose")
    assert (pl.Comment.Preproc, "PL253") in types_
    assert all(t in pl.Comment for t, v in types_[types_.index((pl.Comment.Preproc, "PL253")):])


def test_highlight_docs_renders_every_plan_block(tmp_path):
    """scripts/highlight_docs.py writes language.html with each ```plan block highlighted by the lexer;
    stripped of its markup, each block reads exactly as in the markdown."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "highlight_docs.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "language.html").read_text()
    md = (ROOT / "docs" / "language.md").read_text()
    blocks = re.findall(r"^```(plan(?:-invalid)?)\n(.*?)^```", md, re.MULTILINE | re.DOTALL)
    rendered = re.findall(r'<pre><code class="language-(plan(?:-invalid)?)">(.*?)</code></pre>', page, re.DOTALL)
    assert len(rendered) == len(blocks) > 20
    for (tag, body), (rtag, rbody) in zip(blocks, rendered):
        assert tag == rtag
        assert html.unescape(re.sub(r"<[^>]+>", "", rbody)) == body
        assert '<span class="k">' in rbody or tag == "plan-invalid" or "shard" not in body
    assert '<span class="k">shard</span>' in page
    for anchor in re.findall(r'href="#([^"]+)"', page):  # the contents links resolve
        assert f'id="{anchor}"' in page, anchor
