"""One analysis of one document: parse, resolve and run the model-free checks, under one lock.

The parser keeps a module-level comment sink, so parsing is not thread-safe: every call into
planlang.lang / planlang.plan that parses (check, format, resolve) takes `PARSE_LOCK`. The server runs
its handlers on the event-loop thread and only the model-aware checks on a worker thread; the lock
keeps the two from parsing at the same time.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from planlang.lang import ast as A
from planlang.lang.diagnostics import Diagnostic
from planlang.lang.source import SourceFile
from planlang.plan.checker import CheckResult, check_text
from planlang.plan.types import Plan

PARSE_LOCK = threading.RLock()


@dataclass(frozen=True)
class Analysis:
    """What the editor features need to know about one version of a document."""

    path: str
    text: str
    result: CheckResult

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


def analyze(text: str, path: str, read: Callable[[str], str] | None = None) -> Analysis:
    """Check `text` as the plan file `path` (used modules are read with `read`, default: from disk)."""
    kw = {"read": read} if read is not None else {}
    with PARSE_LOCK:
        result = check_text(text, path, **kw)
    return Analysis(path, text, result)


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
