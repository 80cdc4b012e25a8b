"""The work of `planlang fmt`, without Typer: the Typer command (planlang.cli.language) and the fast path
(planlang.cli.fast, which runs a plain `fmt` as it runs `check` and `lint`) both call `run_fmt`."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional, Sequence

from planlang.cli.checking import read_plan
from planlang.cli.common import STDIN, UsageError, config_for, echo, fail_usage, plan_files, use_color
from planlang.lang.fmt import FormatError, format_text, unified_diff
from planlang.lang.render import render
from planlang.lang.source import SourceFile, plan_text


def run_fmt(paths: Sequence[Path], check_only: bool, diff: bool, stdin_filename: Optional[str],
            config: Optional[Path], isolated: bool) -> int:
    """Format `paths` in place (`-`: standard input to standard output; with `check_only` or `diff` write
    nothing) and say what changed on stderr; the exit code: 1 where a file has syntax errors, or would
    change under --check/--diff, else 0."""
    try:
        files = plan_files(list(paths), config_for(config, isolated))
    except UsageError as err:
        fail_usage(str(err))
    changed, broken = [], 0
    for f in files:
        plan = read_plan(f, stdin_filename)
        name, text = plan.name, plan.text
        if plan.undecodable is not None:
            sys.stderr.write(render([plan.undecodable], {name: SourceFile(name, text)}, "human",
                                    color=use_color(None, sys.stderr)))
            broken += 1
            if f == STDIN and not (check_only or diff):
                sys.stdout.flush()
                sys.stdout.buffer.write(plan.data)  # a filter gives back what it got, byte for byte
            continue
        try:
            new = format_text(text, name)
        except FormatError as err:
            sys.stderr.write(render(list(err.diagnostics), {name: SourceFile(name, plan_text(text))}, "human",
                                    color=use_color(None, sys.stderr)))
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
            echo(f"would reformat {name}")
        elif f != STDIN:
            Path(f).write_text(new, encoding="utf-8")
            echo(f"reformatted {name}", err=True)
    verb = "would be reformatted" if (check_only or diff) else "reformatted"
    echo(f"{len(changed)} file{'s' if len(changed) != 1 else ''} {verb}, "
         f"{len(files) - len(changed) - broken} unchanged" + (f", {broken} with syntax errors" if broken else ""),
         err=True)
    if broken:
        return 1
    return 1 if changed and (check_only or diff) else 0
