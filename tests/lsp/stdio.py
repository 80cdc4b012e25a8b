"""Helpers for the tests that drive `python -m planlang.lsp` over stdio: start a server, open a
document, convert offsets to LSP positions and apply the edits the server returns."""
from __future__ import annotations

import sys

from lsprotocol import types as L

from planlang.lsp.positions import LineIndex

from .client import LspClient
from .conftest import ROOT

PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv" / "bin" / "python").exists() else sys.executable
OPTIONS = {"tabSize": 4, "insertSpaces": True}


def start(capabilities: dict | None = None, init_options=None, cwd=None) -> LspClient:
    c = LspClient([PYTHON, "-m", "planlang.lsp", "--stdio"], cwd=cwd or str(ROOT))
    c.init_result = c.request("initialize", {"processId": None, "rootUri": None,
                                             "initializationOptions": init_options,
                                             "capabilities": capabilities or {}})
    c.notify("initialized", {})
    return c


def open_doc(c: LspClient, uri: str, text: str, version: int = 1) -> dict:
    """didOpen, and the diagnostics published for that version."""
    mark = c.mark()
    c.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "planlang", "version": version,
                                                       "text": text}})
    return c.wait_for("textDocument/publishDiagnostics", lambda p: p["uri"] == uri and p["version"] == version,
                      after=mark)


def change(c: LspClient, uri: str, text: str, version: int) -> dict:
    """A full-text didChange, and the diagnostics published for it."""
    mark = c.mark()
    c.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": version},
                                        "contentChanges": [{"text": text}]})
    return c.wait_for("textDocument/publishDiagnostics", lambda p: p["uri"] == uri and p["version"] == version,
                      after=mark)


def pos(text: str, offset: int) -> dict:
    p = LineIndex(text).position(offset)
    return {"line": p.line, "character": p.character}


def offset(text: str, p: dict) -> int:
    return LineIndex(text).offset(L.Position(p["line"], p["character"]))


def span_of(text: str, rng: dict) -> str:
    return text[offset(text, rng["start"]):offset(text, rng["end"])]


def apply(text: str, edits: list[dict]) -> str:
    """The text with LSP text edits applied (back to front)."""
    spans = sorted(((offset(text, e["range"]["start"]), offset(text, e["range"]["end"]), e["newText"]) for e in edits),
                   reverse=True)
    for start, end, new in spans:
        text = text[:start] + new + text[end:]
    return text
