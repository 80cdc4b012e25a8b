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
                exit_zero: bool = False, statistics: bool = False, cache: bool = True) -> int:
    try:
        files = plan_files(paths, config)
    except UsageError as err:
        _fail_usage(str(err))
    diags: list[Diagnostic] = []
    sources: dict[str, SourceFile] = {}

    for f in files:
        plan = _read_plan(f, stdin_filename)
        if plan.undecodable is not None:  # reported where it is; the other files are still checked
            diags.append(plan.undecodable)
            sources[plan.name] = SourceFile(plan.name, plan.text)
            continue
        res = _check_one(plan.name, plan.text, model, config.use_paths if config is not None else (), cache)
        diags.extend(config.keep(res.diagnostics) if config is not None else res.diagnostics)
        sources.update(res.sources)
    if statistics:
        sys.stdout.write(_statistics(diags))
    else:
        out = render(diags, sources, fmt.value, color=_use_color(color) if fmt is OutputFormat.human else False)
        if out:
            sys.stdout.write(out if out.endswith("\n") else out + "\n")
    if fmt is OutputFormat.human:
        label = f"{len(files)} file{'s' if len(files) != 1 else ''}"
        typer.echo(f"{label}: {summary_line(diags)}", err=True)
    bad = {"error"} | ({"warning"} if fail_on_warnings else set())
    return 1 if not exit_zero and any(d.severity.value in bad for d in diags) else 0


def check(
    paths: List[Path] = _PATHS,
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
    raise typer.Exit(_run_checks(paths, format, color, fail_on_warnings=fail_on_warnings, model=model, config=cfg,
                                 stdin_filename=stdin_filename, exit_zero=exit_zero, statistics=statistics,
                                 cache=not no_cache))


def lint(
    paths: List[Path] = _PATHS,
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
) -> None:
    """Check plans for CI: concise output by default; exit 1 on errors or warnings."""
    cfg = _config(config, isolated, select, extend_select, ignore)
    raise typer.Exit(_run_checks(paths, format, color if format is OutputFormat.human else False,
                                 fail_on_warnings=True, model=model, config=cfg, stdin_filename=stdin_filename,
                                 exit_zero=exit_zero, statistics=statistics, cache=not no_cache))


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
