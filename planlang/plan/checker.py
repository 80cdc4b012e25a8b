"""Run the checks: resolve a plan file, apply the ordered rule list, honour suppression comments.

Rule lists are passed explicitly, never registered on import: `RULES` are the model-free rules
(planlang.plan.rules, in their order); the model layer's `planlang.model.checks.validate` runs
`RULES + MODEL_RULES`. A rule is a pure function of a `CheckContext`; rules that need the model set
`needs_model=True` and read `ctx.facts["model"]`; they are skipped when it is absent.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from planlang.lang import ast as A
from planlang.lang.diagnostics import Diagnostic, Severity
from planlang.lang.source import SourceFile

from . import rules as R
from .resolve import Resolution, Resolver
from .types import Plan


@dataclass(frozen=True)
class Rule:
    name: str
    codes: tuple[str, ...]
    func: Callable[["CheckContext"], Iterable[Diagnostic]]
    needs_model: bool = False

    def __str__(self) -> str:
        return f"{self.name} ({', '.join(self.codes)})"


@dataclass(frozen=True)
class CheckContext:
    plan: Plan
    sources: dict[str, SourceFile]
    modules: dict[str, A.Module]
    facts: dict = field(default_factory=dict)  # e.g. {"model": ModelFacts} from planlang.model


RULES: tuple[Rule, ...] = tuple(Rule(f.__name__, codes, f) for f, codes in R.RULES)


@dataclass(frozen=True)
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
        if rule.needs_model and "model" not in ctx.facts:
            continue
        out.extend(rule.func(ctx))
    return out


def check_resolution(res: Resolution, path: str, facts: dict | None = None,
                     rules: Sequence[Rule] = RULES) -> CheckResult:
    """The one place a resolved plan is checked: `rules` in order, then suppression comments. Without
    model facts (`facts["model"]`) the model-aware rules among `rules` are skipped."""
    diags = list(res.diagnostics)
    if res.plan is not None and not any(d.code.startswith("PL1") for d in diags):
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


def _dedupe(diags: list[Diagnostic]) -> list[Diagnostic]:
    seen, out = set(), []
    for d in diags:
        key = (d.code, d.span, d.message)
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out


# ------------------------------------------------------------------------------ suppression
_SUPPRESS = re.compile(r"#\s*plan:\s*(ignore|ignore-file)\[([A-Za-z0-9_,\s]+)\]")


def suppressions(module: A.Module, source_text: str | None = None) -> tuple[dict[int, set[str]], set[str]]:
    """(line -> codes, file-wide codes) from `# plan: ignore[PL303]` and `# plan: ignore-file[PL218]`.

    A suppression comment at the end of a line covers that line; on a line of its own it covers the
    next line that is not a comment.
    """
    per_line: dict[int, set[str]] = {}
    whole: set[str] = set()
    comment_lines = {c.span.line for c in module.comments if c.span.col == _first_col(source_text, c.span.line)}
    for c in module.comments:
        m = _SUPPRESS.search(c.text)
        if not m:
            continue
        codes = {x.strip().upper() for x in m.group(2).split(",") if x.strip()}
        if m.group(1) == "ignore-file":
            whole |= codes
            continue
        line = c.span.line
        if line in comment_lines:  # own line: applies to the next line with code
            blank = _blank_lines(source_text)
            line += 1
            while line in comment_lines or line in blank:
                line += 1
        per_line.setdefault(line, set()).update(codes)
    return per_line, whole


def _blank_lines(text: str | None) -> set[int]:
    if text is None:
        return set()
    return {i + 1 for i, s in enumerate(text.split("\n")) if not s.strip()}


def _first_col(text: str | None, line: int) -> int:
    if text is None:
        return 1
    lines = text.split("\n")
    if line - 1 >= len(lines):
        return 1
    s = lines[line - 1]
    return len(s) - len(s.lstrip()) + 1


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
