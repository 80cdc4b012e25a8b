"""Lark's LALR parser for the grammar (`planlang/grammar/planlang.lark`): contextual lexer, newlines made
significant by `PlanPostLex`, comments kept aside by a lexer callback (`SINK`, per thread), and the
reductions of `reductions.py` installed in place of Lark's tree builder, so that it builds the same AST as
the fast driver (`driver.py`), which reads its tables. It parses where the fast driver cannot.
"""
from __future__ import annotations

import threading
from functools import lru_cache
from pathlib import Path as FsPath
from typing import TYPE_CHECKING

from .logs import debug
from .reductions import install_builders
from .source import SourceFile, Span
from .to_ast import ToAst

if TYPE_CHECKING:  # Lark loads when its parser is built: a parse from the parser cache needs none
    from lark import Lark, Token


# package data (in the wheel too); `grammar/` at the top of the checkout links here
GRAMMAR_PATH = FsPath(__file__).resolve().parents[1] / "grammar" / "planlang.lark"


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


class CommentSink:
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


SINK = CommentSink()


@lru_cache(maxsize=1)
def lark_parser() -> Lark:
    """The one LALR parser, whose reductions build AST nodes directly (`reductions.install_builders`): no Lark
    tree is built and walked again, and a node's span comes from its first and last tokens. Installing them
    reads names of Lark's that it does not promise to keep: where that fails (logged once, at debug), the
    parser builds Lark's `Tree`, with positions, and `reductions.tree_to_ast` makes the same AST of it."""
    # lazy: lark loads when its parser is built (a parse from the parser cache needs none)
    from lark import Lark

    lark = Lark(
        GRAMMAR_PATH.read_text(),
        parser="lalr",
        lexer="contextual",
        postlex=PlanPostLex(),
        maybe_placeholders=True,
        lexer_callbacks={"COMMENT": SINK},
        propagate_positions=True,  # for Lark's own tree, where the reductions cannot be installed
        cache=True,
    )
    try:
        install_builders(lark, ToAst)
    except Exception as exc:  # noqa: BLE001 -- Lark's parser as it is then: it builds a Tree
        debug(__name__, "the parser's reductions cannot be installed in Lark's parser (%s: %s); its trees are "
                  "turned into the AST instead", type(exc).__name__, exc, exc_info=exc)
    return lark


def tok_span(source: SourceFile, tok: Token) -> Span:
    """The span of a Lark token in `source`."""
    line, col, end_line, end_col = tok.line, tok.column, tok.end_line, tok.end_column
    start, end = tok.start_pos, tok.end_pos
    if (line is not None and col is not None and end_line is not None and end_col is not None and start is not None
            and end is not None):  # a lexed token knows its lines and columns
        return Span(source.path, line, col, end_line, end_col, start, end)
    start = tok.start_pos or 0
    end = tok.end_pos if tok.end_pos is not None else start + len(str(tok))
    return source.span(start, end)
