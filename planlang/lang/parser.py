"""Parse plan text into the typed AST (`planlang.lang.ast`), with located syntax diagnostics: `parse`,
`parse_file`, `ParseResult`.

The grammar is Lark's (LALR, contextual lexer, `lark_parser.py`). Its parse table and its lexer's regexes
are driven by the fast driver (`driver.py`), whose reductions (`reductions.py`) build AST nodes directly
(`to_ast.py`), with spans, keeping comments for the formatter; at a syntax error it raises the exception
Lark's parser would, and `syntax_errors.py` turns it into a PL1xx diagnostic that says in words what was
expected. After an error `recovery.py` repairs or blanks the offending line and parses again, so one run
reports several independent syntax errors.

Lark's own parser, with the same reductions, runs wherever the fast driver does not: where it meets
something it does not handle (`Fallback`), and for every parse once building or running it failed in any
other way — it reads names Lark does not promise to keep, so a Lark release may break it; it is then
logged once (debug, the `planlang.lang.parser` logger) and never tried again in the process. Both give
the same AST, comments and diagnostics (tests/plan/test_scaling.py, tests/lang/test_parser_fallback.py).

Costs are linear in the text: a 5 MB plan parses in about 4 s (bench/check_time.py, tests/plan/test_scaling.py).
"""
from __future__ import annotations

import gc
import threading
from contextlib import contextmanager
from pathlib import Path as FsPath

from .frozen import value_type
from .logs import debug
from . import ast as A
from .diagnostics import Diagnostic
from .driver import Fallback, FastParser
from .lark_parser import GRAMMAR_PATH, SINK, CommentSink, PlanPostLex, lark_parser, tok_span
from . import parser_cache
from .lexical import code_of
from .parser_cache import NeedLark
from .recovery import MAX_SYNTAX_ERRORS, recover
from .reductions import BUILDER, Reduced, tree_to_ast
from .source import SourceFile, Span, plan_text
from .syntax_errors import (BIDI, MAX_NESTING, accepted, bidi_warnings, diagnostic_for, nesting_diagnostic,
                            unexpected_input)
from .to_ast import CANONICAL_PATH, CANONICAL_SPEC, MAX_DIGITS, ToAst

__all__ = ["GRAMMAR_PATH", "MAX_DIGITS", "MAX_NESTING", "MAX_SYNTAX_ERRORS", "ParseResult", "PlanPostLex", "code_of",
           "no_cycle_collection", "parse", "parse_file", "parse_used"]


# The parts, under the names tests reach them by (`from planlang.lang import parser as P`; P._fast and the
# two canonical checks are read from this module at each parse, so a test may replace them here).
_BUILDER, _SINK, _CommentSink, _ToAst, _Fallback = BUILDER, SINK, CommentSink, ToAst, Fallback
_lark, _tok_span, _accepted, _diagnostic_for, _nesting_diagnostic = (
    lark_parser, tok_span, accepted, diagnostic_for, nesting_diagnostic)
_CANONICAL_PATH, _CANONICAL_SPEC = CANONICAL_PATH, CANONICAL_SPEC


@value_type
class ParseResult:
    module: A.Module
    diagnostics: tuple[Diagnostic, ...]  # syntax errors: the module is empty when there are any
    source: SourceFile
    warnings: tuple[Diagnostic, ...] = ()  # about the text, whether it parses or not (PL225)

    @property
    def ok(self) -> bool:
        return not self.diagnostics


@contextmanager
def no_cycle_collection():
    """Python's cycle collector off for a pass that builds millions of objects and no reference cycles:
    it would walk all of them again and again (half the time of parsing a 5 MB plan). Reference counting
    still frees everything; the collector is back on (if it was on) afterwards."""
    enabled = gc.isenabled()
    if enabled:
        gc.disable()
    try:
        yield
    finally:
        if enabled:
            # what was made is counted as new: the first collection would walk all of it. Move it to
            # the oldest generation (freeze, then unfreeze: two list moves), where it is walked by full
            # collections only, as anything that lives long
            gc.freeze()
            gc.unfreeze()
            gc.enable()


def parse(text: str, path: str = "<plan>") -> ParseResult:
    """Parse one file. Never raises for bad input: syntax errors come back as diagnostics."""
    with no_cycle_collection():
        result = _parse(text, path)
    if BIDI.search(text):
        result = ParseResult(result.module, result.diagnostics, result.source, bidi_warnings(result.source))
    return result


def parse_used(text: str, path: str) -> ParseResult:
    """`parse`, for a module a plan `use`s (the standard library's, a file shared by plans): the result is
    kept for the same text at the same path, so a process parses each such module once, not at every
    check (the language server checks at every edit; the standard library's modules were most of a
    check of gpt2_3d.plan in one process). The last `_USED_KEPT` are kept (texts up to `_USED_MAX_CHARS`: an
    edited big module is not kept in many versions); the result is immutable."""
    if len(text) > _USED_MAX_CHARS:
        return parse(text, path)
    key = (path, text)
    with _USED_LOCK:
        hit = _USED.pop(key, None)
        if hit is not None:
            _USED[key] = hit  # now the most recent
            return hit
    result = parse(text, path)
    with _USED_LOCK:
        _USED[key] = result
        while len(_USED) > _USED_KEPT:
            del _USED[next(iter(_USED))]  # the least recently used
    return result


_USED: dict[tuple[str, str], ParseResult] = {}  # (path, text) -> its parse, least recently used first
_USED_LOCK = threading.Lock()
_USED_KEPT = 32
_USED_MAX_CHARS = 256_000  # the standard library's largest module is under 10 000


def parse_file(path: str | FsPath) -> ParseResult:
    p = FsPath(path)
    return parse(p.read_text(encoding="utf-8"), str(path))


def _parse(text: str, path: str) -> ParseResult:
    text = plan_text(text)  # without a byte-order mark, "\r" line ends as "\n": what every span counts in
    source = SourceFile(path, text)
    whole = _whole_span(source)
    too_deep = nesting_diagnostic(source)
    if too_deep is not None:
        return ParseResult(A.Module((), (), path, span=whole), (too_deep,), source)
    module, comments, diags = recover(source, _attempt)
    if module is None:
        return ParseResult(A.Module((), comments, path, span=whole), diags, source)
    return ParseResult(A.Module(module.statements, comments, path, span=whole), (), source)


def _whole_span(source: SourceFile) -> Span:
    """`source.span(0, len(text))`, without building the file's line index."""
    text = source.text
    last_line_start = text.rfind("\n") + 1
    return Span(source.path, 1, 1, text.count("\n") + 1, len(text) - last_line_start + 1, 0, len(text))


def _builder(source: SourceFile) -> ToAst:
    return ToAst(source, _CANONICAL_PATH, _CANONICAL_SPEC)


def _attempt(source: SourceFile, work: str, build: bool) -> tuple[A.Module | None, list[A.Comment], ToAst]:
    """Parse `work` (the file, or the file with lines blanked after errors): (module, comments, builder),
    or Lark's exception for the first syntax error. The fast driver, unless it cannot be built, meets
    what it does not handle (`Fallback`) or fails in any other way than a syntax error of the text: then
    Lark's parser. Without `build`, the module is None."""
    fast = _fast(build)
    while fast is not None:
        builder = _builder(source)
        try:
            module, comments = fast.parse(work, builder)
            return module, comments, builder
        except unexpected_input():  # evaluated only when the parse raises: Lark loads on the error path
            raise  # the text's syntax error, as Lark's parser raises it
        except NeedLark:  # the cached driver at a syntax error, its tables not Lark's now: parse again with Lark's
            fast = _fast_from_lark(build)
            continue
        except Fallback:
            pass
        except Exception as exc:  # noqa: BLE001 -- any failure of the driver: Lark's parser gives the same
            _FAST[bool(build)] = None
            _fell_back("running", exc)
        break
    SINK.tokens = []
    builder = BUILDER.ast = _builder(source)  # a fresh one: a failed parse may have built some nodes
    parsed = lark_parser().parse(work)
    if isinstance(parsed, Reduced):  # what the reductions installed in it build
        built = parsed.value
    else:  # they could not be installed: Lark's own tree
        built = tree_to_ast(parsed, builder) if build else None
    return built, [A.Comment(str(t), span=tok_span(source, t)) for t in SINK.tokens], builder


_FAST: dict[bool, FastParser | None] = {}  # build -> the fast driver, or None where it failed
_FROM_LARK: dict[bool, FastParser | None] = {}  # build -> the driver built from Lark's parser, or None
_FAST_LOCK = threading.RLock()
_FELL_BACK: list[str] = []  # what was logged (once per process)


def _fast(build: bool = True) -> FastParser | None:
    """The fast driver (with `build` False, one that only checks the syntax: its reductions build
    nothing); None when it cannot be built or failed before. The building one is read from the parser
    cache where it can be (`parser_cache`: no Lark parser is loaded), else built from Lark and cached."""
    key = bool(build)
    try:
        return _FAST[key]
    except KeyError:
        pass
    with _FAST_LOCK:
        if key not in _FAST:
            fast: FastParser | None = parser_cache.load(lambda: _fast_from_lark(True)) if key else None
            if fast is None:
                fast = _fast_from_lark(key)
                if fast is not None and key:
                    parser_cache.store(fast)
            _FAST[key] = fast
        return _FAST[key]


def _fast_from_lark(build: bool) -> FastParser | None:
    """The fast driver built from Lark's parser (once), or None when it cannot be built."""
    key = bool(build)
    with _FAST_LOCK:
        if key not in _FROM_LARK:
            try:
                _FROM_LARK[key] = FastParser(lark_parser(), key)
            except Exception as exc:  # noqa: BLE001 -- Lark's tables or lexers not as the driver reads them
                _FROM_LARK[key] = None
                _fell_back("building", exc)
        return _FROM_LARK[key]


def _fell_back(when: str, exc: BaseException) -> None:
    """Log, once per process, that the fast driver failed and Lark's parser parses instead."""
    if not _FELL_BACK:
        _FELL_BACK.append(when)
        debug(__name__, "the fast parser failed %s (%s: %s); Lark's own parser parses instead (the same AST, "
                  "about 3x slower)", when, type(exc).__name__, exc, exc_info=exc)
