"""The one scanner of a plan's comments and strings, for the code that reads plan text without parsing it:
the parser's error recovery and syntax diagnostics (brackets outside strings and comments), and the
language server: its lexical tokens (comments, strings, numbers, words, holes), the blocks open at the
cursor and whether the cursor stands in a comment or a string (completion, hover on a line no tree
covers).

A comment runs from `#` to the end of the line; a string is the grammar's STRING (`"`, then characters
other than `"`, `\\` and a newline, or a backslash and any character but a newline, then `"`), except
that here a string left open ends where its line (or a lone backslash) ends, so a text being typed is
still scanned line by line. `planlang/grammar/planlang.lark` defines both for the parser; this module
must agree with it (tests/lang/test_lexical.py compares them on the corpus).

Suppression comments (`# plan: ignore[PL303]`, `# plan: ignore-file[PL218]`) are comments like any
other to the scan; `suppression` reads one (for the checker, from the comments the parser keeps) and
`suppression_open` says whether a comment typed so far stands inside one's `[...]` (for completion):
one pattern for both.
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
_CLOSED_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')

_SUPPRESSION_HEAD = r"\#\s*plan:\s*(?P<kind>ignore-file|ignore)\["
_CODES = r"[A-Za-z0-9_,\s]"
_SUPPRESSION = re.compile(rf"{_SUPPRESSION_HEAD}(?P<codes>{_CODES}+)\]")
_SUPPRESSION_OPEN = re.compile(rf"{_SUPPRESSION_HEAD}{_CODES}*$")

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



def inside(text: str, offset: int, start: int = 0) -> str | None:
    """"comment" when `offset` is inside a comment (after its `#`), "string" when inside a string (after
    its opening quote, before its closing one: a string still open at `offset` too), else None; the
    scan starts at `start` (a line's start: strings and comments never span lines)."""
    last = None
    for last in _SCAN.finditer(text, start, offset):
        pass
    if last is None or last.end() < offset:
        return None
    kind = last.lastgroup
    if kind == "comment":
        return "comment"
    if kind == "string" and not _CLOSED_STRING.fullmatch(text, last.start(), last.end()):
        return "string"
    return None


def suppression(comment: str) -> tuple[bool, set[str]] | None:
    """(whole file, codes in upper case) of a suppression comment's text (`# plan: ignore[PL303, PL304]`,
    `# plan: ignore-file[PL218]`), or None when the comment suppresses nothing."""
    m = _SUPPRESSION.search(comment)
    if m is None:
        return None
    return m.group("kind") == "ignore-file", {c.strip().upper() for c in m.group("codes").split(",") if c.strip()}


def suppression_open(prefix: str) -> bool:
    """Whether `prefix` (a line up to the cursor) ends inside a suppression comment's `[...]`, where
    codes go."""
    return _SUPPRESSION_OPEN.search(prefix) is not None
