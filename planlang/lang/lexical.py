"""The one scanner of a plan's comments and strings, for the code that reads plan text without parsing it:
the parser's error recovery and syntax diagnostics (brackets outside strings and comments), and the
language server's lexical tokens (comments, strings, numbers, words, holes).

A comment runs from `#` to the end of the line; a string is the grammar's STRING (`"`, then characters
other than `"`, `\\` and a newline, or a backslash and any character but a newline, then `"`), except
that here a string left open ends where its line (or a lone backslash) ends, so a text being typed is
still scanned line by line. `planlang/grammar/planlang.lark` defines both for the parser; this module
must agree with it (tests/lang/test_lexical.py compares them on the corpus).

Suppression comments (`# plan: ignore[PL303]`) are comments like any other here: the checker reads them
from the comments the parser keeps.
"""
from __future__ import annotations

import re
from collections.abc import Iterator

COMMENT = r"\#[^\n]*"
STRING = r'"(?:[^"\\\n]|\\.)*"?'
NUMBER = r"[0-9](?:_?[0-9])*(?:\.[0-9](?:_?[0-9])*)?(?:[eE][+-]?[0-9]+)?(?![A-Za-z_])"

# what a scan reports, by kind (the named groups); a word may start with a digit (`4x` is no number)
_SCAN = re.compile(rf"""
    (?P<comment>{COMMENT})
  | (?P<string>{STRING})
  | (?P<number>{NUMBER})
  | (?P<word>[A-Za-z0-9_]+)
  | (?P<hole>\?)
  | (?P<bracket>[{{}}()\[\]])
""", re.X)
_SKIPPED = re.compile(rf"{COMMENT}|{STRING}")

KINDS = ("comment", "string", "number", "word", "hole", "bracket")


def scan(text: str, start: int = 0, end: int | None = None) -> Iterator[tuple[str, int, int]]:
    """(kind, start, end) of each comment, string, number, word, hole `?` and bracket of `text[start:end]`,
    in order; white space and other punctuation are passed over."""
    for m in _SCAN.finditer(text, start, len(text) if end is None else end):
        yield m.lastgroup or "", m.start(), m.end()


def brackets(text: str, start: int = 0, end: int | None = None) -> Iterator[tuple[str, int]]:
    """Each bracket (`{ } ( ) [ ]`) of `text[start:end]` outside strings and comments, and its offset."""
    for kind, a, _ in scan(text, start, end):
        if kind == "bracket":
            yield text[a], a


def code_of(text: str) -> str:
    """`text` without its comments and its strings (quotes included): for counting brackets and braces."""
    return _SKIPPED.sub("", text)

