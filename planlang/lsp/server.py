"""The planlang language server (pygls): diagnostics (pushed, or pulled by a client that asks), hover,
definition, formatting, completion and semantic tokens for .plan files, and the editing features wired
in editing.py (code actions, rename, references, symbols, folding, inlay hints, signature help, range
formatting). Start it with `planlang lsp` or `python -m planlang.lsp` (stdio).

Threads: every handler runs on the event-loop thread, so model-free analysis (milliseconds) answers at
once after each change. Model-aware checks (opt-in: initializationOptions {"modelChecks": true} or the
setting `planlang.modelChecks`) build the model on the meta device, which takes seconds: they run on
one worker thread after a pause in typing (`planlang.modelCheckDelay`, default 0.5 s), their result is
published only if the document has not changed meanwhile (parsing is re-entrant: no lock).
They run again when the model's source changes (a file the model was built from reads differently):
on a `workspace/didChangeWatchedFiles` notification (the server asks for `**/*.py` when the client can
register watchers dynamically), and when a hover or completion finds the source changed, which until
then answers without the outdated model facts.
The protocol owns stdout: `main` moves everything else that writes to fd 1 (a model factory's
print) to stderr. Logs go to stderr.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from lsprotocol import types as L
from pygls.lsp.server import LanguageServer

from planlang.lang.version import __version__
from planlang.lang.diagnostics import Diagnostic
from planlang.lang.source import lone_cr_as_lf

from .analysis import Analysis, analyze, reader, references, stand_in_for
from .completion import completion
from .diagnostics import to_lsp, uri
from .editing import register as register_editing, text_of
from .formatting import format_edits
from .hover import hover
from .model_checks import ModelChecker, ModelInsight, model_layer_available
from .positions import UTF16, LineIndex
from .symbols import definition, symbol_at, word_symbol
from .tokens import LEGEND, semantic_tokens

log = logging.getLogger("planlang.lsp")
TRIGGER_CHARACTERS = [".", "[", "(", " ", ","]
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


@dataclass(frozen=True)
class Settings:
    """The server's settings (section `planlang` of the workspace configuration)."""

    model_checks: bool = False
    model_check_delay: float = 0.5  # seconds of quiet before model-aware checks run

    def __str__(self) -> str:
        return f"modelChecks={self.model_checks}, modelCheckDelay={self.model_check_delay}"

    def updated(self, values) -> "Settings":
        """These settings with the keys of `values` applied ({"modelChecks": ...} or {"planlang": {...}})."""
        if not isinstance(values, dict):
            return self
        if isinstance(values.get("planlang"), dict):
            values = values["planlang"]
        out = self
        if isinstance(values.get("modelChecks"), bool):
            out = replace(out, model_checks=values["modelChecks"])
        delay = values.get("modelCheckDelay")
        if isinstance(delay, (int, float)) and not isinstance(delay, bool) and 0 <= delay <= 60:
            out = replace(out, model_check_delay=float(delay))
        return out


@dataclass
class DocState:
    """What the server knows about one open document."""

    uri: str
    path: str
    version: int | None
    analysis: Analysis
    good: Analysis | None = None  # the latest version that parsed (names for completion while typing)
    insight: ModelInsight | None = None  # the latest model-aware run
    model_only: list[Diagnostic] = field(default_factory=list)  # its diagnostics the model-free run lacks
    model_lines: int = 0  # line count of the text it ran on
    model_text: str | None = None  # the text it ran on
    timer: asyncio.TimerHandle | None = None
    running: bool = False
    rerun: bool = False


class PlanServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__("planlang", __version__, text_document_sync_kind=L.TextDocumentSyncKind.Incremental)
        self.docs: dict[str, DocState] = {}
        self.settings = Settings()
        self.model_checker: ModelChecker | None = None
        self.model_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="planlang-model")
        self._warned_no_model = False
        self._watching = False

    # ------------------------------------------------------------------ helpers
    @property
    def encoding(self) -> str:
        try:
            enc = self.workspace.position_encoding
        except RuntimeError:  # not initialized yet
            return UTF16
        return str(getattr(enc, "value", enc) or UTF16)

    def open_text(self, path: str) -> str | None:
        """The editor's text of an open document (used modules read it instead of the disk)."""
        want = os.path.realpath(path)
        for st in self.docs.values():
            if os.path.realpath(st.path) == want:
                return self.workspace.get_text_document(st.uri).source
        return None

    def model_checks_on(self) -> bool:
        if not self.settings.model_checks:
            return False
        if not model_layer_available():
            if not self._warned_no_model:
                self._warned_no_model = True
                self.window_log_message(L.LogMessageParams(
                    L.MessageType.Warning, "planlang: model checks are on, but torch is not installed here"))
            return False
        return True

    def apply_settings(self, settings: Settings) -> None:
        """New settings; open documents are checked again when they change what is checked."""
        before, self.settings = self.settings, settings
        if settings != before:
            log.info("settings: %s", settings)
            if settings.model_checks and _loop_running():
                asyncio.ensure_future(self.watch_model_sources())
            for doc_uri in list(self.docs):
                self.refresh(doc_uri)

    async def watch_model_sources(self) -> None:
        """Ask the client to report changes of Python files (the model's source), once, when it can."""
        if self._watching or not self.settings.model_checks:
            return
        ws = self.client_capabilities.workspace if self.client_capabilities else None
        watched = ws.did_change_watched_files if ws is not None else None
        if watched is None or not watched.dynamic_registration:
            return
        self._watching = True
        try:
            await self.client_register_capability_async(L.RegistrationParams([L.Registration(
                "planlang-model-sources", L.WORKSPACE_DID_CHANGE_WATCHED_FILES,
                L.DidChangeWatchedFilesRegistrationOptions([L.FileSystemWatcher(glob_pattern="**/*.py")]))]))
        except Exception as err:  # noqa: BLE001 - no watcher: hovers still notice a changed model
            log.info("could not register the file watcher: %r", err)

    def current_insight(self, st: DocState, quick: bool = True) -> ModelInsight | None:
        """The latest model insight, unless the model's source changed since it was built: then the
        insight without its model facts (marked stale), and the model checks are scheduled again.
        `quick`: files whose size and mtime_ns are unchanged are not read again (every request asks)."""
        ins = st.insight
        if ins is None or ins.stale or not self.model_checks_on():
            return ins
        if ins.source_changed(quick):
            log.info("the model's source changed: checking %s again", st.uri)
            st.insight = ins = ins.without_model()
            self.schedule_model_check(st)
        return ins

    def model_sources_changed(self) -> None:
        """Python files changed: check again every document whose model was built from one of them,
        or whose model did not build (a fix may have landed)."""
        if not self.model_checks_on():
            return
        for st in list(self.docs.values()):
            ins = st.insight
            if ins is None or ins.stale:
                continue
            if ins.facts is None and ins.plan is not None and ins.plan.model is not None:
                self.schedule_model_check(st)
            else:
                self.current_insight(st, quick=False)

    # ------------------------------------------------------------------ analysis and diagnostics
    def refresh(self, uri: str) -> DocState:
        doc = self.workspace.get_text_document(uri)
        path = doc.path or uri
        analysis = analyze(doc.source, path, reader(self.open_text))
        st = self.docs.get(uri)
        if st is None:
            st = self.docs[uri] = DocState(uri, path, doc.version, analysis)
        st.version, st.analysis = doc.version, analysis
        if analysis.parses:
            st.good = analysis
        self.publish(st)
        if self.model_checks_on():
            self.schedule_model_check(st)
        return st

    def diagnostics_of(self, st: DocState) -> list[Diagnostic]:
        """Model-free diagnostics of the current text, plus the model-aware ones of the latest model run
        while they can still be placed (same line count, and the text parses)."""
        diags = list(st.analysis.diagnostics)
        lines = st.analysis.text.count("\n")
        if st.model_only and st.analysis.parses and lines == st.model_lines and self.settings.model_checks:
            have = {_key(d) for d in diags}
            diags += [d for d in st.model_only if _key(d) not in have]
        diags.sort(key=lambda d: (d.span.file != st.path, d.span.line, d.span.col, d.code))
        return diags

    def insight_for_text(self, st: DocState) -> ModelInsight | None:
        """The latest model insight when it was computed from the current text (its spans hold)."""
        ins = self.current_insight(st)
        if ins is None or not self.settings.model_checks or st.model_text != st.analysis.text:
            return None
        return ins

    @property
    def pull_diagnostics(self) -> bool:
        """Whether the client pulls diagnostics (textDocument/diagnostic): then none are pushed, and a
        finished model-aware run asks the client to pull again."""
        caps = self.client_capabilities
        return caps is not None and caps.text_document is not None and caps.text_document.diagnostic is not None

    def publish(self, st: DocState) -> None:
        if self.pull_diagnostics:
            return
        self.text_document_publish_diagnostics(L.PublishDiagnosticsParams(
            st.uri, to_lsp(st.analysis, self.diagnostics_of(st), self.encoding), version=st.version))

    def model_results_ready(self, st: DocState) -> None:
        """A model-aware run finished for the current text: push its diagnostics, or ask a pulling client
        to pull again, and to ask for inlay hints again (they show its shapes and estimates)."""
        self.publish(st)
        ws = self.client_capabilities.workspace if self.client_capabilities else None
        if self.pull_diagnostics and ws is not None and ws.diagnostics is not None and ws.diagnostics.refresh_support:
            self.workspace_diagnostic_refresh(None)
        if ws is not None and ws.inlay_hint is not None and ws.inlay_hint.refresh_support:
            self.workspace_inlay_hint_refresh(None)

    def schedule_model_check(self, st: DocState) -> None:
        if st.timer is not None:
            st.timer.cancel()
        loop = asyncio.get_running_loop()
        st.timer = loop.call_later(self.settings.model_check_delay,
                                   lambda: asyncio.ensure_future(self.model_check(st.uri)))

    async def model_check(self, uri: str) -> None:
        st = self.docs.get(uri)
        if st is None:
            return
        st.timer = None
        if not self.model_checks_on():
            return
        if st.running:  # one run per document at a time; the newest text runs next
            st.rerun = True
            return
        version, analysis = st.version, st.analysis
        if not analysis.parses:
            return  # nothing model-aware to say about text that does not parse; keep the last insight
        if self.model_checker is None:
            self.model_checker = ModelChecker()
        read = reader(_snapshot(self))
        st.running = True
        try:
            insight = await asyncio.get_running_loop().run_in_executor(
                self.model_pool, self.model_checker.run, analysis.text, analysis.path, read)
        except Exception as err:  # noqa: BLE001 - a bug or a model that breaks torch: keep serving
            log.exception("model checks failed for %s", uri)
            self.window_log_message(L.LogMessageParams(L.MessageType.Error, f"planlang: model checks failed: {err!r}"))
            insight = None
        finally:
            st.running = False
        if self.docs.get(uri) is not st:
            return  # closed meanwhile
        if st.rerun:
            st.rerun = False
            self.schedule_model_check(st)
        if insight is None or st.version != version:
            return  # stale: the newer text is scheduled
        fast = {_key(d) for d in analysis.diagnostics}
        st.insight = insight
        st.model_only = [d for d in insight.diagnostics if _key(d) not in fast]
        st.model_lines = analysis.text.count("\n")
        st.model_text = analysis.text
        self.model_results_ready(st)

    def close(self, uri: str) -> None:
        st = self.docs.pop(uri, None)
        if st is not None and st.timer is not None:
            st.timer.cancel()
        self.text_document_publish_diagnostics(L.PublishDiagnosticsParams(uri, []))

    def state(self, uri: str) -> DocState:
        st = self.docs.get(uri)
        doc = self.workspace.get_text_document(uri)
        if st is None or st.version != doc.version or st.analysis.text != lone_cr_as_lf(doc.source):
            st = self.refresh(uri)
        return st

    def offset(self, st: DocState, pos: L.Position) -> int:
        return LineIndex(st.analysis.text, self.encoding).offset(pos)


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _key(d: Diagnostic) -> tuple:
    return d.code, d.span, d.message


def _snapshot(server: PlanServer):
    texts = {os.path.realpath(st.path): server.workspace.get_text_document(st.uri).source
             for st in server.docs.values()}
    return lambda p: texts.get(os.path.realpath(p))


# ---------------------------------------------------------------------- features
def build_server() -> PlanServer:
    server = PlanServer()

    @server.feature(L.INITIALIZE)
    def initialize(ls: PlanServer, params: L.InitializeParams):
        ls.settings = ls.settings.updated(params.initialization_options)
        log.info("planlang lsp %s: %s", __version__, ls.settings)

    @server.feature(L.INITIALIZED)
    async def initialized(ls: PlanServer, params: L.InitializedParams):
        ws = ls.client_capabilities.workspace
        if ws is not None and ws.configuration:
            await pull_configuration(ls)
        await ls.watch_model_sources()

    @server.feature(L.WORKSPACE_DID_CHANGE_WATCHED_FILES)
    def did_change_watched_files(ls: PlanServer, params: L.DidChangeWatchedFilesParams):
        ls.model_sources_changed()

    @server.feature(L.WORKSPACE_DID_CHANGE_CONFIGURATION)
    async def did_change_configuration(ls: PlanServer, params: L.DidChangeConfigurationParams):
        if isinstance(params.settings, dict) and params.settings:
            ls.apply_settings(ls.settings.updated(params.settings))
        else:
            await pull_configuration(ls)

    @server.feature(L.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: PlanServer, params: L.DidOpenTextDocumentParams):
        ls.refresh(params.text_document.uri)

    @server.feature(L.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: PlanServer, params: L.DidChangeTextDocumentParams):
        ls.refresh(params.text_document.uri)

    @server.feature(L.TEXT_DOCUMENT_DID_SAVE)
    def did_save(ls: PlanServer, params: L.DidSaveTextDocumentParams):
        ls.refresh(params.text_document.uri)

    @server.feature(L.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: PlanServer, params: L.DidCloseTextDocumentParams):
        ls.close(params.text_document.uri)

    @server.feature(L.TEXT_DOCUMENT_HOVER)
    def on_hover(ls: PlanServer, params: L.HoverParams):
        st = ls.state(params.text_document.uri)
        analysis, offset = stand_in_for(st.analysis, st.good, ls.offset(st, params.position))
        h = hover(analysis, offset, ls.current_insight(st), ls.encoding, ls.settings.model_checks,
                  references(st.analysis, st.good))
        if h is not None and analysis is not st.analysis and analysis is not st.analysis.recovered:
            h.range = None  # the range was computed on the stand-in's text
        return h

    @server.feature(L.TEXT_DOCUMENT_DEFINITION)
    def on_definition(ls: PlanServer, params: L.DefinitionParams):
        st = ls.state(params.text_document.uri)
        analysis, offset = stand_in_for(st.analysis, st.good, ls.offset(st, params.position))
        sym = symbol_at(analysis, offset)
        place = definition(analysis, sym) if sym is not None else None
        if place is None and not analysis.parses:  # a line no tree covers: the name under the cursor
            for ref in references(st.analysis, st.good):
                sym = word_symbol(analysis.text, offset, [ref], analysis.source)
                place = definition(ref, sym) if sym is not None else None
                if place is not None:
                    break
        if place is None:
            return None
        same = place.path == st.path
        text = st.analysis.text if same else text_of(ls, place.path)
        rng = LineIndex(text, ls.encoding).range(place.span)
        return L.Location(st.uri if same else uri(str(Path(place.path).resolve())), rng)

    @server.feature(L.TEXT_DOCUMENT_FORMATTING)
    def on_formatting(ls: PlanServer, params: L.DocumentFormattingParams):
        doc = ls.workspace.get_text_document(params.text_document.uri)
        return format_edits(doc.source, doc.path or params.text_document.uri, ls.encoding)

    @server.feature(L.TEXT_DOCUMENT_COMPLETION, L.CompletionOptions(trigger_characters=TRIGGER_CHARACTERS))
    def on_completion(ls: PlanServer, params: L.CompletionParams):
        st = ls.state(params.text_document.uri)
        return completion(st.analysis, ls.offset(st, params.position), st.good, ls.current_insight(st), ls.encoding)

    @server.feature(L.TEXT_DOCUMENT_SEMANTIC_TOKENS_FULL, LEGEND)
    def on_semantic_tokens(ls: PlanServer, params: L.SemanticTokensParams):
        st = ls.state(params.text_document.uri)
        return semantic_tokens(st.analysis, ls.encoding)

    register_editing(server)

    @server.feature(L.SHUTDOWN)
    def on_shutdown(ls: PlanServer, params=None):
        for st in ls.docs.values():
            if st.timer is not None:
                st.timer.cancel()
        ls.model_pool.shutdown(wait=False, cancel_futures=True)

    return server


async def pull_configuration(ls: PlanServer) -> None:
    try:
        values = await ls.workspace_configuration_async(
            L.ConfigurationParams([L.ConfigurationItem(section="planlang")]))
    except Exception as err:  # noqa: BLE001 - a client that cannot answer keeps the current settings
        log.info("workspace/configuration failed: %r", err)
        return
    if values:
        ls.apply_settings(ls.settings.updated(values[0]))




def main(argv: list[str] | None = None) -> None:
    """Serve the language server protocol on stdin/stdout until the client exits.

    `--stdio` is accepted and changes nothing (stdio is the only transport; VS Code's client adds the
    flag); `--log-level` sets the stderr log level (default: $PLANLANG_LSP_LOG, else WARNING).
    """

    parser = argparse.ArgumentParser(prog="planlang lsp", description="The planlang language server (stdio).")
    parser.add_argument("--stdio", action="store_true", help="serve on stdin/stdout (the default)")
    parser.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS,
                        default=os.environ.get("PLANLANG_LSP_LOG", "WARNING").upper(),
                        help="stderr log level (default: $PLANLANG_LSP_LOG, else WARNING)")
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=args.log_level if args.log_level in LOG_LEVELS else "WARNING",
                        format="planlang-lsp %(levelname)s %(name)s: %(message)s")
    serve_stdio()


def serve_stdio() -> None:
    stdin = sys.stdin.buffer
    # The protocol gets its own handle on the real stdout; fd 1 and sys.stdout go to stderr, so nothing
    # else (a model factory's print, a library's warning) can corrupt the message stream.
    protocol_out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    build_server().start_io(stdin, protocol_out)
