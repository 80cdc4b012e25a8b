"""The `planlang` command line: thin commands, each calling one library function.

Exit codes: 0 clean, 1 findings (errors; for `lint` also warnings; for `fmt --check` unformatted
files), 2 usage errors and internal errors. `check`, `lint`, `fmt` and `explain` never import torch.
The app and its shared options: planlang.cli.app; the commands: planlang.cli.language (check, lint, fmt,
explain, lsp) and planlang.cli.model (the ones that build, price or run a model), registered by
planlang.cli.commands. A plain `check` or `lint` and `--version` run without Typer (planlang.cli.fast)."""
from __future__ import annotations

import os
import sys
import types
from typing import Any

from planlang.lang.version import __version__

# What the `torch` extra brings (pyproject.toml): commands that price or run a model import them.
TORCH_EXTRA = {"torch", "numpy", "networkx", "pulp", "highspy", "matplotlib"}


def __getattr__(name: str) -> Any:
    """`COMMANDS`, `reflow`, `summary` (planlang.cli.commands): loaded on first use, so that `planlang
    check` need not load Typer."""
    if name in ("COMMANDS", "reflow", "summary"):
        # lazy: typer loads only for the command lines planlang.cli.fast does not run
        from planlang.cli import commands

        return getattr(commands, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _Package(types.ModuleType):
    """This package, whose `app` is the Typer app with its commands registered (as when this module
    imported it at the top), loaded on first use. The import system sets `app` to the submodule
    planlang.cli.app when that loads; the setter leaves it in sys.modules only."""

    @property
    def app(self) -> Any:
        # lazy: typer loads only for the command lines planlang.cli.fast does not run
        from planlang.cli.commands import app

        return app

    @app.setter
    def app(self, module: Any) -> None:
        pass


sys.modules[__name__].__class__ = _Package


def main() -> None:
    try:
        argv = sys.argv[1:]
        if argv in (["--version"], ["-V"]) and not os.environ.get("PLANLANG_NO_FAST_CLI"):
            sys.stdout.write(f"planlang {__version__}\n")  # what the app's --version says
            sys.exit(0)
        if argv[:1] in (["check"], ["lint"], ["fmt"]):
            # lazy: the checker (the parser, the rules) loads only for a command that checks plans
            from planlang.cli.fast import main as fast_main

            code = fast_main(argv)
            if code is not None:
                sys.exit(code)
        # lazy: typer loads only for the command lines planlang.cli.fast does not run
        from planlang.cli.commands import app

        app()
    except KeyboardInterrupt:
        sys.exit(130)
    except SystemExit:
        raise
    except Exception as err:  # an internal error: a bug in planlang, never the user's input
        missing = err.name.split(".")[0] if isinstance(err, ModuleNotFoundError) and err.name else None
        if missing in TORCH_EXTRA:  # the language-only install: a missing extra, not a bug
            sys.stderr.write(f"planlang: error: this command needs {missing}, which is not installed; install "
                             f"planlang's torch extra: pip install 'planlang[torch]'\n")
            sys.exit(2)

        # lazy: only an internal error prints a traceback
        import traceback

        traceback.print_exc()
        sys.stderr.write(f"planlang: internal error: {err!r} — please report this with the plan that caused it\n")
        sys.exit(2)


if __name__ == "__main__":
    main()
