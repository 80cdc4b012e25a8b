"""The fast LALR driver: Lark's parse table and its contextual lexer's regexes, driven by one loop whose
reductions (`reductions.py`) build the AST directly, with spans, and which keeps comments aside for
the formatter. It reads Lark's tables and lexers through names Lark does not promise to keep (the
`lark.lexer`, `lark.parsers` imports below, `_parse_table`, `_mres`): a Lark release that changes them
makes building or running it fail, and `parser.py` then parses with Lark's own parser
(`lark_parser.py`), which gives the same AST and the same syntax errors, about 3x slower.
"""
from __future__ import annotations

from collections.abc import Callable
from sys import intern
from typing import TYPE_CHECKING, TypeVar

from . import ast as A
from .lark_parser import SINK
from .reductions import BUILDER, build_nothing, rule_callbacks
from .to_ast import ToAst

if TYPE_CHECKING:  # Lark loads where a driver is built from it or a syntax error is raised: the cached
    # driver (parser_cache.py) parses a clean plan without it
    from lark import Lark
    from lark.exceptions import UnexpectedInput, UnexpectedToken
    from lark.parsers.lalr_parser_state import ParserState

_Err = TypeVar("_Err", bound="UnexpectedInput")

class Fallback(Exception):
    """The fast path stops at something it does not handle (no plan gets here: Lark would fail on it too);
    Lark's own parser runs instead."""


class FastParser:
    """Lark's LALR(1) table and the scanners of its contextual lexer, driven by one loop.

    The same automaton as `Lark.parse` with the same lexer, newline folding (`PlanPostLex`) and the same
    reductions (`reductions.py`), without Lark's per-token objects and calls: about 3x faster on a
    big plan. At the first character that does not lex or token that does not fit it raises the exception
    Lark's parser raises there (`_lexer_error`, `_parser_error`: the same class, token, expected set and
    interactive parser), which the syntax diagnostics are made of.
    """

    def __init__(self, lark: Lark, build: bool = True):
        """The driver of `lark`'s tables; with `build` False its reductions build nothing (a syntax check)."""
        # lazy: lark loads when a driver is built from it or a syntax error is raised
        from lark.parsers.lalr_analysis import Shift

        frontend = lark.parser
        table = frontend.parser._parse_table
        self.table, self.lalr = table, frontend.parser.parser  # for Lark's exceptions
        if build:
            callbacks = rule_callbacks(lark, ToAst, lark_tokens=False)
        else:
            callbacks = {rule: build_nothing for rule in lark.rules}
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
        # a state's scanner is built (its terminals' regex compiled) when a parse first lexes in that state:
        # a plan reaches some of the 122 (gpt2_3d.plan and the stdlib modules it uses: 54), which every
        # `planlang check` built before it parsed anything
        self.scanners: list = [None] * size
        self._made: dict[int, tuple] = {}  # id(lexer) -> its scanner; states with the same terminals share one
        self._scanner_of(self.start_state)  # fails here, not in a parse, where Lark's lexers are not as read

    def _scanner_of(self, state: int) -> tuple:
        """The scanner of `state` (see `_scanner`), built on first use."""
        lexer = self.contextual.lexers[state]
        made = self._made.get(id(lexer))
        if made is None:
            made = self._made[id(lexer)] = self._scanner(lexer)
        self.scanners[state] = made
        return made

    @staticmethod
    def _scanner(lexer) -> tuple:
        """(match, kinds, special) for one of the contextual lexer's lexers: `match(text, pos)` of its
        terminals; what to do with each terminal (`_WORD`, `_PUNCT`, `_OPEN`, `_CLOSE`, `_SPECIAL`, or for one
        with an "unless" callback -- NAME: `shard` is the keyword `shard` where one is expected -- keyword
        text -> terminal); for the ignored and newline terminals, flags (1: may hold newlines, 2: ignored,
        4: a comment)."""
        # lazy: lark loads when a driver is built from it or a syntax error is raised
        from lark.lexer import PatternStr, UnlessCallback

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
            elif cb is not SINK:
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

    def parse(self, text: str, builder: ToAst) -> tuple[A.Module, list[A.Comment]]:
        """The module and its comments; `Fallback` where Lark would raise."""
        actions, goto, scanners = self.actions, self.goto, self.scanners
        end_state = self.end_state
        states = [self.start_state]
        values: list = []
        comments: list[A.Comment] = []
        comment, fid = A.Comment, builder.fid
        pack: Callable[..., A.SpanArg] = A.pack_span  # a comment's span, packed
        n = len(text)
        pos, line, line_start = 0, 1, 0
        depth, last_nl = 0, True  # PlanPostLex: brackets open, and whether the last token fed was a newline
        tok: tuple | None = None
        BUILDER.ast = builder
        while True:
            # ---- the next token the parser sees (lexed in the parser's state, as the contextual lexer does)
            state = states[-1]
            if pos >= n:  # $END, at the last token fed (Lark's Token.new_borrow_pos)
                type_ = "$END"
                tok = ("$END", "", 0, None, 1, 1, None, None) if tok is None else ("$END", "") + tok[2:]
            else:
                scanner = scanners[state]
                if scanner is None:
                    scanner = self._scanner_of(state)
                match, kinds, special = scanner
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
                raise Fallback

    # ------------------------------------------------------------------ Lark's exceptions, as Lark raises them
    def _parser_state(self, text: str, states: list, values: list) -> ParserState:
        # lazy: lark loads when a driver is built from it or a syntax error is raised
        from lark.lexer import LexerThread
        from lark.parsers.lalr_parser_state import ParseConf, ParserState

        lexer_thread = LexerThread.from_text(self.contextual, text)
        return ParserState(ParseConf(self.table, {}, "start"), lexer_thread, list(states), list(values))

    def _interactive(self, err: _Err, parser_state: ParserState) -> _Err:
        # lazy: lark loads when a driver is built from it or a syntax error is raised
        from lark.parsers.lalr_interactive_parser import InteractiveParser

        err.interactive_parser = InteractiveParser(self.lalr, parser_state, parser_state.lexer)  # parse_from_state's
        return err

    def _parser_error(self, text: str, tok: tuple, states: list, values: list) -> UnexpectedToken:
        """What `ParserState.feed_token` raises for a token the parser's state has no action for."""
        # lazy: lark loads when a driver is built from it or a syntax error is raised
        from lark import Token
        from lark.exceptions import UnexpectedToken

        type_, value, start, end, line, col, end_line, end_col = tok
        token = Token(type_, value, start, line, col, end_line, end_col, end)
        expected = {s for s in self.table.states[states[-1]].keys() if s.isupper()}
        parser_state = self._parser_state(text, states, values)
        return self._interactive(UnexpectedToken(token, expected, state=parser_state), parser_state)

    def _lexer_error(self, text: str, pos: int, line: int, line_start: int, states: list,
                     values: list) -> UnexpectedInput:
        """What `ContextualLexer.lex` raises where no terminal of the state's lexer matches: the token the
        lexer of all terminals finds there as an UnexpectedToken, or else UnexpectedCharacters."""
        # lazy: lark loads when a driver is built from it or a syntax error is raised
        from lark.exceptions import UnexpectedCharacters, UnexpectedToken
        from lark.lexer import LexerState, LineCounter, TextSlice

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
