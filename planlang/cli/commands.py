"""The Typer app with its commands registered, in the order `planlang --help` lists them (`run` passes
what follows `--` to the script). planlang.cli.main loads it for every command line that
planlang.cli.fast does not run."""
from __future__ import annotations

import inspect
import re
from typing import Callable

from planlang.cli import language as L
from planlang.cli import model as M
from planlang.cli.app import app

__all__ = ["COMMANDS", "app", "reflow", "summary"]

COMMANDS: tuple[Callable[..., None], ...] = (L.check, L.lint, L.fmt, M.inspect, M.estimate, M.lower, M.verify, M.run,
                                             M.solve, M.diff, L.lsp, M.report, M.probe, L.explain)


def reflow(doc: str | None) -> str:
    """A docstring as help text: its paragraphs, each on one line (the terminal wraps them at its width;
    the docstring's own line breaks would break lines mid-sentence)."""
    paragraphs = inspect.cleandoc(doc or "").split("\n\n")
    return "\n\n".join(" ".join(p.split()) for p in paragraphs)


def summary(doc: str | None) -> str:
    """The first sentence of a docstring: the command's line in `planlang --help`."""
    text = reflow(doc).split("\n\n")[0]
    return re.split(r"(?<=[.!?])\s+(?=[A-Z])", text, maxsplit=1)[0]


for _command in COMMANDS:
    extra = {"allow_extra_args": True, "ignore_unknown_options": True} if _command is M.run else None
    app.command(context_settings=extra, help=reflow(_command.__doc__),
                short_help=summary(_command.__doc__))(_command)
