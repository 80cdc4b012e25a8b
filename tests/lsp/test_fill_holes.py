"""The "fill this hole" code actions over stdio: listed cheaply at a `?`, solved at codeAction/resolve with
`planlang solve`'s search, the edit replacing only the holes; an unsolvable plan says why, with no edit."""
import re

import pytest
from lsprotocol import types as L

from planlang.lang.fmt import format_text
from planlang.lsp.fill_holes import FILL, FILL_ALL, FILL_ONE, fill_actions, hole_offsets
from planlang.plan.checker import check_text

from .conftest import at
from .stdio import apply, change, open_doc, pos, start

# holes of four kinds: mesh axis sizes, a ZeRO stage, a spec, `checkpoint ?` (a statement solve rewrites)
PLAN = """# a partial MLP plan
use hardware
model mlp = "examples.mlp.model:build"(in_features = 64, hidden = 256, out_features = 64)
input x : f32[batch = 4096, features = 64]
mesh ranks of 4 x hardware.cpu {
    dp = ? over hardware.loopback
    tp = ? over hardware.loopback
}
budget 1 GiB per device
optimizer adamw(lr = 0.001) {
    zero = ? over dp  # a `?` in a comment is no hole
}
data x : [dp, _]
shard fc1.weight : ?
checkpoint ?
"""
RESOLVES = {"textDocument": {"codeAction": {"resolveSupport": {"properties": ["edit"]}}}}


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    path = tmp_path_factory.mktemp("fill") / "partial.plan"
    path.write_text(PLAN)
    c = start(RESOLVES)
    open_doc(c, path.as_uri(), PLAN)
    yield c, path
    c.close()


def _actions(c, uri, text, offset):
    p = pos(text, offset)
    return c.request("textDocument/codeAction", {"textDocument": {"uri": uri}, "range": {"start": p, "end": p},
                                                 "context": {"diagnostics": []}})


def _solved(path):
    """What `planlang solve` writes for the plan at `path` (the same entry), without its header."""
    # lazy: the solver imports torch
    from planlang.solve.driver import solve

    res = solve(str(path))
    header = {f"# {h}" if h else "#" for h in res.summary}
    return "\n".join(line for line in res.text.split("\n") if line not in header)


def test_holes_are_the_question_marks_outside_comments_and_strings():
    text = 'model m = "a?b:c"\nzero = ? over dp  # not ?\nshard w : ?'
    assert hole_offsets(text) == [text.index("= ?") + 2, text.rindex("?")]
    rng = L.Range(L.Position(0, 3), L.Position(0, 3))
    assert fill_actions(text, "file:///p.plan", 1, rng, "utf-16") == []  # away from every hole


def test_fill_one_hole_then_every_hole(session):
    c, path = session
    uri = path.as_uri()
    assert c.init_result["capabilities"]["codeActionProvider"]["resolveProvider"] is True
    listed = _actions(c, uri, PLAN, at(PLAN, "dp = ?", 5))
    fills = {a["title"]: a for a in listed if a["kind"] == FILL}
    assert set(fills) == {FILL_ONE, f"{FILL_ALL} (5)"}
    assert all("edit" not in a for a in fills.values())  # listing runs no solve

    one = c.request("codeAction/resolve", fills[FILL_ONE], timeout=120)
    (edits,) = one["edit"]["changes"].values()
    assert len(edits) == 1
    filled = apply(PLAN, edits)
    q = at(PLAN, "dp = ?", 5)
    expected = _solved(path)
    line = PLAN.count("\n", 0, q)
    assert filled.split("\n")[line] == expected.split("\n")[line]  # the value `planlang solve` writes there
    value = filled.split("\n")[line].split("=")[1].split()[0]
    assert filled == PLAN[:q] + value + PLAN[q + 1:]  # only the `?` replaced
    checked = check_text(filled, str(path))
    assert not checked.errors and len(hole_offsets(filled)) == 4

    every = c.request("codeAction/resolve", fills[f"{FILL_ALL} (5)"], timeout=120)
    (edits,) = every["edit"]["changes"].values()
    done = apply(PLAN, edits)
    assert hole_offsets(done) == [] and "a `?` in a comment is no hole" in done  # the rest as written
    assert format_text(done, str(path)) == expected  # solve's plan, but for its header
    checked = check_text(done, str(path))
    assert not checked.errors and checked.plan is not None and not checked.plan.holes()


def test_an_unsolvable_plan_says_why_and_gives_no_edit(session):
    c, path = session
    uri = path.as_uri()
    tight = PLAN.replace("1 GiB", "1 KiB")
    change(c, uri, tight, 10)
    listed = _actions(c, uri, tight, at(tight, "fc1.weight : ?", 13))
    (one,) = [a for a in listed if a["title"] == FILL_ONE]
    mark = c.mark()
    out = c.request("codeAction/resolve", one, timeout=120)
    assert "edit" not in out or out["edit"] is None
    assert out["disabled"]["reason"].startswith("no plan fits the budget")
    shown = c.wait_for("window/showMessage", after=mark)
    assert shown["type"] == L.MessageType.Warning and "no plan fits the budget" in shown["message"]

    # a plan with errors: the first error, no solve
    broken = tight.replace("data x : [dp, _]", "data x : [dq, _]")
    change(c, uri, broken, 11)
    (one,) = [a for a in _actions(c, uri, broken, at(broken, "fc1.weight : ?", 13)) if a["title"] == FILL_ONE]
    out = c.request("codeAction/resolve", one, timeout=120)
    assert re.match(r"the plan has errors; fix them first \(PL\d+ at line \d+: ", out["disabled"]["reason"])
    assert "edit" not in out

    # an action offered for an older version is refused without solving
    change(c, uri, broken + "\n", 12)
    out = c.request("codeAction/resolve", one, timeout=15)
    assert "document changed" in out["disabled"]["reason"]
    assert "Traceback" not in c.stderr_text()


def test_not_offered_to_a_client_that_cannot_resolve_the_edit(tmp_path):
    path = tmp_path / "partial.plan"
    path.write_text(PLAN)
    c = start()  # no codeAction.resolveSupport: the edit would have to be solved while listing
    try:
        open_doc(c, path.as_uri(), PLAN)
        assert [a for a in _actions(c, path.as_uri(), PLAN, at(PLAN, "dp = ?", 5)) if a["kind"] == FILL] == []
    finally:
        c.close()
