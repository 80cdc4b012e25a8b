"""`planlang check`, `planlang lint` and `planlang fmt` without Typer and Click: importing them and
building the commands is ~0.05 CPU-s of a 0.2 CPU-s check. Only a command line read here exactly as Click
reads it runs here (paths, and the options below as `--opt value`, `--opt=value` or `-f value`, each once);
anything else (--help, --model, an unknown option or format, `--`, a bad value, another command) goes to
the Typer app, which says what is wrong as before. PLANLANG_NO_FAST_CLI=1 sends everything to Typer
(tests/test_cli_fast_path.py runs both and compares)."""
from __future__ import annotations

import errno
import os
import sys
from pathlib import Path
from typing import Optional, TextIO, cast

from planlang.cli.checking import FixMode, run_checks
from planlang.cli.common import OutputFormat, config_for
from planlang.cli.formatting import run_fmt

# the options of `check` and `lint` handled here: name -> the parameter it sets
_VALUED = {"--format": "format", "-f": "format", "--stdin-filename": "stdin_filename", "--config": "config",
           "--select": "select", "--extend-select": "extend_select", "--ignore": "ignore"}
_REPEATABLE = {"select", "extend_select", "ignore"}
_FLAGS = {"--color": ("color", True), "--no-color": ("color", False), "--isolated": ("isolated", True),
          "--exit-zero": ("exit_zero", True), "--statistics": ("statistics", True), "--no-cache": ("no_cache", True)}
_COMMAND_FLAGS = {"check": {"--fail-on-warnings": ("fail_on_warnings", True)},
                  "lint": {"--fix": ("fix", True), "--unsafe-fixes": ("unsafe_fixes", True), "--diff": ("diff", True)}}
_FORMATS = {f.value: f for f in OutputFormat}


# `fmt`: its own options only (Click refuses check's there)
_FMT_FLAGS = {"--check": ("check_only", True), "--diff": ("diff", True), "--isolated": ("isolated", True)}
_FMT_VALUED = {"--stdin-filename": "stdin_filename", "--config": "config"}


def parse(argv: list[str]) -> Optional[tuple[str, dict]]:
    """(command, its parameters) for a command line handled here, else None (Typer's)."""
    if not argv or argv[0] not in (*_COMMAND_FLAGS, "fmt"):
        return None
    command = argv[0]
    flags = _FMT_FLAGS if command == "fmt" else {**_FLAGS, **_COMMAND_FLAGS[command]}
    valued = _FMT_VALUED if command == "fmt" else _VALUED
    opts: dict = {"paths": [], "select": [], "extend_select": [], "ignore": []}
    seen: set[str] = set()
    rest = argv[1:]
    i = 0
    while i < len(rest):
        arg = rest[i]
        i += 1
        if arg == "-" or not arg.startswith("-"):
            if not arg:
                return None  # an empty path: as Click's Path type takes it
            opts["paths"].append(Path(arg))
            continue
        flag: object
        name, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name in flags and not eq:
            param, flag = flags[name]
        elif name in valued:
            param = valued[name]
            if not eq:
                if i >= len(rest):
                    return None  # a missing value
                value = rest[i]
                i += 1
            if not value or value.startswith("-"):
                return None  # Click reads these otherwise, or says what is wrong
            if param == "format":
                if value not in _FORMATS:
                    return None
                flag = _FORMATS[value]
            else:
                flag = Path(value) if param == "config" else value
        else:
            return None  # --help, --model, --, an unknown option, a flag given a value
        if param in _REPEATABLE:
            opts[param].append(flag)
        elif param in seen:
            return None  # given twice: Click keeps the last, of a flag and its negation too
        else:
            seen.add(param)
            opts[param] = flag
    if command == "fmt" and not opts["paths"]:
        return None  # fmt needs a path: Click says so
    return command, opts


def run(command: str, opts: dict) -> int:
    """What the Typer command does with these parameters: its exit code."""
    if command == "fmt":
        return run_fmt(opts["paths"], opts.get("check_only", False), opts.get("diff", False),
                       opts.get("stdin_filename"), opts.get("config"), opts.get("isolated", False))
    cfg = config_for(opts.get("config"), opts.get("isolated", False), opts["select"], opts["extend_select"],
                     opts["ignore"])
    common = dict(model=False, config=cfg, stdin_filename=opts.get("stdin_filename"),
                  exit_zero=opts.get("exit_zero", False), statistics=opts.get("statistics", False),
                  cache=not opts.get("no_cache", False))
    color = opts.get("color")
    if command == "check":
        return run_checks(opts["paths"], opts.get("format", OutputFormat.human), color,
                          fail_on_warnings=opts.get("fail_on_warnings", False), **common)
    fmt = opts.get("format", OutputFormat.concise)
    return run_checks(opts["paths"], fmt, color if fmt is OutputFormat.human else False, fail_on_warnings=True,
                      fixes=FixMode(opts.get("fix", False), opts.get("unsafe_fixes", False), opts.get("diff", False)),
                      **common)


class _QuietFlush:
    """click.utils.PacifyFlushWrapper: a stream whose reader went away (EPIPE) flushes without a word."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def flush(self) -> None:
        try:
            self.stream.flush()
        except OSError as err:
            if err.errno != errno.EPIPE:
                raise

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def main(argv: list[str]) -> Optional[int]:
    """The exit code of a command line handled here (as Typer's app would end: a closed pipe is exit 1),
    else None."""
    if os.environ.get("PLANLANG_NO_FAST_CLI") or os.environ.get("_PLANLANG_COMPLETE"):
        return None
    parsed = parse(argv)
    if parsed is None:
        return None
    try:
        return run(*parsed)
    except OSError as err:
        if err.errno != errno.EPIPE:
            raise
        sys.stdout, sys.stderr = cast(TextIO, _QuietFlush(sys.stdout)), cast(TextIO, _QuietFlush(sys.stderr))
        return 1
