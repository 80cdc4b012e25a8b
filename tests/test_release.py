"""What a release is made of (issue #32): one version, its CHANGELOG entry, the GitHub Action (action.yml),
the VS Code build (scripts/build_vsix.sh) that .ci/run runs after the tests."""
from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import yaml
from packaging.version import Version

from planlang.lang.version import __version__

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
ACTION = yaml.safe_load((ROOT / "action.yml").read_text())
GOOD = "use hardware\n\nmesh m of 2 x hardware.cpu {\n    dp = 2 over hardware.loopback\n}\n"
BAD = GOOD.replace("use hardware\n", "use hardware\nuse meshes\n") + "budget 2 GiB per device\nshard w : [dq]\n"


# ------------------------------------------------------------------ the version, written once


def test_pyproject_reads_the_version_from_the_package():
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    attr = PYPROJECT["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    module, _, name = attr.rpartition(".")
    assert module == "planlang.lang.version" and name == "__version__"
    assert str(Version(__version__)) == __version__  # a PEP 440 version, written in its normal form
    # the installed package's metadata (built from pyproject by ./scripts/install.sh) says the same
    assert importlib.metadata.version("planlang") == __version__


def test_editor_packages_carry_the_same_version():
    versions = {
        "editors/vscode/package.json": json.loads((ROOT / "editors/vscode/package.json").read_text())["version"],
        "editors/tree-sitter-planlang/package.json":
            json.loads((ROOT / "editors/tree-sitter-planlang/package.json").read_text())["version"],
        "editors/tree-sitter-planlang/tree-sitter.json":
            json.loads((ROOT / "editors/tree-sitter-planlang/tree-sitter.json").read_text())["metadata"]["version"],
        "editors/zed/extension.toml": tomllib.loads((ROOT / "editors/zed/extension.toml").read_text())["version"],
    }
    assert {path: v for path, v in versions.items() if v != __version__} == {}


def test_changelog_has_an_entry_for_this_version():
    """Keep a Changelog: an Unreleased section, then one `## [X.Y.Z] - YYYY-MM-DD` per release, newest first,
    with only the standard kinds of change, and a link for each heading."""
    text = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$", text, re.M)
    assert headings[0] == ("Unreleased", "")
    releases = [Version(v) for v, _ in headings[1:]]
    assert releases and releases == sorted(releases, reverse=True) and all(d for _, d in headings[1:])
    assert releases[0] == Version(__version__)
    kinds = set(re.findall(r"^### (.+)$", text, re.M))
    assert kinds and kinds <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
    for version, _ in headings:
        assert re.search(rf"^\[{re.escape(version)}\]: https://\S+$", text, re.M), version
    assert f"releases/tag/v{__version__}" in text


# ------------------------------------------------------------------ action.yml


def _steps() -> dict[str, dict]:
    return {step.get("id", step["name"]): step for step in ACTION["runs"]["steps"]}


def test_action_is_composite_and_every_input_is_declared_and_used():
    assert ACTION["runs"]["using"] == "composite"
    inputs = set(ACTION["inputs"])
    assert {"paths", "version", "args"} <= inputs
    text = (ROOT / "action.yml").read_text()
    used = set(re.findall(r"\$\{\{\s*inputs\.([A-Za-z_-]+)", text)) | set(re.findall(r"\binputs\.([A-Za-z_-]+) ==", text))
    assert used == inputs
    for step in ACTION["runs"]["steps"]:
        if "run" in step:
            assert step["shell"] == "bash"
            # inputs reach a script through env: a value spliced into the script could run as code
            assert "${{" not in step["run"], step["name"]
    uploads = [s for s in ACTION["runs"]["steps"] if s.get("uses", "").startswith("github/codeql-action/upload-sarif@")]
    assert len(uploads) == 1 and uploads[0]["with"]["sarif_file"] == "${{ steps.lint.outputs.sarif-file }}"
    install = _steps()["install"]
    assert "${{ github.action_path }}" in install["env"].values()  # installs the action's own checkout
    assert '"$venv/bin/python" -m pip install' in install["run"]


def _run_steps(tmp_path: Path, names: list[str], inputs: dict[str, str]) -> list[subprocess.CompletedProcess]:
    """Run the named steps of action.yml as the runner does (bash -eo pipefail, env from `env:` with the
    expressions evaluated for these inputs and the installed planlang), one bash process for all of them."""
    planlang = ROOT / ".venv" / "bin" / "planlang"
    values = {**{k: str(v.get("default", "")) for k, v in ACTION["inputs"].items()}, **inputs}
    out_file = tmp_path / "github_output"
    driver = ["set +e"]
    for i, name in enumerate(names):
        step = _steps()[name]
        script = tmp_path / f"step{i}.sh"
        script.write_text(step["run"])
        env = []
        for key, expr in step.get("env", {}).items():
            m = re.fullmatch(r"\$\{\{ (inputs|steps\.(\w+)\.outputs)\.([\w-]+) \}\}", expr)
            assert m, expr
            if m[1] == "inputs":
                value = values[m[3]]
            elif m[2] == "install":
                value = str(planlang)
            else:
                value = "$(grep '^%s=' %s | tail -n1 | cut -d= -f2-)" % (m[3], out_file)
            env.append(f'{key}="{value}"')
        driver.append(f"env {' '.join(env)} bash --noprofile --norc -eo pipefail {script} >{tmp_path}/out{i} 2>&1; "
                      f"echo $? >{tmp_path}/rc{i}")
    (tmp_path / "driver.sh").write_text("\n".join(driver) + "\n")
    proj = tmp_path / "repo"
    subprocess.run(["bash", str(tmp_path / "driver.sh")], cwd=proj, check=True, timeout=120,
                   env={**os.environ, "RUNNER_TEMP": str(tmp_path), "GITHUB_OUTPUT": str(out_file)})
    return [subprocess.CompletedProcess(name, int((tmp_path / f"rc{i}").read_text()),
                                        (tmp_path / f"out{i}").read_text()) for i, name in enumerate(names)]


def test_action_lints_the_paths_into_sarif_and_fails_on_findings(tmp_path):
    proj = tmp_path / "repo"
    (proj / "plans" / "ok").mkdir(parents=True)
    (proj / "plans" / "bad.plan").write_text(BAD)
    (proj / "plans" / "ok" / "good.plan").write_text(GOOD)
    (proj / "elsewhere.plan").write_text(BAD)  # not among the paths: never linted
    lint, result = _run_steps(tmp_path, ["lint", "planlang lint (result)"],
                              {"paths": "plans/bad.plan plans/ok", "args": "--ignore PL218"})  # `meshes` unused
    assert lint.returncode == 0, lint.stdout  # findings still upload
    outputs = dict(line.split("=", 1) for line in (tmp_path / "github_output").read_text().splitlines())
    assert outputs["exit-code"] == "1"
    sarif = json.loads(Path(outputs["sarif-file"]).read_text())
    assert sarif["version"] == "2.1.0" and sarif["runs"][0]["tool"]["driver"]["version"] == __version__
    results = sarif["runs"][0]["results"]
    assert {r["ruleId"] for r in results} == {"PL201"}
    assert {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in results} == {"plans/bad.plan"}
    # the result step annotates the pull request, then fails the job on the findings
    assert result.returncode == 1
    assert "::error file=plans/bad.plan,line=8," in result.stdout and "title=PL201::" in result.stdout


def test_build_vsix_without_node_says_so(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dirname", "basename", "mkdir", "mktemp", "rm", "cat"):
        if shutil.which(tool):
            os.symlink(shutil.which(tool), bin_dir / tool)
    proc = subprocess.run([shutil.which("bash") or "bash", str(ROOT / "scripts" / "build_vsix.sh"), str(tmp_path / "out")],
                          env={"PATH": str(bin_dir)}, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "needs node and npm" in proc.stderr and "node npm" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_ci_builds_the_vsix_after_the_tests_and_the_demo_then_runs_the_grammar_npm_test():
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    steps = [line for line in lines if line.startswith("./scripts/")]
    assert steps == ["./scripts/test.sh", "./scripts/demo.sh", "./scripts/build_vsix.sh"]
    assert lines[-1] == ("(cd editors/tree-sitter-planlang && npm ci --ignore-scripts --no-audit --no-fund "
                         "--loglevel=error && npm test)")
    assert os.access(ROOT / "scripts" / "build_vsix.sh", os.X_OK)
