"""CI integration files: .pre-commit-hooks.yaml and the commands docs/ci.md shows are real."""
import json
import re
import shlex
import subprocess

from .conftest import ROOT

PLANLANG = ROOT / ".venv" / "bin" / "planlang"
GOOD = "use hardware\n\nmesh m of 2 x hardware.cpu {\n    dp = 2 over hardware.loopback\n}\n"
BAD = GOOD.replace("\n}\n", "\n}\nbudget 2 GiB per device\nshard w : [dq]\n")
UNFORMATTED = GOOD.replace("    dp = 2", "dp=2")


def parse_hooks(text: str) -> list[dict[str, str]]:
    """The subset of YAML .pre-commit-hooks.yaml uses: a list of flat mappings with scalar values."""
    hooks: list[dict[str, str]] = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = re.match(r"^(- |  )([A-Za-z_]+):\s*(.*)$", line)
        assert m, f"unexpected line: {line!r}"
        if m.group(1) == "- ":
            hooks.append({})
        value = m.group(3).strip()
        if value[:1] in "'\"":
            value = value[1:-1]
        hooks[-1][m.group(2)] = value
    return hooks


def _run(entry: str, *files) -> subprocess.CompletedProcess:
    argv = shlex.split(entry)
    assert argv[0] == "planlang"
    return subprocess.run([str(PLANLANG), *argv[1:], *map(str, files)], capture_output=True, text=True, cwd=ROOT)


HOOKS = {"planlang-lint": "planlang lint --fix", "planlang-fmt": "planlang fmt",  # rewrite, as ruff's do
         "planlang-lint-check": "planlang lint", "planlang-fmt-check": "planlang fmt --check"}  # change nothing


def test_hooks_file_declares_lint_and_fmt():
    hooks = {h["id"]: h for h in parse_hooks((ROOT / ".pre-commit-hooks.yaml").read_text())}
    assert {name: h["entry"] for name, h in hooks.items()} == HOOKS
    for h in hooks.values():
        assert h["language"] == "python" and h["name"]
        files = re.compile(h["files"])
        assert files.search("plans/gpt2.plan") and not files.search("model.py") and not files.search("a.plan.bak")


def test_hook_entries_are_real_commands(tmp_path):
    """pre-commit runs `entry FILE...` and fails when it exits non-zero or changed a file: planlang-fmt and
    planlang-lint rewrite (the layout; the safe fixes), their -check variants only fail."""
    hooks = {h["id"]: h["entry"] for h in parse_hooks((ROOT / ".pre-commit-hooks.yaml").read_text())}
    good, bad, messy = tmp_path / "good.plan", tmp_path / "bad.plan", tmp_path / "messy.plan"
    good.write_text(GOOD)
    bad.write_text(BAD)
    messy.write_text(UNFORMATTED)
    check = hooks["planlang-lint-check"]
    assert _run(check, good).returncode == 0
    res = _run(check, good, bad)
    assert res.returncode == 1 and "PL201" in res.stdout and bad.read_text() == BAD
    res = _run(hooks["planlang-fmt-check"], messy)
    assert res.returncode == 1 and messy.read_text() == UNFORMATTED  # --check writes nothing
    assert _run(hooks["planlang-fmt"], messy).returncode == 0 and messy.read_text() == GOOD
    # the lint hook applies the safe fix (the axis `dq` is `dp`) and fails only on what remains
    fixed = _run(hooks["planlang-lint"], good, bad)
    assert good.read_text() == GOOD and bad.read_text() == BAD.replace("[dq]", "[dp]")
    after = _run(check, bad)
    assert "PL201" not in after.stdout and fixed.returncode == after.returncode


def test_lint_github_and_sarif_formats_as_the_workflow_uses_them(tmp_path):
    (tmp_path / "bad.plan").write_text(BAD)
    res = subprocess.run([str(PLANLANG), "lint", "--format", "github", "bad.plan"], capture_output=True, text=True,
                         cwd=tmp_path)
    assert res.returncode == 1
    (line,) = res.stdout.splitlines()
    assert line.startswith("::error file=bad.plan,line=7,") and "title=PL201::" in line
    res = subprocess.run([str(PLANLANG), "lint", "--format", "sarif", "bad.plan"], capture_output=True, text=True,
                         cwd=tmp_path)
    sarif = json.loads(res.stdout)
    assert sarif["version"] == "2.1.0"
    (result,) = sarif["runs"][0]["results"]
    assert result["ruleId"] == "PL201"
    assert result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "bad.plan"


def test_docs_ci_commands_exist():
    from planlang.cli import app

    commands = {c.name or c.callback.__name__ for c in app.registered_commands} | {"lsp"}
    text = (ROOT / "docs" / "ci.md").read_text()
    used = re.findall(r"(?:`|run: |entry: )planlang ([a-z]+)\b", text)  # commands in code, not prose
    assert {"lint", "fmt"} <= set(used)
    assert set(used) <= commands, set(used) - commands
    assert "--format github" in text and "--format sarif" in text and "upload-sarif" in text
    assert "id: planlang-lint" in text and "id: planlang-fmt" in text
