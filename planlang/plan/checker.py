"""Run the checks: resolve a plan file, apply the ordered rule list, honour suppression comments.

Rule lists are passed explicitly, never registered on import: `RULES` are the model-free rules
(planlang.plan.rules, in their order); the model layer's `planlang.model.checks.validate` runs
`RULES + MODEL_RULES`. A rule is a pure function of a `CheckContext`; a rule names the facts it reads
(`needs`, keys of `ctx.facts`: "model", "estimate", "lowered", ...) and is skipped when one is absent
(planlang.model.validation computes each once and leaves out only what a plan with errors or holes
cannot have; a fact it could not compute is a failure, PL369).
"""
from __future__ import annotations

from dataclasses import field
from typing import Callable, Iterable, Sequence

from planlang.lang.frozen import value_type
from planlang.lang import ast as A
from planlang.lang.diagnostics import Diagnostic, Severity
from planlang.lang.lexical import suppression
from planlang.lang.source import SourceFile

from . import rules as R
from .resolve import Resolution, Resolver
from .types import Plan


@value_type
class Rule:
    name: str
    codes: tuple[str, ...]
    func: Callable[["CheckContext"], Iterable[Diagnostic]]
    needs: tuple[str, ...] = ()  # the facts (CheckContext.facts keys) it reads; it runs only when all are there

    @property
    def needs_model(self) -> bool:
        return "model" in self.needs

    def __str__(self) -> str:
        return f"{self.name} ({', '.join(self.codes)})"


@value_type
class CheckContext:
    plan: Plan
    sources: dict[str, SourceFile]
    modules: dict[str, A.Module]
    facts: dict = field(default_factory=dict)  # e.g. {"model": ModelFacts} from planlang.model


RULES: tuple[Rule, ...] = tuple(Rule(f.__name__, codes, f) for f, codes in R.RULES)


@value_type
class CheckResult:
    path: str
    diagnostics: tuple[Diagnostic, ...]
    sources: dict[str, SourceFile]
    plan: Plan | None
    modules: dict[str, A.Module]
    suppressed: int = 0

    @property
    def errors(self) -> int:
        return sum(d.severity is Severity.ERROR for d in self.diagnostics)

    @property
    def warnings(self) -> int:
        return sum(d.severity is Severity.WARNING for d in self.diagnostics)


def run_rules(ctx: CheckContext, rules: Sequence[Rule] = RULES) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    for rule in rules:
        if any(f not in ctx.facts for f in rule.needs):
            continue
        out.extend(rule.func(ctx))
    return out


def check_resolution(res: Resolution, path: str, facts: dict | None = None,
                     rules: Sequence[Rule] = RULES, resolution: bool = True) -> CheckResult:
    """The one place a resolved plan is checked: `rules` in order, then suppression comments. A rule
    whose facts (`needs`) are not in `facts` is skipped. Without `resolution` the result holds only what
    the rules found (a later phase of planlang.model.validation), not the resolver's diagnostics."""
    diags = list(res.diagnostics) if resolution else []
    if res.plan is not None and not any(d.code.startswith("PL1") for d in res.diagnostics):
        ctx = CheckContext(res.plan, res.sources, res.modules, dict(facts or {}))
        diags.extend(run_rules(ctx, rules))
    kept, dropped = apply_suppressions(diags, res.modules, res.sources)
    kept = _dedupe(kept)
    kept.sort(key=lambda d: (d.span.file != path, d.sort_key))
    return CheckResult(path, tuple(kept), res.sources, res.plan, res.modules, dropped)


def check_file(path: str, facts: dict | None = None, **resolver_kw) -> CheckResult:
    """Parse, resolve and check one plan file (the `planlang check` library call)."""
    return check_resolution(Resolver(**resolver_kw).resolve_file(path), path, facts)


def check_text(text: str, path: str = "<plan>", facts: dict | None = None, **resolver_kw) -> CheckResult:
    return check_resolution(Resolver(**resolver_kw).resolve_text(text, path), path, facts)


# (code, code it supersedes on the same line): one mistake two rules see. Stages written as index
# ranges that overlap are PL406 at the range (model-free, the more precise) and PL461 at the stage
# (the model-aware rule, which also sees overlaps of a module and its children).
_SUPERSEDES = (("PL406", "PL461"),)


def _dedupe(diags: list[Diagnostic]) -> list[Diagnostic]:
    seen, out = set(), []
    lines = {(d.code, d.span.file, d.span.line) for d in diags if d.span is not None}
    for d in diags:
        key = (d.code, d.span, d.message)
        if key in seen or any(d.code == lost and d.span is not None and (code, d.span.file, d.span.line) in lines
                              for code, lost in _SUPERSEDES):
            continue
        seen.add(key)
        out.append(d)
    return out


# ------------------------------------------------------------------------------ suppression
def suppressions(module: A.Module, source_text: str | None = None) -> tuple[dict[int, set[str]], set[str]]:
    """(line -> codes, file-wide codes) from `# plan: ignore[PL303]` and `# plan: ignore-file[PL218]`.

    A suppression comment at the end of a line covers that line; on a line of its own it covers the
    next line that is not a comment.
    """
    per_line: dict[int, set[str]] = {}
    whole: set[str] = set()
    spans = [(c, c.span) for c in module.comments]
    comment_lines = {sp.line for _, sp in spans if _own_line(source_text, sp)}
    lines = _NextCode(source_text, comment_lines)
    for c, sp in spans:
        found = suppression(c.text)
        if found is None:
            continue
        whole_file, codes = found
        if whole_file:
            whole |= codes
            continue
        line = sp.line
        if line in comment_lines:  # own line: applies to the next line with code
            line = lines.after(line, sp.start)
        per_line.setdefault(line, set()).update(codes)
    return per_line, whole


def _own_line(text: str | None, span) -> bool:
    """Whether a comment is the first thing on its line (only whitespace before it)."""
    if text is None:
        return span.col == 1
    line_start = span.start - (span.col - 1)
    return line_start == span.start or text[line_start:span.start].isspace()


class _NextCode:
    """For an own-line comment, the next line that is neither blank nor an own-line comment (or the line
    after the last). Walks the text from the comment, not the whole file, and remembers the walk."""

    def __init__(self, text: str | None, comment_lines: set[int]):
        self.text = text
        self.comment_lines = comment_lines
        self.memo: dict[int, int] = {}  # line -> the answer for any comment just above it

    def after(self, line: int, offset: int) -> int:
        text, memo = self.text, self.memo
        walked: list[int] = []
        line += 1
        pos = -1 if text is None else text.find("\n", offset) + 1  # start of `line`; 0: past the end
        while True:
            if line in memo:
                line = memo[line]
                break
            if line in self.comment_lines:
                pass
            elif text is None or pos == 0 or not _blank(text, pos):
                break
            walked.append(line)
            line += 1
            if text is not None and pos:
                pos = text.find("\n", pos) + 1
        for k in walked:
            memo[k] = line
        return line


def _blank(text: str, pos: int) -> bool:
    """Whether the line of `text` starting at offset `pos` is blank."""
    end = text.find("\n", pos)
    return not text[pos:len(text) if end < 0 else end].strip()


def apply_suppressions(diags: list[Diagnostic], modules: dict[str, A.Module],
                       sources: dict[str, SourceFile]) -> tuple[list[Diagnostic], int]:
    tables = {}
    for path, mod in modules.items():
        src = sources.get(path)
        tables[path] = suppressions(mod, src.text if src else None)
    kept, dropped = [], 0
    for d in diags:
        per_line, whole = tables.get(d.span.file, ({}, set()))
        if d.code.startswith("PL1"):  # a file that does not parse is never "clean"
            kept.append(d)
            continue
        if d.code in whole or d.code in per_line.get(d.span.line, set()):
            dropped += 1
            continue
        kept.append(d)
    return kept, dropped
