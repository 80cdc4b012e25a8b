"""What the commands share, without Typer: output formats, plan file arguments, the configuration,
colour, usage errors and `echo` (Typer's, as planlang.cli.fast prints without it)."""
from __future__ import annotations

import os
import re
import sys
from enum import Enum
from pathlib import Path
from typing import List, NoReturn, Optional, Sequence

from planlang.lang.config import Config, ConfigError, load_config


class OutputFormat(str, Enum):
    human = "human"
    concise = "concise"
    json = "json"
    sarif = "sarif"
    github = "github"


class UsageError(Exception):
    pass


STDIN = "-"
_ANSI = re.compile(r"\033\[[;?0-9]*[a-zA-Z]")  # what click.echo strips where the stream is no terminal


def echo(message: str, err: bool = False) -> None:
    """`typer.echo(message, err=err)`: a line, flushed; colour codes dropped where the stream is no terminal."""
    stream = sys.stderr if err else sys.stdout
    if not stream.isatty():
        message = _ANSI.sub("", message)
    stream.write(message + "\n")
    stream.flush()


def fail_usage(msg: str) -> NoReturn:
    echo(f"planlang: error: {msg}", err=True)
    raise SystemExit(2)


def use_color(flag: Optional[bool], stream=None) -> bool:
    """--color/--no-color, else NO_COLOR (off), else FORCE_COLOR (on), else whether `stream` is a terminal."""
    if flag is not None:
        return flag
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return (stream or sys.stdout).isatty()


def config_for(config: Optional[Path], isolated: bool, select: Sequence[str] = (), extend_select: Sequence[str] = (),
               ignore: Sequence[str] = ()) -> Config:
    """The project configuration (planlang.toml / pyproject.toml [tool.planlang]) with the command line on top."""

    try:
        base = Config(root=Path.cwd()) if isolated else load_config(config)
        return base.with_options(select, extend_select, ignore)
    except ConfigError as err:
        fail_usage(str(err))


def plan_files(paths: List[Path], config=None) -> list[str]:
    """Expand arguments: files as given, folders to every *.plan below them (sorted; less what the
    configuration excludes and git ignores), `-` for standard input."""

    config = config or Config(root=Path.cwd(), respect_gitignore=False)
    out: list[str] = []
    for p in paths:
        if str(p) == STDIN:
            if STDIN in out:
                raise UsageError("`-` (standard input) is given twice")
            out.append(STDIN)
        elif p.is_dir():
            out += [str(f) for f in config.plan_files(p)]
        elif p.is_file():
            out.append(str(p))
        else:
            raise UsageError(f"no such file or folder: {p}")
    if not out:
        raise UsageError("no .plan files given")
    return out
