"""The `planlang` application: the Typer app, its options and output formats, and what every command
shares (reading plan files and configuration, colour, usage errors). The commands register on `app` from
planlang.cli.language and planlang.cli.model."""
from __future__ import annotations

import os
import sys
from enum import Enum
from pathlib import Path
from typing import List, NoReturn, Optional

import typer

from planlang.lang.version import __version__
from planlang.lang.config import Config, ConfigError, load_config
from planlang.cli.progress import ENV as PROGRESS_ENV


app = typer.Typer(
    name="planlang",
    help="A declarative language and toolchain for distributed-training plans.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


class OutputFormat(str, Enum):
    human = "human"
    concise = "concise"
    json = "json"
    sarif = "sarif"
    github = "github"


class TableFormat(str, Enum):
    table = "table"
    json = "json"


class TextFormat(str, Enum):
    """`solve` and `lower`: their text (the plan, the program) or a JSON object holding it."""
    text = "text"
    json = "json"


class Objective(str, Enum):
    time = "time"
    memory = "memory"
    balanced = "balanced"


class UsageError(Exception):
    pass


STDIN = "-"


def _version(value: bool) -> None:
    if value:
        typer.echo(f"planlang {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", "-V", callback=_version, is_eager=True,
                                 help="Print the version."),
    color: Optional[bool] = typer.Option(None, "--color/--no-color",
                                         help="Colour for every command (default: NO_COLOR, FORCE_COLOR, a terminal)."),
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress",
                                            help="What a long command is doing, on stderr (default: when stderr "
                                                 "is a terminal)."),
) -> None:
    if color is not None:  # rich (progress, tables) reads these too
        os.environ.pop("NO_COLOR" if color else "FORCE_COLOR", None)
        os.environ["FORCE_COLOR" if color else "NO_COLOR"] = "1"
    if progress is not None:  # planlang.cli.progress reads it
        os.environ[PROGRESS_ENV] = "1" if progress else "0"


def _config(config: Optional[Path], isolated: bool, select=(), extend_select=(), ignore=()):
    """The project configuration (planlang.toml / pyproject.toml [tool.planlang]) with the command line on top."""

    try:
        base = Config(root=Path.cwd()) if isolated else load_config(config)
        return base.with_options(select, extend_select, ignore)
    except ConfigError as err:
        _fail_usage(str(err))


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


def _use_color(flag: Optional[bool], stream=None) -> bool:
    """--color/--no-color, else NO_COLOR (off), else FORCE_COLOR (on), else whether `stream` is a terminal."""
    if flag is not None:
        return flag
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return (stream or sys.stdout).isatty()


def _fail_usage(msg: str) -> NoReturn:
    typer.echo(f"planlang: error: {msg}", err=True)
    raise typer.Exit(2)


# Options `check` and `lint` share (ruff's names).
_PATHS = typer.Argument(..., help="Plan files or folders (every *.plan below), or - for standard input.")


_STDIN_NAME = typer.Option(None, "--stdin-filename", help="The name of the plan read from - (for locations, "
                           "per-file-ignores and `use` of files next to it).")


_SELECT = typer.Option([], "--select", help="Codes or prefixes to report, replacing the configuration's "
                       "(comma-separated, repeatable): --select PL3,PL501.")


_EXTEND = typer.Option([], "--extend-select", help="Codes or prefixes to report in addition.")


_IGNORE = typer.Option([], "--ignore", help="Codes or prefixes not to report.")


_CONFIG = typer.Option(None, "--config", help="A planlang.toml or pyproject.toml to read (default: the nearest one).")


_ISOLATED = typer.Option(False, "--isolated", help="Read no configuration file.")


_EXIT_ZERO = typer.Option(False, "--exit-zero", help="Exit 0 even when something is found.")


_STATS = typer.Option(False, "--statistics", help="Print the number of findings per code instead of the findings.")


_COLOR = typer.Option(None, "--color/--no-color", help="Colour (default: NO_COLOR, FORCE_COLOR, a terminal).")


_MODEL = typer.Option(False, "--model", help="Also load the model on meta and check paths and shapes.")
