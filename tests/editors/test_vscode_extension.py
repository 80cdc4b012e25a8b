"""editors/vscode/extension.js, run by node with fake `vscode` and `vscode-languageclient` modules: it starts
`planlang lsp` over stdio when the executable is found, and does nothing but log a line otherwise."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from .grammar_facts import ROOT

HARNESS = ROOT / "tests" / "editors" / "vscode_extension_harness.js"

pytestmark = pytest.mark.skipif(shutil.which("node") is None and not os.environ.get("CI"),
                                reason="node is not installed")


def run(**scenario) -> dict:
    proc = subprocess.run(["node", str(HARNESS), json.dumps(scenario)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["error"] is None, out["error"]
    return out


@pytest.fixture
def fake_planlang(tmp_path):
    """A directory holding an executable named planlang (never run: the language client is a fake)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "planlang"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    return exe


def test_starts_planlang_lsp_over_stdio_when_found_on_path(fake_planlang):
    out = run(PATH=f"/nonexistent:{fake_planlang.parent}", settings={"planlang.modelChecks": True})
    (client,) = out["clients"]
    assert client["serverOptions"]["command"] == str(fake_planlang)
    assert client["serverOptions"]["args"] == ["lsp"]
    assert client["serverOptions"]["transport"] == 0  # TransportKind.stdio
    assert {"scheme": "file", "language": "plan"} in client["clientOptions"]["documentSelector"]
    assert client["clientOptions"]["initializationOptions"] == {"modelChecks": True, "modelCheckDelay": 0.5}
    assert client["clientOptions"]["synchronize"]["configurationSection"] == "planlang"
    assert client["started"] is True
    assert "planlang.restartServer" in out["commands"]


def test_does_nothing_but_log_when_planlang_is_missing(tmp_path):
    out = run(PATH=str(tmp_path))
    assert out["clients"] == []
    assert any("not found" in line for line in out["log"]), out["log"]


def test_path_setting_to_a_file_that_is_not_executable_is_not_started(tmp_path):
    plain = tmp_path / "planlang"
    plain.write_text("not a program")
    plain.chmod(0o644)
    out = run(PATH="", settings={"planlang.path": str(plain)})
    assert out["clients"] == []


def test_path_setting_relative_to_the_workspace_folder(fake_planlang, tmp_path):
    out = run(PATH="", workspaceFolder=str(tmp_path), settings={"planlang.path": "${workspaceFolder}/bin/planlang"})
    assert [c["serverOptions"]["command"] for c in out["clients"]] == [str(fake_planlang)]
    out = run(PATH="", workspaceFolder=str(tmp_path), settings={"planlang.path": "bin/planlang"})
    assert [c["serverOptions"]["command"] for c in out["clients"]] == [str(fake_planlang)]


def test_default_setting_finds_planlang_in_the_workspace_venv_without_path(tmp_path):
    """planlang need not be on PATH: the default setting also looks in the workspace's .venv (or venv),
    where ./scripts/install.sh installs it; only once the workspace is trusted, as any program inside it."""
    exe = tmp_path / ".venv" / "bin" / "planlang"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    out = run(PATH="", workspaceFolder=str(tmp_path))
    assert [c["serverOptions"]["command"] for c in out["clients"]] == [str(exe)]
    out = run(PATH="", workspaceFolder=str(tmp_path), untrusted=True)
    assert out["clients"] == [] and any("untrusted workspace" in line for line in out["log"]), out["log"]
    # a setting other than the default names the one executable to run: no search elsewhere
    out = run(PATH="", workspaceFolder=str(tmp_path), settings={"planlang.path": "planlang-dev"})
    assert out["clients"] == [] and any("not found" in line for line in out["log"]), out["log"]
    out = run(PATH="", findExecutable={"setting": "planlang", "options": {
        "platform": "win32", "workspaceFolder": str(tmp_path), "env": {"PATH": ""}}})
    assert out["found"] is None  # Windows keeps it in .venv\\Scripts\\planlang.exe
    (tmp_path / "venv" / "Scripts").mkdir(parents=True)
    (tmp_path / "venv" / "Scripts" / "planlang.exe").write_text("")
    out = run(PATH="", findExecutable={"setting": "planlang", "options": {
        "platform": "win32", "workspaceFolder": str(tmp_path), "env": {"PATH": ""}}})
    assert out["found"] == str(tmp_path / "venv" / "Scripts" / "planlang.exe")


def test_missing_language_client_package_is_logged_not_thrown(fake_planlang):
    out = run(PATH=str(fake_planlang.parent), noClient=True)
    assert out["clients"] == []
    assert any("vscode-languageclient" in line for line in out["log"]), out["log"]


def test_a_server_that_fails_to_start_is_logged(fake_planlang):
    out = run(PATH=str(fake_planlang.parent), startFails=True)
    assert len(out["clients"]) == 1 and out["clients"][0]["started"] is False
    assert any("did not start" in line for line in out["log"]), out["log"]


def test_changing_the_executable_restarts_the_server(fake_planlang, tmp_path):
    other = tmp_path / "other-planlang"
    shutil.copy(fake_planlang, other)
    out = run(PATH=str(fake_planlang.parent), changeSetting={"planlang.path": str(other)})
    assert [c["serverOptions"]["command"] for c in out["clients"]] == [str(fake_planlang), str(other)]
    assert out["stopped"] == 1


def test_other_settings_reach_the_running_server_without_a_restart(fake_planlang):
    """modelChecks changes go to the server as didChangeConfiguration (synchronize.configurationSection)."""
    out = run(PATH=str(fake_planlang.parent), changeSetting={"planlang.modelChecks": True})
    assert len(out["clients"]) == 1 and out["stopped"] == 0


ANSWER = {"modelChecks": True, "modelCheckDelay": 2, "path": "planlang"}


def test_a_trusted_workspace_passes_model_checks_on(fake_planlang):
    out = run(PATH=str(fake_planlang.parent), settings={"planlang.modelChecks": True}, configurationAnswer=ANSWER)
    (client,) = out["clients"]
    assert client["clientOptions"]["initializationOptions"]["modelChecks"] is True
    assert client["configuration"] == [ANSWER, True, {"tabSize": 4}]
    assert client["announced"] == ["planlang"]  # didChangeConfiguration carries the values


def test_an_untrusted_workspace_never_turns_model_checks_on(fake_planlang):
    """Model checks import the workspace's model code: off at start, in every answer to the server's
    workspace/configuration, and a change is announced without values (the server then asks)."""
    out = run(PATH=str(fake_planlang.parent), settings={"planlang.modelChecks": True}, untrusted=True,
              configurationAnswer=ANSWER)
    (client,) = out["clients"]
    assert client["clientOptions"]["initializationOptions"] == {"modelChecks": False, "modelCheckDelay": 0.5}
    assert client["configuration"] == [dict(ANSWER, modelChecks=False), False, {"tabSize": 4}]
    assert client["announced"] is None
    assert client["started"] is True  # the syntax and plan checks run no model code


def test_an_executable_inside_an_untrusted_workspace_waits_for_trust(fake_planlang, tmp_path):
    settings = {"planlang.path": "${workspaceFolder}/bin/planlang", "planlang.modelChecks": True}
    out = run(PATH="", workspaceFolder=str(tmp_path), settings=settings, untrusted=True)
    assert out["clients"] == []
    assert any("untrusted workspace" in line for line in out["log"]), out["log"]
    out = run(PATH="", workspaceFolder=str(tmp_path), settings=settings, untrusted=True, grantTrust=True)
    (client,) = out["clients"]  # trusted: started, with the settings in full
    assert client["serverOptions"]["command"] == str(fake_planlang)
    assert client["clientOptions"]["initializationOptions"]["modelChecks"] is True


def test_deactivate_stops_the_server(fake_planlang):
    out = run(PATH=str(fake_planlang.parent), deactivate=True)
    assert out["stopped"] == 1


def test_find_executable_on_windows_uses_pathext(tmp_path):
    (tmp_path / "planlang.EXE").write_text("")
    out = run(PATH="", findExecutable={"setting": "planlang",
                                       "options": {"platform": "win32",
                                                   "env": {"PATH": str(tmp_path), "PATHEXT": ".EXE;.CMD"}}})
    assert out["found"] == str(tmp_path / "planlang.EXE")
