"""planlang diagnostics -> LSP diagnostics (textDocument/publishDiagnostics).

Ranges come from the spans' 1-based lines and code-point columns, converted to the client's position
encoding (positions.py). The help line and notes are appended to the message (editors show one text);
labels become related information; the code links to its entry in docs/diagnostics.md.
A diagnostic located in a used module (a template body, a preset) is shown on the `use` statement that
brings that module in, with its real place as related information.
"""
from __future__ import annotations

from pathlib import Path

from lsprotocol import types as L
from pygls.uris import from_fs_path

from planlang.lang import ast as A
from planlang.lang.diagnostics import Diagnostic, Severity

from .analysis import Analysis
from .positions import UTF16, LineIndex
from .symbols import used_file

SEVERITY = {
    Severity.ERROR: L.DiagnosticSeverity.Error,
    Severity.WARNING: L.DiagnosticSeverity.Warning,
    Severity.NOTE: L.DiagnosticSeverity.Information,
}
DOCS = Path(__file__).resolve().parents[2] / "docs" / "diagnostics.md"
SOURCE = "planlang"


def uri(path: str) -> str:
    return from_fs_path(path) or path


def code_href(code: str) -> str | None:
    """A link to the code's entry in docs/diagnostics.md (where the docs are next to the package)."""
    if not DOCS.is_file():
        return None
    return uri(str(DOCS)) + "#" + code.lower()


class Converter:
    """Converts the diagnostics of one analysis, with a line index per file they point into."""

    def __init__(self, analysis: Analysis, encoding: str = UTF16):
        self.analysis = analysis
        self.encoding = encoding
        self._indexes: dict[str, LineIndex] = {analysis.path: LineIndex(analysis.text, encoding)}

    def index(self, path: str) -> LineIndex:
        if path not in self._indexes:
            src = self.analysis.result.sources.get(path)
            text = src.text if src is not None else ""
            if src is None:
                try:
                    text = Path(path).read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError):
                    pass
            self._indexes[path] = LineIndex(text, self.encoding)
        return self._indexes[path]

    def location(self, span) -> L.Location:
        return L.Location(uri(span.file), self.index(span.file).range(span))

    def use_site(self, path: str) -> L.Range:
        """The `use` statement of the open plan that brings in `path` (else the first `use`, else 0:0)."""
        uses = [s for s in self.analysis.module.statements if isinstance(s, A.Use)]
        here = self.index(self.analysis.path)
        for s in uses:
            found = used_file(s, self.analysis.path)
            if found is not None and Path(found).resolve() == Path(path).resolve():
                return here.range(s.span)
        if uses:
            return here.range(uses[0].span)
        return L.Range(L.Position(0, 0), L.Position(0, 0))

    def convert(self, d: Diagnostic) -> L.Diagnostic:
        message = d.message
        if d.help:
            message += f"\nhelp: {d.help}"
        for note in d.notes:
            message += f"\nnote: {note}"
        related = [L.DiagnosticRelatedInformation(self.location(lab.span), lab.message) for lab in d.labels
                   if lab.span.line >= 1]
        if d.span.file == self.analysis.path or d.span.line < 1:
            rng = self.index(self.analysis.path).range(d.span)
        else:
            rng = self.use_site(d.span.file)
            message = f"{Path(d.span.file).name}:{d.span.line}:{d.span.col}: {message}"
            related.insert(0, L.DiagnosticRelatedInformation(self.location(d.span), d.message))
        href = code_href(d.code)
        return L.Diagnostic(
            range=rng,
            message=message,
            severity=SEVERITY[d.severity],
            code=d.code,
            code_description=L.CodeDescription(href) if href else None,
            source=SOURCE,
            related_information=related or None,
            data={"help": d.help} if d.help else None,
        )


def to_lsp(analysis: Analysis, diagnostics=None, encoding: str = UTF16) -> list[L.Diagnostic]:
    """The LSP diagnostics of an analysis (its model-free ones, or the given list)."""
    conv = Converter(analysis, encoding)
    return [conv.convert(d) for d in (analysis.diagnostics if diagnostics is None else diagnostics)]
