"""Document symbols and folding ranges over stdio: the plan's outline."""
import pytest

from .conftest import at
from .stdio import change, open_doc, pos, span_of, start

PLAN = """use hardware
use patterns.megatron

# two pipeline stages
# of tensor-parallel blocks
mesh m of 8 x hardware.cpu {
    pp = 2 over hardware.loopback
    dp = 2 over hardware.loopback
    tp = 2 over hardware.loopback
}
input x : f32[batch = 8, features = 16]
data x : [dp, _]
template cols(ax: axis) {
    shard weight : [ax, _]
}
pipeline over pp schedule 1f1b microbatches 4 {
    stage fc1, act
    stage fc2
}
for layer in blocks[*] {
    apply cols(tp) to layer.fc
}
"""

# LSP SymbolKind numbers
MODULE, NAMESPACE, FUNCTION, VARIABLE, FIELD, ARRAY, OBJECT, TYPE_PARAMETER, PROPERTY, METHOD = \
    2, 3, 12, 13, 8, 18, 19, 26, 7, 6


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    path = tmp_path_factory.mktemp("ol") / "main.plan"
    path.write_text(PLAN)
    c = start({"textDocument": {"documentSymbol": {"hierarchicalDocumentSymbolSupport": True}}})
    open_doc(c, path.as_uri(), PLAN)
    yield c, path.as_uri()
    c.close()


def _symbols(c, uri):
    return c.request("textDocument/documentSymbol", {"textDocument": {"uri": uri}})


def test_symbols_list_the_mesh_with_its_axes_the_stages_and_the_templates(session):
    c, uri = session
    syms = _symbols(c, uri)
    top = [(s["name"], s["kind"]) for s in syms]
    assert top == [("use hardware", MODULE), ("use patterns.megatron", MODULE), ("mesh m", NAMESPACE),
                   ("input x", VARIABLE), ("data x", VARIABLE), ("cols", FUNCTION), ("pipeline over pp", OBJECT),
                   ("for layer in blocks[*]", NAMESPACE)]
    mesh, template, pipeline, loop = syms[2], syms[5], syms[6], syms[7]
    assert [(a["name"], a["kind"], a["detail"]) for a in mesh["children"]] == [
        ("pp", FIELD, "2 over hardware.loopback"), ("dp", FIELD, "2 over hardware.loopback"),
        ("tp", FIELD, "2 over hardware.loopback")]
    assert mesh["detail"] == "8 x hardware.cpu"
    # ranges: the whole statement; selection: its name
    assert span_of(PLAN, mesh["range"]).startswith("mesh m of") and span_of(PLAN, mesh["range"]).endswith("}")
    assert span_of(PLAN, mesh["selectionRange"]) == "m"
    assert span_of(PLAN, mesh["children"][2]["selectionRange"]) == "tp"
    assert [(s["name"], s["detail"]) for s in pipeline["children"]] == [("stage 0", "fc1, act"), ("stage 1", "fc2")]
    assert all(s["kind"] == ARRAY for s in pipeline["children"])
    assert template["detail"] == "template(ax: axis)" and span_of(PLAN, template["selectionRange"]) == "cols"
    assert [(s["name"], s["kind"]) for s in template["children"]] == [("ax", TYPE_PARAMETER),
                                                                        ("shard weight", PROPERTY)]
    assert [(s["name"], s["kind"], s["detail"]) for s in loop["children"]] == [
        ("apply cols(tp)", METHOD, "to layer.fc")]


def test_a_broken_line_keeps_the_rest_of_the_outline(session):
    c, uri = session
    broken = PLAN.replace("data x : [dp, _]", "data x : [dp,")
    change(c, uri, broken, 2)
    names = [s["name"] for s in _symbols(c, uri)]
    assert "mesh m" in names and "cols" in names and "data x" not in names
    change(c, uri, PLAN, 3)


def test_folding_ranges_fold_blocks_and_comment_runs(session):
    c, uri = session
    folds = c.request("textDocument/foldingRange", {"textDocument": {"uri": uri}})
    got = {(f["startLine"], f["endLine"], f.get("kind")) for f in folds}
    line = {m: pos(PLAN, at(PLAN, m))["line"] for m in ("use hardware", "# two", "mesh m", "template cols",
                                                         "pipeline over", "for layer")}
    assert got == {
        (line["use hardware"], line["use hardware"] + 1, "imports"),
        (line["# two"], line["# two"] + 1, "comment"),
        (line["mesh m"], line["mesh m"] + 3, "region"),  # the closing `}` stays visible
        (line["template cols"], line["template cols"] + 1, "region"),
        (line["pipeline over"], line["pipeline over"] + 2, "region"),
        (line["for layer"], line["for layer"] + 1, "region"),
    }
