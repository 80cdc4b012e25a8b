"""Parse plan text into the typed AST (`planlang.lang.ast`), with located syntax diagnostics.

The grammar is Lark's (LALR, contextual lexer): its parse table and its lexer's regexes are what parse.
`_FastParser` drives them in one loop whose reductions build AST nodes directly, with spans, keeps comments
for the formatter, and at a syntax error raises the exception Lark's parser would; this module turns those
into PL1xx diagnostics that say in words what was expected. After an error it blanks the offending line
and parses again, so one run reports several independent syntax errors. Lark's own parser (with the same
reductions, `_install_builders`) runs only where the fast one meets something it does not handle.

Costs are linear in the text: a 5 MB plan parses in about 4 s (bench/check_time.py, tests/plan/test_scaling.py).
"""
from __future__ import annotations

import gc
import re
import threading
import unicodedata
from sys import intern
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path as FsPath

from lark import Lark, Token
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken
from lark.lexer import LexerState, LexerThread, LineCounter, PatternStr, TextSlice, UnlessCallback
from lark.parse_tree_builder import ChildFilterLALR_NoPlaceholders, maybe_create_child_filter
from lark.parsers.lalr_analysis import Shift
from lark.parsers.lalr_interactive_parser import InteractiveParser
from lark.parsers.lalr_parser_state import ParseConf, ParserState

from . import ast as A
from .diagnostics import Diagnostic, Severity
from .render._common import escape_char
from .source import SourceFile, Span, plan_text
from .spec_text import is_canonical
from .syntax_errors import STATEMENT_KEYWORDS, describe_unexpected_token, quote_source

# package data (in the wheel too); `grammar/` at the top of the checkout links here
GRAMMAR_PATH = FsPath(__file__).resolve().parents[1] / "grammar" / "planlang.lark"
MAX_SYNTAX_ERRORS = 20
MAX_NESTING = 64  # brackets open at once (PL106); every pass over the tree recurses once per level
MAX_DIGITS = 100  # digits of one number literal (PL107); int() refuses more than 4300


class PlanPostLex:
    """Newline handling: ignore newlines inside ( ) and [ ], fold runs of newlines into one."""

    always_accept = ("_NL",)

    def process(self, stream):
        # No lookahead here: the contextual lexer lexes each token in the parser state left by the
        # tokens already yielded, so a newline must be passed on before the next token is read.
        depth = 0
        last_nl = True  # newlines before the first statement are dropped too
        for tok in stream:
            if tok.type == "_NL":
                if depth == 0 and not last_nl:
                    last_nl = True
                    yield tok
                continue
            last_nl = False
            if tok.type in ("LPAR", "LSQB"):
                depth += 1
            elif tok.type in ("RPAR", "RSQB") and depth > 0:
                depth -= 1
            yield tok


class _CommentSink:
    """The COMMENT tokens of the parse running in this thread. Lark's lexer callbacks belong to the one
    cached parser, so the list is thread-local: parses in several threads (the language server's) do
    not see each other's comments, and need no lock."""

    def __init__(self) -> None:
        self._local = threading.local()

    @property
    def tokens(self) -> list[Token]:
        return self._local.__dict__.setdefault("tokens", [])

    @tokens.setter
    def tokens(self, value: list[Token]) -> None:
        self._local.tokens = value

    def __call__(self, tok: Token) -> Token:
        self.tokens.append(tok)
        return tok


_SINK = _CommentSink()


_BUILDER = threading.local()  # `.ast`: the _ToAst of the parse running in this thread


@lru_cache(maxsize=1)
def _lark() -> Lark:
    """The one LALR parser, whose reductions build AST nodes directly (`_install_builders`): no Lark
    tree is built and walked again, and a node's span comes from its first and last tokens."""
    lark = Lark(
        GRAMMAR_PATH.read_text(),
        parser="lalr",
        lexer="contextual",
        postlex=PlanPostLex(),
        maybe_placeholders=True,
        lexer_callbacks={"COMMENT": _SINK},
        cache=True,
    )
    _install_builders(lark)
    return lark


def _fast(build: bool = True) -> "_FastParser":
    """The fast parser; with `build` False it only checks the syntax (its reductions build nothing)."""
    return _fast_parser(bool(build))


@lru_cache(maxsize=None)
def _fast_parser(build: bool) -> "_FastParser":
    return _FastParser(_lark(), build)


class _Reduced:
    """A reduced rule on the parser's value stack: what it built and the first and last tokens of the text
    it covers (None, None for a rule that matched nothing). These are Lark's "container" positions
    (`propagate_positions`): tokens the tree leaves out still count, so a `shard` statement starts at
    `shard`, an index `[3]` covers its brackets and a `device` declaration ends at its `}`."""

    __slots__ = ("value", "first", "last")

    def __init__(self, value, first, last):
        self.value = value
        self.first = first
        self.last = last


def _install_builders(lark: Lark) -> None:
    """Replace the callbacks of Lark's LALR parser (which build a `Tree`, shaped by `?rule`, `_rule`,
    filtered tokens and `[ ]` placeholders) by ones that shape the children the same way and hand them to
    the `_ToAst` method of the rule. Done once per process: the current builder is thread-local."""
    lark.parser.parser.parser.callbacks = _rule_callbacks(lark, lark_tokens=True)  # ParsingFrontend -> LALR_Parser -> _Parser


def _rule_callbacks(lark: Lark, lark_tokens: bool) -> dict:
    """Grammar rule -> reduction callback. With `lark_tokens` the callbacks take Lark's `Token`s (Lark's
    own parser), else the tuples of `_FastParser`."""
    callbacks = {}
    for rule in lark.rules:
        opts = rule.options
        name = rule.alias or opts.template_source or rule.origin.name
        flt = maybe_create_child_filter(rule.expansion, opts.keep_all_tokens, False, opts.empty_indices)
        if flt is None:
            include = tuple((i, False, 0) for i in range(len(rule.expansion)))
            tail = 0
        elif flt.func is ChildFilterLALR_NoPlaceholders:
            include, tail = tuple((i, x, 0) for i, x in flt.args[0]), 0
        else:
            include, tail = tuple(flt.args[0]), flt.args[1]
        expand1 = bool(opts.expand1 and not rule.alias)
        method = getattr(_ToAst, name, None)
        if name.startswith("_"):
            method = None  # spliced into the parent, as Lark's `_rule`
        elif method is None and not expand1:
            raise TypeError(f"no AST builder for grammar rule `{name}`")
        if expand1 and (tail or any(x or n for _, x, n in include)):
            raise TypeError(f"`?{rule.origin.name}` with inlined children or placeholders is not supported")
        if lark_tokens:
            callbacks[rule] = _callback(method, include, tail, expand1, lark_tokens)
        else:
            terminals = [sym.is_term for sym in rule.expansion]
            callbacks[rule] = _compiled_callback(method, include, tail, expand1, terminals)
    return callbacks


def _compiled_callback(method, include, tail, expand1, terminals):
    """`_callback` for the fast parser, written out for one rule (its children's shape is known): a
    reduction is run for every rule of every statement of a big plan."""
    size = len(terminals)
    body = []
    if expand1 and size == 1:  # `?rule: child`: the child itself, in the same container
        body.append("return children[0]")
    else:
        if size:  # positions: the first and last children that have one (Lark's container rule)
            body += ["c = children[0]",
                     "first = c.first if c.__class__ is _Reduced else c",
                     "c = children[-1]",
                     "last = c.last if c.__class__ is _Reduced else c",
                     "if first is None or last is None:",
                     "    first, last = _positions(children)"]
        else:
            body.append("first = last = None")
        if expand1:  # one child kept: the child itself, in this container
            (i, _, _), = include
            body += [f"c = children[{i}]",
                     "if c.__class__ is not _Reduced:",
                     "    return c",
                     "return _Reduced(c.value, first, last)"]
        else:
            def value(i: int) -> str:
                if terminals[i]:
                    return f"children[{i}]"
                return f"(children[{i}].value if children[{i}].__class__ is _Reduced else children[{i}])"

            if not any(splice for _, splice, _ in include):
                parts = []
                for i, _, nones in include:
                    parts += ["None"] * nones + [value(i)]
                parts += ["None"] * tail
                body.append(f"items = [{', '.join(parts)}]")
            else:
                body.append("items = []")
                for i, splice, nones in include:
                    if nones:
                        body.append(f"items += [None] * {nones}")
                    if splice:  # a `_rule`: its items go into this rule's; left recursion grows one list
                        body += [f"s = children[{i}].value",
                                 "if items:",
                                 "    items += s",
                                 "else:",
                                 "    items = s"]
                    else:
                        body.append(f"items.append({value(i)})")
                if tail:
                    body.append(f"items += [None] * {tail}")
            if method is None:
                body.append("return _Reduced(items, first, last)")
            else:
                body += ["node = _Reduced(None, first, last)",
                         "node.value = method(_BUILDER.ast, node, items)",
                         "return node"]
    source = "def reduce(children):\n" + "".join(f"    {line}\n" for line in body)
    scope = {"_Reduced": _Reduced, "_positions": _positions, "_BUILDER": _BUILDER, "method": method}
    exec(compile(source, f"<reduction of {method.__name__ if method else 'a rule'}>", "exec"), scope)
    return scope["reduce"]


_NOTHING = _Reduced(None, None, None)


def _build_nothing(children) -> _Reduced:
    return _NOTHING


def _positions(children) -> tuple:
    """(first, last) token of the children that have positions, or (None, None)."""
    first = last = None
    for c in children:
        if type(c) is _Reduced:
            if c.first is not None:
                first = c.first
                break
        else:
            first = c
            break
    if first is not None:
        for c in reversed(children):
            if type(c) is _Reduced:
                if c.last is not None:
                    last = c.last
                    break
            else:
                last = c
                break
    return first, last


def _callback(method, include, tail, expand1, lark_tokens):
    def reduce(children):
        if lark_tokens:
            children = [_tok(c) if isinstance(c, Token) else c for c in children]
        first, last = _positions(children)
        if expand1 and len(include) == 1:  # `?rule` with one child: the child itself, in this container
            c = children[include[0][0]]
            if type(c) is not _Reduced:
                return c
            return _Reduced(c.value, first, last)
        items: list = []
        for i, splice, nones in include:
            if nones:
                items += [None] * nones
            c = children[i]
            if splice:  # a `_rule`: its items go into this rule's (Lark's ChildFilterLALR)
                if items:
                    items += c.value
                else:
                    items = c.value  # left recursion (`x*`): the list grows in place, no copies
            else:
                items.append(c.value if type(c) is _Reduced else c)
        if tail:
            items += [None] * tail
        if method is None:
            return _Reduced(items, first, last)
        node = _Reduced(None, first, last)
        node.value = method(_BUILDER.ast, node, items)
        return node

    return reduce


def _tok(t: Token) -> tuple:
    """A Lark token in the form the builders take (`_FastParser`'s tokens)."""
    return (t.type, t.value, t.start_pos, t.end_pos, t.line, t.column, t.end_line, t.end_column)


# Tokens of the fast path are tuples: (type, value, start, end, line, column, end_line, end_column).
_TYPE, _VALUE, _START, _END, _LINE, _COL, _ELINE, _ECOL = range(8)


class _Fallback(Exception):
    """The fast path stops at something it does not handle (no plan gets here: Lark would fail on it too);
    Lark's own parser runs instead."""


class _FastParser:
    """Lark's LALR(1) table and the scanners of its contextual lexer, driven by one loop.

    The same automaton as `Lark.parse` with the same lexer, newline folding (`PlanPostLex`) and the same
    reductions (`_install_builders`), without Lark's per-token objects and calls: about 3x faster on a
    big plan. At the first character that does not lex or token that does not fit it raises the exception
    Lark's parser raises there (`_lexer_error`, `_parser_error`: the same class, token, expected set and
    interactive parser), which the syntax diagnostics are made of.
    """

    def __init__(self, lark: Lark, build: bool = True):
        frontend = lark.parser
        table = frontend.parser._parse_table
        self.table, self.lalr = table, frontend.parser.parser  # for Lark's exceptions
        if build:
            callbacks = _rule_callbacks(lark, lark_tokens=False)
        else:
            callbacks = {rule: _build_nothing for rule in lark.rules}
        self.start_state = table.start_states["start"]
        self.end_state = table.end_states["start"]
        size = max(table.states) + 1
        # by state: terminal -> shift target (an int) or reduction (callback, size, rule name); rule -> state
        self.actions: list[dict[str, object]] = [{} for _ in range(size)]
        self.goto: list[dict[str, int]] = [{} for _ in range(size)]
        rules: dict[int, tuple] = {}
        for state, acts in table.states.items():
            row, goto = self.actions[state], self.goto[state]
            for sym, (action, arg) in acts.items():
                if action is Shift:
                    if sym.isupper() or sym == "$END":
                        row[sym] = arg
                    else:
                        goto[sym] = arg
                else:
                    key = id(arg)
                    if key not in rules:
                        rules[key] = (callbacks[arg], len(arg.expansion), arg.origin.name)
                    row[sym] = rules[key]
        contextual = frontend.lexer.lexer  # PostLexConnector -> ContextualLexer
        self.contextual = contextual
        self.scanners: list = [None] * size
        made: dict[int, tuple] = {}
        for state, lexer in contextual.lexers.items():
            if id(lexer) not in made:
                made[id(lexer)] = self._scanner(lexer)
            self.scanners[state] = made[id(lexer)]

    @staticmethod
    def _scanner(lexer) -> tuple:
        """(match, kinds, special) for one of the contextual lexer's lexers: `match(text, pos)` of its
        terminals; what to do with each terminal (`_WORD`, `_PUNCT`, `_OPEN`, `_CLOSE`, `_SPECIAL`, or for one
        with an "unless" callback -- NAME: `shard` is the keyword `shard` where one is expected -- keyword
        text -> terminal); for the ignored and newline terminals, flags (1: may hold newlines, 2: ignored,
        4: a comment)."""
        scanner = lexer.scanner  # builds the scanner and the callbacks
        if len(scanner._mres) != 1:
            raise TypeError("the fast parser expects one regex per lexer state")
        keywords = {}
        for type_, cb in lexer.callback.items():
            if isinstance(cb, UnlessCallback):
                terminals = cb.scanner.terminals
                if not all(isinstance(t.pattern, PatternStr) and not t.pattern.flags for t in terminals):
                    raise TypeError(f"unexpected keyword terminals for {type_}")
                keywords[type_] = {t.pattern.value: t.name for t in terminals}
            elif cb is not _SINK:
                raise TypeError(f"unexpected lexer callback for {type_}")
        special = {}
        for type_ in lexer.newline_types | lexer.ignore_types:
            special[type_] = ((type_ in lexer.newline_types) | (type_ in lexer.ignore_types) << 1
                              | (type_ == "COMMENT") << 2)
        kinds: dict[str, object] = {}
        for t in lexer.terminals:
            if t.name in special:
                kinds[t.name] = _SPECIAL
            elif t.name in keywords:
                kinds[t.name] = keywords[t.name]
            elif t.name in _BRACKETS:
                kinds[t.name] = _OPEN if _BRACKETS[t.name] > 0 else _CLOSE
            elif isinstance(t.pattern, PatternStr) and not t.pattern.value.isalpha():
                kinds[t.name] = _PUNCT
            else:
                kinds[t.name] = _WORD
        return scanner._mres[0].match, kinds, special

    def parse(self, text: str, builder: "_ToAst") -> tuple[A.Module, list[A.Comment]]:
        """The module and its comments; `_Fallback` where Lark would raise."""
        actions, goto, scanners = self.actions, self.goto, self.scanners
        end_state = self.end_state
        states = [self.start_state]
        values: list = []
        comments: list[A.Comment] = []
        comment, pack, fid = A.Comment, A.pack_span, builder.fid
        n = len(text)
        pos, line, line_start = 0, 1, 0
        depth, last_nl = 0, True  # PlanPostLex: brackets open, and whether the last token fed was a newline
        tok = None
        _BUILDER.ast = builder
        while True:
            # ---- the next token the parser sees (lexed in the parser's state, as the contextual lexer does)
            state = states[-1]
            if pos >= n:  # $END, at the last token fed (Lark's Token.new_borrow_pos)
                type_ = "$END"
                tok = ("$END", "", 0, None, 1, 1, None, None) if tok is None else ("$END", "") + tok[2:]
            else:
                match, kinds, special = scanners[state]
                m = match(text, pos)
                if m is None:
                    raise self._lexer_error(text, pos, line, line_start, states, values)
                type_ = m.lastgroup
                value = m.group()
                start, tline, col = pos, line, pos - line_start + 1
                pos = m.end()
                kind = kinds[type_]
                if kind is _SPECIAL:  # whitespace, newlines, line continuations, comments
                    flags = special[type_]
                    if flags & 1:
                        nl = value.count("\n")
                        if nl:
                            line += nl
                            line_start = start + value.rindex("\n") + 1
                    if flags & 2:
                        if flags & 4:
                            comments.append(comment(value, span=pack(fid, tline, col, line, pos - line_start + 1,
                                                                     start, pos)))
                        continue
                    if type_ == "_NL":  # PlanPostLex: newlines only outside brackets, one for a run
                        if depth or last_nl:
                            continue
                        last_nl = True
                    else:
                        last_nl = False
                        value = intern(value)
                else:
                    last_nl = False
                    if kind.__class__ is dict:  # NAME, or a keyword where the parser takes one
                        value = intern(value)  # names repeat through a big plan: one string each
                        type_ = kind.get(value, type_)
                    elif kind is _WORD:
                        value = intern(value)
                    elif kind is _OPEN:
                        depth += 1
                    elif kind is _CLOSE and depth:
                        depth -= 1
                tok = (type_, value, start, pos, tline, col, line, pos - line_start + 1)
            # ---- feed it: reduce while the table says so, then shift
            while True:
                act = actions[state].get(type_)
                if act is None:
                    raise self._parser_error(text, tok, states, values)
                if act.__class__ is int:
                    states.append(act)
                    values.append(tok)
                    break
                reduce, size, origin = act
                if size:
                    children = values[-size:]
                    del states[-size:]
                    del values[-size:]
                else:
                    children = []
                values.append(reduce(children))
                state = goto[states[-1]][origin]
                states.append(state)
                if type_ == "$END" and state == end_state:
                    return values[-1].value, comments
            if type_ == "$END":  # shifted $END without reaching the end state: not Lark's way out
                raise _Fallback

    # ------------------------------------------------------------------ Lark's exceptions, as Lark raises them
    def _parser_state(self, text: str, states: list, values: list) -> ParserState:
        lexer_thread = LexerThread.from_text(self.contextual, text)
        return ParserState(ParseConf(self.table, {}, "start"), lexer_thread, list(states), list(values))

    def _interactive(self, err: UnexpectedInput, parser_state: ParserState) -> UnexpectedInput:
        err.interactive_parser = InteractiveParser(self.lalr, parser_state, parser_state.lexer)  # parse_from_state's
        return err

    def _parser_error(self, text: str, tok: tuple, states: list, values: list) -> UnexpectedToken:
        """What `ParserState.feed_token` raises for a token the parser's state has no action for."""
        type_, value, start, end, line, col, end_line, end_col = tok
        token = Token(type_, value, start, line, col, end_line, end_col, end)
        expected = {s for s in self.table.states[states[-1]].keys() if s.isupper()}
        parser_state = self._parser_state(text, states, values)
        return self._interactive(UnexpectedToken(token, expected, state=parser_state), parser_state)

    def _lexer_error(self, text: str, pos: int, line: int, line_start: int, states: list,
                     values: list) -> UnexpectedInput:
        """What `ContextualLexer.lex` raises where no terminal of the state's lexer matches: the token the
        lexer of all terminals finds there as an UnexpectedToken, or else UnexpectedCharacters."""
        lexer = self.contextual.lexers[states[-1]]
        parser_state = self._parser_state(text, states, values)
        allowed = lexer.scanner.allowed_types - lexer.ignore_types or {"<END-OF-FILE>"}
        err = UnexpectedCharacters(text, pos, line, pos - line_start + 1, allowed=allowed, state=parser_state,
                                   terminals_by_name=lexer.terminals_by_name)
        counter = LineCounter("\n")
        counter.char_pos, counter.line, counter.line_start_pos = pos, line, line_start
        counter.column = pos - line_start + 1
        root = self.contextual.root_lexer
        try:
            token = root.next_token(LexerState(TextSlice.cast_from(text), counter), parser_state)
        except UnexpectedCharacters:
            return self._interactive(err, parser_state)
        return self._interactive(UnexpectedToken(token, allowed, state=parser_state,
                                                 terminals_by_name=root.terminals_by_name), parser_state)


_BRACKETS = {"LPAR": 1, "LSQB": 1, "RPAR": -1, "RSQB": -1}  # PlanPostLex's depth
_WORD, _PUNCT, _OPEN, _CLOSE, _SPECIAL = "word", "punct", "open", "close", "special"  # kinds of terminals


@dataclass(frozen=True)
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
    if _BIDI.search(text):
        result = ParseResult(result.module, result.diagnostics, result.source, _bidi_warnings(result.source))
    return result


# Unicode's explicit bidirectional embeddings, overrides (U+202A-U+202E) and isolates (U+2066-U+2069)
_BIDI = re.compile("[\u202a-\u202e\u2066-\u2069]")


def _bidi_warnings(source: SourceFile) -> tuple[Diagnostic, ...]:
    """PL225 once per line that holds a bidirectional control (Trojan Source: the line reads in another
    order than it is shown), at its first one."""
    out, last_line = [], 0
    for m in _BIDI.finditer(source.text):
        span = source.span(m.start(), m.end())
        if span.line == last_line:
            continue
        last_line = span.line
        ch = m.group()
        out.append(Diagnostic(
            "PL225", Severity.WARNING,
            f"bidirectional control character {_describe_char(ch)}: the line may be shown in another order "
            "than it is read", span,
            help="remove it (\"Trojan Source\", CVE-2021-42574); plans need no right-to-left text",
        ))
    return tuple(out)


def _parse(text: str, path: str) -> ParseResult:
    text = plan_text(text)  # without a byte-order mark, "\r" line ends as "\n": what every span counts in
    source = SourceFile(path, text)
    whole = _whole_span(source)
    empty = A.Module((), (), path, span=whole)
    too_deep = _nesting_diagnostic(source)
    if too_deep is not None:
        return ParseResult(empty, (too_deep,), source)
    diags: list[Diagnostic] = []
    work = text
    blanked: dict[int, int] = {}  # line -> how much of it has been blanked (1: all but braces, 2: all)
    comma_tried: set[int] = set()  # offsets where a missing `,` was put in (at most once each)
    for _ in range(3 * (MAX_SYNTAX_ERRORS + 1)):  # up to three repairs per error: a `,`, then blanking twice
        if len(diags) >= MAX_SYNTAX_ERRORS:
            break
        try:
            # after a syntax error the tree is not wanted: only where the next error is (or that none is)
            module, comments, builder = _attempt(source, work, build=not diags)
        except UnexpectedInput as err:
            unclosed = _unclosed_before(err, source, work)
            if unclosed is not None:
                # a bracket left open runs into the next statement: one error at the bracket, and the
                # unfinished statement blanked up to the line where the next one starts
                diag, first, stop = unclosed
                if len(diags) < MAX_SYNTAX_ERRORS:
                    diags.append(diag)
                work = _blank_lines(work, first, stop - 1)
                continue
            stray = _stray_closer(err, work)
            if stray is not None:  # a `}` that closes nothing: blank just it, the line around it may be fine
                diag = Diagnostic("PL101", Severity.ERROR, f"unexpected `{work[stray]}`: it closes no bracket",
                                  source.span(stray, stray + 1), help="remove it")
                if all(d.span.line != diag.span.line for d in diags):  # not when its line's error left it alone
                    diags.append(diag)
                work = work[:stray] + " " + work[stray + 1:]
                continue
            orphan = _orphan_body(err, work)
            if orphan is not None:  # a block's lines without the line that opens it: one error, at the first
                first, last = orphan
                diag = _diagnostic_for(err, source, work)
                diags.append(Diagnostic(diag.code, diag.severity, diag.message, diag.span, help=(
                    "this line is indented like the body of a block, but no block is open here: is the line "
                    "that opens it missing?")))
                work = _blank_lines(work, first, last)
                continue
            comma = _missing_comma(err, work, comma_tried)
            if comma is not None:  # items wrapped over lines with a `,` missing at a line's end
                comma_tried.add(comma)
                retry = work[:comma] + "," + work[comma + 1:]
                if _parses_past(source, retry, work.find("\n", err.token.end_pos)):
                    line_start = work.rfind("\n", 0, comma) + 1
                    prev_end = len(work[:line_start - 1].rstrip())
                    word = work[comma + 1:].split(None, 1)[0] if work[comma + 1:].strip() else ""
                    diags.append(Diagnostic(
                        "PL101", Severity.ERROR, f"missing `,` before `{quote_source(word)}`",
                        source.span(comma + 1, comma + 1 + len(word)),
                        help=f"items that wrap over lines still need a `,` between them: end line "
                             f"{work.count(chr(10), 0, prev_end) + 1} with one"))
                    work = retry
                    continue
            diag = _diagnostic_for(err, source, work)
            if all(d.span.line != diag.span.line for d in diags) and len(diags) < MAX_SYNTAX_ERRORS:
                diags.append(diag)
            line = diag.span.line
            if isinstance(err, UnexpectedEOF) or (isinstance(err, UnexpectedToken) and err.token.type == "$END"):
                break
            level = blanked.get(line, 0) + 1
            if level > 2:
                break
            blanked[line] = level
            work = _blank_line(work, line, keep_braces=(level == 1))
            continue
        if work is not text:  # the comments of the text as written, not of what was blanked
            comments = [c for c in comments if _comment_in(c, text)]
        comments = tuple(comments)
        if diags:
            return ParseResult(A.Module((), comments, path, span=whole), tuple(diags), source)
        if builder.diags:
            return ParseResult(A.Module((), comments, path, span=whole), tuple(builder.diags), source)
        module = A.Module(module.statements, comments, path, span=whole)
        return ParseResult(module, (), source)
    return ParseResult(A.Module((), (), path, span=whole), tuple(diags), source)


def _attempt(source: SourceFile, work: str, build: bool) -> tuple[A.Module, list[A.Comment], "_ToAst"]:
    """Parse `work` (the file, or the file with lines blanked after errors): (module, comments, builder),
    or Lark's exception for the first syntax error. The fast parser, unless it meets what it does not
    handle (`_Fallback`): then Lark's. Without `build`, the module is None."""
    builder = _ToAst(source)
    try:
        module, comments = _fast(build).parse(work, builder)
        return module, comments, builder
    except _Fallback:
        pass
    _SINK.tokens = []
    builder = _BUILDER.ast = _ToAst(source)  # a fresh one: a failed parse may have built some nodes
    module = _lark().parse(work).value
    return module, [A.Comment(str(t), span=_tok_span(source, t)) for t in _SINK.tokens], builder


def _comment_in(comment: A.Comment, text: str) -> bool:
    start, end = A.span_offsets(A.raw_span(comment))
    return text[start:end] == comment.text


def _whole_span(source: SourceFile) -> Span:
    """`source.span(0, len(text))`, without building the file's line index."""
    text = source.text
    last_line_start = text.rfind("\n") + 1
    return Span(source.path, 1, 1, text.count("\n") + 1, len(text) - last_line_start + 1, 0, len(text))


def parse_file(path: str | FsPath) -> ParseResult:
    p = FsPath(path)
    return parse(p.read_text(encoding="utf-8"), str(path))


def _blank_line(text: str, line: int, keep_braces: bool) -> str:
    """Blank a line for error recovery. A line that opens a block is blanked through the block's `}`,
    so one broken statement yields one error rather than one per line of its body."""
    lines = text.split("\n")
    if keep_braces and 1 <= line <= len(lines):
        opened = code_of(lines[line - 1]).count("{") - code_of(lines[line - 1]).count("}")
        if opened > 0:
            depth, last = opened, line
            for j in range(line, len(lines)):
                code = code_of(lines[j])
                depth += code.count("{") - code.count("}")
                last = j + 1
                if depth <= 0:
                    break
            if depth <= 0:
                for k in range(line - 1, last):
                    lines[k] = " " * len(lines[k])
                return "\n".join(lines)
    if 1 <= line <= len(lines):
        old = lines[line - 1]
        lines[line - 1] = "".join(c if (keep_braces and c in "{}") else " " for c in old)
        # the statement's continuation: the lines after it that start deeper (inside its brackets, or the
        # body of a block whose `{` is missing), through a line at its depth of closers only (`)`, `}`)
        depth, j = _indent(old), line
        while j < len(lines) and (not code_of(lines[j]).strip() or _indent(lines[j]) > depth):
            j += 1
        closing = code_of(lines[j]).strip() if j < len(lines) else ""
        deeper = any(code_of(lines[k]).strip() for k in range(line, j))
        if deeper and closing and _indent(lines[j]) == depth and not closing.strip(")]},; \t"):
            for k in range(line, j + 1):
                lines[k] = " " * len(lines[k])
    return "\n".join(lines)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _parses_past(source: SourceFile, work: str, pos: int) -> bool:
    """Whether `work` parses without error up to offset `pos` (-1: the end)."""
    try:
        _attempt(source, work, build=False)
    except UnexpectedInput as err:
        at = getattr(err, "pos_in_stream", None)
        if isinstance(err, UnexpectedToken):
            at = err.token.start_pos
        return pos >= 0 and at is not None and at > pos
    return True


def _open_brackets(work: str, end: int) -> list[int]:
    """Offsets of the brackets still open at offset `end` (strings and comments skipped), innermost last."""
    stack: list[int] = []
    for m in _BRACKET_OR_SKIPPED.finditer(work, 0, end):
        ch = m.group()
        if ch in _CLOSER:
            stack.append(m.start())
        elif ch in "})]" and stack and _CLOSER[work[stack[-1]]] == ch:
            stack.pop()
    return stack


def _stray_closer(err: UnexpectedInput, work: str) -> int | None:
    """The offset of the token of `err` when it is a `}`, `)` or `]` that closes no open bracket."""
    if not isinstance(err, UnexpectedToken) or err.token.type not in ("RBRACE", "RPAR", "RSQB"):
        return None
    pos = err.token.start_pos
    if pos is None:
        return None
    stack = _open_brackets(work, pos)
    return pos if not stack or _CLOSER[work[stack[-1]]] != work[pos] else None


def _orphan_body(err: UnexpectedInput, work: str) -> tuple[int, int] | None:
    """(first, last) lines of a block body whose opening line is missing (deleted, commented out): `err`
    is at the first token of an indented line where a statement should start, outside every bracket, and
    the lines after it, as deep or deeper, end at a line of closers only (`}`, `)`) less deep."""
    if not isinstance(err, UnexpectedToken) or err.token.start_pos is None or err.token.type == "$END":
        return None
    if sum(1 for e in _accepted(err) if e.lower() in STATEMENT_KEYWORDS) < 8:
        return None
    pos = err.token.start_pos
    line_start = work.rfind("\n", 0, pos) + 1
    if line_start == 0 or work[line_start:pos].strip(" \t") or pos == line_start:
        return None
    depth = pos - line_start
    end = work.find("\n", pos)
    while end >= 0:
        nxt = work.find("\n", end + 1)
        line = work[end + 1:nxt if nxt >= 0 else len(work)]
        code = code_of(line).strip()
        if code and _indent(line) < depth:
            if code.strip(")]}, \t"):
                return None
            if _open_brackets(work, line_start):  # in a block, where statements may stand indented
                return None
            first = work.count("\n", 0, line_start) + 1
            return first, first + work.count("\n", line_start, end + 1)
        end = nxt
    return None


def _missing_comma(err: UnexpectedInput, work: str, tried: set[int]) -> int | None:
    """Where a `,` would go when `err` is on a line of a list wrapped over lines (a `,` accepted, no line
    break) and the line before has no `,` at its end: the last space of the line's indentation."""
    if not isinstance(err, UnexpectedToken) or err.token.start_pos is None or err.token.type == "$END":
        return None
    expected = _accepted(err)
    if "COMMA" not in expected or "_NL" in expected:
        return None
    pos = err.token.start_pos
    line_start = work.rfind("\n", 0, pos) + 1
    if line_start == 0:
        return None
    line = work[line_start:pos]
    indent = len(line) - len(line.lstrip(" \t"))
    if indent == 0 or line_start + indent - 1 in tried:
        return None
    before = code_of(work[work.rfind("\n", 0, line_start - 1) + 1:line_start - 1]).rstrip()
    if not before or before[-1] in ",([{":
        return None
    return line_start + indent - 1


def _blank_lines(text: str, first: int, last: int) -> str:
    """Lines `first`..`last` (1-based, inclusive) as spaces, newlines kept (offsets do not move)."""
    lines = text.split("\n")
    for k in range(first - 1, min(last, len(lines))):
        lines[k] = " " * len(lines[k])
    return "\n".join(lines)


_BRACKET_OR_SKIPPED = re.compile(r'#[^\n]*|"(?:[^"\n]|(?<=\\)")*"?|[{}()\[\]]')
_CLOSER = {"{": "}", "(": ")", "[": "]"}


def _unclosed_before(err: UnexpectedInput, source: SourceFile, work: str) -> tuple[Diagnostic, int, int] | None:
    """A syntax error on a line that starts no deeper than the line of a bracket still open there, in a
    file with more openers of that kind than closers: the bracket was never closed and the line begins
    the next statement (`mesh m of 8 x gpu {` ... then `budget 40 GiB per device` at the left margin,
    or `stage a, h[0:6` then `stage h[6:12]`). (PL104 at the bracket, the bracket's line, the error's
    line), else None."""
    if not isinstance(err, UnexpectedToken) or err.token.type == "$END" or err.token.start_pos is None:
        return None
    code = _STRING_OR_COMMENT.sub("", work)
    short = {o for o, c in _CLOSER.items() if code.count(o) > code.count(c)}
    if not short:
        return None
    pos = err.token.start_pos
    line_start = work.rfind("\n", 0, pos) + 1
    line_end = work.find("\n", pos)
    line = work[line_start:line_end if line_end >= 0 else len(work)]
    margin = len(line) - len(line.lstrip(" \t"))
    for opener in reversed(_open_brackets(work, line_start)):
        ch = work[opener]
        start = work.rfind("\n", 0, opener) + 1
        indent = len(work[start:opener]) - len(work[start:opener].lstrip(" \t"))
        if ch in short and margin <= indent:
            first_line = work.count("\n", 0, start) + 1
            err_line = work.count("\n", 0, line_start) + 1
            words = line.split(None, 1)
            what = f"`{quote_source(words[0])}` on line {err_line}" if words else f"the end of line {err_line}"
            return Diagnostic(
                "PL104", Severity.ERROR, f"`{ch}` is never closed before {what}",
                source.span(opener, opener + 1), help=f"add the matching `{_CLOSER[ch]}` before line {err_line}",
            ), first_line, err_line
        if margin > indent:
            break
    return None


def code_of(line: str) -> str:
    """A line without its comment and the contents of its strings (for counting braces and brackets)."""
    out, in_str = [], False
    for i, ch in enumerate(line):
        if in_str:
            in_str = not (ch == '"' and line[i - 1] != "\\")
            continue
        if ch == '"':
            in_str = True
        elif ch == "#":
            break
        else:
            out.append(ch)
    return "".join(out)


# strings and comments as `_nesting_diagnostic` reads them: a string ends at a newline or at a `"` after
# any character but a backslash
_STRING_OR_COMMENT = re.compile(r'#[^\n]*|"(?:[^"\n]|(?<=\\)")*"?')
_NOT_BRACKET = re.compile(r"[^{}()\[\]]+")
_ONE_KIND = str.maketrans("{[}]", "(())")


def _max_nesting_at_most(text: str, limit: int) -> bool:
    """True when brackets (outside strings and comments) never stand more than `limit` deep, by string
    operations only (a big plan has millions of characters): with the brackets alone, each pass that
    removes `()` pairs takes off one level of matched brackets, and what is left is `)...)(...(`, the
    closers ignored at depth 0 and the openers never closed; no bracket is deeper than the passes plus
    those openers. False means: maybe deeper, look closely."""
    brackets = _NOT_BRACKET.sub("", _STRING_OR_COMMENT.sub("", text)).translate(_ONE_KIND)
    passes = 0
    while "()" in brackets:
        passes += 1
        if passes > limit:
            return False
        brackets = brackets.replace("()", "")
    return passes + brackets.count("(") <= limit


def _nesting_diagnostic(source: SourceFile) -> Diagnostic | None:
    """PL106 at the first bracket opened while MAX_NESTING are open (outside strings and comments), so
    that no later pass (the tree transformer, the resolver, the formatter) recurses without bound."""
    text = source.text
    if text.count("{") + text.count("(") + text.count("[") <= MAX_NESTING or _max_nesting_at_most(text, MAX_NESTING):
        return None
    depth = 0
    in_str = in_comment = False
    for i, ch in enumerate(text):
        if in_comment:
            in_comment = ch != "\n"
        elif in_str:
            if ch == "\n" or (ch == '"' and text[i - 1] != "\\"):
                in_str = False
        elif ch == "#":
            in_comment = True
        elif ch == '"':
            in_str = True
        elif ch in "{([":
            depth += 1
            if depth > MAX_NESTING:
                return Diagnostic(
                    "PL106", Severity.ERROR, f"brackets nested more than {MAX_NESTING} deep",
                    source.span(i, i + 1),
                    help=f"a plan nests a few levels; flatten this to at most {MAX_NESTING} open brackets",
                )
        elif ch in "})]" and depth > 0:
            depth -= 1
    return None


def _tok_span(source: SourceFile, tok: Token) -> Span:
    if tok.end_line is not None and tok.start_pos is not None:  # a lexed token knows its lines and columns
        return Span(source.path, tok.line, tok.column, tok.end_line, tok.end_column, tok.start_pos, tok.end_pos)
    start = tok.start_pos or 0
    end = tok.end_pos if tok.end_pos is not None else start + len(str(tok))
    return source.span(start, end)


def _diagnostic_for(err: UnexpectedInput, source: SourceFile, work: str) -> Diagnostic:
    if isinstance(err, UnexpectedCharacters):
        pos = err.pos_in_stream
        ch = work[pos] if pos < len(work) else ""
        if ch == '"':
            end = work.find("\n", pos)
            end = len(work) if end < 0 else end
            return Diagnostic(
                "PL103", Severity.ERROR, "unterminated string", source.span(pos, end),
                help='close the string with `"` on the same line',
            )
        return Diagnostic(
            "PL102", Severity.ERROR, f"unexpected character {_describe_char(ch)}", source.span(pos, pos + 1),
            help=_char_help(ch),
        )
    if isinstance(err, UnexpectedEOF) or (isinstance(err, UnexpectedToken) and err.token.type == "$END"):
        return _eof_diagnostic(source, work)
    assert isinstance(err, UnexpectedToken)
    tok = err.token
    start = tok.start_pos if tok.start_pos is not None else 0
    end = tok.end_pos if tok.end_pos is not None else start + max(1, len(str(tok)))
    if tok.type == "_NL":
        end = start + 1
    expected = _accepted(err)
    names = {t.name: t.pattern.value for t in _lark().terminals}
    message, help_ = describe_unexpected_token(tok, expected, work, names)
    return Diagnostic("PL101", Severity.ERROR, message, source.span(start, end), help=help_)


def _accepted(err: UnexpectedToken) -> set[str]:
    """The terminals the parser really accepts here (LALR's `expected` set over-approximates after a
    reduction; the interactive parser tries each candidate)."""
    try:
        acc = set(err.interactive_parser.accepts()) if err.interactive_parser is not None else set()
    except Exception:  # accepts() replays the parser; fall back to Lark's own set
        acc = set()
    return acc or set(err.expected or ())


def _describe_char(ch: str) -> str:
    """`@`, or `\\u200b` (ZERO WIDTH SPACE): a character that is not plain ASCII is escaped if it prints
    nothing or passes for a space, and named (a Cyrillic `а` looks like a Latin `a`)."""
    if " " <= ch < "\x7f":
        return f"`{ch}`"
    shown = escape_char(ch) or ch
    name = unicodedata.name(ch, "")
    return f"`{shown}` ({name})" if name else f"`{shown}` (U+{ord(ch):04X})"


def _char_help(ch: str) -> str:
    if ch == "'":
        return 'strings use double quotes: "examples.mlp:build"'
    if ch in "-+":
        return "numbers in plans are never negative; arithmetic is not part of the language"
    if ch == "=":
        return "`==` is not an operator here; use `=` to give a value"
    return "remove it, or put it inside a comment (`# ...`) or a string"


def _eof_diagnostic(source: SourceFile, work: str) -> Diagnostic:
    """An unexpected end of file is almost always an unclosed bracket: point at the opener."""
    stack: list[tuple[str, int]] = []
    pairs = {"}": "{", ")": "(", "]": "["}
    in_str = in_comment = False
    for i, ch in enumerate(work):
        if in_comment:
            in_comment = ch != "\n"
            continue
        if in_str:
            if ch == '"' and work[i - 1] != "\\":
                in_str = False
            continue
        if ch == "#":
            in_comment = True
        elif ch == '"':
            in_str = True
        elif ch in "{([":
            stack.append((ch, i))
        elif ch in "})]" and stack and stack[-1][0] == pairs[ch]:
            stack.pop()
    end = len(source.text)
    if stack:
        ch, pos = stack[-1]
        closer = {"{": "}", "(": ")", "[": "]"}[ch]
        return Diagnostic(
            "PL104", Severity.ERROR, f"unexpected end of file: `{ch}` is never closed",
            source.span(pos, pos + 1), help=f"add the matching `{closer}`",
        )
    return Diagnostic(
        "PL104", Severity.ERROR, "unexpected end of file: the last statement is incomplete",
        source.span(max(0, end - 1), end), help="finish the statement or remove it",
    )


# ------------------------------------------------------------------------------------------- tree → AST
def _unescape(raw: str) -> str:
    body = raw[1:-1]
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            out.append({"n": "\n", "t": "\t"}.get(nxt, nxt))
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


class _Sel:
    """A selector (`[3]`, `[0:6]`, `[*]`) before it is built: its node class, arguments, and first and
    last tokens (not its `_Reduced`, whose value it is: that would be a reference cycle)."""

    __slots__ = ("node", "args", "first", "last")

    def __init__(self, node, args: tuple, meta: _Reduced):
        self.node, self.args, self.first, self.last = node, args, meta.first, meta.last


class _Seg:
    """A path segment before it is built: its name, `_Sel`s, and first and last tokens."""

    __slots__ = ("text", "sels", "first", "last")

    def __init__(self, text: str, sels: list, meta: _Reduced):
        self.text, self.sels, self.first, self.last = text, sels, meta.first, meta.last


# A parsed path or spec is stored as its source text when that text is what `str()` of its node gives
# (ast.path_text / ast.spec_text): these find what would make it differ.
# path: a space, tab, form feed or carriage return; a line continuation; a number with a leading zero or
# an underscore (`h[01]`, `h[1_0]`): numbers stand after `[` or `:` in a path
_CANONICAL_PATH = re.compile(r"[ \t\f\r\\]|[\[:](?:0[0-9_]|[0-9]*_)")
# spec: anything but what `spec_text.is_canonical` accepts


class _NotCanonicalSpec:
    """`_CANONICAL_SPEC.search(text)`: None when the whole of `text` is a canonically written spec."""

    @staticmethod
    def search(text: str):
        return None if is_canonical(text) else True


_CANONICAL_SPEC = _NotCanonicalSpec()


class _ToAst:
    """Grammar rule → AST node: the parser calls the method named after the rule (or its alias) with the
    rule's `_Reduced` (its first and last tokens, for `_span`) and its children shaped as Lark's tree would
    have them (transformed children, tokens as they are). Every node gets the span of the text it came from."""

    def __init__(self, source: SourceFile):
        self.src = source
        self.fid = A.file_id(source.path)
        self._spans: dict[int, int] = {}
        self.diags: list[Diagnostic] = []  # PL107

    def _number(self, tok: tuple, convert):
        """`convert` of the literal's digits; PL107 (and 0) for a literal of more than MAX_DIGITS digits."""
        digits = tok[_VALUE].replace("_", "")
        mantissa = digits.lower().partition("e")[0] if convert is float else digits
        if len(mantissa) > MAX_DIGITS and sum(c.isdigit() for c in mantissa) > MAX_DIGITS:
            self.diags.append(Diagnostic(
                "PL107", Severity.ERROR, f"a number with {sum(c.isdigit() for c in mantissa)} digits",
                A.unpack_span(self._tspan(tok)), help=f"a number literal has at most {MAX_DIGITS} digits",
            ))
            return convert(0)
        return convert(digits)

    def _int(self, tok: tuple) -> int:
        return self._number(tok, int)

    # helpers -----------------------------------------------------------------------
    def _span(self, meta: _Reduced) -> "Span | int":
        """The span of a rule's text, packed (`ast.pack_span`)."""
        first, last = meta.first, meta.last
        if first is None:
            return Span(self.src.path, 0, 0, 0, 0)
        # nested rules often cover the same text (a name, its segment, its path): they share one span
        key = first[_START] << 32 | last[_END]
        span = self._spans.get(key)
        if span is None:
            if len(self._spans) > 64:
                self._spans.clear()
            span = self._spans[key] = A.pack_span(self.fid, first[_LINE], first[_COL], last[_ELINE], last[_ECOL],
                                                  first[_START], last[_END])
        return span

    def _tspan(self, tok: tuple) -> int:
        return A.pack_span(self.fid, tok[_LINE], tok[_COL], tok[_ELINE], tok[_ECOL], tok[_START], tok[_END])

    def _intnode(self, tok) -> A.Int:
        if isinstance(tok, A.Int):
            return tok
        return A.Int(self._int(tok), text=tok[_VALUE], span=self._tspan(tok))

    def _coerce_every(self, x):
        if type(x) is tuple:  # an INT token
            return self._intnode(x)
        return x

    @staticmethod
    def _present(items):
        return tuple(i for i in items if i is not None)

    # names and values ---------------------------------------------------------------
    def name(self, meta, items):
        return A.Name(items[0][_VALUE], span=self._span(meta))

    def dotted(self, meta, items):
        return A.Dotted(tuple(items), span=self._span(meta))

    def hole(self, meta, items):
        return A.Hole(span=self._span(meta))

    def int(self, meta, items):
        return self._intnode(items[0])

    def float(self, meta, items):
        tok = items[0]
        return A.Float(self._number(tok, float), text=tok[_VALUE], span=self._tspan(tok))

    def string(self, meta, items):
        tok = items[0]
        return A.Str(_unescape(tok[_VALUE]), text=tok[_VALUE], span=self._tspan(tok))

    def unit(self, meta, items):
        text = items[0][_VALUE] + ("" if items[1] is None else "/" + items[1][_VALUE])
        return A.Unit(text, span=self._span(meta))

    def quantity(self, meta, items):
        return A.Quantity(items[0], items[1], span=self._span(meta))

    def ref(self, meta, items):
        return A.Ref(items[0], span=self._span(meta))

    def list(self, meta, items):
        return A.ListValue(self._present(items), span=self._span(meta))

    # paths ----------------------------------------------------------------------------
    # A path's selectors and segments are built only if the path needs them: most paths are written as
    # they print and are kept as their text (`A.Path`). Until then they are _Sel / _Seg marks.
    def index(self, meta, items):
        return _Sel(A.Index, (self._int(items[0]),), meta)

    def slice(self, meta, items):
        a, b = items
        return _Sel(A.Slice, (None if a is None else self._int(a), None if b is None else self._int(b)), meta)

    def star(self, meta, items):
        return _Sel(A.Star, (), meta)

    def segment(self, meta, items):
        head, *sels = items
        text = head.text if isinstance(head, A.Name) else head[_VALUE]
        return _Seg(text, sels, meta)

    def path(self, meta, items):
        text = self._canonical(meta, _CANONICAL_PATH)
        if text is not None:
            return A.Path(text, span=self._span(meta))
        return A.Path(tuple([self._segment(seg) for seg in items]), span=self._span(meta))

    def rooted_path(self, meta, items):
        text = self._canonical(meta, _CANONICAL_PATH)
        if text is not None:
            return A.Path(text, span=self._span(meta))
        sels = tuple(self._selector(i) for i in items if isinstance(i, _Sel))
        segs = tuple(self._segment(i) for i in items if isinstance(i, _Seg))
        first_end = sels[-1].span
        root = A.Segment("", sels, span=sels[0].span.cover(first_end))
        return A.Path((root,) + segs, span=self._span(meta))

    def _selector(self, sel: "_Sel") -> A.Selector:
        return sel.node(*sel.args, span=self._span(sel))

    def _segment(self, seg: "_Seg") -> A.Segment:
        return A.Segment(seg.text, tuple([self._selector(s) for s in seg.sels]), span=self._span(seg))

    def _canonical(self, meta, not_canonical: re.Pattern) -> str | None:
        """The rule's source text (shared), if it is what printing its node gives (`not_canonical` finds
        nothing in it) and its span packs short (one line); else None."""
        span = self._span(meta)
        if span.__class__ is int and span & 1:
            text = self.src.text[meta.first[_START]:meta.last[_END]]
            if not_canonical.search(text) is None:
                return intern(text)
        return None

    def act_kind(self, meta, items):
        return items[0][_VALUE]

    def activation(self, meta, items):
        return A.Activation(items[0], items[1], span=self._span(meta))

    # specs -----------------------------------------------------------------------------
    def axis_entry(self, meta, items):
        return A.AxisEntry(items[0], span=self._span(meta))

    def axis_tuple(self, meta, items):
        return A.AxisTuple(tuple(items), span=self._span(meta))

    def replicated(self, meta, items):
        return A.Replicated(span=self._span(meta))

    def partial(self, meta, items):
        return tuple(items)

    def spec(self, meta, items):
        text = self._canonical(meta, _CANONICAL_SPEC)
        if text is not None:
            return A.Spec(text, None, span=self._span(meta))
        *entries, partial = items
        return A.Spec(self._present(entries), partial or (), span=self._span(meta))

    # statements -------------------------------------------------------------------------
    def use_alias(self, meta, items):
        return items[0]

    def use_stmt(self, meta, items):
        target, alias = items
        if type(target) is tuple:  # a STRING token
            target = A.Str(_unescape(target[_VALUE]), text=target[_VALUE], span=self._tspan(target))
        return A.Use(target, alias, span=self._span(meta))

    def kwarg(self, meta, items):
        return A.KwArg(items[0], items[1], span=self._span(meta))

    def call_args(self, meta, items):
        return self._present(items)

    def model_decl(self, meta, items):
        name, factory, args = items
        fac = A.Str(_unescape(factory[_VALUE]), text=factory[_VALUE], span=self._tspan(factory))
        return A.ModelDecl(name, fac, args, span=self._span(meta))

    def dim_decl(self, meta, items):
        return A.DimDecl(items[0], self._intnode(items[1]), span=self._span(meta))

    def input_decl(self, meta, items):
        name, dtype, *dims = items
        return A.InputDecl(name, dtype, self._present(dims), span=self._span(meta))

    def field_over(self, meta, items):
        return items[0]

    def field(self, meta, items):
        return A.Field(items[0], items[1], items[2], span=self._span(meta))

    def device_decl(self, meta, items):
        return A.DeviceDecl(items[0], self._present(items[1:]), span=self._span(meta))

    def link_decl(self, meta, items):
        return A.LinkDecl(items[0], self._present(items[1:]), span=self._span(meta))

    def mesh_count(self, meta, items):
        return self._intnode(items[0])

    def axis_link(self, meta, items):
        return items[0]

    def axis_decl(self, meta, items):
        return A.AxisDecl(items[0], items[1], items[2], span=self._span(meta))

    def mesh_decl(self, meta, items):
        name, count, device, *axes = items
        return A.MeshDecl(name, count, device, self._present(axes), span=self._span(meta))

    def mesh_alias(self, meta, items):
        return A.MeshAlias(items[0], items[1], span=self._span(meta))

    def per_device(self, meta, items):
        return True

    def budget_decl(self, meta, items):
        return A.BudgetDecl(items[0], bool(items[1]), span=self._span(meta))

    def optimizer_block(self, meta, items):
        return self._present(items)

    def optimizer_decl(self, meta, items):
        name, args, block = items
        return A.OptimizerDecl(name, args, block, span=self._span(meta))

    def data_decl(self, meta, items):
        return A.DataDecl(items[0], items[1], span=self._span(meta))

    def shard_stmt(self, meta, items):
        return A.ShardStmt(items[0], items[1], span=self._span(meta))

    def schedule_chunks(self, meta, items):
        return items[0]

    def schedule(self, meta, items):
        if isinstance(items[0], A.Hole):
            return items[0]
        tok, chunks = items
        return A.Schedule(A.Name(tok[_VALUE], span=self._tspan(tok)), chunks, span=self._span(meta))

    def degree(self, meta, items):
        return A.Degree(items[0], items[1], span=self._span(meta))

    def stage_with(self, meta, items):
        return tuple(items)

    def stage_decl(self, meta, items):
        *paths, degrees = items
        return A.StageDecl(tuple(paths), degrees or (), span=self._span(meta))

    def stages(self, meta, items):
        return self._present(items)

    def stages_hole(self, meta, items):
        return items[0]

    def pipeline_decl(self, meta, items):
        axis, schedule, micro, stages = items
        return A.PipelineDecl(axis, schedule, micro, stages, span=self._span(meta))

    def checkpoint_every(self, meta, items):
        return self._coerce_every(items[0])

    def checkpoint_stmt(self, meta, items):
        *paths, every = items
        return A.CheckpointStmt(tuple(paths), every, span=self._span(meta))

    def checkpoint_hole(self, meta, items):
        return A.CheckpointStmt(items[0], None, span=self._span(meta))

    def param(self, meta, items):
        return A.Param(items[0], items[1], span=self._span(meta))

    def block(self, meta, items):
        return self._present(items)

    def template_decl(self, meta, items):
        name, *rest = items
        body = rest[-1]
        params = self._present(rest[:-1])
        return A.TemplateDecl(name, params, body, span=self._span(meta))

    def template_args(self, meta, items):
        return self._present(items)

    def apply_stmt(self, meta, items):
        return A.ApplyStmt(items[0], items[1], items[2], span=self._span(meta))

    def for_stmt(self, meta, items):
        return A.ForStmt(items[0], items[1], items[2], span=self._span(meta))

    def start(self, meta, items):
        return A.Module(self._present(items), span=self._span(meta))
