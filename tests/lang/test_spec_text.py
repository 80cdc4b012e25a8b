"""planlang.lang.spec_text: the one reader of a spec's text agrees with the grammar (the parser's AST)."""
from __future__ import annotations

import pytest

from planlang.lang import ast as A
from planlang.lang.parser import parse
from planlang.lang.spec_text import is_canonical, read_spec

SPECS = [
    "[dp, _]",
    "[(dp, tp), _]",
    "[tp, _] partial(tp)",
    "[]",
    "[?, _]",
    "[(dp)]",
    "[_, (dp, tp)] partial(dp, tp)",
    "[(_, dp)]",  # `_` inside ( ) is a name: the contextual lexer only looks for names there
    "[dp] partial(_)",
    "[partial, x] partial(partial)",  # soft keywords are names
    # not canonical: white space, wrapped lines, trailing commas
    "[ dp ,_ ]",
    "[dp,\n  (a, b,),\n] partial( tp , )",
    "[dp, _]   partial(tp)",
]


def _parsed(text: str) -> A.Spec:
    res = parse(f"shard a : {text}\n")
    assert res.ok, res.diagnostics
    spec = res.module.statements[0].spec
    assert isinstance(spec, A.Spec)
    return spec


def _shape(spec: A.Spec) -> tuple:
    out = []
    for e in spec.entries:
        if isinstance(e, A.Replicated):
            out.append(("replicated", ()))
        elif isinstance(e, A.Hole):
            out.append(("hole", ()))
        elif isinstance(e, A.AxisTuple):
            out.append(("tuple", tuple(n.text for n in e.axes)))
        else:
            out.append(("axis", (e.axis.text,)))
    return tuple(out), tuple(p.text for p in spec.partial)


@pytest.mark.parametrize("text", SPECS)
def test_reads_what_the_parser_parses(text):
    got = read_spec(text)
    entries, partial = _shape(_parsed(text))
    assert tuple((e.kind, e.axes) for e in got.entries) == entries
    assert got.partial == partial
    for e in got.entries:  # offsets: the entry's text, and each name's
        assert text[e.start:e.end] in ("_", "?") or text[e.start:e.end].strip("()").replace(" ", "")
        for name, (a, b) in zip(e.axes, e.axis_offsets):
            assert text[a:b] == name
    for name, (a, b) in zip(got.partial, got.partial_offsets):
        assert text[a:b] == name


@pytest.mark.parametrize("text", SPECS)
def test_canonical_is_what_the_ast_prints(text):
    assert is_canonical(text) == (A.spec_text(_parsed(text)) == text)


def test_nodes_built_from_the_text_have_the_parsers_spans():
    text = "shard a : [(dp, tp), _, ?] partial(tp)\n"
    spec = parse(text).module.statements[0].spec
    assert A.spec_compact(spec) is not None  # stored as its text, built on first read
    entries = spec.entries
    assert [text[e.span.start:e.span.end] for e in entries] == ["(dp, tp)", "_", "?"]
    assert [text[n.span.start:n.span.end] for n in entries[0].axes] == ["dp", "tp"]
    assert [text[n.span.start:n.span.end] for n in spec.partial] == ["tp"]


def test_axes_and_names():
    s = read_spec("[(dp, tp), _] partial(pp)")
    assert s.axes() == (("dp", "tp"), ())
    assert s.names() == {"dp", "tp", "pp"}
    assert read_spec("[?, dp]").axes() is None


@pytest.mark.parametrize("text", [
    "[tp, _, partial(tp)]",  # partial(...) follows the `]`
    "dp", "[dp", "[dp,,]", "[,]", "[dp tp]", "[()]", "[dp] partial()", "[dp] over", "[dp] partial(tp) x",
    "[1]",
])
def test_refuses_what_the_grammar_refuses(text):
    with pytest.raises(ValueError):
        read_spec(text)
    assert not parse(f"shard a : {text}\n").ok


def test_comments_are_the_plans_not_the_specs():
    """A comment after a spec belongs to the plan (the parser keeps it aside); a spec's own text has none."""
    with pytest.raises(ValueError):
        read_spec("[dp] # comment")
