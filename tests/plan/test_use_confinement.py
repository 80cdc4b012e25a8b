"""`use` is confined (PL222): the standard library, the root plan's folder and below, and the folders of
`use-paths`. Nothing outside is read, so no diagnostic can show another file's content."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from planlang.plan.checker import check_text
from planlang.plan.resolve import Resolver

SECRET = "root:x:0:0:the-secret-line"


@pytest.fixture()
def tree(tmp_path):
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.plan").write_text(SECRET + "\n")
    (tmp_path / "outside" / "devs.plan").write_text("device g2 { memory = 8 GiB }\n")
    project = tmp_path / "project"
    (project / "lib").mkdir(parents=True)
    (project / "lib" / "devs.plan").write_text("device g1 { memory = 8 GiB }\n")
    (project / "notes.txt").write_text(SECRET + "\n")
    (project / "link.plan").symlink_to(tmp_path / "outside" / "secret.plan")
    return tmp_path, project


def codes(res):
    return [d.code for d in res.diagnostics]


@pytest.mark.parametrize("target", ["{tmp}/outside/secret.plan", "../outside/secret.plan", "link.plan",
                                    "lib/../../outside/secret.plan", "notes.txt"])
def test_targets_outside_the_plans_folders_are_refused_unread(tree, target):
    tmp, project = tree
    text = f'use "{target.format(tmp=tmp)}"\n'
    read = []

    def reader(path):
        read.append(path)
        return Path(path).read_text()

    res = check_text(text, str(project / "main.plan"), read=reader)
    assert codes(res) == ["PL222"]
    assert read == [] and all(SECRET not in d.message and SECRET not in (d.help or "") for d in res.diagnostics)


def test_the_plans_folder_the_stdlib_and_use_paths_are_allowed(tree):
    tmp, project = tree
    ok = 'use hardware\nuse "lib/devs.plan"\nmesh m of 2 x devs.g1 {\n    dp = 2 over hardware.nvlink3\n}\n'
    assert "PL222" not in codes(check_text(ok, str(project / "main.plan")))
    other = 'use "../outside/devs.plan"\nmesh m of 2 x devs.g2 {\n    dp = 2 over l\n}\nlink l { bandwidth = 1 GB/s }\n'
    assert codes(check_text(other, str(project / "main.plan")))[:1] == ["PL222"]
    allowed = check_text(other, str(project / "main.plan"), search_paths=(str(tmp / "outside"),))
    assert "PL222" not in codes(allowed) and allowed.errors == 0


def test_use_paths_come_from_planlang_toml_and_every_format_hides_the_content(tree):
    tmp, project = tree
    (project / "main.plan").write_text('use "../outside/secret.plan"\n')
    for fmt in ("human", "concise", "json", "sarif", "github"):
        out = subprocess.run([sys.executable, "-m", "planlang.cli", "check", "main.plan", "--format", fmt],
                             cwd=project, capture_output=True, text=True, timeout=60)
        assert out.returncode == 1 and "PL222" in out.stdout and SECRET not in out.stdout + out.stderr
    (project / "planlang.toml").write_text('use-paths = ["../outside"]\n')
    out = subprocess.run([sys.executable, "-m", "planlang.cli", "check", "main.plan", "--format", "concise"],
                         cwd=project, capture_output=True, text=True, timeout=60)
    assert "PL222" not in out.stdout  # now read: it is a (broken) plan, so PL1xx, which is the user's choice


def test_a_resolver_keeps_the_root_plans_folder(tree):
    _, project = tree
    r = Resolver()
    r.resolve_text('use "lib/devs.plan"\n', str(project / "main.plan"))
    assert r.root == project.resolve() and r.allowed(str(project / "lib" / "devs.plan"))
    assert not r.allowed(os.path.join(str(project), "..", "outside", "devs.plan"))
