"""The `planlang` command line, run as a real process (`python -m planlang.cli`).

Exit codes: 0 clean, 1 findings, 2 usage errors. `check`, `lint` and `explain` must not import torch.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from planlang import __version__
from planlang.lang.codes import CODES
from planlang.lang.fmt import format_text

REPO = Path(__file__).resolve().parents[1]
INVALID = "tests/lang/corpus/invalid/pl301_mesh_size_mismatch.plan"  # relative to the repo root
WARNING_ONLY = "tests/lang/corpus/invalid/pl309_axis_without_link.plan"

VALID_PLAN = textwrap.dedent("""\
    device gpu { memory = 80 GiB }
    link nv { bandwidth = 300 GB/s }
    model net = "examples.mlp:build"
    input idx : i64[batch = 32, seq = 128]
    mesh m of 8 x gpu {
        dp = 2 over nv
        tp = 4 over nv
    }
    budget 40 GiB per device
    data idx : [dp, _]
    shard h[*].mlp.c_fc.weight : [_, tp]
""")


def planlang(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "planlang.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=60,
    )


@pytest.fixture
def valid(tmp_path: Path) -> Path:
    p = tmp_path / "valid.plan"
    p.write_text(VALID_PLAN, encoding="utf-8")
    return p


# ------------------------------------------------------------------------------------------ check
def test_check_valid_exits_0(valid):
    r = planlang("check", str(valid))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout == ""
    assert "no problems" in r.stderr


def test_check_invalid_exits_1():
    r = planlang("check", "--no-color", INVALID)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "error[PL301]" in r.stdout
    assert f"--> {INVALID}:5:1" in r.stdout
    assert "\x1b[" not in r.stdout
    assert "1 error" in r.stderr


def test_check_folder_of_plans():
    r = planlang("check", "--format", "concise", "tests/lang/corpus/invalid")
    assert r.returncode == 1
    for code in ("PL101", "PL301", "PL505"):
        assert f"[{code}]" in r.stdout


def test_check_warning_only_exits_0_but_lint_exits_1():
    assert planlang("check", WARNING_ONLY).returncode == 0
    r = planlang("lint", WARNING_ONLY)
    assert r.returncode == 1
    assert "warning[PL309]" in r.stdout


def test_check_fail_on_warnings_exits_1_on_a_warning_and_0_on_a_clean_plan(valid):
    # `planlang explain PL364` and docs/byom.md name this option as the way to make warnings fail CI
    r = planlang("check", "--fail-on-warnings", "--no-color", WARNING_ONLY)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "warning[PL309]" in r.stdout
    assert planlang("check", "--fail-on-warnings", str(valid)).returncode == 0
    assert planlang("check", "--fail-on-warnings", INVALID).returncode == 1  # errors as before
    assert planlang("check", "--fail-on-warnings", "--exit-zero", WARNING_ONLY).returncode == 0


def test_a_bom_and_cr_line_ends_check_clean_and_fmt_writes_plain_utf8_with_newlines(valid):
    # editors on other systems save a byte-order mark and "\r" line ends; the plan is the same plan
    valid.write_bytes(b"\xef\xbb\xbf" + VALID_PLAN.replace("\n", "\r").encode("utf-8"))
    r = planlang("check", str(valid))
    assert r.returncode == 0, r.stdout + r.stderr
    assert planlang("fmt", "--check", str(valid)).returncode == 1  # not canonical as bytes
    assert planlang("fmt", str(valid)).returncode == 0
    assert valid.read_bytes() == format_text(VALID_PLAN).encode("utf-8")  # no mark, "\n" line ends
    assert planlang("fmt", "--check", str(valid)).returncode == 0


def test_nonexistent_file_exits_2_without_traceback(tmp_path):
    missing = tmp_path / "no_such.plan"
    r = planlang("check", str(missing))
    assert r.returncode == 2
    assert "no such file" in r.stderr and str(missing) in r.stderr
    assert "Traceback" not in r.stdout + r.stderr


def test_lint_nonexistent_file_exits_2():
    r = planlang("lint", "nowhere/missing.plan")
    assert r.returncode == 2
    assert "Traceback" not in r.stdout + r.stderr


# ------------------------------------------------------------------------------------------ lint formats
def test_lint_json():
    r = planlang("lint", "--format", "json", INVALID)
    assert r.returncode == 1
    data = json.loads(r.stdout)
    assert [d["code"] for d in data] == ["PL301"]
    d = data[0]
    assert (d["file"], d["line"], d["column"], d["severity"]) == (INVALID, 5, 1, "error")


def test_lint_sarif():
    r = planlang("lint", "--format", "sarif", INVALID)
    assert r.returncode == 1
    data = json.loads(r.stdout)
    assert data["version"] == "2.1.0"
    run = data["runs"][0]
    assert [res["ruleId"] for res in run["results"]] == ["PL301"]
    assert "PL301" in {rule["id"] for rule in run["tool"]["driver"]["rules"]}
    loc = run["results"][0]["locations"][0]["physicalLocation"]
    assert loc["artifactLocation"]["uri"] == INVALID
    assert loc["region"]["startLine"] == 5


def test_lint_github():
    r = planlang("lint", "--format", "github", INVALID)
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"::error file={INVALID},line=5")
    assert "PL301" in lines[0]


def test_lint_concise():
    r = planlang("lint", "--format", "concise", INVALID)
    assert r.returncode == 1
    assert r.stdout.splitlines() == [
        f"{INVALID}:5:1: error[PL301] mesh axes give dp(2) * tp(2) = 4 devices, but 8 are declared"
    ]


def test_lint_concise_is_default():
    assert planlang("lint", INVALID).stdout == planlang("lint", "--format", "concise", INVALID).stdout


def test_lint_valid_exits_0(valid):
    for fmt in ("json", "sarif", "github", "concise"):
        r = planlang("lint", "--format", fmt, str(valid))
        assert r.returncode == 0, (fmt, r.stdout, r.stderr)
    assert json.loads(planlang("lint", "--format", "json", str(valid)).stdout) == []


# ------------------------------------------------------------------------------------------ explain, version
def test_explain_known_code():
    r = planlang("explain", "PL301")
    assert r.returncode == 0
    assert r.stdout.startswith("PL301 (mesh-size-mismatch, error)")
    assert CODES["PL301"].explanation.splitlines()[0] in r.stdout


def test_explain_is_case_insensitive():
    r = planlang("explain", "pl309")
    assert r.returncode == 0
    assert "PL309 (axis-without-link, warning)" in r.stdout


def test_explain_unknown_code_exits_2():
    r = planlang("explain", "PL999")
    assert r.returncode == 2
    assert "unknown code PL999" in r.stderr
    assert "Traceback" not in r.stdout + r.stderr


def test_version():
    r = planlang("--version")
    assert r.returncode == 0
    assert r.stdout.strip() == f"planlang {__version__}"


def test_no_arguments_prints_help():
    r = planlang()
    assert r.returncode in (0, 2)
    assert "check" in r.stdout + r.stderr


# ------------------------------------------------------------------------------------------ no torch
def test_check_does_not_import_torch(valid):
    code = textwrap.dedent(f"""\
        import sys
        from planlang.cli import main
        for argv in (["planlang", "check", {str(valid)!r}], ["planlang", "lint", {INVALID!r}],
                     ["planlang", "explain", "PL301"]):
            sys.argv = argv
            try:
                main()
            except SystemExit:
                pass
        print("torch" in sys.modules, file=sys.stderr)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.stderr.strip().splitlines()[-1] == "False", r.stderr


@pytest.mark.parametrize("module", ["planlang.lang", "planlang.lang.parser", "planlang.plan.checker"])
def test_import_does_not_load_torch(module):
    r = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {module}"],
                       capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 0, r.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
    assert module in imported
    assert not any(name == "torch" or name.startswith("torch.") for name in imported)


# ------------------------------------------------------------------------------------------ lower --traffic
def test_lower_traffic_prints_the_step_collectives():
    r = planlang("lower", "tests/runtime/plans/mlp_dp2_tp2.plan", "--traffic")
    assert r.returncode == 0, r.stderr
    assert "collective traffic of one training step" in r.stdout
    assert "grad_sync" in r.stdout and "all_reduce" in r.stdout
    assert "sent per rank per step" in r.stdout


def test_lower_traffic_refuses_a_pipeline_plan_without_traceback():
    r = planlang("lower", "tests/runtime/plans/gpt2_pp4_1f1b.plan", "--traffic")
    assert r.returncode != 0
    assert "pipeline" in r.stderr and "Traceback" not in r.stderr
