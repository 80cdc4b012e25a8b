"""The language commands: `check`, `lint`, `fmt`, `explain` and `lsp`. None imports torch (`check --model`
loads the model layer on request)."""
from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

import typer

from planlang.cli import cached
from planlang.cli.cached import NO_CACHE_HELP
from planlang.lang.codes import CODES, explain as explain_code
from planlang.lang.diagnostics import Diagnostic, did_you_mean
from planlang.lang.fixes import fix_to_fixed_point
from planlang.lang.render import render, summary_line
from planlang.lang.source import SourceFile, decode_plan, plan_text
from planlang.cli.app import (OutputFormat, STDIN, UsageError, _COLOR, _CONFIG, _EXIT_ZERO, _EXTEND, _IGNORE, _ISOLATED,
                              _MODEL, _PATHS, _SELECT, _STATS, _STDIN_NAME, _config, _fail_usage, _use_color, plan_files)


@dataclass(frozen=True)
class _PlanInput:
    """A file argument as read: the name diagnostics use, its text, its bytes, and PL105 when they are
    not UTF-8 (the text then shows U+FFFD for the bad bytes)."""

    name: str
    text: str
    data: bytes
    undecodable: Diagnostic | None = None  # PL105


def _read_plan(name: str, stdin_filename: Optional[str]) -> _PlanInput:
    """A file argument; `-` reads standard input once. A file that cannot be read at all is a usage error."""

    if name == STDIN:
        data, name = sys.stdin.buffer.read(), stdin_filename or "<stdin>"
    else:
        try:
            data = Path(name).read_bytes()
        except OSError as err:
            _fail_usage(f"cannot read {name}: {err.strerror or err}")
    try:  # the text as written: `fmt` rewrites a byte-order mark or "\r" line ends, the parser reads past them
        return _PlanInput(name, data.decode("utf-8"), data)
    except UnicodeDecodeError:
        source, bad = decode_plan(data, name)
        assert bad is not None  # the bytes did not decode: decode_plan says where
    return _PlanInput(name, source.text, data, Diagnostic(
        "PL105", CODES["PL105"].severity, "the file is not UTF-8 text: this byte is not valid UTF-8",
        source.span(*bad), help="save the file as UTF-8"))


# with --model: model results kept on disk are not read or written (planlang.cli.cached)
_NO_CACHE = typer.Option(False, "--no-cache", help=NO_CACHE_HELP)


def _check_one(name: str, text: str, model: bool, use_paths: tuple[str, ...] = (), cache: bool = True):
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
    # lazy: lark loads only when this runs
    from planlang.plan.checker import check_text

    return check_text(text, name, search_paths=use_paths)


def _statistics(diags) -> str:
    counts = Counter(d.code for d in diags)
    width = len(str(max(counts.values(), default=0)))
    rows = [f"{n:>{width}}  {code}  {CODES[code].name if code in CODES else ''}".rstrip()
            for code, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    return "".join(r + "\n" for r in rows) + f"Found {sum(counts.values())} finding{'s' if len(diags) != 1 else ''}.\n"


def _run_checks(paths: List[Path], fmt: OutputFormat, color: Optional[bool], fail_on_warnings: bool,
                model: bool = False, *, config=None, stdin_filename: Optional[str] = None,
                exit_zero: bool = False, statistics: bool = False, cache: bool = True,
                fixes: Optional["_FixMode"] = None) -> int:
    """Check `paths` and render what is found; with `fixes` (lint --fix / --diff) apply the fixes first
    and report what remains."""
    try:
        files = plan_files(paths or [Path(".")], config)  # no path: the working folder, as ruff does
    except UsageError as err:
        _fail_usage(str(err))
    diags: list[Diagnostic] = []
    sources: dict[str, SourceFile] = {}
    fixed: list[Diagnostic] = []
    would_change = 0
    use_paths = config.use_paths if config is not None else ()
    active = fixes is not None and (fixes.apply or fixes.diff)
    # `-` fixed: its text goes to stdout (a filter), so the findings go to stderr
    out_stream = sys.stderr if active and fixes is not None and fixes.apply and STDIN in files else sys.stdout

    for f in files:
        plan = _read_plan(f, stdin_filename)
        if plan.undecodable is not None:  # reported where it is; the other files are still checked
            diags.append(plan.undecodable)
            sources[plan.name] = SourceFile(plan.name, plan.text)
            continue
        text = plan.text
        if active:
            assert fixes is not None
            new, done = _fix_one(f, plan.name, text, use_paths, config, fixes)
            fixed.extend(done)
            would_change += new != text
            text = text if fixes.diff else new  # --diff: the findings are those of the file as it is
        res = _check_one(plan.name, text, model, use_paths, cache)
        diags.extend(config.keep(res.diagnostics) if config is not None else res.diagnostics)
        sources.update(res.sources)
    if statistics:
        sys.stdout.write(_statistics(diags))
    elif not (fixes is not None and fixes.diff):
        out = render(diags, sources, fmt.value, color=_use_color(color) if fmt is OutputFormat.human else False)
        if out:
            out_stream.write(out if out.endswith("\n") else out + "\n")
    if fmt is OutputFormat.human and not active:
        label = f"{len(files)} file{'s' if len(files) != 1 else ''}"
        typer.echo(f"{label}: {summary_line(diags)}", err=True)
    if (fmt is OutputFormat.concise or active) and not statistics:
        _found_line(diags, fixed, fixes)
    bad = {"error"} | ({"warning"} if fail_on_warnings else set())
    if exit_zero:
        return 0
    return 1 if any(d.severity.value in bad for d in diags) or (fixes is not None and fixes.diff and would_change) else 0


@dataclass(frozen=True)
class _FixMode:
    apply: bool  # --fix: write the fixed files
    unsafe: bool  # --unsafe-fixes: unsafe fixes count as fixes too
    diff: bool  # --diff: print the changes as a unified diff, write nothing


def _fix_one(f: str, name: str, text: str, use_paths: tuple[str, ...], config, mode: _FixMode):
    """Fix one plan to a fixed point (model-free checks: model-aware diagnostics carry no fixes), write it
    back (or print its diff, or the text for `-`), and say on stderr what was fixed."""
    # lazy: lark loads only when this runs
    from planlang.lang.fmt import unified_diff

    def diagnostics(t: str) -> list[Diagnostic]:
        found = _check_one(name, t, False, use_paths).diagnostics
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
        typer.echo(f"fixed {name}:{d.span.line}:{d.span.col}: {d.code} {d.fix.message}", err=True)
    return result.text, result.fixed


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _found_line(diags: list[Diagnostic], fixed: list[Diagnostic], mode: Optional[_FixMode]) -> None:
    """ruff's closing lines, on stderr (stdout is the findings): `Found 3 problems (2 fixed, 1 remaining).`,
    and how many more `--fix` or `--unsafe-fixes` would fix."""
    n = len(diags) + len(fixed)
    if n == 0:
        typer.echo("All checks passed!", err=True)
        return
    if mode is not None and mode.diff:
        typer.echo(f"Would fix {_plural(len(fixed), 'problem')} ({len(diags)} found in the files as they are).",
                   err=True)
        return
    if fixed:
        typer.echo(f"Found {_plural(n, 'problem')} ({len(fixed)} fixed, {len(diags)} remaining).", err=True)
    else:
        typer.echo(f"Found {_plural(n, 'problem')}.", err=True)
    unsafe = mode is not None and mode.unsafe
    fixable = sum(d.fix is not None and (d.fix.safe or unsafe) for d in diags)
    hidden = sum(d.fix is not None and not d.fix.safe for d in diags) if not unsafe else 0
    if fixable and not (mode is not None and mode.apply):
        typer.echo(f"[*] {fixable} fixable with `planlang lint --fix`" + (" --unsafe-fixes" if unsafe else "") + ".",
                   err=True)
    if hidden:
        typer.echo(f"({hidden} more fix{'es' if hidden != 1 else ''} with `--unsafe-fixes`: "
                   f"{'they' if hidden != 1 else 'it'} may change what the plan means.)", err=True)


# `check` and `lint` with no path check the working folder (as `ruff check` does)
_PATHS_OR_HERE = typer.Argument(None, help="Plan files or folders (every *.plan below), or - for standard input; "
                                           "none: the working folder.", show_default=False)


def check(
    paths: Optional[List[Path]] = _PATHS_OR_HERE,
    format: OutputFormat = typer.Option(OutputFormat.human, "--format", "-f", help="Output format."),
    color: Optional[bool] = _COLOR,
    model: bool = _MODEL,
    stdin_filename: Optional[str] = _STDIN_NAME,
    select: List[str] = _SELECT,
    extend_select: List[str] = _EXTEND,
    ignore: List[str] = _IGNORE,
    config: Optional[Path] = _CONFIG,
    isolated: bool = _ISOLATED,
    exit_zero: bool = _EXIT_ZERO,
    statistics: bool = _STATS,
    fail_on_warnings: bool = typer.Option(False, "--fail-on-warnings",
                                          help="Exit 1 on warnings too (as `lint` does), not only on errors."),
    no_cache: bool = _NO_CACHE,
) -> None:
    """Check plans: syntax, names, units, mesh, specs, pipeline, checkpointing, budget. Exit 1 on errors
    (and on warnings with --fail-on-warnings)."""
    cfg = _config(config, isolated, select, extend_select, ignore)
    raise typer.Exit(_run_checks(paths or [], format, color, fail_on_warnings=fail_on_warnings, model=model, config=cfg,
                                 stdin_filename=stdin_filename, exit_zero=exit_zero, statistics=statistics,
                                 cache=not no_cache))


def lint(
    paths: Optional[List[Path]] = _PATHS_OR_HERE,
    format: OutputFormat = typer.Option(OutputFormat.concise, "--format", "-f", help="Output format."),
    color: Optional[bool] = _COLOR,
    model: bool = _MODEL,
    stdin_filename: Optional[str] = _STDIN_NAME,
    select: List[str] = _SELECT,
    extend_select: List[str] = _EXTEND,
    ignore: List[str] = _IGNORE,
    config: Optional[Path] = _CONFIG,
    isolated: bool = _ISOLATED,
    exit_zero: bool = _EXIT_ZERO,
    statistics: bool = _STATS,
    no_cache: bool = _NO_CACHE,
    fix: bool = typer.Option(False, "--fix", help="Apply the safe fixes, rewriting the files (`-`: the fixed "
                                                  "plan to standard output); report what remains."),
    unsafe_fixes: bool = typer.Option(False, "--unsafe-fixes", help="With --fix or --diff, apply the fixes that "
                                                                    "may change what a plan means too."),
    diff: bool = typer.Option(False, "--diff", help="Write nothing; print the fixes as a unified diff (exit 1 if "
                                                    "there is one)."),
) -> None:
    """Check plans for CI: concise output by default; exit 1 on errors or warnings. `--fix` applies the
    mechanical fixes (those marked [*]) and reports what remains."""
    cfg = _config(config, isolated, select, extend_select, ignore)
    raise typer.Exit(_run_checks(paths or [], format, color if format is OutputFormat.human else False,
                                 fail_on_warnings=True, model=model, config=cfg, stdin_filename=stdin_filename,
                                 exit_zero=exit_zero, statistics=statistics, cache=not no_cache,
                                 fixes=_FixMode(fix, unsafe_fixes, diff)))


def fmt(
    paths: List[Path] = typer.Argument(..., help="Plan files or folders, or - (standard input to standard output)."),
    check_only: bool = typer.Option(False, "--check", help="Write nothing; exit 1 if a file would change."),
    diff: bool = typer.Option(False, "--diff", help="Write nothing; print a unified diff of the changes."),
    stdin_filename: Optional[str] = _STDIN_NAME,
    config: Optional[Path] = _CONFIG,
    isolated: bool = _ISOLATED,
) -> None:
    """Format plans in place (canonical layout, comments kept); `planlang fmt -` formats standard input to
    standard output (a plan with syntax errors is written back unchanged, the errors on stderr)."""
    # lazy: lark loads only when this runs
    from planlang.lang.fmt import FormatError, format_text, unified_diff

    try:
        files = plan_files(paths, _config(config, isolated))
    except UsageError as err:
        _fail_usage(str(err))
    changed, broken = [], 0
    for f in files:
        plan = _read_plan(f, stdin_filename)
        name, text = plan.name, plan.text
        if plan.undecodable is not None:
            sys.stderr.write(render([plan.undecodable], {name: SourceFile(name, text)}, "human",
                                    color=_use_color(None, sys.stderr)))
            broken += 1
            if f == STDIN and not (check_only or diff):
                sys.stdout.flush()
                sys.stdout.buffer.write(plan.data)  # a filter gives back what it got, byte for byte
            continue
        try:
            new = format_text(text, name)
        except FormatError as err:
            sys.stderr.write(render(list(err.diagnostics), {name: SourceFile(name, plan_text(text))}, "human",
                                    color=_use_color(None, sys.stderr)))
            broken += 1
            if f == STDIN and not (check_only or diff):
                sys.stdout.write(text)  # a filter (vim's formatprg) must not lose the buffer
            continue
        if f == STDIN and not (check_only or diff):
            sys.stdout.write(new)
        if new == text:
            continue
        changed.append(name)
        if diff:
            sys.stdout.write(unified_diff(text, new, name))
        elif check_only:
            typer.echo(f"would reformat {name}")
        elif f != STDIN:
            Path(f).write_text(new, encoding="utf-8")
            typer.echo(f"reformatted {name}", err=True)
    verb = "would be reformatted" if (check_only or diff) else "reformatted"
    typer.echo(f"{len(changed)} file{'s' if len(changed) != 1 else ''} {verb}, "
               f"{len(files) - len(changed) - broken} unchanged" + (f", {broken} with syntax errors" if broken else ""),
               err=True)
    if broken:
        raise typer.Exit(1)
    raise typer.Exit(1 if changed and (check_only or diff) else 0)


def lsp(
    stdio: bool = typer.Option(True, "--stdio", help="Serve on stdin/stdout (the default; editors pass it)."),
    log_level: str = typer.Option("WARNING", "--log-level", help="stderr log level: DEBUG, INFO, WARNING, ERROR."),
) -> None:
    """Run the language server on stdio (for editors)."""
    # lazy: the language server's packages load only for `planlang lsp`
    from planlang.lsp.server import main as serve

    serve(["--log-level", log_level])


def explain(code: str = typer.Argument(..., help="A diagnostic code such as PL301.")) -> None:
    """Explain a diagnostic code."""

    text = explain_code(code)
    if text is None:
        guess = did_you_mean(code.upper(), CODES)
        _fail_usage(f"unknown code {code}" + (f"; did you mean {guess}?" if guess else
                                              f"; codes are {min(CODES)} ... {max(CODES)} (docs/diagnostics.md)"))
    typer.echo(text, nl=False)
