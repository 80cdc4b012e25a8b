"""The editing features of the server (registered by `register`, called from server.build_server):
code actions, rename and references, document symbols and folding, inlay hints, signature help, range
formatting and pull diagnostics. Each handler reads the document's state from the server (server.py)
and answers with the modules that compute it (actions, rename, outline, inlay, signature, formatting).

A request that cannot be done for a user's reason (a rename of a keyword, a name that is taken) is
answered with an error response whose message says why (code -32803, RequestFailed); it is logged
without a traceback.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Protocol

from lsprotocol import types as L
from pygls.exceptions import JsonRpcException
from pygls.lsp.server import LanguageServer
from pygls.workspace import Workspace

from .actions import KINDS, code_actions, wanted
from .analysis import Analysis, references
from .diagnostics import to_lsp, uri
from .fill_holes import FILL, fill_actions, is_fill, resolve as resolve_fill
from .formatting import range_format_edits
from .inlay import inlay_hints
from .outline import document_symbols, folding_ranges
from .positions import LineIndex
from .rename import RenameRefused, find, occurrences, prepare, read_text, rename
from .model_checks import ModelInsight
from .signature import signature_help

log = logging.getLogger("planlang.lsp")
REQUEST_FAILED = -32803  # LSP's RequestFailed: the request was valid, the server cannot do it
SIGNATURE_TRIGGERS = ["(", ","]


class DocState(Protocol):
    """What these features read of server.DocState (server.py imports this module, not the reverse)."""

    uri: str
    analysis: Analysis
    good: Analysis | None


class PlanServer(Protocol):
    """What these features use of server.PlanServer."""

    @property
    def workspace(self) -> Workspace: ...

    @property
    def encoding(self) -> str: ...

    def state(self, uri: str) -> Any: ...

    def offset(self, st: Any, pos: L.Position) -> int: ...

    def open_text(self, path: str) -> str | None: ...

    def diagnostics_of(self, st: Any) -> list: ...

    def insight_for_text(self, st: Any) -> ModelInsight | None: ...


class Refused(JsonRpcException):
    """An error response for a user's mistake (pygls logs the exception it answers with)."""

    CODE = REQUEST_FAILED


class _QuietRefusals(logging.Filter):
    """pygls logs every error response with its traceback; a refusal is not a server error."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, Refused):
            record.exc_info, record.exc_text = None, None
            record.msg, record.args = "refused: %s", (exc.message,)
            record.levelno, record.levelname = logging.INFO, "INFO"
            return logging.getLogger(record.name).isEnabledFor(logging.INFO)
        return True


logging.getLogger("pygls.protocol.json_rpc").addFilter(_QuietRefusals())


def _refuse(err: RenameRefused) -> Refused:
    return Refused(str(err), REQUEST_FAILED)


def text_of(ls: PlanServer, path: str) -> str:
    """A file's text as the editor has it: its open buffer, else the file on disk ("" when unreadable)."""
    text = ls.open_text(path)
    if text is not None:
        return text
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""


def _reader(ls: PlanServer):
    return lambda path: text_of(ls, path)


def _resolves_edits(ls: Any) -> bool:
    """Whether the client can resolve a code action's edit (codeAction.resolveSupport lists "edit")."""
    caps = ls.client_capabilities
    ca = caps.text_document.code_action if caps is not None and caps.text_document is not None else None
    return ca is not None and ca.resolve_support is not None and "edit" in ca.resolve_support.properties


def _tree(st: DocState):
    """The analysis whose tree stands for the current text at the same offsets: the current one, else
    its recovered version (broken lines blanked), else None."""
    return st.analysis if st.analysis.parses else st.analysis.recovered


def register(server: LanguageServer) -> None:
    @server.feature(L.TEXT_DOCUMENT_CODE_ACTION, L.CodeActionOptions(code_action_kinds=KINDS + [FILL],
                                                                      resolve_provider=True))
    def on_code_action(ls: PlanServer, params: L.CodeActionParams):
        st = ls.state(params.text_document.uri)
        only = [str(getattr(k, "value", k)) for k in params.context.only] if params.context.only else None
        out = code_actions(st.analysis, ls.diagnostics_of(st), st.uri, params.range, ls.encoding, _reader(ls), only)
        if wanted(FILL, only) and _resolves_edits(ls):  # the solve runs at resolve (fill_holes.py)
            out += fill_actions(st.analysis.text, st.uri, st.version, params.range, ls.encoding)
        return out

    @server.feature(L.CODE_ACTION_RESOLVE)
    async def on_code_action_resolve(ls: PlanServer, action: L.CodeAction):
        return await resolve_fill(ls, action) if is_fill(action) else action

    @server.feature(L.TEXT_DOCUMENT_PREPARE_RENAME)
    def on_prepare_rename(ls: PlanServer, params: L.PrepareRenameParams):
        st = ls.state(params.text_document.uri)
        try:
            span, text = prepare(st.analysis, ls.offset(st, params.position))
        except RenameRefused as err:
            raise _refuse(err) from None
        rng = LineIndex(st.analysis.text, ls.encoding).offset_range(span.start, span.end)
        return L.PrepareRenamePlaceholder(range=rng, placeholder=text)

    @server.feature(L.TEXT_DOCUMENT_RENAME)
    def on_rename(ls: PlanServer, params: L.RenameParams):
        st = ls.state(params.text_document.uri)
        try:
            spans = rename(st.analysis, ls.offset(st, params.position), params.new_name)
        except RenameRefused as err:
            raise _refuse(err) from None
        index = LineIndex(st.analysis.text, ls.encoding)
        edits = [L.TextEdit(index.offset_range(s.start, s.end), params.new_name) for s in spans]
        return L.WorkspaceEdit(changes={st.uri: edits})

    @server.feature(L.TEXT_DOCUMENT_REFERENCES)
    def on_references(ls: PlanServer, params: L.ReferenceParams):
        st = ls.state(params.text_document.uri)
        analysis = _tree(st)
        found = find(analysis, ls.offset(st, params.position)) if analysis is not None else None
        if analysis is None or found is None:
            return []
        target = found[1]
        index = LineIndex(analysis.text, ls.encoding)
        decl = target.decl
        decl_here = decl is not None and Path(decl.path).resolve() == Path(analysis.path).resolve()
        out = []
        for s in occurrences(analysis, target).spans:
            if decl_here and decl is not None and s.start == decl.span.start and not params.context.include_declaration:
                continue
            out.append(L.Location(st.uri, index.offset_range(s.start, s.end)))
        if decl is not None and not decl_here and params.context.include_declaration:
            text = read_text(analysis, decl.path)
            out.insert(0, L.Location(uri(str(Path(decl.path).resolve())), LineIndex(text, ls.encoding).range(decl.span)))
        return out

    @server.feature(L.TEXT_DOCUMENT_DOCUMENT_SYMBOL)
    def on_document_symbol(ls: PlanServer, params: L.DocumentSymbolParams):
        return document_symbols(_tree(ls.state(params.text_document.uri)), ls.encoding)

    @server.feature(L.TEXT_DOCUMENT_FOLDING_RANGE)
    def on_folding_range(ls: PlanServer, params: L.FoldingRangeParams):
        return folding_ranges(_tree(ls.state(params.text_document.uri)), ls.encoding)

    @server.feature(L.TEXT_DOCUMENT_INLAY_HINT)
    def on_inlay_hint(ls: PlanServer, params: L.InlayHintParams):
        st = ls.state(params.text_document.uri)
        return inlay_hints(st.analysis, params.range, ls.encoding, ls.insight_for_text(st))

    @server.feature(L.TEXT_DOCUMENT_SIGNATURE_HELP, L.SignatureHelpOptions(trigger_characters=SIGNATURE_TRIGGERS))
    def on_signature_help(ls: PlanServer, params: L.SignatureHelpParams):
        st = ls.state(params.text_document.uri)
        return signature_help(st.analysis.text, ls.offset(st, params.position), references(st.analysis, st.good))

    @server.feature(L.TEXT_DOCUMENT_RANGE_FORMATTING)
    def on_range_formatting(ls: PlanServer, params: L.DocumentRangeFormattingParams):
        doc = ls.workspace.get_text_document(params.text_document.uri)
        return range_format_edits(doc.source, params.range, doc.path or params.text_document.uri, ls.encoding)

    @server.feature(L.TEXT_DOCUMENT_DIAGNOSTIC, L.DiagnosticOptions(identifier="planlang", inter_file_dependencies=True,
                                                                    workspace_diagnostics=False))
    def on_diagnostic(ls: PlanServer, params: L.DocumentDiagnosticParams):
        st = ls.state(params.text_document.uri)
        items = to_lsp(st.analysis, ls.diagnostics_of(st), ls.encoding)
        return L.RelatedFullDocumentDiagnosticReport(items=items)
