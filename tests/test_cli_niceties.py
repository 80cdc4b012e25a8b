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
        assert summary(command.__doc__) in text, command.__name__
    # each command's entry in the Commands panel: lines as full as the column allows (none broken early)
    panel = lines[next(i for i, x in enumerate(lines) if "Commands" in x) + 1:]
    panel = panel[:next(i for i, x in enumerate(panel) if x.startswith("╰"))]
    col = panel[0].index("Check plans")
    width = max(len(x[col:-1].rstrip()) for x in panel)
    entries: list[list[str]] = []
    for x in panel:
        if x[1:col].strip():
            entries.append([])
        entries[-1].append(x[col:-1].strip())
    assert [" ".join(e) for e in entries] == [summary(c.__doc__) for c in COMMANDS]
    for e in entries:
        for line, nxt in zip(e, e[1:]):
            assert len(line) + 1 + len(nxt.split()[0]) > width, (line, nxt)
    assert "-V" in text and "--install-completion" in text and "--show-completion" in text


@pytest.mark.parametrize("command", [c.__name__ for c in COMMANDS])
def test_command_help_wraps_only_at_the_terminals_width(command):
    r = invoke(command, "--help")
    assert r.exit_code == 0, r.stdout
    lines = r.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines)
    # the description: the docstring's paragraphs, whole, each in lines as full as 80 columns allow (a line
    # that ends early, with room for the next word, is a line broken mid-sentence)
    doc = next(c for c in COMMANDS if c.__name__ == command).__doc__
    text = [line.strip() for line in lines[lines.index(next(x for x in lines if "Usage:" in x)) + 1:]]
    text = text[:next(i for i, line in enumerate(text) if line.startswith("╭"))]
    paragraphs = [p.split("\n") for p in "\n".join(text).strip("\n").split("\n\n")]
    assert [" ".join(p).split() for p in paragraphs] == [p.split() for p in reflow(doc).split("\n\n")]
    for p in paragraphs:
        for line, nxt in zip(p, p[1:]):
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
