"""One analysis of one document: parse, resolve and run the model-free checks.

A text that does not parse also has a *recovered* analysis (`Analysis.recovered`, computed on first
use): the same text with its broken lines blanked (offsets kept: every character becomes a space) and
the blocks left open at the end closed, analysed again. Its names and spans stand for the current text
wherever a line was not blanked, so completion and hover work in a file that has never parsed (a new
plan being typed), not only while an earlier version that parsed can stand in.

Parsing is re-entrant (the parser collects comments per thread), so the event-loop thread and the
model-checks worker parse at the same time without a lock.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable

from planlang.lang import ast as A
from planlang.lang.diagnostics import Diagnostic
from planlang.lang.lexical import code_of
from planlang.lang.source import SourceFile, lone_cr_as_lf
from planlang.plan.checker import CheckResult, check_text
from planlang.plan.types import Plan

MAX_RECOVERY_ROUNDS = 12


@dataclass(frozen=True)
class Analysis:
    """What the editor features need to know about one version of a document."""

    path: str
    text: str
    result: CheckResult
    read: Callable[[str], str] | None = field(default=None, compare=False, repr=False)

    @property
    def module(self) -> A.Module:
        return self.result.modules.get(self.path) or A.Module((), (), self.path)

    @property
    def source(self) -> SourceFile:
        return self.result.sources.get(self.path) or SourceFile(self.path, self.text)

    @property
    def parses(self) -> bool:
        return not any(d.code.startswith("PL1") and d.span.file == self.path for d in self.result.diagnostics)

    @property
    def plan(self) -> Plan | None:
        return self.result.plan

    @property
    def diagnostics(self) -> tuple[Diagnostic, ...]:
        return self.result.diagnostics

    def module_of(self, path: str) -> A.Module | None:
        """A parsed used module (by the path the resolver found it at)."""
        return self.result.modules.get(path)

    @cached_property
    def recovered(self) -> "Analysis | None":
        """This analysis when the text parses; else the analysis of the text with its broken lines
        blanked and its open blocks closed (same offsets), or None when that does not parse either."""
        return self if self.parses else recover(self)


def analyze(text: str, path: str, read: Callable[[str], str] | None = None) -> Analysis:
    """Check `text` as the plan file `path` (used modules are read with `read`, default: from disk). The
    analysis holds the text with its lone "\\r" line ends made "\\n" (`Analysis.text`): the client counts
    lines at "\\n", "\\r\\n" and "\\r", the features below (the scanner, completion's patterns, the
    stand-ins' line comparisons) at "\\n", and a "\\r\\n" line is a "\\n" line with a "\\r" at its end."""
    text = lone_cr_as_lf(text)  # same offsets and lines: every feature below reads lines as ending at "\n"
    result = check_text(text, path, read=read)  # read None: the resolver reads from disk
    return Analysis(path, text, result, read)


def reader(open_documents: Callable[[str], str | None]) -> Callable[[str], str]:
    """A file reader that prefers the editor's unsaved text of an open document over the disk."""

    def read(p: str) -> str:
        text = open_documents(p)
        return text if text is not None else Path(p).read_text(encoding="utf-8")

    return read


def stand_in(current: Analysis, good: Analysis | None, offset: int) -> tuple[Analysis, int]:
    """The analysis (and offset) to answer a request at `offset` with. While the text does not parse,
    the last version that did stands in, when the cursor's line reads the same there and no line was
    added or removed (so every span of that version still points at the same line)."""
    if current.parses or good is None:
        return current, offset
    cur_lines, good_lines = current.text.split("\n"), good.text.split("\n")
    if len(cur_lines) != len(good_lines):
        return current, offset
    line = current.text.count("\n", 0, offset)
    if cur_lines[line] != good_lines[line]:
        return current, offset
    col = offset - (current.text.rfind("\n", 0, offset) + 1)
    start = sum(len(s) + 1 for s in good_lines[:line])
    return good, start + col


def references(current: Analysis, good: Analysis | None = None) -> list[Analysis]:
    """The analyses whose names stand for the current text's, best first: the current one when it
    parses; else its recovered version (same offsets, less the broken lines) and the last version that
    parsed; else the current one (no names)."""
    if current.parses:
        return [current]
    refs = [r for r in (current.recovered, good) if r is not None]
    return refs or [current]


def stand_in_for(current: Analysis, good: Analysis | None, offset: int) -> tuple[Analysis, int]:
    """Like `stand_in`, trying the recovered text first: it is the current text less its broken lines,
    so it answers at the same offset wherever the cursor's line was kept."""
    if current.parses:
        return current, offset
    rec = current.recovered
    if rec is not None and same_line(current.text, rec.text, offset):
        return rec, offset
    return stand_in(current, good, offset)


def same_line(text: str, other: str, offset: int) -> bool:
    """Whether the line of `text` at `offset` reads the same in `other` (at the same offsets)."""
    start = text.rfind("\n", 0, offset) + 1
    end = text.find("\n", offset)
    end = len(text) if end < 0 else end
    return other[start:end] == text[start:end] and bool(text[start:end].strip())


# ------------------------------------------------------------------------------ recovery
def recover(current: Analysis) -> Analysis | None:
    """The analysis of `current`'s text made to parse: statements whose `(` or `[` never closes and the
    lines the parser reports are blanked (a line that opens a block that closes: the whole block, as the
    parser's own recovery does), blocks left open at the end are closed on lines after the text.
    Offsets in the text are unchanged. None when no version parses within a few rounds."""
    lines = current.text.split("\n")
    _blank_unclosed_brackets(lines)
    n = len(lines)
    blanked: dict[int, int] = {}
    for _ in range(MAX_RECOVERY_ROUNDS):
        depth = 0
        for text_line in lines:
            code = code_of(text_line)
            depth = max(0, depth + code.count("{") - code.count("}"))
        work = "\n".join(lines) + ("\n" + "}\n" * depth if depth else "")
        a = analyze(work, current.path, current.read)
        bad = sorted({d.span.line for d in a.diagnostics if d.code.startswith("PL1") and d.span.file == current.path})
        if not bad:
            return a
        progress = False
        for line in bad:
            if line > n:  # at a closing brace of ours: the text's last statement is unfinished
                last = _last_code_line(lines)
                if last is None:
                    return None
                line = last
            level = blanked.get(line, 0) + 1
            if level > 2:
                continue
            blanked[line] = level
            _blank_at(lines, line - 1, whole_block=level == 1)
            progress = True
        if not progress:
            return None
    return None


STATEMENT_START = re.compile(
    r"^\s*(use|model|input|device|link|mesh|budget|optimizer|data|shard|pipeline|checkpoint|template|apply"
    r"|for|stage)\s+[\w\"?]")


def _blank_unclosed_brackets(lines: list[str]) -> None:
    """Blank the statements whose `(` or `[` is still open when the next statement (or a `}`, or the
    end) starts: a list may span lines, but an unclosed one swallows what follows."""
    depth, opened_at = 0, 0
    for i, line in enumerate(lines + [""]):
        code = code_of(line)
        if depth > 0 and (i == len(lines) or STATEMENT_START.match(code) or code.lstrip().startswith("}")):
            for k in range(opened_at, i):
                lines[k] = _blank(lines[k], "{}")
            depth = 0
        for ch in code:
            if ch in "([":
                if depth == 0:
                    opened_at = i
                depth += 1
            elif ch in ")]":
                depth = max(0, depth - 1)


def _blank(line: str, keep: str = "") -> str:
    return "".join(c if c in keep else " " for c in line)


def _last_code_line(lines: list[str]) -> int | None:
    for i in range(len(lines) - 1, -1, -1):
        if code_of(lines[i]).strip():
            return i + 1
    return None


def _blank_at(lines: list[str], i: int, whole_block: bool) -> None:
    """Blank line `i` (0-based). First time: a line that opens a block that closes takes the block with
    it; otherwise the braces stay (the block's body keeps its context). Second time: braces too."""
    if not 0 <= i < len(lines):
        return
    before = lines[i]
    code = code_of(before)
    opened = code.count("{") - code.count("}")
    if whole_block and opened > 0:
        depth = opened
        for j in range(i + 1, len(lines)):
            c = code_of(lines[j])
            depth += c.count("{") - c.count("}")
            if depth <= 0:
                for k in range(i, j + 1):
                    lines[k] = _blank(lines[k])
                return
    lines[i] = _blank(before, "{}" if whole_block else "")
