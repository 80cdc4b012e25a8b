"""The `planlang` application: the Typer app, its options and output formats, and what every command
shares (reading plan files and configuration, colour, usage errors: those without Typer are
planlang.cli.common's). The commands register on `app` in planlang.cli.commands."""
from __future__ import annotations

import os
from enum import Enum
from typing import Optional

import typer

from planlang.lang.version import __version__
from planlang.cli.common import OutputFormat, STDIN, UsageError, plan_files
from planlang.cli.progress import ENV as PROGRESS_ENV

__all__ = ["OutputFormat", "STDIN", "UsageError", "plan_files"]  # planlang.cli.common's


app = typer.Typer(
    name="planlang",
    help="A declarative language and toolchain for distributed-training plans.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


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
