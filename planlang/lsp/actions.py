"""textDocument/codeAction: the mechanical fixes diagnostics carry (`Diagnostic.fix`), as quick fixes.

A fix is a list of edits (character offsets into a file's text, planlang.lang.diagnostics.Edit); each
becomes an LSP text edit in the client's position encoding. A fix that does not change what the plan
means (`safe`) is the preferred action; one that does is offered too, with "(changes meaning)" in its
title. `source.fixAll.planlang` applies every safe fix of the document whose edits do not overlap (what
`planlang lint --fix` applies). The actions that fill a hole with `planlang solve`'s choice are in
fill_holes.py (their edit is computed when one is picked: codeAction/resolve).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable

from lsprotocol import types as L

from planlang.lang.diagnostics import Diagnostic, Fix

from .analysis import Analysis
from .diagnostics import Converter, uri
from .positions import LineIndex

FIX_ALL = "source.fixAll.planlang"
KINDS = [L.CodeActionKind.QuickFix, FIX_ALL]


def _overlaps(a: L.Range, b: L.Range) -> bool:
    def key(p: L.Position):
        return p.line, p.character

    return key(a.start) <= key(b.end) and key(b.start) <= key(a.end)


class FixEdits:
    """Converts fixes to workspace edits; edits in the open document use its uri, others the file's."""

    def __init__(self, analysis: Analysis, doc_uri: str, encoding: str, read: Callable[[str], str]):
        self.analysis, self.doc_uri, self.encoding, self.read = analysis, doc_uri, encoding, read
        self._indexes: dict[str, LineIndex] = {}

    def index(self, path: str) -> LineIndex:
        if path not in self._indexes:
            text = self.analysis.text if path == self.analysis.path else self.read(path)
            self._indexes[path] = LineIndex(text, self.encoding)
        return self._indexes[path]

    def workspace_edit(self, fix: Fix) -> L.WorkspaceEdit:
        changes: dict[str, list[L.TextEdit]] = {}
        for e in fix.edits:
            path = e.span.file
            here = path == self.analysis.path
            target = self.doc_uri if here else uri(str(Path(path).resolve()))
            rng = self.index(path).offset_range(e.span.start, e.span.end)
            changes.setdefault(target, []).append(L.TextEdit(rng, e.text))
        return L.WorkspaceEdit(changes=changes)


def code_actions(analysis: Analysis, diagnostics: Iterable[Diagnostic], doc_uri: str, rng: L.Range,
                 encoding: str, read: Callable[[str], str], only: list[str] | None = None) -> list[L.CodeAction]:
    """The quick fixes of the diagnostics whose range meets `rng`, and the fix-all action."""
    diags = [d for d in diagnostics if d.fix is not None and d.fix.edits]
    conv = Converter(analysis, encoding)
    edits = FixEdits(analysis, doc_uri, encoding, read)
    out: list[L.CodeAction] = []
    want_quick = wanted(L.CodeActionKind.QuickFix.value, only)
    want_all = wanted(FIX_ALL, only)
    if want_quick:
        for d in diags:
            shown = conv.convert(d)
            if not _overlaps(shown.range, rng):
                continue
            fix = d.fix
            assert fix is not None
            title = fix.message if fix.safe else f"{fix.message} (changes meaning)"
            out.append(L.CodeAction(title=title, kind=L.CodeActionKind.QuickFix, diagnostics=[shown],
                                    is_preferred=fix.safe, edit=edits.workspace_edit(fix)))
    if want_all:
        chosen = fix_all(d.fix for d in diags if d.fix is not None and d.fix.safe)
        if chosen:
            merged = Fix("fix all", tuple(e for f in chosen for e in f.edits))
            n = len(chosen)
            out.append(L.CodeAction(title=f"Fix all safe planlang problems ({n})", kind=FIX_ALL,
                                    edit=edits.workspace_edit(merged)))
    return out


def wanted(kind: str, only: list[str] | None) -> bool:
    """Whether a client that asked for the kinds `only` (hierarchical: `source` includes
    `source.fixAll.planlang`) wants actions of `kind`."""
    return not only or any(kind == k or kind.startswith(k + ".") for k in only)


def fix_all(fixes: Iterable[Fix]) -> list[Fix]:
    """The fixes to apply together: in order, each whose edits overlap no edit taken before (the rest
    wait for the next round, as a re-check would show them again)."""
    taken: list[tuple[str, int, int]] = []
    out: list[Fix] = []
    for fix in fixes:
        spans = [(e.span.file, e.span.start, e.span.end) for e in fix.edits]
        if any(f == g and s < e2 and s2 < e or (f == g and s == e == s2 == e2)
               for f, s, e in spans for g, s2, e2 in taken):
            continue
        taken += spans
        out.append(fix)
    return out
