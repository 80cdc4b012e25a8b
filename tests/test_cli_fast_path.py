"""planlang.cli.fast runs a plain `check`, `lint` or `fmt` without Typer: for each command line below,
`planlang.cli.main` with and without PLANLANG_NO_FAST_CLI=1 (Typer's app, as before the fast path)
gives the same stdout, stderr and exit code; the lines it must leave to Typer reach Typer. In process."""
from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

import planlang.cli
from planlang.cli import fast

ROOT = Path(__file__).resolve().parents[1]
GOOD = str(ROOT / "examples" / "gpt2" / "gpt2_3d.plan")
SYNTAX = "mesh m of 8 x hardware.a100_80g {\n    dp = 8\n}\nshard wte.weight : [dp, _\nbudget 40 GiB per device\n"
TYPO = "use hardware\nmesh m of 8 x hardware.a100_80g {\n    dp = 8\n}\nshrad wte.weight : [dp, _]\n"
UGLY = "use hardware\nmesh m of 8 x hardware.a100_80g {\n  dp   =  8\n}\nshard   wte.weight : [ dp , _ ]\n"

# (argv, whether the fast path runs it); {bad}, {typo}, {good} are files, {dir} a folder holding them
CASES = [
    (["check", "{good}"], True),
    (["check", "{bad}"], True),
    (["check", "{typo}", "{good}"], True),
    (["check", "--format", "json", "{bad}"], True),
    (["check", "--format=concise", "{typo}"], True),
    (["check", "-f", "sarif", "{good}"], True),
    (["check", "-f", "github", "{bad}"], True),
    (["check", "--color", "{typo}"], True),
    (["check", "--no-color", "--fail-on-warnings", "{dir}"], True),
    (["check", "--select", "PL1", "--ignore", "PL102", "{bad}", "{typo}"], True),
    (["check", "--isolated", "--statistics", "{dir}"], True),
    (["check", "--exit-zero", "--extend-select=PL5", "{bad}"], True),
    (["check", "--config", "{dir}/missing.toml", "{good}"], True),
    (["check", "{dir}/no_such.plan"], True),
    (["check"], True),  # the working folder
    (["check", "-", "--stdin-filename", "piped.plan"], True),
    (["check", "-", "-"], True),
    (["lint", "{typo}"], True),
    (["lint", "--diff", "{typo}"], True),
    (["lint", "--fix", "-"], True),
    (["lint", "-f", "human", "{dir}"], True),
    (["check", "--unknown", "{good}"], False),
    (["check", "--help"], False),
    (["check", "--format", "xml", "{good}"], False),
    (["check", "--format"], False),
    (["check", "-fjson", "{good}"], False),
    (["check", "--color", "--no-color", "{good}"], False),
    (["check", "--isolated=1", "{good}"], False),
    (["check", "--", "{good}"], False),
    (["lint", "--fail-on-warnings", "{good}"], False),
    (["fmt", "--check", "{good}"], True),
    (["fmt", "--diff", "{ugly}"], True),
    (["fmt", "--check", "{dir}"], True),  # syntax errors and a file to reformat
    (["fmt", "-"], True),  # a filter: the text back unchanged, its syntax error on stderr
    (["fmt", "--isolated", "--stdin-filename", "piped.plan", "-"], True),
    (["fmt", "--check", "{dir}/no_such.plan"], True),
    (["fmt"], False),  # a path is required: Click says so
    (["fmt", "--select", "PL1", "{good}"], False),
    (["fmt", "-f", "json", "{good}"], False),
    (["fmt", "--check", "--check", "{good}"], False),
]


def _run(argv: list[str], monkeypatch, capsysbinary, stdin: bytes, typer_only: bool) -> tuple[bytes, bytes, int]:
    monkeypatch.setattr(sys, "argv", ["planlang", *argv])
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    if typer_only:
        monkeypatch.setenv("PLANLANG_NO_FAST_CLI", "1")
    else:
        monkeypatch.delenv("PLANLANG_NO_FAST_CLI", raising=False)
    with pytest.raises(SystemExit) as stop:
        planlang.cli.main()
    out, err = capsysbinary.readouterr()
    return out, err, stop.value.code


@pytest.mark.parametrize("argv, handled", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_fast_path_is_typers(argv, handled, tmp_path, monkeypatch, capsysbinary):
    folder = tmp_path / "plans"
    folder.mkdir()
    (folder / "bad.plan").write_text(SYNTAX, encoding="utf-8")
    (folder / "typo.plan").write_text(TYPO, encoding="utf-8")
    (folder / "ugly.plan").write_text(UGLY, encoding="utf-8")
    names = {"good": GOOD, "bad": str(folder / "bad.plan"), "typo": str(folder / "typo.plan"), "dir": str(folder),
             "ugly": str(folder / "ugly.plan")}
    argv = [a.format(**names) for a in argv]
    monkeypatch.chdir(folder)
    for var in ("NO_COLOR", "FORCE_COLOR"):
        monkeypatch.delenv(var, raising=False)
    assert (fast.parse(argv) is not None) is handled
    before = {f.name: f.read_text() for f in folder.iterdir()}
    through_typer = _run(argv, monkeypatch, capsysbinary, TYPO.encode(), typer_only=True)
    assert {f.name: f.read_text() for f in folder.iterdir()} == before  # nothing here writes a file
    fast_path = _run(argv, monkeypatch, capsysbinary, TYPO.encode(), typer_only=False)
    assert fast_path == through_typer
    assert through_typer[2] in (0, 1, 2)
    if handled:
        assert through_typer[0] or through_typer[1]  # each says something


def test_the_matrix_covers_findings_usage_errors_and_clean_plans(tmp_path, monkeypatch, capsysbinary):
    """The cases above are not all alike: the fast path's exit codes span 0, 1 and 2."""
    (tmp_path / "bad.plan").write_text(SYNTAX, encoding="utf-8")
    codes = {_run(argv, monkeypatch, capsysbinary, b"", typer_only=False)[2]
             for argv in (["check", GOOD], ["check", str(tmp_path / "bad.plan")], ["check", str(tmp_path / "no.plan")])}
    assert codes == {0, 1, 2}


def test_version_without_typer(monkeypatch, capsysbinary):
    fast_path = _run(["--version"], monkeypatch, capsysbinary, b"", typer_only=False)
    assert fast_path == _run(["--version"], monkeypatch, capsysbinary, b"", typer_only=True)
    assert fast_path[0].startswith(b"planlang ") and fast_path[2] == 0
