"""A real client session with `python -m planlang.lsp` over stdio (JSON-RPC, Content-Length framing)."""
import subprocess
import sys
import time

import pytest

from planlang.lang.fmt import format_text
from planlang.lsp.positions import LineIndex
from planlang.plan.resolve import STDLIB_DIR

from .client import LspClient
from .conftest import ROOT, at

PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv" / "bin" / "python").exists() else sys.executable

PLAN = """use hardware
use patterns.megatron

mesh m of 4 x hardware.cpu {
    dp = 2 over hardware.loopback
    tp = 2 over hardware.loopback
}
input x : f32[batch = 8, features = 16]
data x : [dp, _]
apply megatron.linear_mlp(tp) to mlp
shard fc.weight : [tq, _]
"""


def _pos(text, offset):
    p = LineIndex(text).position(offset)
    return {"line": p.line, "character": p.character}


def _apply(text, edits):
    index = LineIndex(text)
    for e in sorted(edits, key=lambda e: (e["range"]["start"]["line"], e["range"]["start"]["character"]),
                    reverse=True):
        start = index.offset(_p(e["range"]["start"]))
        end = index.offset(_p(e["range"]["end"]))
        text = text[:start] + e["newText"] + text[end:]
    return text


def _p(d):
    from lsprotocol import types as L

    return L.Position(d["line"], d["character"])


def _start(init_options=None, config=None, cwd=None):
    c = LspClient([PYTHON, "-m", "planlang.lsp", "--stdio"], cwd=cwd or str(ROOT), config=config)
    result = c.request("initialize", {"processId": None, "rootUri": None, "initializationOptions": init_options,
                                      "capabilities": {"workspace": {"configuration": config is not None}}})
    c.notify("initialized", {})
    return c, result


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    path = tmp_path_factory.mktemp("s") / "main.plan"
    path.write_text(PLAN)
    c, result = _start()
    yield c, result, path, path.as_uri()
    if c.proc.poll() is None:
        c.close()


def test_capabilities(session):
    _, result, _, _ = session
    caps = result["capabilities"]
    for key in ("hoverProvider", "definitionProvider", "documentFormattingProvider", "completionProvider",
                "semanticTokensProvider", "textDocumentSync"):
        assert caps[key], key
    assert result["serverInfo"]["name"] == "planlang"


def test_open_then_fix_an_error(session):
    c, _, _, uri = session
    mark = c.mark()
    c.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "planlang", "version": 1,
                                                       "text": PLAN}})
    diags = c.wait_for("textDocument/publishDiagnostics", lambda p: p["version"] == 1, after=mark)["diagnostics"]
    (d,) = diags
    start = at(PLAN, "tq")
    assert d["code"] == "PL201" and d["severity"] == 1
    assert d["range"] == {"start": _pos(PLAN, start), "end": _pos(PLAN, start + 2)}
    assert "did you mean `tp`?" in d["message"]
    # an incremental change replacing `tq` with `tp`
    c.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": 2}, "contentChanges": [
        {"range": d["range"], "text": "tp"}]})
    assert c.wait_for("textDocument/publishDiagnostics", lambda p: p["version"] == 2, after=mark)["diagnostics"] == []


def test_hover_definition_completion_tokens_formatting(session):
    c, _, path, uri = session
    text = PLAN.replace("[tq, _]", "[tp, _]")
    c.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": 3},
                                        "contentChanges": [{"text": text}]})
    doc = {"uri": uri}
    h = c.request("textDocument/hover", {"textDocument": doc, "position": _pos(text, at(text, "[tp", 2))})
    assert "size **2**" in h["contents"]["value"] and "hardware.loopback" in h["contents"]["value"]

    loc = c.request("textDocument/definition", {"textDocument": doc,
                                                "position": _pos(text, at(text, "linear_mlp", 3))})
    megatron = STDLIB_DIR / "patterns" / "megatron.plan"
    assert loc["uri"] == megatron.resolve().as_uri()
    line = megatron.read_text().splitlines()[loc["range"]["start"]["line"]]
    assert line[loc["range"]["start"]["character"]:].startswith("linear_mlp(")

    loc = c.request("textDocument/definition", {"textDocument": doc, "position": _pos(text, at(text, "[dp", 1))})
    assert loc["uri"] == uri and loc["range"]["start"] == _pos(text, at(text, "dp = 2"))

    comp = c.request("textDocument/completion", {"textDocument": doc, "position": _pos(text, at(text, "[tp", 1))})
    items = comp["items"] if isinstance(comp, dict) else comp
    assert {"dp", "tp", "_"} <= {i["label"] for i in items}

    toks = c.request("textDocument/semanticTokens/full", {"textDocument": doc})["data"]
    assert len(toks) % 5 == 0 and toks[:5] == [0, 0, 3, 0, 0]  # `use`, a keyword, first

    messy = text.replace("data x : [dp, _]", "data x:[dp,_]   ;   input y : f32[b=1]")
    c.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": 4},
                                        "contentChanges": [{"text": messy}]})
    edits = c.request("textDocument/formatting", {"textDocument": doc,
                                                  "options": {"tabSize": 4, "insertSpaces": True}})
    assert edits and _apply(messy, edits) == format_text(messy, str(path))
    broken = messy + "mesh {\n"
    c.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": 5},
                                        "contentChanges": [{"text": broken}]})
    assert c.request("textDocument/formatting", {"textDocument": doc,
                                                 "options": {"tabSize": 4, "insertSpaces": True}}) in (None, [])


def test_close_clears_diagnostics(session):
    c, _, _, uri = session
    mark = c.mark()
    c.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
    assert c.wait_for("textDocument/publishDiagnostics", lambda p: p["uri"] == uri, after=mark)["diagnostics"] == []


def test_shutdown_and_exit_cleanly(session):
    c = session[0]
    assert c.close() == 0
    assert c.raw_garbage == []
    assert "Traceback" not in c.stderr_text()


FACTORY = '''import torch
print("printed by the model module")


def build():
    print("printed by the factory")
    return torch.nn.Linear(8, 4)
'''
MODEL_PLAN = """use hardware
model lin = "printing_model:build"
input x : f32[batch = 4, features = 8]
mesh m of 2 x hardware.cpu {
    tp = 2 over hardware.loopback
}
budget 1 GiB per device
shard weight : [tp, _, _]
"""


def test_model_checks_after_typing_stops_and_stdout_stays_clean(tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "printing_model.py").write_text(FACTORY)
    path = tmp_path / "main.plan"
    path.write_text(MODEL_PLAN)
    uri = path.as_uri()
    c, _ = _start(config={"planlang": {"modelChecks": True, "modelCheckDelay": 0.2}}, cwd=str(tmp_path))
    try:
        c.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "planlang", "version": 1,
                                                           "text": MODEL_PLAN}})
        first = c.wait_for("textDocument/publishDiagnostics")
        assert first["diagnostics"] == []  # the model-free result comes first, without waiting for torch
        for v in range(2, 6):  # typing: each change restarts the pause
            c.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": v},
                                                "contentChanges": [{"text": MODEL_PLAN + "#" * v}]})
        # while the model check runs on its worker thread (importing torch takes seconds), requests are
        # still answered: this hover comes back before the model-aware diagnostics
        time.sleep(0.6)
        h = c.request("textDocument/hover", {"textDocument": {"uri": uri},
                                             "position": _pos(MODEL_PLAN, at(MODEL_PLAN, "tp =", 1))})
        assert "size **2**" in h["contents"]["value"]
        assert not any(d["code"] == "PL361" for n in c.notifications if n["method"] == "textDocument/publishDiagnostics"
                       for d in n["params"]["diagnostics"])
        model = c.wait_for("textDocument/publishDiagnostics",
                           lambda p: any(d["code"] == "PL361" for d in p["diagnostics"]), timeout=60)
        assert model["version"] == 5
        (d,) = model["diagnostics"]
        assert d["range"]["start"]["line"] == MODEL_PLAN.count("\n") - 1
        assert "`weight` has 2 dims [4, 8]" in d["message"]
        published = [n["params"] for n in c.notifications if n["method"] == "textDocument/publishDiagnostics"]
        assert all(p["version"] == 5 for p in published if any(x["code"] == "PL361" for x in p["diagnostics"]))
        h = c.request("textDocument/hover", {"textDocument": {"uri": uri},
                                             "position": _pos(MODEL_PLAN, at(MODEL_PLAN, "weight :", 1))})
        assert "float32 [4, 8]" in h["contents"]["value"]
    finally:
        rc = c.close()
    assert rc == 0
    assert c.raw_garbage == []
    assert "printed by the factory" in c.stderr_text()


def test_importing_the_server_does_not_import_torch():
    code = ("import sys, planlang.lsp, planlang.lsp.server, planlang.lsp.hover, planlang.lsp.completion; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([PYTHON, "-c", code], cwd=ROOT).returncode == 0


