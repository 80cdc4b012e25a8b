"""What a user of the command line meets before any plan: `-V`, help at 80 columns that wraps only where
the terminal ends (no line broken mid-sentence by a docstring's own line breaks), shell completion.
In process (typer's runner): no subprocess."""
from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from planlang.cli import COMMANDS, app, reflow, summary
from planlang.lang.version import __version__

RUNNER = CliRunner()


def invoke(*args: str, **env: str):
    return RUNNER.invoke(app, list(args), env={"COLUMNS": "80", "NO_COLOR": "1", "TERM": "dumb", **env},
                         prog_name="planlang")


@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_version(flag):
    r = invoke(flag)
    assert r.exit_code == 0 and r.stdout == f"planlang {__version__}\n"


def _cells(help_text: str) -> list[str]:
    """The help's text with the box drawing gone, one row per line."""
    return [re.sub(r"[│╭╮╰╯─]", " ", line).strip() for line in help_text.splitlines()]


def test_reflow_and_summary():
    doc = """Fill every hole of PLAN (fixed choices are constraints) and write
    a complete plan. Progress goes to stderr (e.g. a bar).

    Second paragraph,
    on two lines."""
    assert reflow(doc) == ("Fill every hole of PLAN (fixed choices are constraints) and write a complete plan. "
                           "Progress goes to stderr (e.g. a bar).\n\nSecond paragraph, on two lines.")
    assert summary(doc) == "Fill every hole of PLAN (fixed choices are constraints) and write a complete plan."
    assert summary("See e.g. `x`. Then") == "See e.g. `x`."


def test_help_lists_each_command_by_its_first_sentence_wrapped_at_80_columns():
    r = invoke("--help")
    assert r.exit_code == 0
    lines = r.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines)
    text = " ".join(" ".join(_cells(r.stdout)).split())
    for command in COMMANDS:
        assert summary(command.__doc__) in text, command.__name__  # whole: no line ends it early
    assert "-V" in text and "--install-completion" in text and "--show-completion" in text


@pytest.mark.parametrize("command", [c.__name__ for c in COMMANDS])
def test_command_help_wraps_only_at_the_terminals_width(command):
    r = invoke(command, "--help")
    assert r.exit_code == 0, r.stdout
    lines = r.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines)
    # the description: the docstring's text, whole, in lines as full as 80 columns allow (a line that ends
    # early, with room for the next word, is a line broken mid-sentence)
    doc = next(c for c in COMMANDS if c.__name__ == command).__doc__
    words = reflow(doc).split()
    body = [c for c in _cells(r.stdout) if c][1:]  # after the usage line
    desc = []
    for line in body:
        if " ".join(desc + [line]).split() != words[:len(" ".join(desc + [line]).split())]:
            break
        desc.append(line)
    assert " ".join(desc).split() == words
    for line, nxt in zip(desc, desc[1:]):
        assert len(line) + 1 + len(nxt.split()[0]) > 78, (line, nxt)


def test_shell_completion_completes_commands_and_options():
    r = invoke("--show-completion", "bash")
    assert r.exit_code == 0 and "complete" in r.stdout
    r = RUNNER.invoke(app, [], env={"_PLANLANG_COMPLETE": "complete_bash", "COMP_WORDS": "planlang ch",
                                    "COMP_CWORD": "1"}, prog_name="planlang")
    assert r.stdout.split() == ["check"]
    r = RUNNER.invoke(app, [], env={"_PLANLANG_COMPLETE": "complete_bash", "COMP_WORDS": "planlang check --fo",
                                    "COMP_CWORD": "2"}, prog_name="planlang")
    assert r.stdout.split() == ["--format"]
