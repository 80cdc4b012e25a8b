"""The language commands: `check`, `lint`, `fmt`, `explain` and `lsp`. None imports torch (`check --model`
loads the model layer on request). What `check` and `lint` do is planlang.cli.checking's (no Typer)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from planlang.cli.cached import NO_CACHE_HELP
from planlang.cli.checking import FixMode, run_checks
from planlang.cli.formatting import run_fmt
from planlang.lang.codes import CODES, explain as explain_code
from planlang.lang.diagnostics import did_you_mean
from planlang.cli.app import (OutputFormat, _COLOR, _CONFIG, _EXIT_ZERO, _EXTEND, _IGNORE, _ISOLATED, _MODEL, _SELECT,
                              _STATS, _STDIN_NAME)
from planlang.cli.common import config_for, fail_usage


# with --model: model results kept on disk are not read or written (planlang.cli.cached)
_NO_CACHE = typer.Option(False, "--no-cache", help=NO_CACHE_HELP)


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
    cfg = config_for(config, isolated, select, extend_select, ignore)
    raise typer.Exit(run_checks(paths or [], format, color, fail_on_warnings=fail_on_warnings, model=model, config=cfg,
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
    cfg = config_for(config, isolated, select, extend_select, ignore)
    raise typer.Exit(run_checks(paths or [], format, color if format is OutputFormat.human else False,
                                 fail_on_warnings=True, model=model, config=cfg, stdin_filename=stdin_filename,
                                 exit_zero=exit_zero, statistics=statistics, cache=not no_cache,
                                 fixes=FixMode(fix, unsafe_fixes, diff)))


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
    raise typer.Exit(run_fmt(paths, check_only, diff, stdin_filename, config, isolated))


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
        fail_usage(f"unknown code {code}" + (f"; did you mean {guess}?" if guess else
                                              f"; codes are {min(CODES)} ... {max(CODES)} (docs/diagnostics.md)"))
    typer.echo(text, nl=False)
