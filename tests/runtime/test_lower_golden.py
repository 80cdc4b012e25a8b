"""`planlang lower`'s generated per-rank code, golden-tested (regenerate with PLANLANG_UPDATE_GOLDEN=1)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from planlang.plan.checker import check_file
from planlang.runtime.apply import load_plan
from planlang.runtime.launch import coords_of, lower_source

HERE = Path(__file__).parent
# the last: pipeline x tensor parallelism, the functions of the stages rank 3 holds (1 and 3) and the loss tail
CASES = [("mlp_dp2_tp2", 1), ("mlp_tp4", 3), ("gpt2_dp2_tp2_ckpt", 2), ("gpt2_pp2_tp2_interleaved", 3)]


@pytest.mark.parametrize("name,rank", CASES)
def test_lowered_code_matches_golden(name, rank, monkeypatch):
    monkeypatch.chdir(HERE.parent.parent)
    plan = load_plan(f"tests/runtime/plans/{name}.plan")
    code = lower_source(plan, rank)
    compile(code, name, "exec")  # the generated program is valid Python
    golden = HERE / "golden" / f"{name}_rank{rank}.py.txt"
    if os.environ.get("PLANLANG_UPDATE_GOLDEN"):
        golden.write_text(code)
    assert code == golden.read_text()


def test_coords_are_row_major():
    plan = check_file(str(HERE / "plans" / "mlp_dp2_tp2.plan")).plan
    assert [coords_of(r, plan.mesh) for r in range(4)] == [
        {"dp": 0, "tp": 0}, {"dp": 0, "tp": 1}, {"dp": 1, "tp": 0}, {"dp": 1, "tp": 1}]
