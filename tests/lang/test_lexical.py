"""planlang.lang.lexical, the one scanner of comments and strings, agrees with the grammar (the parser)."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from planlang.lang import ast as A
from planlang.lang.lexical import brackets, code_of, inside, scan, suppression, suppression_open
from planlang.lang.parser import GRAMMAR_PATH, parse
from tests.lang.repo_plans import repo_plans

ROOT = Path(__file__).resolve().parents[2]


def _plans() -> list[tuple[str, str]]:
    return repo_plans()


def _strings(x) -> list[tuple[int, int]]:
    """The offsets of every string literal node under `x`."""
    if isinstance(x, A.Str):
        return [A.span_offsets(A.raw_span(x))]
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return [s for f in dataclasses.fields(x) if f.name != "comments" for s in _strings(getattr(x, f.name))]
    if isinstance(x, (tuple, list)):
        return [s for i in x for s in _strings(i)]
    return []


def _spans(kind: str, text: str) -> list[tuple[int, int]]:
    return [(a, b) for k, a, b in scan(text) if k == kind]


def test_comments_and_strings_are_the_parsers_on_every_plan():
    compared = 0
    for path, text in _plans():
        res = parse(text, path)
        if not res.ok or "\r" in text or text.startswith("\ufeff"):
            continue
        comments = [A.span_offsets(A.raw_span(c)) for c in res.module.comments]
        assert _spans("comment", text) == comments, path
        strings = sorted(_strings(res.module))
        assert _spans("string", text) == strings, path
        compared += 1
    assert compared > 100


def test_strings_are_the_grammars():
    grammar = GRAMMAR_PATH.read_text()
    string = re.search(r'^STRING: /(.*)/$', grammar, re.M).group(1)
    for text in ['"a"', r'"a\"b"', r'"a\\"', r'"\\\\"', r'"x\ty"', '"é"']:
        assert re.fullmatch(string, text)
        assert _spans("string", text + " # c") == [(0, len(text))]


@pytest.mark.parametrize("line, code", [
    ('shard a : [dp]  # a [ comment', "shard a : [dp]  "),
    ('model m = "x.y:build(" # )', "model m =  "),
    (r'use "a\"b{" as x', "use  as x"),
    (r'use "a\\" as x # "', "use  as x "),  # an escaped backslash: the `"` ends the string
    ('model m = "open [ to the end', "model m = "),  # a string left open ends with its line
])
def test_code_of_leaves_out_comments_and_strings(line, code):
    assert code_of(line) == code


def test_brackets_outside_strings_and_comments():
    text = 'mesh m of 4 x gpu {  # {\n  tp = "[" ; x = [(a)]\n}\n'
    assert [ch for ch, _ in brackets(text)] == ["{", "[", "(", ")", "]", "}"]
    assert all(text[at] == ch for ch, at in brackets(text))


@pytest.mark.parametrize("line, offset, where", [
    ('shard a : [dp]  # x', 16, None),  # before the `#`
    ('shard a : [dp]  # x', 17, "comment"),  # just after it
    ('use "a#b" as x', 6, "string"),  # a `#` inside a string is no comment
    ('use "a#b" as x', 9, None),  # just after the closing quote
    ('use "a#b" as x # c', 18, "comment"),
    (r'use "a\"b', 9, "string"),  # an escaped quote does not close it
    (r'use "a\\" # c', 9, None),  # an escaped backslash: the quote closes it
    (r'use "a\\" # c', 12, "comment"),
    ('model m = "x', 12, "string"),  # still open at the cursor
    ('x = 1\nmodel m = "x', 17, "string"),
    ('model m = "x\nshard', 18, None),  # a string left open ends with its line
])
def test_inside_a_comment_or_a_string(line, offset, where):
    start = line.rfind("\n", 0, offset) + 1
    assert inside(line, offset, start) == where
    assert inside(line, offset) == where


@pytest.mark.parametrize("comment, found", [
    ("# plan: ignore[PL303]", (False, {"PL303"})),
    ("#plan:ignore[pl303, PL304 ]", (False, {"PL303", "PL304"})),
    ("# plan: ignore-file[PL218]", (True, {"PL218"})),
    ("# note  # plan: ignore[PL303] why", (False, {"PL303"})),
    ("# plan: ignore[]", None),
    ("# plan: ignore[PL303", None),  # unclosed: suppresses nothing
    ("# plan: ignore-files[PL303]", None),
    ("# a comment", None),
])
def test_suppression_comments(comment, found):
    assert suppression(comment) == found


@pytest.mark.parametrize("prefix, open_", [
    ("  # plan: ignore[", True),
    ("shard a : [dp]  # plan: ignore-file[PL3", True),
    ("# plan: ignore[PL303, PL", True),
    ("# plan: ignore[PL303] ", False),
    ("# plan: ignore", False),
])
def test_suppression_open_is_where_codes_complete(prefix, open_):
    assert suppression_open(prefix) is open_
    if open_:  # what completes there, once closed, suppresses
        assert suppression(prefix + "PL101]") is not None
