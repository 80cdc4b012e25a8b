from __future__ import annotations

import os
import shutil

import pytest

from .grammar_facts import VSCODE_DIR


@pytest.fixture(scope="session")
def node_modules():
    """editors/vscode/node_modules, installed by scripts/install_editors.sh. Missing: the test skips
    on a developer machine without node, and fails under CI (CI=true), where it must be installed."""
    folder = VSCODE_DIR / "node_modules"
    if shutil.which("node") and (folder / ".bin" / "vscode-tmgrammar-test").exists():
        return folder
    reason = ("editors/vscode/node_modules is not installed (or node is missing): run "
              "./scripts/install_editors.sh (needs node and npm)")
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)
