"""docs/tutorial.md stays true to its files: the plans of examples/tutorial/ check clean, the plan shown is
the file, the diff shown is the solve's, the script excerpt is the script's, and every quoted `planlang`
command names a command and options that exist and files that do. (Running them is the tutorial's own
job: solve, verify and run take minutes of 8 processes, too long for the suite.)"""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer.main

from planlang.cli import app
from planlang.plan.checker import check_file

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "tutorial.md"
TEXT = DOC.read_text(encoding="utf-8")
PLANS = sorted((ROOT / "examples" / "tutorial").glob("*.plan"))
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)
BLOCKS = [(m.group(1), m.group(2)) for m in _FENCE.finditer(TEXT)]


def _rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("path", PLANS, ids=[p.name for p in PLANS])
def test_tutorial_plans_check_clean(path, monkeypatch):
    monkeypatch.chdir(ROOT)
    result = check_file(_rel(path))
    assert not result.diagnostics, "\n".join(str(d) for d in result.diagnostics)


def test_the_solved_plan_has_no_holes():
    assert [p.name for p in PLANS] == ["gpt2_3d.plan", "gpt2_3d_solved.plan"]
    solved = (ROOT / "examples" / "tutorial" / "gpt2_3d_solved.plan").read_text(encoding="utf-8")
    code = "\n".join(line.split("#")[0] for line in solved.splitlines())
    assert "?" not in code
    assert "?" in (ROOT / "examples" / "tutorial" / "gpt2_3d.plan").read_text(encoding="utf-8")


def test_the_plan_shown_is_the_file():
    shown = [body for lang, body in BLOCKS if lang == "plan"]
    assert shown == [(ROOT / "examples" / "tutorial" / "gpt2_3d.plan").read_text(encoding="utf-8")]


def test_the_diff_shown_is_the_solves():
    """Each `-` line of the diff is a line of the plan with holes, each `+` line one of the solved plan, each
    context line one of both; the hunks appear in file order."""
    (diff,) = [body for lang, body in BLOCKS if lang == "diff"]
    before = (ROOT / "examples" / "tutorial" / "gpt2_3d.plan").read_text(encoding="utf-8").splitlines()
    after = (ROOT / "examples" / "tutorial" / "gpt2_3d_solved.plan").read_text(encoding="utf-8").splitlines()
    at = {"-": 0, "+": 0}
    for line in diff.splitlines():
        if line.startswith("@@"):
            continue
        sign, text = line[0], line[1:]
        files = {"-": [("-", before)], "+": [("+", after)], " ": [("-", before), ("+", after)]}[sign]
        for key, lines in files:
            assert text in lines[at[key]:], f"{line!r} not in the {'solved' if key == '+' else 'holed'} plan"
            at[key] = lines.index(text, at[key]) + 1


def test_the_script_excerpt_is_the_scripts():
    script = (ROOT / "examples" / "tutorial" / "train.py").read_text(encoding="utf-8")
    (excerpt,) = [body for lang, body in BLOCKS if lang == "python"]
    lines = [line for line in excerpt.splitlines() if line.strip()]
    assert lines and all(line in script.splitlines() for line in lines)


COMMANDS = [line[2:] for lang, body in BLOCKS if lang == "text" for line in body.splitlines()
            if line.startswith("$ planlang ")]


def test_the_tutorial_quotes_each_step():
    used = [shlex.split(c)[1] for c in COMMANDS]
    assert {"inspect", "check", "solve", "estimate", "verify", "run"} <= set(used)


@pytest.mark.parametrize("command", COMMANDS)
def test_quoted_command_exists(command):
    words = shlex.split(command)
    if "--" in words:
        words, after = words[:words.index("--")], words[words.index("--") + 1:]
        assert (ROOT / after[0]).is_file(), after[0]
    group = typer.main.get_command(app)
    commands = getattr(group, "commands")  # a group of commands (typer's own click)
    if words[1].startswith("-"):  # `planlang --version`
        assert words[1] in {o for p in group.params for o in p.opts}
        return
    assert words[1] in commands, words[1]
    opts = {o for p in commands[words[1]].params for o in p.opts}
    for w in words[2:]:
        if w.startswith("-"):
            assert w in opts, f"`planlang {words[1]}` has no option {w}"
        elif w.endswith((".plan", ".py")) and "examples/" in w:
            assert (ROOT / w).is_file(), w
