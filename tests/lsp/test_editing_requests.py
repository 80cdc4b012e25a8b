"""Signature help, range formatting, model-free inlay hints, pull diagnostics and semantic tokens of a
long line, over stdio, with a client that pulls diagnostics (textDocument/diagnostic) instead of
receiving them."""
import time

import pytest

from planlang.lang.fmt import format_text
from planlang.lsp.analysis import analyze
from planlang.lsp.tokens import decode, tokens

from .conftest import at
from .stdio import OPTIONS, apply, pos, start

PLAN = """use hardware
use patterns.megatron

mesh m of 4 x hardware.cpu {
    dp = 2 over hardware.loopback
    tp = 2 over hardware.loopback
}
input x : f32[batch = 8, features = 16]
data x : [dp, _]
template pair(a: axis, b: axis) {
    shard weight : [a, b]
}
apply megatron.linear_mlp(tp) to mlp
shard fc.weight : [tq, _]
"""
PULL = {"textDocument": {"diagnostic": {"dynamicRegistration": False}, "signatureHelp": {}}}
FEATURES = ("codeActionProvider", "renameProvider", "referencesProvider", "documentSymbolProvider",
            "inlayHintProvider", "signatureHelpProvider", "foldingRangeProvider",
            "documentRangeFormattingProvider", "diagnosticProvider", "hoverProvider", "definitionProvider",
            "documentFormattingProvider", "completionProvider", "semanticTokensProvider")


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    path = tmp_path_factory.mktemp("ed") / "main.plan"
    path.write_text(PLAN)
    c = start(PULL)
    yield c, path
    c.close()


def _open(c, uri, text, version=1):
    c.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "planlang", "version": version,
                                                       "text": text}})


def _change(c, uri, text, version):
    c.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": version},
                                        "contentChanges": [{"text": text}]})


def test_every_feature_is_advertised(session):
    caps = session[0].init_result["capabilities"]
    assert [f for f in FEATURES if not caps.get(f)] == []
    assert set(caps["signatureHelpProvider"]["triggerCharacters"]) == {"(", ","}
    assert "source.fixAll.planlang" in caps["codeActionProvider"]["codeActionKinds"]


def test_pull_diagnostics_and_no_push_to_a_pulling_client(session):
    c, path = session
    uri = path.as_uri()
    _open(c, uri, PLAN)
    report = c.request("textDocument/diagnostic", {"textDocument": {"uri": uri}})
    assert report["kind"] == "full"
    (d,) = report["items"]
    assert d["code"] == "PL201" and d["range"]["start"] == pos(PLAN, at(PLAN, "tq"))
    fixed = PLAN.replace("[tq, _]", "[tp, _]")
    _change(c, uri, fixed, 2)
    assert c.request("textDocument/diagnostic", {"textDocument": {"uri": uri}})["items"] == []
    time.sleep(0.2)  # a push would have come by now
    assert not any(n["method"] == "textDocument/publishDiagnostics" for n in c.notifications)


def test_model_free_inlay_hints_show_an_inputs_local_shape(session):
    c, path = session
    uri = path.as_uri()
    text = PLAN.replace("[tq, _]", "[tp, _]")
    _change(c, uri, text, 3)
    whole = {"start": pos(text, 0), "end": pos(text, len(text))}
    hints = c.request("textDocument/inlayHint", {"textDocument": {"uri": uri}, "range": whole})
    # batch 8 over dp (2): 4 rows per device; features whole. Parameters' shapes need the model
    end_of_data = pos(text, text.index("\n", at(text, "data x")))
    assert [(h["position"], h["label"]) for h in hints] == [(end_of_data, "local [4, 16]")]
    assert "i64" not in hints[0]["tooltip"]["value"] and "f32[batch = 4, features = 16]" in hints[0]["tooltip"]["value"]
    before = {"start": pos(text, 0), "end": pos(text, at(text, "data x"))}
    assert c.request("textDocument/inlayHint", {"textDocument": {"uri": uri}, "range": before}) == []


def test_signature_help_for_a_template_being_applied(session):
    c, path = session
    uri = path.as_uri()
    typing = PLAN.replace("shard fc.weight : [tq, _]\n", "apply pair(dp, ")
    _change(c, uri, typing, 4)
    help_ = c.request("textDocument/signatureHelp", {"textDocument": {"uri": uri},
                                                     "position": pos(typing, len(typing))})
    (sig,) = help_["signatures"]
    assert sig["label"] == "template pair(a: axis, b: axis)"
    assert help_["activeParameter"] == 1
    start_, end = sig["parameters"][1]["label"]
    assert sig["label"][start_:end] == "b: axis"
    stdlib = c.request("textDocument/signatureHelp", {"textDocument": {"uri": uri},
                                                      "position": pos(PLAN, at(PLAN, "linear_mlp(", 11))})
    assert stdlib["signatures"][0]["label"].startswith("template linear_mlp(")
    assert stdlib["activeParameter"] == 0
    outside = c.request("textDocument/signatureHelp", {"textDocument": {"uri": uri}, "position": pos(PLAN, 3)})
    assert outside is None


def test_range_formatting_touches_only_the_selected_statements(session):
    c, path = session
    uri = path.as_uri()
    messy = PLAN.replace("data x : [dp, _]", "data   x:[dp,_]").replace("    tp = 2 over", "  tp   =  2 over")
    _change(c, uri, messy, 5)
    line = pos(messy, at(messy, "data   x"))["line"]
    rng = {"start": {"line": line, "character": 0}, "end": {"line": line, "character": 3}}
    edits = c.request("textDocument/rangeFormatting", {"textDocument": {"uri": uri}, "range": rng,
                                                       "options": OPTIONS})
    assert apply(messy, edits) == messy.replace("data   x:[dp,_]", "data x : [dp, _]")  # the mesh left alone
    whole = {"start": {"line": 0, "character": 0}, "end": pos(messy, len(messy))}
    edits = c.request("textDocument/rangeFormatting", {"textDocument": {"uri": uri}, "range": whole,
                                                       "options": OPTIONS})
    assert apply(messy, edits) == format_text(messy, str(path))
    _change(c, uri, messy + "mesh {\n", 6)  # does not parse: nothing is formatted
    assert c.request("textDocument/rangeFormatting", {"textDocument": {"uri": uri}, "range": whole,
                                                      "options": OPTIONS}) in (None, [])


def test_semantic_tokens_of_a_20k_character_line(session):
    c, path = session
    uri = path.as_uri()
    n = 700
    text = "use hardware\nmesh m of 4 x hardware.cpu { dp = 4 }; " + "".join(
        f"shard h{i}.weight : [dp, _]; " for i in range(n)) + "\n"
    assert len(text.splitlines()[1]) > 20_000
    _change(c, uri, text, 7)
    data = c.request("textDocument/semanticTokens/full", {"textDocument": {"uri": uri}}, timeout=60)["data"]
    got = decode(text, data)
    want = tokens(analyze(text, str(path)))
    assert len(got) == len(want) >= 4 * n  # shard, h{i}, weight, dp
    assert [(t[2], t[3]) for t in got] == [(text[t.start:t.end], t.type) for t in want]
    assert sum(1 for t in got if t[2] == "shard" and t[3] == "keyword") == n
