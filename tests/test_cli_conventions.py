"""The command line's conventions, as ruff's users expect them: standard input (`-`, --stdin-filename),
project configuration (planlang.toml, pyproject.toml [tool.planlang]), rule selection, --exit-zero,
--statistics, colour from NO_COLOR / FORCE_COLOR / --color, and unknown option values as usage errors.
Run as real processes (`python -m planlang.cli`)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from planlang.lang.config import Config, ConfigError, load_config

REPO = Path(__file__).resolve().parents[1]
# PL501 (error: a budget above the device's memory) and PL309 (warning: an axis without a link)
TWO_FINDINGS = textwrap.dedent("""\
    device gpu { memory = 80 GiB }
    mesh m of 2 x gpu {
        dp = 2
    }
    budget 100 GiB per device
""")
UNFORMATTED = "device gpu {memory=80 GiB}\n"


def planlang(*args: str, cwd: Path = REPO, stdin: str | None = None, env: dict | None = None):
    full_env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "planlang.cli", *args], capture_output=True, text=True,
                          cwd=cwd, input=stdin, env=full_env, timeout=60)


def codes(concise: str) -> list[str]:
    return sorted({line.split("[")[1].split("]")[0] for line in concise.splitlines() if "[PL" in line})


# ------------------------------------------------------------------------------ standard input
def test_fmt_reads_stdin_and_writes_the_formatted_plan():
    out = planlang("fmt", "-", stdin=UNFORMATTED)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "device gpu {\n    memory = 80 GiB\n}\n"


def test_fmt_of_broken_stdin_gives_the_text_back_unchanged():
    broken = "mesh m of {\n"
    out = planlang("fmt", "-", "--stdin-filename", "buffer.plan", stdin=broken)
    assert out.returncode == 1
    assert out.stdout == broken  # an editor's formatprg replaces the buffer with this: nothing is lost
    assert "buffer.plan:" in out.stderr and "PL1" in out.stderr


def test_fmt_check_on_stdin_writes_nothing_and_fails():
    out = planlang("fmt", "--check", "-", stdin=UNFORMATTED)
    assert out.returncode == 1 and "would reformat <stdin>" in out.stdout


def test_lint_stdin_locates_findings_in_the_given_file_name(tmp_path):
    out = planlang("lint", "-", "--stdin-filename", "plans/x.plan", stdin=TWO_FINDINGS, cwd=tmp_path)
    assert out.returncode == 1
    assert codes(out.stdout) == ["PL309", "PL501"]
    assert all(line.startswith("plans/x.plan:") for line in out.stdout.splitlines())


def test_stdin_uses_files_next_to_the_stdin_filename(tmp_path):
    (tmp_path / "devices.plan").write_text("device gpu { memory = 80 GiB }\n")
    plan = 'use "devices.plan"\nlink nv { bandwidth = 300 GB/s }\nmesh m of 2 x devices.gpu {\n    dp = 2 over nv\n}\n'
    out = planlang("check", "-", "--stdin-filename", str(tmp_path / "main.plan"), stdin=plan)
    assert out.returncode == 0, out.stdout + out.stderr


# ------------------------------------------------------------------------------ selection
def test_select_ignore_and_extend_select(tmp_path):
    (tmp_path / "a.plan").write_text(TWO_FINDINGS)
    assert codes(planlang("lint", "a.plan", cwd=tmp_path).stdout) == ["PL309", "PL501"]
    assert codes(planlang("lint", "a.plan", "--select", "PL3", cwd=tmp_path).stdout) == ["PL309"]
    assert codes(planlang("lint", "a.plan", "--ignore", "PL309", cwd=tmp_path).stdout) == ["PL501"]
    # the more specific selector wins: PL3 ignored, PL309 selected again
    out = planlang("lint", "a.plan", "--ignore", "PL3", "--extend-select", "PL309", cwd=tmp_path)
    assert codes(out.stdout) == ["PL309", "PL501"]


def test_unknown_code_in_select_is_a_usage_error(tmp_path):
    out = planlang("lint", "-", "--select", "PL3O9", stdin=TWO_FINDINGS, cwd=tmp_path)
    assert out.returncode == 2 and "PL3O9 is no diagnostic code" in out.stderr and "did you mean PL309" in out.stderr


def test_exit_zero_and_statistics(tmp_path):
    (tmp_path / "a.plan").write_text(TWO_FINDINGS)
    (tmp_path / "b.plan").write_text(TWO_FINDINGS)
    out = planlang("lint", ".", "--exit-zero", cwd=tmp_path)
    assert out.returncode == 0 and len(codes(out.stdout)) == 2
    stats = planlang("lint", ".", "--statistics", cwd=tmp_path)
    assert stats.returncode == 1
    lines = stats.stdout.splitlines()
    assert lines[:2] == ["2  PL309  axis-without-link", "2  PL501  budget-exceeds-device"]
    assert lines[-1] == "Found 4 findings."


# ------------------------------------------------------------------------------ configuration
def test_pyproject_configuration_selects_ignores_and_excludes(tmp_path):
    (tmp_path / "pyproject.toml").write_text(textwrap.dedent("""\
        [project]
        name = "x"
        [tool.planlang]
        ignore = ["PL309"]
        per-file-ignores = { "legacy/*.plan" = ["PL5"] }
        extend-exclude = ["generated/"]
    """))
    for folder in ("plans", "legacy", "generated"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "a.plan").write_text(TWO_FINDINGS)
    sub = tmp_path / "plans"
    out = planlang("lint", "..", "--format", "json", cwd=sub)  # found from a folder below the config
    found = {(Path(d["file"]).parent.name, d["code"]) for d in json.loads(out.stdout)}
    assert found == {("plans", "PL501")}
    # a file named on the command line is checked even inside an excluded folder
    assert codes(planlang("lint", "generated/a.plan", cwd=tmp_path).stdout) == ["PL501"]
    assert codes(planlang("lint", "generated/a.plan", "--isolated", cwd=tmp_path).stdout) == ["PL309", "PL501"]


def test_planlang_toml_wins_and_gitignore_is_respected(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("scratch/\n")
    (tmp_path / "planlang.toml").write_text('select = ["PL5"]\n')
    (tmp_path / "pyproject.toml").write_text('[tool.planlang]\nselect = ["PL3"]\n')
    for folder in ("plans", "scratch"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "a.plan").write_text(TWO_FINDINGS)
    out = planlang("lint", ".", cwd=tmp_path)
    assert out.stdout.splitlines() and all(l.startswith("plans/a.plan:") for l in out.stdout.splitlines())
    assert codes(out.stdout) == ["PL501"]


def test_bad_configuration_is_a_usage_error_naming_the_key(tmp_path):
    (tmp_path / "planlang.toml").write_text('selct = ["PL5"]\n')
    out = planlang("lint", "-", stdin=TWO_FINDINGS, cwd=tmp_path)
    assert out.returncode == 2 and "unknown setting `selct`; did you mean `select`?" in out.stderr
    (tmp_path / "planlang.toml").write_text('ignore = "PL309"\n')
    out = planlang("lint", "-", stdin=TWO_FINDINGS, cwd=tmp_path)
    assert out.returncode == 2 and "`ignore` must be a list of strings" in out.stderr


def test_selection_semantics_by_hand(tmp_path):
    cfg = Config(root=tmp_path).with_options(select=["PL3"], ignore=["PL30"], extend_select=["PL305"])
    assert [c for c in ("PL501", "PL301", "PL305", "PL309", "PL311") if cfg.enabled(c)] == ["PL305", "PL311"]
    assert Config(root=tmp_path).with_options(select=["ALL"], ignore=["PL1"]).enabled("PL501")
    with pytest.raises(ConfigError):
        (tmp_path / "planlang.toml").write_text("per-file-ignores = 3\n")
        load_config(cwd=tmp_path)


# ------------------------------------------------------------------------------ colour and usage
def test_colour_follows_force_color_no_color_and_the_flag(tmp_path):
    (tmp_path / "a.plan").write_text(TWO_FINDINGS)
    plain = planlang("check", "a.plan", cwd=tmp_path)
    assert "\x1b[" not in plain.stdout  # not a terminal
    assert "\x1b[" in planlang("check", "a.plan", cwd=tmp_path, env={"FORCE_COLOR": "1"}).stdout
    assert "\x1b[" not in planlang("check", "a.plan", cwd=tmp_path,
                                   env={"FORCE_COLOR": "1", "NO_COLOR": "1"}).stdout
    assert "\x1b[" in planlang("check", "a.plan", "--color", cwd=tmp_path, env={"NO_COLOR": "1"}).stdout
    assert "\x1b[" in planlang("--color", "check", "a.plan", cwd=tmp_path).stdout
    assert "\x1b[" in planlang("lint", "a.plan", "--format", "human", "--color", cwd=tmp_path).stdout


@pytest.mark.parametrize("args", [("estimate", "x.plan", "--format", "yaml"), ("lint", "-", "--format", "xml"),
                                  ("solve", "x.plan", "--objective", "speed")])
def test_unknown_option_values_are_usage_errors(args):
    out = planlang(*args, stdin="")
    assert out.returncode == 2 and "Invalid value" in out.stderr


def test_a_file_that_is_not_utf8_is_pl105_and_the_others_are_still_checked(tmp_path):
    (tmp_path / "a.plan").write_bytes(b"device g { memory = 8 GiB }\n# caf\xe9\n")
    (tmp_path / "b.plan").write_text(TWO_FINDINGS)
    out = planlang("lint", ".", cwd=tmp_path)
    assert out.returncode == 1
    assert "a.plan:2:6: error[PL105]" in out.stdout and codes(out.stdout) == ["PL105", "PL309", "PL501"]
    json_out = json.loads(planlang("check", "a.plan", "--format", "json", cwd=tmp_path).stdout)
    assert [(d["code"], d["line"], d["column"]) for d in json_out] == [("PL105", 2, 6)]
    # a formatter filter gives the bytes back unchanged
    raw = (tmp_path / "a.plan").read_bytes()
    filt = subprocess.run([sys.executable, "-m", "planlang.cli", "fmt", "-"], input=raw, capture_output=True,
                          cwd=tmp_path, timeout=60)
    assert filt.returncode == 1 and filt.stdout == raw and b"PL105" in filt.stderr
