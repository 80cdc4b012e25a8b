"""Progress on stderr for the commands that can take seconds to minutes (estimate, check --model, report,
diff, inspect, lower): what the command is doing and for how long, while stdout stays the product.

    with progress("estimate") as say:      say("building the model on meta") at each stage
        ...

Shown when stderr is a terminal: one rich spinner line (stage, elapsed seconds), gone when the command
ends, with whatever the command writes to stderr meanwhile (diagnostics, warnings) printed above it, and
what it writes to stdout too where stdout is the same terminal; a piped stdout is never touched. `planlang --progress` shows it wherever stderr goes, as plain lines
`planlang COMMAND: STAGE  [ELAPSED s]` (the format of `verify` and `solve`) where it is no terminal;
`planlang --no-progress`, or stderr captured by a test or a pipe, shows nothing.
(`solve`, `verify` and `run` report their own progress: planlang.solve.progress, planlang.runtime.launch.)
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Callable, Iterator, TextIO

ENV = "PLANLANG_PROGRESS"  # "1" / "0" from --progress / --no-progress; unset: whether stderr is a terminal


def wanted(stream: TextIO | None = None) -> bool:
    """Whether progress is shown on `stream` (default: stderr)."""
    flag = os.environ.get(ENV)
    if flag in ("0", "1"):
        return flag == "1"
    stream = stream or sys.stderr
    return bool(getattr(stream, "isatty", lambda: False)())


@contextlib.contextmanager
def progress(command: str, stream: TextIO | None = None) -> Iterator[Callable[[str], None]]:
    """While the block runs, progress of `command` on `stream` (default: stderr); the block gets `say(stage)`
    (see the module docstring). Nothing is shown where it is not wanted (`wanted`)."""
    out = stream or sys.stderr
    if not wanted(out):
        yield lambda stage: None
        return
    t0 = time.monotonic()
    if not out.isatty():
        def line(stage: str) -> None:
            out.write(f"planlang {command}: {stage}  [{time.monotonic() - t0:.1f} s]\n")
            out.flush()

        yield line
        return
    # lazy: rich loads only when a terminal shows progress
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
    from rich.table import Column

    # what the command writes meanwhile is printed above the spinner line. stdout only where it is a terminal
    # too (the same screen): piped, it is the product, never touched
    ours = out is sys.stderr
    # a long stage is cut with an ellipsis, the spinner and the time kept; what is printed above goes as
    # written (soft_wrap: the diagnostics are laid out already, rich must not wrap them again)
    text = TextColumn(f"planlang {command}: {{task.description}}", markup=False,
                      table_column=Column(no_wrap=True, overflow="ellipsis", ratio=1))
    bar = Progress(SpinnerColumn(), text, TimeElapsedColumn(), expand=True,
                   console=Console(file=out, highlight=False, soft_wrap=True), transient=True,
                   redirect_stdout=ours and sys.stdout.isatty(), redirect_stderr=ours)
    task = bar.add_task("starting", total=None)
    with bar:
        yield lambda stage: bar.update(task, description=stage)
