"""What ships: the VS Code extension packaged as a .vsix (scripts/package_vscode.sh), and the licence every
editor package declares (the project's, Apache-2.0, as pyproject.toml says)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tomllib
import zipfile

import pytest

from .grammar_facts import ROOT, VSCODE_DIR

PACKAGE = json.loads((VSCODE_DIR / "package.json").read_text())
LOCK = json.loads((VSCODE_DIR / "package-lock.json").read_text())
PROJECT_LICENSE = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"]


@pytest.fixture(scope="session")
def vsce():
    """editors/vscode/node_modules/.bin/vsce, installed by scripts/install_editors.sh; skipped without
    node on a developer machine, a failure under CI (CI=true)."""
    tool = VSCODE_DIR / "node_modules" / ".bin" / "vsce"
    if shutil.which("node") and shutil.which("npm") and tool.exists():
        return tool
    reason = "@vscode/vsce is not installed (or node is missing): run ./scripts/install_editors.sh"
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


def _production_packages() -> set[str]:
    """The node_modules folders a user's install of the extension needs: the lock's non-dev packages."""
    return {path.removeprefix("node_modules/") for path, meta in LOCK["packages"].items()
            if path.startswith("node_modules/") and not meta.get("dev") and "/node_modules/" not in path}


@pytest.fixture(scope="module")
def vsix(vsce, tmp_path_factory):
    out = tmp_path_factory.mktemp("vsix") / "planlang.vsix"
    proc = subprocess.run([str(ROOT / "scripts" / "package_vscode.sh"), str(out)], capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == str(out) and proc.stderr == ""
    with zipfile.ZipFile(out) as z:
        assert z.testzip() is None
        return {name: z.read(name) for name in z.namelist()}


def test_vsix_holds_the_extension_and_its_grammar(vsix):
    for name in ("extension.vsixmanifest", "extension/package.json", "extension/extension.js",
                 "extension/language-configuration.json", "extension/syntaxes/plan.tmLanguage.json",
                 "extension/readme.md", "extension/LICENSE.txt"):
        assert name in vsix, name
    packaged = json.loads(vsix["extension/package.json"])
    assert packaged["name"] == PACKAGE["name"] and packaged["version"] == PACKAGE["version"]
    assert packaged["license"] == PROJECT_LICENSE
    for grammar in packaged["contributes"]["grammars"]:
        assert "extension/" + grammar["path"].removeprefix("./") in vsix
    assert vsix["extension/syntaxes/plan.tmLanguage.json"] == (VSCODE_DIR / "syntaxes" / "plan.tmLanguage.json").read_bytes()
    assert b"Apache License" in vsix["extension/LICENSE.txt"]
    assert b'Id="planlang"' in vsix["extension.vsixmanifest"] and b"Publisher=\"planlang\"" in vsix["extension.vsixmanifest"]


def test_vsix_bundles_the_language_client_and_no_dev_tooling(vsix):
    """vscode-languageclient (the extension requires it at run time) and its dependencies go in; the dev
    tooling (vsce, vscode-tmgrammar-test and theirs), the grammar tests and the lock file stay out."""
    bundled = {m.group(1) for name in vsix
               if (m := re.match(r"extension/node_modules/((?:@[^/]+/)?[^/]+)/", name))}
    assert "vscode-languageclient" in bundled
    assert bundled == _production_packages()
    assert not any(name.startswith("extension/node_modules/.bin/") for name in vsix)
    assert not any(name.startswith("extension/tests/") for name in vsix)
    assert "extension/package-lock.json" not in vsix and "extension/.vscodeignore" not in vsix
    main = json.loads(vsix["extension/node_modules/vscode-languageclient/package.json"])
    assert "extension/node_modules/vscode-languageclient/node.js" in vsix, main.get("main")
    assert len(vsix) < 400


def test_untrusted_workspaces_are_limited_and_cannot_turn_on_code_running_settings():
    # model checks import the plan's model (the workspace's Python) and `planlang.path` names a program
    # to run: a workspace nobody trusted must not set either
    caps = PACKAGE["capabilities"]["untrustedWorkspaces"]
    assert caps["supported"] == "limited" and caps["description"]
    assert set(caps["restrictedConfigurations"]) == {"planlang.path", "planlang.modelChecks"}
    settings = PACKAGE["contributes"]["configuration"]["properties"]
    assert set(caps["restrictedConfigurations"]) <= set(settings)


def test_vsce_is_pinned_as_a_dev_dependency():
    assert re.fullmatch(r"\d+\.\d+\.\d+", PACKAGE["devDependencies"]["@vscode/vsce"])
    assert LOCK["packages"]["node_modules/@vscode/vsce"]["version"] == PACKAGE["devDependencies"]["@vscode/vsce"]
    assert LOCK["packages"]["node_modules/@vscode/vsce"]["dev"] is True
    assert "files" not in PACKAGE, "package.json `files` would stop vsce from bundling vscode-languageclient"
    ignore = (VSCODE_DIR / ".vscodeignore").read_text().split()
    assert "tests/**" in ignore and "package-lock.json" in ignore
    assert "*.vsix" in (VSCODE_DIR / ".gitignore").read_text().split()
    assert os.access(ROOT / "scripts" / "package_vscode.sh", os.X_OK)


def test_package_vscode_without_npm_says_so(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dirname", "basename", "mkdir", "mktemp", "rm", "cat"):
        if shutil.which(tool):
            os.symlink(shutil.which(tool), bin_dir / tool)
    proc = subprocess.run([shutil.which("bash"), str(ROOT / "scripts" / "package_vscode.sh"), str(tmp_path / "x.vsix")],
                          env={"PATH": str(bin_dir)}, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "needs node and npm" in proc.stderr
    assert not (tmp_path / "x.vsix").exists()


# ------------------------------------------------------------------ licences


def test_every_editor_package_says_the_projects_license():
    assert PROJECT_LICENSE == "Apache-2.0"
    assert PACKAGE["license"] == PROJECT_LICENSE
    assert LOCK["packages"][""]["license"] == PROJECT_LICENSE
    ts_dir = ROOT / "editors" / "tree-sitter-planlang"
    assert json.loads((ts_dir / "package.json").read_text())["license"] == PROJECT_LICENSE
    assert json.loads((ts_dir / "tree-sitter.json").read_text())["metadata"]["license"] == PROJECT_LICENSE
    assert ";; SPDX-License-Identifier: Apache-2.0" in (ROOT / "editors" / "emacs" / "planlang-mode.el").read_text()
    for vim_file in sorted((ROOT / "editors" / "vim").rglob("*.vim")):
        assert "SPDX-License-Identifier: Apache-2.0" in vim_file.read_text(), vim_file
    for folder in (VSCODE_DIR, ts_dir, ROOT / "editors" / "zed"):
        if folder.exists():
            assert (folder / "LICENSE").read_text().lstrip().startswith("Apache License"), folder


def test_no_editor_file_claims_another_license():
    """No MIT (or other) licence left in the editor files we write (node_modules and locks aside)."""
    skip = {"node_modules", "package-lock.json", "src"}
    offenders = []
    for path in (ROOT / "editors").rglob("*"):
        if path.is_file() and not skip & set(path.relative_to(ROOT / "editors").parts):
            text = path.read_text(errors="replace")
            if re.search(r'"license"\s*:\s*"(?!Apache-2\.0")|\bMIT License\b|SPDX-License-Identifier: (?!Apache-2\.0)', text):
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []
