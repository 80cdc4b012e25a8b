"""The `planlang` command line: thin commands, each calling one library function.

Exit codes: 0 clean, 1 findings (errors; for `lint` also warnings; for `fmt --check` unformatted
files), 2 usage errors and internal errors. `check`, `lint`, `fmt` and `explain` never import torch.
The app and its shared options: planlang.cli.app; the commands: planlang.cli.language (check, lint, fmt,
explain, lsp) and planlang.cli.model (the ones that build, price or run a model)."""
from __future__ import annotations

import inspect
import re
import sys
import traceback
from typing import Callable

import typer

from planlang.cli import language as L
from planlang.cli import model as M
from planlang.cli.app import app

# the commands, in the order `planlang --help` lists them (`run` passes what follows `--` to the script)
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


# What the `torch` extra brings (pyproject.toml): commands that price or run a model import them.
TORCH_EXTRA = {"torch", "numpy", "networkx", "pulp", "highspy", "matplotlib"}


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
    except SystemExit:
        raise
    except Exception as err:  # an internal error: a bug in planlang, never the user's input
        missing = err.name.split(".")[0] if isinstance(err, ModuleNotFoundError) and err.name else None
        if missing in TORCH_EXTRA:  # the language-only install: a missing extra, not a bug
            typer.echo(f"planlang: error: this command needs {missing}, which is not installed; install "
                       f"planlang's torch extra: pip install 'planlang[torch]'", err=True)
            sys.exit(2)

        traceback.print_exc()
        typer.echo(f"planlang: internal error: {err!r} — please report this with the plan that caused it", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
