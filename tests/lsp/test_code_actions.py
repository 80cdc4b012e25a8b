"""Code actions over stdio: the fixes diagnostics carry (planlang.lang.diagnostics.Fix) as quick fixes."""
import pytest

from planlang.lsp.actions import fix_all
from planlang.lang.diagnostics import Edit, Fix
from planlang.lang.source import Span

from .conftest import at
from .stdio import apply, change, open_doc, pos, start

PLAN = """use hardware

mesh m of 4 x hardware.cpu {
    dp = 2 over hardware.loopback
    tp = 2 over hardware.loopback
}
budget 4 GB per device
shard fc.weight : [tq, _]
"""


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    path = tmp_path_factory.mktemp("ca") / "main.plan"
    path.write_text(PLAN)
    c = start()
    yield c, path.as_uri()
    c.close()


def _actions(c, uri, text, rng_start, rng_end, diagnostics=(), only=None):
    ctx = {"diagnostics": list(diagnostics)}
    if only is not None:
        ctx["only"] = only
    return c.request("textDocument/codeAction", {"textDocument": {"uri": uri},
                                                 "range": {"start": pos(text, rng_start), "end": pos(text, rng_end)},
                                                 "context": ctx})


def test_a_quick_fix_fixes_the_diagnostic(session):
    c, uri = session
    diags = open_doc(c, uri, PLAN)["diagnostics"]
    assert sorted(d["code"] for d in diags) == ["PL201", "PL253"]
    pl201 = next(d for d in diags if d["code"] == "PL201")
    cursor = at(PLAN, "tq", 1)
    actions = _actions(c, uri, PLAN, cursor, cursor, [pl201])
    quick = [a for a in actions if a["kind"] == "quickfix"]
    assert [a["title"] for a in quick] == ["replace `tq` with `tp`"]
    (fix,) = quick
    assert fix["isPreferred"] is True and fix["diagnostics"][0]["code"] == "PL201"
    (edits,) = fix["edit"]["changes"].values()
    fixed = apply(PLAN, edits)
    assert fixed == PLAN.replace("[tq, _]", "[tp, _]")
    # the document with the fix applied no longer has the diagnostic (the other one stays)
    assert [d["code"] for d in change(c, uri, fixed, 2)["diagnostics"]] == ["PL253"]


def test_a_fix_that_changes_meaning_is_offered_but_not_preferred(session):
    c, uri = session
    text = PLAN
    change(c, uri, text, 3)
    cursor = at(text, "GB", 1)
    (fix,) = [a for a in _actions(c, uri, text, cursor, cursor) if a["kind"] == "quickfix"]
    assert fix["isPreferred"] is False and "(changes meaning)" in fix["title"]
    (edits,) = fix["edit"]["changes"].values()
    assert apply(text, edits) == text.replace("4 GB", "4 GiB")


def test_nothing_to_fix_away_from_the_diagnostics(session):
    c, uri = session
    cursor = at(PLAN, "use hardware", 1)
    assert [a for a in _actions(c, uri, PLAN, cursor, cursor) if a["kind"] == "quickfix"] == []


def test_fix_all_applies_only_safe_fixes(session):
    c, uri = session
    actions = _actions(c, uri, PLAN, 0, 0, only=["source.fixAll"])
    (fix_all_action,) = actions
    assert fix_all_action["kind"] == "source.fixAll.planlang"
    (edits,) = fix_all_action["edit"]["changes"].values()
    assert apply(PLAN, edits) == PLAN.replace("[tq, _]", "[tp, _]")  # GB -> GiB is unsafe: left alone
    assert _actions(c, uri, PLAN, 0, 0, only=["refactor"]) == []


def test_edits_count_utf16_units_after_an_astral_character(session):
    c, uri = session
    text = PLAN.replace("shard fc.weight", 'model m = "m😀d:build"; shard fc.weight')
    change(c, uri, text, 4)
    cursor = at(text, "tq", 1)
    (fix,) = [a for a in _actions(c, uri, text, cursor, cursor) if a["kind"] == "quickfix"]
    (edits,) = fix["edit"]["changes"].values()
    assert edits[0]["range"]["start"] == pos(text, at(text, "tq"))  # one column more than code points
    assert apply(text, edits) == text.replace("[tq, _]", "[tp, _]")


def test_fix_all_leaves_overlapping_fixes_for_the_next_round():
    def fix(start, end, text):
        return Fix("f", (Edit(Span("p", 1, start + 1, 1, end + 1, start, end), text),))

    a, b, c, d = fix(0, 3, "x"), fix(2, 5, "y"), fix(5, 5, "z"), fix(5, 5, "w")
    assert fix_all([a, b, c, d]) == [a, c]  # b overlaps a; d inserts where c does
