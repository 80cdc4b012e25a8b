"""Diagnostics are data: a stable code, a severity, a primary span, labels, a help line.

Every output format (human, concise, json, sarif, github) is a renderer over these values
(see `planlang.lang.render`). Codes and their explanations live in `planlang.lang.codes`.
"""
from __future__ import annotations

import difflib
import os
from dataclasses import field, replace
from enum import Enum

from .frozen import value_type
from .source import Span


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"
    NOTE = "note"

    @property
    def rank(self) -> int:
        return {"error": 0, "warning": 1, "note": 2}[self.value]


@value_type
class Label:
    """A secondary span with a short message (`help` arrows in the human rendering)."""

    span: Span
    message: str

    def __str__(self) -> str:
        return f"{self.span}: {self.message}"


@value_type
class Edit:
    """Replace the text of `span` (its character offsets `start`..`end`) with `text`; an empty span inserts."""

    span: Span
    text: str

    def __str__(self) -> str:
        return f"{self.span}: {self.text!r}"


@value_type
class Fix:
    """A mechanical fix of one diagnostic: its edits, applied together.

    `safe` is False where applying it changes what the plan means (a different size, a dropped line):
    `planlang lint --fix` applies only safe fixes, `--unsafe-fixes` the others too."""

    message: str
    edits: tuple[Edit, ...]
    safe: bool = True

    def __str__(self) -> str:
        return f"fix: {self.message}" + ("" if self.safe else " (unsafe)")


@value_type
class Diagnostic:
    code: str
    severity: Severity
    message: str
    span: Span
    labels: tuple[Label, ...] = ()
    help: str | None = None
    notes: tuple[str, ...] = field(default=())
    fix: Fix | None = None  # where the fix is mechanical: the edits that make it

    def __str__(self) -> str:
        return f"{self.span}: {self.severity.value}[{self.code}]: {self.message}"

    def with_severity(self, severity: Severity) -> "Diagnostic":
        return replace(self, severity=severity)

    @property
    def sort_key(self):
        s = self.span
        return (s.file, s.line, s.col, self.code)


def has_errors(diags) -> bool:
    return any(d.severity is Severity.ERROR for d in diags)


def did_you_mean(word: str, candidates) -> str | None:
    """The closest candidate by edit distance, if it is close enough to be a likely typo."""

    cands = sorted(set(candidates))
    # a difference of case only is the likeliest typo (`GIB` is `GiB`, not `GB`)
    same_letters = [c for c in cands if c.lower() == word.lower()]
    if same_letters:
        return same_letters[0]
    close = close_matches(word, cands)
    return close[0] if close else None


def close_matches(word: str, candidates) -> list[str]:
    """Every candidate close enough to `word` to be a likely typo of it, the closest first.

    difflib's ratio against a cutoff (0.5 for words of up to 3 letters, else 0.6), as get_close_matches,
    but a tie goes to the candidate that starts like the word (`dpp`: `dp`, not `pp`), then to the first
    in sorted order (get_close_matches takes the last)."""
    cutoff = 0.5 if len(word) <= 3 else 0.6
    matcher = difflib.SequenceMatcher()
    matcher.set_seq2(word)
    scored = []
    for c in sorted(set(candidates)):
        matcher.set_seq1(c)
        if matcher.real_quick_ratio() < cutoff or matcher.quick_ratio() < cutoff:
            continue
        ratio = matcher.ratio()
        if ratio >= cutoff:
            scored.append(((-ratio, -len(os.path.commonprefix([word, c]))), c))
    return [c for _, c in sorted(scored, key=lambda t: t[0])]
