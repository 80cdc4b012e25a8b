"""Completion, hover and definition in a file that has never parsed (a new plan being typed, a syntax
error from the first line): names come from the recovered text (`Analysis.recovered`: the broken lines
blanked, open blocks closed, offsets unchanged), the rest from the words around the cursor."""
import sys

from planlang.lsp.analysis import analyze
from planlang.lsp.completion import completion
from planlang.lsp.hover import hover
from planlang.lsp.positions import LineIndex
from planlang.plan.resolve import STDLIB_DIR

from .client import LspClient
from .conftest import ROOT, at

PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv" / "bin" / "python").exists() else sys.executable
PATH = "/tmp/planlang_never_parsed/new.plan"

# a first line that does not parse: no version of this file has ever parsed
HEAD = """mesh mesh mesh
use hardware
use patterns.megatron
input tokens : i64[batch = 8, seq = 128]
mesh m of 4 x hardware.cpu {
    dp = 2 over hardware.loopback
    tp = 2 over hardware.loopback
}
"""


def _labels(text, offset=None, good=None):
    a = analyze(text, PATH)
    assert not a.parses
    return [i.label for i in completion(a, len(text) if offset is None else offset, good).items]


def _hover(text, marker, delta=1):
    a = analyze(text, PATH)
    h = hover(a, at(text, marker, delta))
    return None if h is None else h.contents.value


def test_recovered_text_keeps_offsets_and_drops_only_the_broken_lines():
    text = HEAD + "shard w : [dp,\nbudget 40 GiB per device\n"
    a = analyze(text, PATH)
    rec = a.recovered
    assert not a.parses and rec is not None and rec.parses
    assert rec.text.startswith(" " * len("mesh mesh mesh") + "\nuse hardware\n")
    assert rec.text[:len(text)].split("\n")[-2:] == ["budget 40 GiB per device", ""]
    assert rec.plan.mesh.names == ("dp", "tp") and rec.plan.budget is not None
    # an unclosed block at the end is closed after the text, not cut
    text = HEAD + "template t(ax: axis) {\n    shard w : [ax, _]\n    sh"
    rec = analyze(text, PATH).recovered
    assert rec is not None and rec.text.startswith(text.replace("mesh mesh mesh", " " * 14)[:-2])


def test_names_from_used_modules_and_the_mesh_while_nothing_parsed():
    assert "hardware.cpu" in _labels(HEAD + "mesh n of 8 x hard")
    assert {"megatron.mlp", "megatron.attention"} <= set(_labels(HEAD + "apply megatron."))
    assert set(_labels(HEAD + "shard w : [")) == {"dp", "tp", "_", "?"}
    assert _labels(HEAD + "data ") == ["tokens"]
    # inside the mesh block being typed: its links (the block is still open)
    text = "use hardware\nmesh m of 4 x hardware.cpu {\n    dp = 2 over hardware.loop"
    assert "hardware.loopback" in _labels(text)
    # the axes of a mesh read from a block that does not parse
    text = "mesh mesh mesh\nmesh m of 4 x nowhere {\n    a = 2 over\n    b = 2\n}\nshard w : ["
    assert _labels(text) == ["a", "b", "_", "?"]


def test_statement_keywords_next_keywords_and_units():
    assert "pipeline" in [i.label for i in completion(analyze("", PATH), 0).items]  # an empty file
    assert "use" in _labels("}}\nu")
    assert _labels(HEAD + "mesh n ") == ["of"]
    assert _labels(HEAD + "pipeline over dp ") == ["schedule"]
    assert _labels(HEAD + "pipeline over dp schedule 1f1b ") == ["microbatches"]
    for chunked in ("interleaved", "looped_bfs"):  # the schedules that need `chunks N`
        assert _labels(HEAD + f"pipeline over dp schedule {chunked} ") == ["chunks"]
        assert _labels(HEAD + f"pipeline over dp schedule {chunked} chunks 2 ") == ["microbatches"]
    # zero_bubble takes `chunks N` or goes without (one chunk per rank)
    assert _labels(HEAD + "pipeline over dp schedule zero_bubble ") == ["chunks", "microbatches"]
    assert _labels(HEAD + "pipeline over dp schedule zero_bubble chunks 2 ") == ["microbatches"]
    # the V schedules need `chunks` and take exactly 2 (two stages per rank)
    for v_shape in ("zbv", "dualpipev"):
        assert _labels(HEAD + f"pipeline over dp schedule {v_shape} ") == ["chunks"]
        assert _labels(HEAD + f"pipeline over dp schedule {v_shape} chunks ") == ["2"]
        assert _labels(HEAD + f"pipeline over dp schedule {v_shape} chunks 2 ") == ["microbatches"]
    assert _labels(HEAD + "pipeline over dp schedule interleaved chunks ") == []  # any N >= 2: nothing to offer
    assert _labels(HEAD + "budget 40 GiB ") == ["per device"]
    units = _labels(HEAD + "budget 40 G")
    assert units[:3] == ["GiB", "MiB", "GB"] and "GB/s" not in units
    assert "GB/s" in _labels(HEAD + "link l {\n    bandwidth = 100 ")
    assert _labels(HEAD + "device d {\n    ")[:2] == ["memory", "flops.bf16"]


def test_the_recovered_text_is_preferred_to_an_older_version_that_parsed():
    good = analyze("use hardware\nmesh m of 2 x hardware.cpu {\n    old = 2\n}\n", PATH)
    text = "use hardware\nmesh m of 2 x hardware.cpu {\n    new = 2\n}\nshard w : ["
    assert _labels(text, good=good) == ["new", "_", "?"]


def test_hover_explains_keywords_and_known_names_while_nothing_parsed():
    text = HEAD + "budget 40 GiB per device\nmesh m2 of 8 x hardware.h100_sxm schedule 1f1b # plan: ignore[PL201]\n"
    assert "**mesh** (keyword)" in _hover(text, "mesh m2")
    assert "memory 24 GiB" in _hover(text, "hardware.cpu", len("hardware.c"))  # on a recovered line
    assert "size **2**" in _hover(text, "dp = 2")
    assert "1 GiB = 1,073,741,824 bytes" in _hover(text, "GiB per")
    # words of the broken line itself: a device of a used module, a schedule, a code in the comment
    assert "**device** `hardware.h100_sxm`" in _hover(text, "h100_sxm")
    assert _hover(text, "1f1b").startswith("1F1B")
    assert "unknown-axis" in _hover(text, "PL201", 3)
    assert "**module** `hardware`" in _hover(text, "hardware.h100", 2)
    assert _hover("", "", 0) is None


def test_hover_range_on_the_recovered_text_is_the_current_texts():
    text = HEAD + "shard w : ["
    a = analyze(text, PATH)
    h = hover(a, at(text, "hardware.cpu", 10))
    rng = h.range
    index = LineIndex(text)
    assert text[index.offset(rng.start):index.offset(rng.end)] == "hardware.cpu"


def _pos(text, offset):
    p = LineIndex(text).position(offset)
    return {"line": p.line, "character": p.character}


def test_server_completes_hovers_and_finds_definitions_in_a_never_parsed_file(tmp_path):
    path = tmp_path / "new.plan"
    text = HEAD + "mesh n of 8 x hard"
    uri = path.as_uri()
    c = LspClient([PYTHON, "-m", "planlang.lsp", "--stdio"], cwd=str(ROOT))
    try:
        c.request("initialize", {"processId": None, "rootUri": None, "capabilities": {}})
        c.notify("initialized", {})
        c.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "planlang", "version": 1,
                                                           "text": text}})
        diags = c.wait_for("textDocument/publishDiagnostics", lambda p: p["version"] == 1)["diagnostics"]
        assert any(d["code"].startswith("PL1") for d in diags)
        doc = {"uri": uri}
        comp = c.request("textDocument/completion", {"textDocument": doc, "position": _pos(text, len(text))})
        items = comp["items"] if isinstance(comp, dict) else comp
        assert "hardware.cpu" in {i["label"] for i in items}
        h = c.request("textDocument/hover", {"textDocument": doc, "position": _pos(text, at(text, "tp = 2", 1))})
        assert "size **2**" in h["contents"]["value"]
        assert h["range"]["start"] == _pos(text, at(text, "tp = 2"))
        h = c.request("textDocument/hover", {"textDocument": doc, "position": _pos(text, at(text, "mesh mesh", 1))})
        assert "(keyword)" in h["contents"]["value"]
        loc = c.request("textDocument/definition", {"textDocument": doc,
                                                    "position": _pos(text, at(text, "hardware.loopback", 10))})
        assert loc["uri"] == (STDLIB_DIR / "hardware.plan").resolve().as_uri()
        # the broken line itself: the name under the cursor is still looked up
        broken = HEAD + "mesh n of 8 x hardware.h200 {{\n"
        c.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": 2},
                                            "contentChanges": [{"text": broken}]})
        loc = c.request("textDocument/definition", {"textDocument": doc,
                                                    "position": _pos(broken, at(broken, "h200", 1))})
        assert loc["uri"] == (STDLIB_DIR / "hardware.plan").resolve().as_uri()
    finally:
        assert c.close() == 0
    assert "Traceback" not in c.stderr_text()
