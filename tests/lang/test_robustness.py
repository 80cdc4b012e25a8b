"""Inputs that used to crash the checker (found by bench/fuzz.py), and the limits that now stop them.

Every input goes through what `planlang check` runs: parse, resolve, check, and every renderer. None may
raise; each must come back as a coded diagnostic at a location.
"""
from __future__ import annotations

import pytest

from planlang.lang.fmt import FormatError, format_text
from planlang.lang.parser import MAX_DIGITS, MAX_NESTING, parse
from planlang.lang.render import FORMATS, render
from planlang.plan.checker import check_text

DEVICE = "device gpu { memory = 80 GiB }\n"


def check(text: str, path: str = "t.plan"):
    res = check_text(text, path)
    for fmt in FORMATS:
        render(res.diagnostics, res.sources, fmt)
    try:
        format_text(text, path)
    except FormatError:
        pass
    return res.diagnostics


def codes(text: str) -> list[str]:
    return [d.code for d in check(text)]


# ---- PL107: number literals ---------------------------------------------------------------------

@pytest.mark.parametrize("literal", ["9" * 4400, "9" * 5000, "1_" * 3000 + "1", "5" * 200 + ".5", "0." + "1" * 5000])
def test_huge_number_literal_is_pl107_not_a_crash(literal):
    # int() refuses more than 4300 digits (ValueError); a plan's literal gets PL107 long before that
    diags = check(DEVICE + f"budget {literal} GiB per device\n")
    assert [d.code for d in diags] == ["PL107"]
    assert (diags[0].span.line, diags[0].span.col) == (2, 8)
    assert "digits" in diags[0].message


@pytest.mark.parametrize("stmt", [
    "shard h[{n}].w : [_]", "checkpoint h[0:{n}]", "mesh m of {n} x gpu {{ dp = 1 }}", "checkpoint h[*] every {n}",
    "input x : i64[b = {n}]",
])
def test_huge_integers_everywhere(stmt):
    assert "PL107" in codes(DEVICE + stmt.format(n="7" * 5000) + "\n")


def test_digit_limit_is_inclusive():
    ok = "1" * MAX_DIGITS
    assert "PL107" not in codes(DEVICE + f"budget {ok} GiB per device\n")
    assert "PL107" in codes(DEVICE + f"budget {ok}1 GiB per device\n")
    assert "PL107" not in codes(DEVICE + "budget 1e99999 GiB per device\n")  # few digits: PL223's business


# ---- PL106: nesting ----------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    'model m = "a:b"(x = ' + "[" * 100_000 + "]" * 100_000 + ")\n",
    "data x : " + "[" * 20_000 + "dp" + "]" * 20_000 + "\n",
    "(" * 50_000 + "\n",
    "{" * 1000 + "\n" + "}" * 1000,
    "".join(f"for b{k} in h[*] {{\n" for k in range(2000)) + "checkpoint b0\n" + "}\n" * 2000,
])
def test_deep_nesting_is_pl106_not_a_recursion_error(text):
    diags = check(text)
    assert [d.code for d in diags] == ["PL106"]


def test_nesting_limit():
    inside = "[" * (MAX_NESTING - 1) + "1" + "]" * (MAX_NESTING - 1)
    assert parse(f'model m = "a:b"(x = {inside})\n').ok  # the `(` and 63 `[`
    res = parse(f'model m = "a:b"(x = [{inside}])\n')
    (d,) = res.diagnostics
    col = len('model m = "a:b"(x = [') + MAX_NESTING - 1
    assert (d.code, d.span.line, d.span.col) == ("PL106", 1, col)
    # brackets in strings and comments do not count
    assert parse('model m = "' + "[" * 500 + '"()  # ' + "{" * 500 + "\n").ok


@pytest.mark.parametrize("depth", [MAX_NESTING - 1])
def test_what_the_limit_lets_through_checks_on_a_small_stack(depth):
    import sys

    text = DEVICE + "".join(f"for b{k} in h[*] {{\n" for k in range(depth)) + "checkpoint b0\n" + "}\n" * depth
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(400)  # as if called from deep inside another program
    try:
        check(text)
        check(DEVICE + 'model m = "a:b"(x = ' + "[" * depth + "1" + "]" * depth + ")\n")
    finally:
        sys.setrecursionlimit(old)


# ---- `use` of names the file system refuses ------------------------------------------------------

@pytest.mark.parametrize("target", ['"' + "9" * 5000 + '"', '"' + "a/" * 3000 + 'x.plan"', '"a\x00b.plan"',
                                    ".".join(["m"] * 3000)])
def test_use_of_an_impossible_file_name_is_pl203(target):
    diags = check(f"use {target}\n")
    assert "PL203" in [d.code for d in diags]


# ---- syntax messages -----------------------------------------------------------------------------

def test_unexpected_character_is_escaped_and_named():
    (d,) = check("mesh m\u200bx of 8 x gpu {}\n")
    assert d.code == "PL102" and d.message == "unexpected character `\\u200b` (ZERO WIDTH SPACE)"
    (d,) = check("budget 1 GiB # ok\n\u0430pply t(tp) to h\n")  # a Cyrillic a
    assert d.message == "unexpected character `\u0430` (CYRILLIC SMALL LETTER A)"
    (d,) = check("budget 1 GiB\n\ufeffbudget 2 GiB\n")  # a byte-order mark is one only at the start
    assert d.message == "unexpected character `\\ufeff` (ZERO WIDTH NO-BREAK SPACE)"
    assert (d.span.line, d.span.col) == (2, 1)
    (d,) = check("budget 8 GiB\x00\n")
    assert d.message == "unexpected character `\\x00` (U+0000)"
    assert check("budget 8 GiB @\n")[0].message == "unexpected character `@`"


def test_unexpected_token_message_is_cut():
    (d,) = check("budget 1 GiB\n" + "x" * 30_000 + "\n")
    assert d.code == "PL101" and len(d.message) < 100
    assert d.message.startswith("unexpected `xxx") and "...`" in d.message
    assert (d.span.col, d.span.end_col) == (1, 30_001)  # the span is still the whole token


# ---- template expansion ------------------------------------------------------------------------

MESH = DEVICE + "link nv { bandwidth = 300 GB/s }\nmesh m of 8 x gpu { tp = 8 over nv }\n"


def test_template_applying_itself_twice_is_pl219_at_once():
    # used to expand 2^32 times before the depth limit (12 GB of memory, found by bench/fuzz.py)
    text = MESH + "template deep(tp: axis) {\n    apply deep(tp) to inner\n    apply deep(tp) to inner\n}\n" \
        "apply deep(tp) to h[0]\n"
    diags = check(text)
    assert [(d.code, d.span.line, d.span.col) for d in diags] == [("PL219", 5, 5), ("PL219", 6, 5)]


def test_templates_applying_each_other_are_pl219_at_the_first_repeat():
    text = MESH + "template a(x: axis) { apply b(x) to p; apply b(x) to q }\n" \
        "template b(x: axis) { apply a(x) to r; apply a(x) to s }\napply a(tp) to h\n"
    diags = check(text)
    assert {d.code for d in diags} == {"PL219"}
    assert {d.span.line for d in diags} == {5}  # in `b`, where `a` would be applied again


def test_exponential_template_chain_is_pl224_once():
    from planlang.plan.resolve import EXPANSIONS_PER_APPLY, MAX_EXPANSIONS

    levels = 18  # 2^19 - 1 applications; stopped after 100,000 + 100 per `apply` written
    lines = [f"template t{k}(a: axis) {{ apply t{k + 1}(a) to x; apply t{k + 1}(a) to x }}" for k in range(levels)]
    text = MESH + "\n".join(lines) + f"\ntemplate t{levels}(a: axis) {{ shard w : [a] }}\napply t0(tp) to h\n"
    diags = check(text)
    assert [d.code for d in diags] == ["PL224"]
    (d,) = diags
    assert d.span.line == 4 + levels + 1 and d.span.col == 1  # the outermost `apply`
    budget = MAX_EXPANSIONS + EXPANSIONS_PER_APPLY * (2 * levels + 1)
    assert d.message == f"templates expand to more than {budget:,} applications"
    assert d.labels and d.labels[0].message == f"application {budget + 1:,}"


def test_expansion_budget_grows_with_the_applications_written():
    # a big plan: 1,500 `apply` lines of a template that applies 99 others (150,000 applications)
    inner = "; ".join("apply leaf(a) to x" for _ in range(99))
    text = (MESH + "template leaf(a: axis) { shard w : [a] }\n" + f"template wide(a: axis) {{ {inner} }}\n"
            + "".join(f"apply wide(tp) to h[{i}]\n" for i in range(1500)))
    assert "PL224" not in codes(text)


def test_a_wide_but_finite_template_tree_is_fine():
    lines = [f"template t{k}(a: axis) {{ apply t{k + 1}(a) to x; apply t{k + 1}(a) to y }}" for k in range(10)]
    text = MESH + "\n".join(lines) + "\ntemplate t10(a: axis) { shard w : [a] }\napply t0(tp) to h\n"
    assert not [c for c in codes(text) if c in ("PL219", "PL224")]  # 2,047 applications


def test_an_unclosed_bracket_before_a_blank_line_is_one_located_error():
    """Found by bench/fuzz.py: the recovery that names the line an unclosed bracket runs into took the
    first word of that line, and a line of only a backslash continuation has none (IndexError)."""
    text = "\n\nfor  h in\t[0 #,8('-z:x0\n]\t[\n\n  2 ]{shard [ \\\n0] . \\\nattn: \\\n[+\n\t]\n  \n\n"
    diags = check(text)
    assert diags and all(d.code.startswith("PL1") for d in diags)
    assert any("never closed before the end of line" in d.message for d in diags)


def test_a_long_template_counts_as_many_applications():
    """Found by bench/fuzz.py: a template whose body holds a 200 KB path, applied 100,000 times, built
    gigabytes before PL224. An application counts once per EXPANSION_CHARS of the template's text."""
    from planlang.plan.resolve import EXPANSION_CHARS

    path = ".".join(["h"] * 20_000)  # 40 KB
    text = ("device gpu { memory = 80 GiB }\nlink nv { bandwidth = 300 GB/s }\nmesh m of 8 x gpu { tp = 8 over nv }\n"
            f"template leaf(a: axis) {{\n    shard {path} : [a]\n}}\n"
            "template mid(a: axis) {\n" + "    apply leaf(a) to x\n" * 50 + "}\n"
            "template top(a: axis) {\n" + "    apply mid(a) to y\n" * 50 + "}\n"
            "apply top(tp) to z\n")
    diags = check(text)
    assert [d.code for d in diags] == ["PL224"]
    assert len(path) // EXPANSION_CHARS > 100  # each leaf application counts as more than a hundred
