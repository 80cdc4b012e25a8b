"""What `planlang solve` shows while it searches, and what it keeps from the user.

    reporter(progress)        the search's view of whoever watches: a plain callable(str) (tests, the
                              library) or a SolveProgress; the search calls message / plan_work / advance /
                              priced and never prints
    SolveProgress(stream)     on a terminal: one rich progress bar (phase, work done of total, candidates
                              priced, the best so far, elapsed and remaining); otherwise plain lines
                              `planlang solve: MESSAGE  [ELAPSED s]`, written as they are, never wrapped
    captured_output()         file descriptors 1 and 2 point at a temporary file while the search runs:
                              solver banners (HiGHS, CBC), library logging (torch's fake-tensor and export
                              loggers, warnings) and anything C code prints go there, not to the user; the
                              progress writes to a copy of the original stderr

Work units: stage 1 prices each mesh factorization (one unit each), stage 2 refines the best few meshes
(one unit each); the total is known once stage 1 has ranked its meshes, and the remaining time is
extrapolated from the units done.
"""
from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, TextIO

from planlang.plan.units import format_bytes

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID


class Reporter:
    """The search's progress hooks; this base ignores everything."""

    def message(self, msg: str) -> None:
        """A phase or a finding worth a line."""

    def plan_work(self, total: int) -> None:
        """The units of work the search will do in all (it may be revised)."""

    def advance(self, what: str = "") -> None:
        """One unit of work done; `what` names the next."""

    def priced(self, candidate, best) -> None:
        """A candidate was priced; `best` is the best one so far."""


class _Lines(Reporter):
    """A plain callable gets each message and each priced candidate as a string."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say

    def message(self, msg: str) -> None:
        self.say(msg)

    def priced(self, candidate, best) -> None:
        self.say(str(candidate))


def reporter(progress) -> Reporter:
    return progress if isinstance(progress, Reporter) else _Lines(progress)


@dataclass
class _State:
    total: int = 0
    done: int = 0
    priced: int = 0
    best: str = "-"
    phase: str = "starting"


class SolveProgress(Reporter):
    """Progress on `stream` (the user's stderr): a rich bar when `tty`, else plain unwrapped lines."""

    def __init__(self, stream, tty: bool | None = None, command: str = "solve") -> None:
        self.stream = stream
        self.tty = stream.isatty() if tty is None else tty
        self.command = command
        self.t0 = time.monotonic()
        self.state = _State()
        self._bar: Progress | None = None
        self._task: TaskID | None = None

    # -- the bar (terminal)
    def _start_bar(self) -> Progress:
        # lazy: rich loads only when a terminal watches
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                                   TimeElapsedColumn, TimeRemainingColumn)

        console = Console(file=self.stream, highlight=False)
        bar = self._bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                   TextColumn("{task.fields[priced]} priced, best {task.fields[best]}"),
                                   TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(),
                                   console=console, transient=True, redirect_stdout=False, redirect_stderr=False)
        task_id = self._task = bar.add_task(self.state.phase, total=self.state.total or None, priced=0, best="-")
        for task in bar.tasks:  # elapsed from the command's start, as the plain lines count it
            if task.id == task_id and task.start_time is not None:
                task.start_time -= time.monotonic() - self.t0
        bar.start()
        return bar

    def _update(self) -> None:
        bar = self._bar if self._bar is not None else self._start_bar()
        s = self.state
        if self._task is not None:
            bar.update(self._task, description=s.phase, total=s.total or None, completed=s.done,
                       priced=s.priced, best=s.best)

    # -- plain lines
    def line(self, msg: str) -> None:
        """One line as it is: on a terminal above the bar, else `planlang solve: MSG  [ELAPSED s]`."""
        if self.tty:
            if self._bar is not None:
                self._bar.console.print(msg, style="dim", markup=False, highlight=False, soft_wrap=True)
            else:
                self.stream.write(f"{msg}\n")
                self.stream.flush()
            return
        self.stream.write(f"planlang {self.command}: {msg}  [{time.monotonic() - self.t0:.1f} s]\n")
        self.stream.flush()

    def _left(self) -> str:
        s = self.state
        if not s.done or not s.total or s.done >= s.total:
            return ""
        per = (time.monotonic() - self.t0) / s.done
        return f", about {per * (s.total - s.done):.0f} s left"

    # -- Reporter
    def message(self, msg: str) -> None:
        if self.tty:
            self.state.phase = msg
            self._update()
        else:
            self.line(msg)

    def plan_work(self, total: int) -> None:
        self.state.total = total
        if self.tty:
            self._update()

    def advance(self, what: str = "") -> None:
        s = self.state
        s.done += 1
        if what:
            s.phase = what
        if self.tty:
            self._update()
        elif not what:  # the end of a stage or of a refined mesh (stage 1's meshes each have a candidate line)
            self.line(f"{s.done}/{s.total} done, {s.priced} candidates priced, best so far {s.best}{self._left()}")

    def priced(self, candidate, best) -> None:
        s = self.state
        s.priced += 1
        s.best = _short(best)
        if self.tty:
            self._update()
        else:
            self.line(f"candidate {s.priced}: {candidate}")

    def close(self) -> None:
        """Take the bar off the terminal (it is transient); plain mode has nothing to close."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def _short(c) -> str:
    if c is None:
        return "-"
    return f"{format_bytes(c.peak)}, {c.step_time * 1e3:.2f} ms" + ("" if c.fits else " (over budget)")


@dataclass
class Captured:
    """What the libraries printed while captured (`text` once the block has ended)."""

    text: str = ""


@contextlib.contextmanager
def captured_output() -> Iterator[tuple[object, Captured]]:
    """Point fds 1 and 2 (and sys.stdout / sys.stderr) at a temporary file for the block; yields a text
    stream on the original stderr for the progress, and a Captured whose `text` holds what was printed.
    Python's logging handlers and warnings write through sys.stderr, C code through the fds: all land in
    the file."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved_out, saved_err = os.dup(1), os.dup(2)
    user_err = os.fdopen(os.dup(saved_err), "w", buffering=1, encoding="utf-8", errors="replace")
    cap = Captured()
    py_out, py_err = sys.stdout, sys.stderr
    crashed = False
    with tempfile.TemporaryFile(mode="w+b") as sink, warnings.catch_warnings():
        text = open(sink.fileno(), "w", closefd=False, encoding="utf-8", errors="replace")
        moved = _move_log_streams((py_out, py_err, sys.__stdout__, sys.__stderr__), text)
        def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 file: TextIO | None = None, line: str | None = None) -> None:
            text.write(warnings.formatwarning(message, category, filename, lineno, line))

        warnings.showwarning = show
        try:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            sys.stdout = sys.stderr = text
            yield user_err, cap
        except Exception:  # an internal error: what the libraries said may explain it
            crashed = True
            raise
        finally:
            text.flush()
            _flush_c()
            sys.stdout, sys.stderr = py_out, py_err
            for handler, stream in moved:
                handler.setStream(stream)
            os.dup2(saved_out, 1)
            os.dup2(saved_err, 2)
            os.close(saved_out)
            os.close(saved_err)
            user_err.close()
            sink.seek(0)
            cap.text = sink.read().decode("utf-8", "replace")
            if crashed and cap.text:
                sys.stderr.write("output captured before the error:\n" + cap.text)


def _move_log_streams(streams, to) -> list[tuple[logging.StreamHandler, object]]:
    """Point every logging handler that writes to one of `streams` (the console, however wrapped) at `to`;
    returns (handler, its stream) to put back. Handlers made during the block find sys.stderr redirected."""
    loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]
    moved = []
    for lg in loggers:
        for h in lg.handlers:
            if type(h) is logging.StreamHandler and any(h.stream is s for s in streams if s is not None):
                moved.append((h, h.setStream(to)))
    return moved


def _flush_c() -> None:
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass
