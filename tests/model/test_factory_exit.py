"""A model factory that ends the process (`sys.exit`, `os._exit`) is a coded, located error (PL368), never a
silent `check --model` that exits 0 with no output: a CI gate would pass having checked nothing."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

from planlang.model.capture.load import ModelLoadError, build_model  # noqa: E402
from planlang.plan.types import ModelRef  # noqa: E402

REPO = Path(__file__).resolve().parents[2]

FACTORIES = textwrap.dedent("""\
    import os
    import sys

    import torch


    def quits():
        sys.exit(0)


    def leaves():
        os._exit(0)


    def fails():
        raise ValueError("no such width")


    def builds():
        return torch.nn.Linear(4, 4)
""")
PLAN = textwrap.dedent("""\
    use hardware
    model net = "exiting_factories:{factory}"
    input x : f32[batch = 4, features = 4]
    mesh m of 1 x hardware.cpu {{ dp = 1 over hardware.loopback }}
    budget 1 GiB per device
""")


def test_check_model_reports_a_factory_that_exits_and_exits_1(tmp_path):
    (tmp_path / "exiting_factories.py").write_text(FACTORIES)
    plans = []
    for factory in ("quits", "leaves", "fails"):
        (tmp_path / f"{factory}.plan").write_text(PLAN.format(factory=factory))
        plans.append(str(tmp_path / f"{factory}.plan"))
    r = subprocess.run([sys.executable, "-m", "planlang.cli", "check", "--model", "--format", "concise", *plans],
                       capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    # each on the plan's `model` line (2), naming the factory and what it did
    quits = [x for x in lines if "quits.plan:2:" in x]
    assert quits and "PL368" in quits[0] and "exiting_factories:quits()" in quits[0] and "sys.exit(0)" in quits[0]
    leaves = [x for x in lines if "leaves.plan:2:" in x]
    assert leaves and "PL368" in leaves[0] and "os._exit(0)" in leaves[0], r.stdout
    fails = [x for x in lines if "fails.plan:2:" in x]
    assert fails and "PL261" in fails[0] and "ValueError: no such width" in fails[0], r.stdout
    assert len(lines) == 3, r.stdout  # nothing else: the exits stopped no later plan's check


def test_os_exit_is_restored_after_the_factory(tmp_path, monkeypatch):
    (tmp_path / "exiting_factories_2.py").write_text(FACTORIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    real = os._exit
    with pytest.raises(ModelLoadError) as e:
        build_model(ModelRef("net", "exiting_factories_2:leaves"))
    assert e.value.code == "PL368" and "os._exit(0)" in e.value.message
    assert os._exit is real
    assert isinstance(build_model(ModelRef("net", "exiting_factories_2:builds")), object)
    assert os._exit is real


def test_a_module_that_exits_while_imported_is_pl368(tmp_path, monkeypatch):
    (tmp_path / "exits_on_import.py").write_text("import sys\nsys.exit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModelLoadError) as e:
        build_model(ModelRef("net", "exits_on_import:build"))
    assert e.value.code == "PL368" and "importing `exits_on_import`" in e.value.message
    assert "sys.exit(3)" in e.value.message
