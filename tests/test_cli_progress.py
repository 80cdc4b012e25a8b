"""Progress of the long commands (planlang.cli.progress): on a terminal a rich spinner line on stderr; where
stderr is captured nothing, unless --progress asks, then plain lines; --no-progress silences a terminal.
In process: the helper the commands call, and the root options that set it."""
from __future__ import annotations

import io
import os
import sys

import pytest
from typer.testing import CliRunner

from planlang.cli import app
from planlang.cli.progress import ENV, progress, wanted


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def no_flag(monkeypatch):
    monkeypatch.setenv(ENV, "")  # recorded, so that what a command sets is undone after the test
    monkeypatch.delenv(ENV)


def test_captured_stderr_shows_nothing():
    out = io.StringIO()
    with progress("estimate", out) as say:
        say("building the model on meta")
    assert out.getvalue() == "" and not wanted(out)


def test_a_terminal_shows_a_spinner_with_the_stage_and_clears_it():
    out = Terminal()
    with progress("estimate", out) as say:
        say("building the model on meta")
    text = out.getvalue()
    assert "planlang estimate: building the model on meta" in text
    assert text.endswith("\x1b[2K")  # transient: the line is erased at the end


def test_progress_flag_writes_plain_lines_where_no_terminal(monkeypatch):
    monkeypatch.setenv(ENV, "1")
    out = io.StringIO()
    with progress("lower", out) as say:
        say("validating x.plan")
        say("lowering it")
    lines = out.getvalue().splitlines()
    assert [line.split("  [")[0] for line in lines] == ["planlang lower: validating x.plan", "planlang lower: lowering it"]
    assert all(line.endswith(" s]") for line in lines)


def test_no_progress_silences_a_terminal(monkeypatch):
    monkeypatch.setenv(ENV, "0")
    out = Terminal()
    with progress("diff", out) as say:
        say("comparing")
    assert out.getvalue() == ""


@pytest.mark.parametrize("flag, value", [("--progress", "1"), ("--no-progress", "0")])
def test_root_options_set_it_for_the_command(flag, value, monkeypatch):
    seen = []
    monkeypatch.setattr("planlang.cli.language.explain_code", lambda code: seen.append(os.environ.get(ENV)) or "x\n")
    r = CliRunner().invoke(app, [flag, "explain", "PL101"])
    assert r.exit_code == 0 and seen == [value]


def test_on_a_terminal_what_the_command_writes_goes_above_the_spinner(monkeypatch):
    err, out = Terminal(), Terminal()
    monkeypatch.setattr("sys.stderr", err)
    monkeypatch.setattr("sys.stdout", out)
    with progress("report") as say:
        say("drawing its charts")
        print("wrote x.png")
        print("warning: over budget " + "x" * 120, file=sys.stderr)
        say("a stage named at length " + "y" * 200)
    text = err.getvalue()
    # printed by the console above the live line: kept when the transient line is erased at the end, and
    # as written (a diagnostic is laid out already: not wrapped again at the terminal's width)
    assert "wrote x.png\n" in text and f"warning: over budget {'x' * 120}\n" in text and out.getvalue() == ""
    # the spinner line: the stage cut to fit, the elapsed time kept
    assert "planlang report: a stage named at length yyy" in text and "y" * 200 not in text


def test_a_piped_stdout_is_never_touched(monkeypatch):
    err, out = Terminal(), io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    monkeypatch.setattr("sys.stdout", out)
    with progress("report") as say:
        say("drawing its charts")
        print("wrote x.png")
    assert out.getvalue() == "wrote x.png\n" and "wrote x.png" not in err.getvalue()
