"""Model results kept on disk (planlang.model.capture.disk_cache, planlang.cli.cached): the second `check
--model` or `estimate` of the same plan and model shows the same thing without validating again; another
model argument, an edited model file, another plan or `--no-cache` validates; a corrupt entry is ignored
and written again; the directory is $PLANLANG_CACHE_DIR, else $XDG_CACHE_HOME/planlang, else
~/.cache/planlang (tests/conftest.py points it at a fresh folder for every test)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planlang.cli import app
from planlang.model import validation
from planlang.model.capture import disk_cache

ROOT = Path(__file__).resolve().parents[2]
PLAN = """\
device d {{ memory = 80 GiB; flops.f32 = 10 TFLOPS }}
link l {{ bandwidth = 100 GB/s; latency = 2 us }}
model net = "{module}:build"(hidden = {hidden}, layers = 2)
input idx : i64[batch = 8, seq = 16]
budget {budget} per device
mesh m of 2 x d {{
    dp = 2 over l
}}
data idx : [dp, _]
"""


def text(plan: Path, hidden: int = 32, budget: str = "40 GiB") -> str:
    """The plan's text; its model module is named after its folder (one module per test: a module
    imported in this process from another test's folder would be found under the same name)."""
    return PLAN.format(module=plan.parent.name, hidden=hidden, budget=budget)


@pytest.fixture
def plan(tmp_path):
    p = tmp_path / "p.plan"
    (tmp_path / f"{tmp_path.name}.py").write_text((ROOT / "tests/model/tinynet.py").read_text())
    p.write_text(text(p))
    return p


@pytest.fixture
def validations(monkeypatch):
    """How many times the plans were validated against their model (check --model, estimate)."""
    count = [0]
    validate = validation.validate_plan

    def counted(*a, **k):
        count[0] += 1
        return validate(*a, **k)

    monkeypatch.setattr(validation, "validate_plan", counted)
    return count


def cli(*args):
    out = CliRunner().invoke(app, list(map(str, args)))
    return out.exit_code, out.stdout


def entries() -> list[Path]:
    return sorted(disk_cache.cache_dir().rglob("*.pickle"))


def test_the_second_command_reads_the_cache(plan, validations):
    first = cli("check", "--model", plan)
    assert validations[0] == 1 and len(entries()) == 1
    assert cli("check", "--model", plan) == first and validations[0] == 1
    est = cli("estimate", plan, "--format", "json")
    assert est[0] == 0 and '"peak"' in est[1] and validations[0] == 2 and len(entries()) == 2
    assert cli("estimate", plan, "--format", "json") == est and validations[0] == 2
    table = cli("estimate", plan)  # the table was kept with the JSON
    assert table[0] == 0 and "peak" in table[1] and validations[0] == 2


def test_the_cache_keeps_warnings_and_errors(plan, validations):
    plan.write_text(text(plan, budget="1 KiB"))  # fits no device: PL560 from the estimate
    first = cli("check", "--model", plan)
    assert first[0] == 1 and "PL560" in first[1]
    assert cli("check", "--model", plan) == first and validations[0] == 1


def test_another_argument_source_or_plan_validates_again(plan, validations):
    cli("check", "--model", plan)
    plan.write_text(text(plan, hidden=64))  # another model argument
    cli("check", "--model", plan)
    assert validations[0] == 2
    model = plan.parent / f"{plan.parent.name}.py"
    model.write_text(model.read_text() + "\n# edited\n")  # the model's source changed
    cli("check", "--model", plan)
    assert validations[0] == 3
    cli("check", "--model", plan)
    assert validations[0] == 3 and len(entries()) == 2  # the stale entry was written again


def test_no_cache_neither_reads_nor_writes(plan, validations):
    cli("check", "--model", "--no-cache", plan)
    cli("estimate", "--no-cache", plan)
    assert entries() == [] and validations[0] == 2
    cli("check", "--model", plan)
    cli("check", "--model", "--no-cache", plan)
    assert validations[0] == 4


def test_a_corrupt_entry_is_ignored_and_written_again(plan, validations):
    first = cli("check", "--model", plan)
    (entry,) = entries()
    entry.write_bytes(b"not a pickle")
    assert cli("check", "--model", plan) == first and validations[0] == 2
    assert entry.read_bytes() != b"not a pickle"
    assert cli("check", "--model", plan) == first and validations[0] == 2


def test_model_free_errors_need_no_model(plan, validations):
    plan.write_text(text(plan, budget="900 GiB"))  # PL501: more than the device holds
    code, out = cli("check", "--model", plan)
    assert code == 1 and "PL501" in out and validations[0] == 0 and entries() == []


def test_where_the_cache_is(monkeypatch, tmp_path):
    monkeypatch.setenv("PLANLANG_CACHE_DIR", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert disk_cache.cache_dir() == tmp_path / "a"
    monkeypatch.delenv("PLANLANG_CACHE_DIR")
    assert disk_cache.cache_dir() == tmp_path / "xdg" / "planlang"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert disk_cache.cache_dir() == tmp_path / "home" / ".cache" / "planlang"


def test_the_suite_never_writes_the_home_cache():
    assert os.environ["PLANLANG_CACHE_DIR"] and not Path(os.environ["PLANLANG_CACHE_DIR"]).is_relative_to(
        Path.home() / ".cache")
