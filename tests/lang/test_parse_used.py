"""A module a plan `use`s is parsed once per process for the same text (planlang.lang.parser.parse_used):
the resolver's second check of a plan reads the standard library's trees from the first."""
from __future__ import annotations

from planlang.lang import parser as P
from planlang.plan.checker import check_text
from planlang.plan.resolve import STDLIB_DIR

PLAN = """use hardware
mesh m of 2 x hardware.cpu {
    dp = 2 over hardware.loopback
}
"""


def test_the_same_text_is_parsed_once_and_another_again(monkeypatch):
    monkeypatch.setattr(P, "_USED", {})
    calls = []
    real = P.parse
    monkeypatch.setattr(P, "parse", lambda text, path="<plan>": calls.append(path) or real(text, path))
    a = P.parse_used("use hardware\n", "x.plan")
    assert P.parse_used("use hardware\n", "x.plan") is a and calls == ["x.plan"]
    b = P.parse_used("use meshes\n", "x.plan")  # an edited text: parsed again
    assert b is not a and b.module != a.module and calls == ["x.plan", "x.plan"]
    assert P.parse_used("use hardware\n", "y.plan") is not a  # another path: its spans name it


def test_the_least_recently_used_go_and_big_texts_are_not_kept(monkeypatch):
    monkeypatch.setattr(P, "_USED", {})
    monkeypatch.setattr(P, "_USED_KEPT", 2)
    first = P.parse_used("use a\n", "a.plan")
    P.parse_used("use b\n", "b.plan")
    assert P.parse_used("use a\n", "a.plan") is first  # used again: now the most recent
    P.parse_used("use c\n", "c.plan")  # b goes
    assert list(P._USED) == [("a.plan", "use a\n"), ("c.plan", "use c\n")]
    monkeypatch.setattr(P, "_USED_MAX_CHARS", 10)
    big = "use hardware\n" * 2
    assert P.parse_used(big, "d.plan") is not P.parse_used(big, "d.plan") and len(P._USED) == 2


def test_a_second_check_reads_the_stdlib_trees_of_the_first():
    one, two = check_text(PLAN, "p.plan"), check_text(PLAN, "p.plan")
    (hardware,) = [p for p in one.modules if p.startswith(str(STDLIB_DIR))]
    assert two.modules[hardware] is one.modules[hardware]
    assert one.diagnostics == two.diagnostics == () and one.plan == two.plan
