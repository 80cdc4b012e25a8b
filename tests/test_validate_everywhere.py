"""Every command that prices or runs a plan validates it against its model with the checks of
`planlang check --model`: a misspelt parameter is the same PL360 everywhere, and nothing is launched,
solved or lowered for it."""
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
COMMANDS = [("check", "--model"), ("lower",), ("verify",), ("run", "--", "train.py"), ("solve",), ("estimate",)]


@pytest.fixture(scope="module")
def typo_plan(tmp_path_factory):
    text = (REPO / "examples" / "mlp" / "mlp_2d.plan").read_text()
    assert "shard fc1.weight    : [tp, _]" in text
    path = tmp_path_factory.mktemp("typo") / "typo.plan"
    path.write_text(text.replace("shard fc1.weight    : [tp, _]", "shard fc9.weight    : [tp, _]"))
    return path


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_a_misspelt_parameter_is_pl360_in_every_command(command, typo_plan):
    name, *rest = command
    out = subprocess.run([sys.executable, "-m", "planlang.cli", name, str(typo_plan), *rest], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert "error[PL360]: `fc9.weight` matches no parameter of the model" in out.stdout + out.stderr
    assert out.returncode == (1 if name == "check" else 2)
    assert "Traceback" not in out.stderr and "torchrun" not in out.stderr
