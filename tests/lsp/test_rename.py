"""Rename, prepareRename and references over stdio: axes, templates, template parameters, loop variables."""
import pytest

from planlang.lsp.analysis import analyze
from planlang.lsp.rename import RenameRefused, find, occurrences, rename

from .conftest import at
from .stdio import apply, change, open_doc, pos, span_of, start

# {AX}: every place the mesh axis `tp` is named. The other `tp`s are not that axis: a comment, a template
# parameter named `tp` (its body's `tp` is the parameter), and a module path `tp_proj`
TEMPLATE = """use hardware

# tp below is the tensor axis: a rename leaves comments alone
mesh m of 8 x hardware.cpu {
    pp = 2 over hardware.loopback
    dp = 2 over hardware.loopback
    {AX} = 2 over hardware.loopback
}
input x : f32[batch = 8, features = 16]
optimizer adamw(lr = 0.001) {
    zero = 1 over dp
}
data x : [dp, _]
template cols(ax: axis) {
    shard weight : [ax, _]
    shard bias : [{AX}]
}
template rows(tp: axis) {
    shard weight : [_, tp]
}
pipeline over pp schedule gpipe microbatches 2 {
    stage fc1 with {AX} = 2
    stage fc2
}
apply cols({AX}) to fc1
apply rows(dp) to fc2
for layer in blocks[*] {
    shard layer.tp_proj.weight : [({AX}, dp), _]
    shard output of layer : [_, {AX}]
    shard output of layer.out : [_, dp] partial({AX})
}
"""
PLAN = TEMPLATE.replace("{AX}", "tp")


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    path = tmp_path_factory.mktemp("rn") / "main.plan"
    path.write_text(PLAN)
    c = start({"textDocument": {"rename": {"prepareSupport": True}}})
    assert open_doc(c, path.as_uri(), PLAN)["diagnostics"] == []
    yield c, path.as_uri()
    c.close()


def _rename(c, uri, text, offset, new):
    return c.request("textDocument/rename", {"textDocument": {"uri": uri}, "position": pos(text, offset),
                                             "newName": new})


def _refused(c, uri, text, offset, new=None):
    method, params = ("textDocument/prepareRename", {}) if new is None else ("textDocument/rename", {"newName": new})
    with pytest.raises(RuntimeError) as err:
        c.request(method, {"textDocument": {"uri": uri}, "position": pos(text, offset), **params})
    assert "-32803" in str(err.value)
    return str(err.value)


def test_capabilities(session):
    caps = session[0].init_result["capabilities"]
    assert caps["renameProvider"] == {"prepareProvider": True} and caps["referencesProvider"]


def test_rename_of_an_axis_edits_every_use_and_nothing_else(session):
    c, uri = session
    for marker in ("cols(tp)", "[(tp", "with tp", "    tp = 2 over"):  # from a use, or from the declaration
        offset = at(PLAN, marker, marker.index("tp") + 1)
        prep = c.request("textDocument/prepareRename", {"textDocument": {"uri": uri}, "position": pos(PLAN, offset)})
        assert prep["placeholder"] == "tp" and span_of(PLAN, prep["range"]) == "tp"
        edit = _rename(c, uri, PLAN, offset, "tensor")
        (edits,) = edit["changes"].values()
        assert len(edits) == TEMPLATE.count("{AX}")
        assert apply(PLAN, edits) == TEMPLATE.replace("{AX}", "tensor")
    renamed = TEMPLATE.replace("{AX}", "tensor")
    assert change(c, uri, renamed, 2)["diagnostics"] == []  # still checks clean
    change(c, uri, PLAN, 3)


def test_rename_a_template_parameter_a_loop_variable_and_a_template(session):
    c, uri = session
    (edits,) = _rename(c, uri, PLAN, at(PLAN, "[_, tp]", 5), "width")["changes"].values()
    assert apply(PLAN, edits) == PLAN.replace("rows(tp: axis)", "rows(width: axis)").replace("[_, tp]", "[_, width]", 1)
    (edits,) = _rename(c, uri, PLAN, at(PLAN, "layer.tp_proj", 2), "blk")["changes"].values()
    assert apply(PLAN, edits) == PLAN.replace("layer", "blk")
    (edits,) = _rename(c, uri, PLAN, at(PLAN, "apply cols", 7), "columns")["changes"].values()
    assert apply(PLAN, edits) == PLAN.replace("cols(", "columns(")


def test_rename_is_refused_with_the_reason(session):
    c, uri = session
    axis = at(PLAN, "cols(tp)", 6)
    assert "already has an axis `dp`" in _refused(c, uri, PLAN, axis, "dp")
    assert "keyword" in _refused(c, uri, PLAN, axis, "stage")
    assert "not a name" in _refused(c, uri, PLAN, axis, "2x")
    assert "hide the axis" in _refused(c, uri, PLAN, axis, "ax")  # template cols has a parameter `ax`
    assert "keyword" in _refused(c, uri, PLAN, at(PLAN, "pipeline over", 2))
    assert "is a schedule" in _refused(c, uri, PLAN, at(PLAN, "gpipe", 2))
    assert "is a link" in _refused(c, uri, PLAN, at(PLAN, "hardware.loopback", 12))
    assert "Traceback" not in c.stderr_text()  # a refusal is an answer, not a server error
    # nothing changed: the document is as it was
    assert c.request("textDocument/rename", {"textDocument": {"uri": uri}, "position": pos(PLAN, axis),
                                             "newName": "tp"}) in (None, {"changes": {}}, {"changes": {uri: []}})


def test_references_with_and_without_the_declaration(session):
    c, uri = session
    offset = at(PLAN, "[dp, _]", 2)

    def refs(include):
        return c.request("textDocument/references", {"textDocument": {"uri": uri}, "position": pos(PLAN, offset),
                                                     "context": {"includeDeclaration": include}})

    decl = pos(PLAN, at(PLAN, "    dp = 2") + 4)
    with_decl, without = refs(True), refs(False)
    assert all(r["uri"] == uri and span_of(PLAN, r["range"]) == "dp" for r in with_decl)
    # the declaration, `over dp`, `data x : [dp, _]`, `(tp, dp)`, `rows(dp)`, `[_, dp] partial(tp)`
    assert len(with_decl) == 6 and decl in [r["range"]["start"] for r in with_decl]
    assert [r for r in with_decl if r["range"]["start"] != decl] == without


def test_a_name_declared_in_another_file_or_a_text_that_does_not_parse_is_refused(gpt2):
    text = gpt2.text
    with pytest.raises(RenameRefused, match="declared in .*megatron.plan, not in this document"):
        rename(gpt2, at(text, "megatron.attention", 12), "attn")
    broken = analyze(text + "mesh {\n", gpt2.path)
    with pytest.raises(RenameRefused, match="syntax errors"):
        rename(broken, at(text, "attention(tp)", 11), "tensor")
    assert len(rename(gpt2, at(text, "attention(tp)", 11), "tensor")) == 3  # the mesh's tp and two applies
    # references still find a stdlib template's uses here (the part after the alias), and its declaration
    _, target = find(gpt2, at(text, "megatron.attention", 12))
    assert [text[s.start:s.end] for s in occurrences(gpt2, target).spans] == ["attention"]
    assert target.decl.path.endswith("megatron.plan")


NESTED = """mesh m of 4 x hardware.cpu {
    tp = 4 over hardware.loopback
}
template t(ax: axis, n: int) {
    checkpoint blocks[*] every n
    for b in blocks[*] {
        shard b.w : [ax]
        for c in b.sub[*] {
            shard c.x : [tp]
        }
        shard norm.w : [_]
    }
}
apply t(tp, 2) to layer
"""


def test_every_parameter_and_nested_loops(plan_in):
    a = plan_in("use hardware\n" + NESTED)
    text = a.text
    assert a.parses

    def renamed(marker, delta, new):
        return [text[s.start:s.end] + f"@{s.line}" for s in rename(a, at(text, marker, delta), new)]

    assert renamed("every n", 6, "k") == ["n@5", "n@6"]  # from the use in `every`: the parameter
    assert renamed("for b", 4, "blk") == ["b@7", "b@8", "b@9"]  # the inner loop's path starts with b too
    with pytest.raises(RenameRefused, match="a `for` inside already binds `c`"):
        rename(a, at(text, "for b", 4), "c")
    with pytest.raises(RenameRefused, match="an enclosing `for` already binds `b`"):
        rename(a, at(text, "for c", 4), "b")
    with pytest.raises(RenameRefused, match="`norm` is a module path in the loop's body"):
        rename(a, at(text, "for b", 4), "norm")
