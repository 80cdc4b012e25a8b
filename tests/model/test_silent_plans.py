"""Plans `check --model` accepted and the runtime then ran as something else, or refused (issue 27, "No
silent wrong numbers"): overlapping shard patterns (PL310) and an activation spec whose implicit data
axes do not divide the batch (PL362)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from planlang.model.checks import check_with_model
from planlang.model.load import build_model
from planlang.plan.complete import complete
from planlang.runtime.apply import PlanError, lower_plan

REPO = Path(__file__).resolve().parents[2]
MLP_2D = (REPO / "examples" / "mlp" / "mlp_2d.plan").read_text()


def diags(path):
    return [(d.code, d.span.line, d.message) for d in check_with_model(str(path)).diagnostics]


def mlp_plan(tmp_path, *edits: tuple[str, str]) -> Path:
    text = MLP_2D
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    p = tmp_path / "mlp.plan"
    p.write_text(text)
    return p


# ------------------------------------------------------------------------------ overlapping patterns
def test_a_glob_overlapping_a_parameter_with_another_spec_is_pl310_in_check_model(tmp_path):
    """examples/mlp's parameters are fc1.weight, fc1.bias, fc2.weight, fc2.bias (`planlang inspect`):
    `fc*.weight` selects fc2.weight too, which the next statement shards the other way. The runtime
    took the later one and all_to_all'd fc2.weight every step; now neither may silently win."""
    p = mlp_plan(tmp_path, ("shard fc1.weight    : [tp, _]", "shard fc*.weight : [tp, _]"))
    out = subprocess.run([sys.executable, "-m", "planlang.cli", "check", "--model", str(p)], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr
    assert ("error[PL310]: `fc2.weight` is sharded twice: [tp, _] by `shard fc*.weight : [tp, _]` (line 23) and "
            "[_, tp] by `shard fc2.weight : [_, tp]`") in out.stdout, out.stdout
    assert f"{p}:29:1" in out.stdout  # at the later statement


# ------------------------------------------------------------------------------ implicit data axes
def test_an_activation_spec_whose_implicit_data_axes_do_not_divide_the_batch_is_pl362(tmp_path):
    """`[tp, _]` on an activation under `data x : [dp, _]` is `[(dp, tp), _]` (docs/language.md §14.1):
    a batch of 2 does not split 4 ways. check --model said nothing; every rank then raised "no strategy of
    `gelu` at act fits the layouts [dp, tp]"."""
    p = mlp_plan(tmp_path, ("batch = 64", "batch = 2"),
                 ("shard output of act : [dp, tp]", "shard output of act : [tp, _]"))
    got = [d for d in diags(p) if d[0] == "PL362"]
    assert len(got) == 1, got
    code, line, msg = got[0]
    assert line == 26  # `shard output of act : [tp, _]`
    assert "`output of act` [2, 4096]: dim 0 is 2, not divisible by dp(2) * tp(2) = 4" in msg
    assert "[tp, _] is laid out as [(dp, tp), _]" in msg
    # the runtime's own refusal names the statement, not the op after it
    plan = complete(check_with_model(str(p)).plan)
    with pytest.raises(PlanError, match=r"shard output of act : \[tp, _\]`: the output of `act` \[2, 4096\]"):
        lower_plan(build_model(plan.model, plan.path), plan)


def test_the_same_spec_with_a_batch_that_divides_checks_clean_and_lowers(tmp_path):
    p = mlp_plan(tmp_path, ("batch = 64", "batch = 4"),
                 ("shard output of act : [dp, tp]", "shard output of act : [tp, _]"))
    assert [d for d in diags(p) if d[0] in ("PL362", "PL369")] == []
    plan = complete(check_with_model(str(p)).plan)
    prog = lower_plan(build_model(plan.model, plan.path), plan)
    act = next(ins for ins in prog.instructions if getattr(ins, "node", None) and ins.node.module == "act")
    assert act.output.axes_of(0) == ("dp", "tp")


def test_batch_2_with_the_data_axes_left_implicit_and_tp_on_the_features_is_clean(tmp_path):
    p = mlp_plan(tmp_path, ("batch = 64", "batch = 2"), ("shard output of act : [dp, tp]", "shard output of act : [_, tp]"),
                 ("shard output of fc1 : [dp, tp]", "shard output of fc1 : [_, tp]"))
    assert [d for d in diags(p) if d[0] in ("PL362", "PL369")] == []
