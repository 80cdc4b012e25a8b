"""Turn Lark's "unexpected token, expected one of {...}" into a sentence and a help line."""
from __future__ import annotations

from lark import Token

from .diagnostics import did_you_mean
from .render._common import escape_text

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
    "SCHEDULE": "a schedule (gpipe, 1f1b, interleaved)",
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


def describe_unexpected_token(tok: Token, expected: set[str], text: str,
                              patterns: dict[str, str] | None = None) -> tuple[str, str]:
    """(message, help) for an unexpected token given the terminals the parser would have accepted."""
    exp = set(expected)
    kw = {e for e in exp if e.lower() in STATEMENT_KEYWORDS}
    got = describe_token(tok)
    at_statement_start = len(kw) >= 8 and "NAME" not in exp
    if at_statement_start:
        message = f"unexpected {got}: expected a statement"
        word = str(tok) if tok.type == "NAME" else ""
        guess = did_you_mean(word, STATEMENT_KEYWORDS) if word else None
        if guess:
            return message, f"did you mean `{guess}`?"
        return message, "a statement starts with a keyword: " + ", ".join(STATEMENT_KEYWORDS)
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
        return message, f"did you mean `{guess}`?"
    return message, _help_for(tok, exp)


_WORDS_NOT_NAMES = ("INT", "FLOAT", "STRING", "_NL", "$END")


def _help_for(tok: Token, exp: set[str]) -> str:
    if tok.type == "EQUAL" and "COLON" in exp:
        return "specs follow a `:` — for example `shard h[0].mlp.c_fc.weight : [_, tp]`"
    if tok.type == "COLON" and "EQUAL" in exp:
        return "values follow `=` — for example `pp = 2` or `memory = 80 GiB`"
    if "SCHEDULE" in exp:
        return "write one of `gpipe`, `1f1b`, `interleaved chunks N`, or `?` for the solver to choose"
    if tok.type == "_NL":
        return "the statement is incomplete: finish it on this line (long lists may wrap inside ( ) or [ ])"
    if "_NL" in exp or "SEMICOLON" in exp:
        return "put each statement or block item on its own line, or separate them with `;`"
    if "SCHEDULE" in exp:
        return "write one of `gpipe`, `1f1b`, `interleaved chunks N`, or `?` for the solver to choose"
    if "STRING" in exp and tok.type == "NAME":
        return 'the model factory is a quoted import reference, e.g. "examples.mlp.model:build"'
    if exp == {"INT"} or exp == {"INT", "QMARK"}:
        return "write a whole number (digits, `_` allowed as separator)" + (", or `?`" if "QMARK" in exp else "")
    return "see `docs/language.md` for the statement's form"
