"""Syntax diagnostics: Lark's exceptions (which the fast driver raises as Lark's parser would) turned into
PL1xx diagnostics that say in words what was expected; PL106 for brackets nested too deep, PL225 for a
bidirectional control character.
"""
from __future__ import annotations

import re
import unicodedata
from typing import TYPE_CHECKING

from .diagnostics import Diagnostic, Edit, Fix, Severity, did_you_mean
from .fixes import guess_is_unique, replace as replace_fix
from .lark_parser import lark_parser
from .lexical import brackets, code_of, inside, scan
from .render._common import escape_char, escape_text
from .source import SourceFile

if TYPE_CHECKING:  # lark loads on the error path only: a clean parse reads the parser cache, not Lark
    from lark import Token
    from lark.exceptions import UnexpectedInput, UnexpectedToken

MAX_NESTING = 64  # brackets open at once (PL106); every pass over the tree recurses once per level

STATEMENT_KEYWORDS = (
    "use", "model", "input", "device", "link", "mesh", "budget", "optimizer", "data", "shard",
    "pipeline", "checkpoint", "template", "apply", "for",
)

_PUNCT = {
    "LPAR": "(", "RPAR": ")", "LSQB": "[", "RSQB": "]", "LBRACE": "{", "RBRACE": "}", "COMMA": ",",
    "COLON": ":", "SEMICOLON": ";", "EQUAL": "=", "DOT": ".", "QMARK": "?", "STAR": "*", "SLASH": "/",
    "REPLICATED": "_",
}
_WORDS = {
    "NAME": "a name",
    "INT": "an integer",
    "FLOAT": "a number",
    "STRING": "a string",
    "_NL": "a line break",
    "$END": "the end of the file",
    "SCHEDULE": "a schedule (gpipe, 1f1b, interleaved, looped_bfs, zero_bubble, zbv, dualpipev)",
    "GLOB": "a glob",
}


def _describe_expected(name: str, patterns: dict[str, str] | None = None) -> str:
    if name.startswith("__ANON") and patterns and name in patterns:
        return f"`{patterns[name]}`"
    if name in _WORDS:
        return _WORDS[name]
    if name in _PUNCT:
        return f"`{_PUNCT[name]}`"
    return f"`{name.lower()}`"


def describe_token(tok: Token) -> str:
    if tok.type == "_NL":
        return "line break"
    if tok.type == "$END":
        return "end of file"
    return f"`{quote_source(str(tok))}`"


QUOTE_LIMIT = 40


def quote_source(text: str, limit: int = QUOTE_LIMIT) -> str:
    """Source text for a message: invisible characters escaped (`\\u200b`), cut to `limit` characters
    with `...` (a token can be a 30,000-character name or string)."""
    if len(text) > limit:
        text = text[:limit - 3] + "..."
    return escape_text(text, newlines=True)


def _join(words: list[str]) -> str:
    if len(words) <= 1:
        return "".join(words)
    return ", ".join(words[:-1]) + " or " + words[-1]


Replacement = tuple[str, tuple[str, ...]]  # the token's likely intended text, and the candidates it was picked from


def describe_unexpected_token(tok: Token, expected: set[str], text: str,
                              patterns: dict[str, str] | None = None) -> tuple[str, str, Replacement | None]:
    """(message, help, replacement) for an unexpected token given the terminals the parser would have
    accepted; `replacement` when one word (a keyword for its typo, `:` for `=`) is what was meant."""
    exp = set(expected)
    kw = {e for e in exp if e.lower() in STATEMENT_KEYWORDS}
    got = describe_token(tok)
    at_statement_start = len(kw) >= 8 and "NAME" not in exp
    if at_statement_start:
        message = f"unexpected {got}: expected a statement"
        word = str(tok) if tok.type == "NAME" else ""
        guess = did_you_mean(word, STATEMENT_KEYWORDS) if word else None
        if guess:
            return message, f"did you mean `{guess}`?", (guess, tuple(STATEMENT_KEYWORDS))
        return message, "a statement starts with a keyword: " + ", ".join(STATEMENT_KEYWORDS), None
    def keyword(e: str) -> str | None:
        pattern = (patterns or {}).get(e, e.lower())
        return pattern if e not in _WORDS and e not in _PUNCT and pattern.replace("_", "a").isalnum() else None

    keywords = sorted(k for k in map(keyword, exp) if k)
    if "NAME" in exp:
        # soft keywords are names too; list the name once
        exp = {e for e in exp if not keyword(e)} | {"NAME"}
    words = sorted({_describe_expected(e, patterns) for e in exp})
    message = f"unexpected {got}: expected {_join(words)}"
    guess = did_you_mean(str(tok), keywords) if keywords and "NAME" not in exp and tok.type not in _WORDS_NOT_NAMES \
        and str(tok).replace("_", "a").isalnum() else None
    if guess:
        return message, f"did you mean `{guess}`?", (guess, tuple(keywords))
    if tok.type == "EQUAL" and "COLON" in exp:
        return message, _help_for(tok, exp), (":", ())
    if tok.type == "COLON" and "EQUAL" in exp:
        return message, _help_for(tok, exp), ("=", ())
    return message, _help_for(tok, exp), None


_SCHEDULE_HELP = ("write one of `gpipe`, `1f1b`, `interleaved chunks N`, `looped_bfs chunks N`, `zero_bubble` "
                  "(or `zero_bubble chunks N`), `zbv chunks 2`, `dualpipev chunks 2`, or `?` for the solver "
                  "to choose")
_WORDS_NOT_NAMES = ("INT", "FLOAT", "STRING", "_NL", "$END")


def _help_for(tok: Token, exp: set[str]) -> str:
    if tok.type == "EQUAL" and "COLON" in exp:
        return "specs follow a `:` — for example `shard h[0].mlp.c_fc.weight : [_, tp]`"
    if tok.type == "COLON" and "EQUAL" in exp:
        return "values follow `=` — for example `pp = 2` or `memory = 80 GiB`"
    if "SCHEDULE" in exp:
        return _SCHEDULE_HELP
    if tok.type == "_NL":
        return "the statement is incomplete: finish it on this line (long lists may wrap inside ( ) or [ ])"
    if "_NL" in exp or "SEMICOLON" in exp:
        return "put each statement or block item on its own line, or separate them with `;`"
    if "SCHEDULE" in exp:
        return _SCHEDULE_HELP
    if "STRING" in exp and tok.type == "NAME":
        return 'the model factory is a quoted import reference, e.g. "examples.mlp.model:build"'
    if exp == {"INT"} or exp == {"INT", "QMARK"}:
        return "write a whole number (digits, `_` allowed as separator)" + (", or `?`" if "QMARK" in exp else "")
    return "see `docs/language.md` for the statement's form"


_NOT_BRACKET = re.compile(r"[^{}()\[\]]+")
_ONE_KIND = str.maketrans("{[}]", "(())")


def max_nesting_at_most(text: str, limit: int) -> bool:
    """True when brackets (outside strings and comments) never stand more than `limit` deep, by string
    operations only (a big plan has millions of characters): with the brackets alone, each pass that
    removes `()` pairs takes off one level of matched brackets, and what is left is `)...)(...(`, the
    closers ignored at depth 0 and the openers never closed; no bracket is deeper than the passes plus
    those openers. False means: maybe deeper, look closely."""
    only = _NOT_BRACKET.sub("", code_of(text)).translate(_ONE_KIND)
    passes = 0
    while "()" in only:
        passes += 1
        if passes > limit:
            return False
        only = only.replace("()", "")
    return passes + only.count("(") <= limit


def nesting_diagnostic(source: SourceFile) -> Diagnostic | None:
    """PL106 at the first bracket opened while MAX_NESTING are open (outside strings and comments), so
    that no later pass (the tree transformer, the resolver, the formatter) recurses without bound."""
    text = source.text
    if text.count("{") + text.count("(") + text.count("[") <= MAX_NESTING or max_nesting_at_most(text, MAX_NESTING):
        return None
    depth = 0
    for ch, i in brackets(text):
        if ch in "{([":
            depth += 1
            if depth > MAX_NESTING:
                return Diagnostic(
                    "PL106", Severity.ERROR, f"brackets nested more than {MAX_NESTING} deep",
                    source.span(i, i + 1),
                    help=f"a plan nests a few levels; flatten this to at most {MAX_NESTING} open brackets",
                )
        elif depth > 0:
            depth -= 1
    return None


def unexpected_input() -> type[UnexpectedInput]:
    """Lark's syntax-error class, for `except unexpected_input():` (evaluated only when something is
    raised, so a clean parse does not import Lark)."""
    # lazy: lark loads on the error path only
    from lark.exceptions import UnexpectedInput

    return UnexpectedInput


def diagnostic_for(err: UnexpectedInput, source: SourceFile, work: str) -> Diagnostic:
    # lazy: lark loads when a parse raises its exception (a clean parse reads the parser cache)
    from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedToken

    if isinstance(err, UnexpectedCharacters):
        pos = err.pos_in_stream or 0  # always set by the lexer
        ch = work[pos] if pos < len(work) else ""
        if ch == '"':
            end = work.find("\n", pos)
            end = len(work) if end < 0 else end
            return Diagnostic(
                "PL103", Severity.ERROR, "unterminated string", source.span(pos, end),
                help='close the string with `"` on the same line',
            )
        return Diagnostic(
            "PL102", Severity.ERROR, f"unexpected character {describe_char(ch)}", source.span(pos, pos + 1),
            help=_char_help(ch), fix=_double_quotes(source, pos) if ch == "'" else None,
        )
    if isinstance(err, UnexpectedEOF) or (isinstance(err, UnexpectedToken) and err.token.type == "$END"):
        return _eof_diagnostic(source, work)
    assert isinstance(err, UnexpectedToken)
    tok = err.token
    start = tok.start_pos if tok.start_pos is not None else 0
    end = tok.end_pos if tok.end_pos is not None else start + max(1, len(str(tok)))
    if tok.type == "_NL":
        end = start + 1
    expected = accepted(err)
    names = {t.name: t.pattern.value for t in lark_parser().terminals}
    message, help_, replacement = describe_unexpected_token(tok, expected, work, names)
    span = source.span(start, end)
    fix = None
    if replacement is not None:
        word, (guess, candidates) = str(tok), replacement
        fix = replace_fix(span, guess, f"replace `{quote_source(word)}` with `{guess}`",
                          safe=guess_is_unique(word, guess, candidates))
    return Diagnostic("PL101", Severity.ERROR, message, span, help=help_, fix=fix)


def accepted(err: UnexpectedToken) -> set[str]:
    """The terminals the parser really accepts here (LALR's `expected` set over-approximates after a
    reduction; the interactive parser tries each candidate)."""
    try:
        acc = set(err.interactive_parser.accepts()) if err.interactive_parser is not None else set()
    except Exception:  # accepts() replays the parser; fall back to Lark's own set
        acc = set()
    return acc or set(err.expected or ())


def describe_char(ch: str) -> str:
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
    for ch, i in brackets(work):
        if ch in "{([":
            stack.append((ch, i))
        elif stack and stack[-1][0] == pairs[ch]:
            stack.pop()
    end = len(source.text)
    if stack:
        ch, pos = stack[-1]
        closer = {"{": "}", "(": ")", "[": "]"}[ch]
        return Diagnostic(
            "PL104", Severity.ERROR, f"unexpected end of file: `{ch}` is never closed",
            source.span(pos, pos + 1), help=f"add the matching `{closer}`",
            fix=close_bracket_fix(source, pos, len(source.text)),
        )
    return Diagnostic(
        "PL104", Severity.ERROR, "unexpected end of file: the last statement is incomplete",
        source.span(max(0, end - 1), end), help="finish the statement or remove it",
    )


# Unicode's explicit bidirectional embeddings, overrides (U+202A-U+202E) and isolates (U+2066-U+2069)
BIDI = re.compile("[\u202a-\u202e\u2066-\u2069]")


def bidi_warnings(source: SourceFile) -> tuple[Diagnostic, ...]:
    """PL225 once per line that holds a bidirectional control (Trojan Source: the line reads in another
    order than it is shown), at its first one."""
    out, last_line = [], 0
    for m in BIDI.finditer(source.text):
        span = source.span(m.start(), m.end())
        if span.line == last_line:
            continue
        last_line = span.line
        ch = m.group()
        out.append(Diagnostic(
            "PL225", Severity.WARNING,
            f"bidirectional control character {describe_char(ch)}: the line may be shown in another order "
            "than it is read", span,
            help="remove it (\"Trojan Source\", CVE-2021-42574); plans need no right-to-left text",
            fix=_remove_bidi(source, span),
        ))
    return tuple(out)


def _remove_bidi(source: SourceFile, span) -> Fix:
    """Delete every bidirectional control on the line of `span`. Safe where they all stand outside strings
    (in a comment or between tokens they change nothing the plan says); inside a string they are part of
    its value (a path, an import reference), so the fix is unsafe there."""
    start = source.offset(span.line, 1)
    end = source.text.find("\n", start)
    end = len(source.text) if end < 0 else end
    hits = list(BIDI.finditer(source.text, start, end))
    edits = tuple(Edit(source.span(m.start(), m.end()), "") for m in hits)
    in_string = any(inside(source.text, m.start(), start) == "string" for m in hits)
    return Fix(f"remove {len(hits)} bidirectional control character{'s' if len(hits) > 1 else ''}", edits,
               safe=not in_string)


def close_bracket_fix(source: SourceFile, opener: int, before: int) -> Fix | None:
    """Close the bracket at `opener` after the last text before offset `before`: a `}` on a line of its
    own, indented as the opener's line; a `)` or `]` at the end of that text (none when it ends in a
    comment). Unsafe: where the block or list was meant to end is a guess."""
    text = source.text
    ch = text[opener]
    closer = {"{": "}", "(": ")", "[": "]"}[ch]
    end = code_end(text, before)
    if end <= opener:
        return None
    if ch == "{":
        start = text.rfind("\n", 0, opener) + 1
        indent = text[start:opener][:len(text[start:opener]) - len(text[start:opener].lstrip(" \t"))]
        line_end = text.find("\n", end)
        end = len(text) if line_end < 0 or line_end > before else line_end  # after the line's comment
        insert = "\n" + indent + "}"
    else:
        insert = closer
    return Fix(f"add `{closer}`", (Edit(source.span(end, end), insert),), safe=False)


def code_end(text: str, before: int) -> int:
    """The offset just after the last code (not a comment, not white space) before offset `before`,
    0 when there is none: where a missing `,` or `)` goes."""
    while before > 0:
        line_start = text.rfind("\n", 0, before) + 1
        end = before
        for kind, a, _ in scan(text, line_start, before):
            if kind == "comment":
                end = a
                break
        end = len(text[line_start:end].rstrip()) + line_start
        if end > line_start:
            return end
        before = line_start - 1 if line_start > 0 else 0
    return 0


def _double_quotes(source: SourceFile, pos: int) -> Fix | None:
    """`'a:b'` as `"a:b"`: the string at `pos` closed by `'` on its line, holding no `"` or backslash (which
    would need escaping); else no fix."""
    text = source.text
    line_end = text.find("\n", pos)
    close = text.find("'", pos + 1, len(text) if line_end < 0 else line_end)
    if close < 0 or '"' in text[pos:close] or "\\" in text[pos:close]:
        return None
    return Fix("use double quotes", (Edit(source.span(pos, pos + 1), '"'), Edit(source.span(close, close + 1), '"')))
