"""What `check` and `lint` do, without Typer: reading plan files, checking, rendering, `lint --fix`, and
the closing lines. planlang.cli.language's Typer commands call these;
planlang.cli.fast runs a plain `planlang check` or `lint` through them without loading Typer and Click
(~0.05 CPU-s of every check: issue 32's 0.15 CPU-s target)."""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import List, Optional

from planlang.lang.frozen import value_type
from planlang.cli import cached
from planlang.cli.common import OutputFormat, STDIN, UsageError, echo, fail_usage, plan_files, use_color
from planlang.lang.codes import CODES
from planlang.lang.diagnostics import Diagnostic
from planlang.lang.fixes import fix_to_fixed_point
from planlang.lang.fmt import unified_diff
from planlang.lang.render import render, summary_line
from planlang.lang.source import SourceFile, decode_plan
from planlang.plan.checker import check_text


@value_type
class PlanInput:
    """A file argument as read: the name diagnostics use, its text, its bytes, and PL105 when they are
    not UTF-8 (the text then shows U+FFFD for the bad bytes)."""

    name: str
    text: str
    data: bytes
    undecodable: Diagnostic | None = None  # PL105


def read_plan(name: str, stdin_filename: Optional[str]) -> PlanInput:
    """A file argument; `-` reads standard input once. A file that cannot be read at all is a usage error."""

    if name == STDIN:
        data, name = sys.stdin.buffer.read(), stdin_filename or "<stdin>"
    else:
        try:
            data = Path(name).read_bytes()
        except OSError as err:
            fail_usage(f"cannot read {name}: {err.strerror or err}")
    try:  # the text as written: `fmt` rewrites a byte-order mark or "\r" line ends, the parser reads past them
        return PlanInput(name, data.decode("utf-8"), data)
    except UnicodeDecodeError:
        source, bad = decode_plan(data, name)
        assert bad is not None  # the bytes did not decode: decode_plan says where
    return PlanInput(name, source.text, data, Diagnostic(
        "PL105", CODES["PL105"].severity, "the file is not UTF-8 text: this byte is not valid UTF-8",
        source.span(*bad), help="save the file as UTF-8"))


def check_one(name: str, text: str, model: bool, use_paths: tuple[str, ...] = (), cache: bool = True):
    """Check one plan given as text: its `use "file"` imports resolve next to `name` (and in `use_paths`).
    With `model`: the model-free check first (its errors end it), then the cached result of the same plan
    and model (`cache`: planlang.cli.cached), else the validation against the model."""
    if model:
        def run():
            # lazy: torch loads only when this runs (not when the model-free check or the cache answers)
            from planlang.model.validation import check_with_model
            from planlang.runtime.program_memory import measure

            return check_with_model(name, text=text, search_paths=use_paths, program=measure)

        return cached.check_model(name, text, use_paths, cache, run)
    return check_text(text, name, search_paths=use_paths)


def statistics_table(diags) -> str:
    counts = Counter(d.code for d in diags)
    width = len(str(max(counts.values(), default=0)))
    rows = [f"{n:>{width}}  {code}  {CODES[code].name if code in CODES else ''}".rstrip()
            for code, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    return "".join(r + "\n" for r in rows) + f"Found {sum(counts.values())} finding{'s' if len(diags) != 1 else ''}.\n"


@value_type
class FixMode:
    apply: bool  # --fix: write the fixed files
    unsafe: bool  # --unsafe-fixes: unsafe fixes count as fixes too
    diff: bool  # --diff: print the changes as a unified diff, write nothing


def run_checks(paths: List[Path], fmt: OutputFormat, color: Optional[bool], fail_on_warnings: bool,
               model: bool = False, *, config=None, stdin_filename: Optional[str] = None,
               exit_zero: bool = False, statistics: bool = False, cache: bool = True,
               fixes: Optional[FixMode] = None) -> int:
    """Check `paths` and render what is found; with `fixes` (lint --fix / --diff) apply the fixes first
    and report what remains. The exit code."""
    try:
        files = plan_files(paths or [Path(".")], config)  # no path: the working folder, as ruff does
    except UsageError as err:
        fail_usage(str(err))
    diags: list[Diagnostic] = []
    sources: dict[str, SourceFile] = {}
    fixed: list[Diagnostic] = []
    would_change = 0
    use_paths = config.use_paths if config is not None else ()
    active = fixes is not None and (fixes.apply or fixes.diff)
    # `-` fixed: its text goes to stdout (a filter), so the findings go to stderr
    out_stream = sys.stderr if active and fixes is not None and fixes.apply and STDIN in files else sys.stdout

    for f in files:
        plan = read_plan(f, stdin_filename)
        if plan.undecodable is not None:  # reported where it is; the other files are still checked
            diags.append(plan.undecodable)
            sources[plan.name] = SourceFile(plan.name, plan.text)
            continue
        text = plan.text
        if active:
            assert fixes is not None
            new, done = fix_one(f, plan.name, text, use_paths, config, fixes)
            fixed.extend(done)
            would_change += new != text
            text = text if fixes.diff else new  # --diff: the findings are those of the file as it is
        res = check_one(plan.name, text, model, use_paths, cache)
        diags.extend(config.keep(res.diagnostics) if config is not None else res.diagnostics)
        sources.update(res.sources)
    if statistics:
        sys.stdout.write(statistics_table(diags))
    elif not (fixes is not None and fixes.diff):
        out = render(diags, sources, fmt.value, color=use_color(color) if fmt is OutputFormat.human else False)
        if out:
            out_stream.write(out if out.endswith("\n") else out + "\n")
    if fmt is OutputFormat.human and not active:
        label = f"{len(files)} file{'s' if len(files) != 1 else ''}"
        echo(f"{label}: {summary_line(diags)}", err=True)
    if (fmt is OutputFormat.concise or active) and not statistics:
        found_line(diags, fixed, fixes)
    bad = {"error"} | ({"warning"} if fail_on_warnings else set())
    if exit_zero:
        return 0
    return 1 if any(d.severity.value in bad for d in diags) or (fixes is not None and fixes.diff and would_change) else 0


def fix_one(f: str, name: str, text: str, use_paths: tuple[str, ...], config, mode: FixMode):
    """Fix one plan to a fixed point (model-free checks: model-aware diagnostics carry no fixes), write it
    back (or print its diff, or the text for `-`), and say on stderr what was fixed."""

    def diagnostics(t: str) -> list[Diagnostic]:
        found = check_one(name, t, False, use_paths).diagnostics
        kept = config.keep(found) if config is not None else list(found)
        # only fixes that edit this file: a used module is fixed when it is checked itself
        return [d for d in kept if d.span.file == name and (d.fix is None or all(e.span.file == name for e in d.fix.edits))]

    result = fix_to_fixed_point(text, diagnostics, unsafe=mode.unsafe)
    if mode.diff:
        if result.text != text:  # fmt's diff, its new side named for what made it
            sys.stdout.write(unified_diff(text, result.text, name).replace(f"{name} (formatted)", f"{name} (fixed)", 1))
        return result.text, result.fixed
    if f == STDIN:
        sys.stdout.write(result.text)
    elif result.text != text:
        Path(f).write_text(result.text, encoding="utf-8")
    for d in result.fixed:
        assert d.fix is not None
        echo(f"fixed {name}:{d.span.line}:{d.span.col}: {d.code} {d.fix.message}", err=True)
    return result.text, result.fixed


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def found_line(diags: list[Diagnostic], fixed: list[Diagnostic], mode: Optional[FixMode]) -> None:
    """ruff's closing lines, on stderr (stdout is the findings): `Found 3 problems (2 fixed, 1 remaining).`,
    and how many more `--fix` or `--unsafe-fixes` would fix."""
    n = len(diags) + len(fixed)
    if n == 0:
        echo("All checks passed!", err=True)
        return
    if mode is not None and mode.diff:
        echo(f"Would fix {_plural(len(fixed), 'problem')} ({len(diags)} found in the files as they are).", err=True)
        return
    if fixed:
        echo(f"Found {_plural(n, 'problem')} ({len(fixed)} fixed, {len(diags)} remaining).", err=True)
    else:
        echo(f"Found {_plural(n, 'problem')}.", err=True)
    unsafe = mode is not None and mode.unsafe
    fixable = sum(d.fix is not None and (d.fix.safe or unsafe) for d in diags)
    hidden = sum(d.fix is not None and not d.fix.safe for d in diags) if not unsafe else 0
    if fixable and not (mode is not None and mode.apply):
        echo(f"[*] {fixable} fixable with `planlang lint --fix`" + (" --unsafe-fixes" if unsafe else "") + ".",
             err=True)
    if hidden:
        echo(f"({hidden} more fix{'es' if hidden != 1 else ''} with `--unsafe-fixes`: "
             f"{'they' if hidden != 1 else 'it'} may change what the plan means.)", err=True)
