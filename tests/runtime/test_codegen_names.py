"""The generated per-rank program is valid Python, and means the plan, whatever the plan's names: an
input named like a keyword (`lambda`), a builtin (`input`), the step's own parameters (`p`, `rt`), a
name Python cannot bind (`__debug__`) or a function the program defines (`checkpoint_0`) gets a `_`."""
from __future__ import annotations

from pathlib import Path

import pytest

from planlang.plan.checker import check_text
from planlang.plan.complete import complete
from planlang.runtime.codegen import ident
from planlang.runtime.launch import lower_source

REPO = Path(__file__).resolve().parents[2]
PLAN = """\
use hardware
model mlp = "examples.mlp.model:build"(in_features = 16, hidden = 32, out_features = 8)
input {name} : f32[batch = 8, features = 16]
mesh ranks of 2 x hardware.cpu {{ dp = 2 over hardware.loopback }}
budget 1 GiB per device
optimizer adamw(lr = 0.001)
data {name} : [dp, _]
checkpoint fc1, act
"""


class _Recorder:
    """A stand-in for the runtime: each op's result is (op name, its arguments)."""

    def run(self, name, *args):
        return (name, args)

    def checkpoint(self, fn, *args):
        return fn(*args)

    def convert(self, name, x):
        return x


def _ops_of(loss) -> dict:
    """Each op the recorded loss was computed through: op name -> its arguments."""
    ops: dict = {}

    def walk(v):
        if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str):
            ops[v[0]] = v[1]
            for a in v[1]:
                walk(a)

    walk(loss)
    return ops


def _program(name: str, monkeypatch) -> str:
    monkeypatch.chdir(REPO)
    res = check_text(PLAN.format(name=name), str(REPO / "names.plan"))
    assert not [d for d in res.diagnostics if d.severity.value == "error"], res.diagnostics
    return lower_source(complete(res.plan), 0)


@pytest.mark.parametrize("name,shown", [
    ("lambda", "lambda_"), ("p", "p_"), ("rt", "rt_"), ("__debug__", "__debug___"), ("input", "input_"),
    ("checkpoint_0", "checkpoint_0_"),
])
def test_the_program_compiles_and_reads_the_input_it_was_given(name, shown, monkeypatch):
    code = _program(name, monkeypatch)
    compile(code, f"<{name}>", "exec")  # a SyntaxError for `p`, `rt` and `__debug__` once
    assert f"def step(rt, p, {shown}, target):" in code
    scope: dict = {}
    exec(code, scope)  # noqa: S102 - the program under test
    params = {ref: ref for ref in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")}
    loss = scope["step"](_Recorder(), params, "THE INPUT", "THE TARGET")
    # the loss is mean((fc2(act(fc1(x))) - target)^2): follow it back to fc1's first argument
    ops = _ops_of(loss)
    assert ops["model_fc1"][0] == "THE INPUT"  # not the function `checkpoint_0`, not the parameters
    assert "THE TARGET" in ops["mse_loss_diff"]


def test_names_that_need_no_escape_are_kept():
    assert [ident(n) for n in ("x", "model_fc1", "fc1_weight", "idx", "target", "h_0_attn")] == \
        ["x", "model_fc1", "fc1_weight", "idx", "target", "h_0_attn"]


def test_the_escape_is_one_to_one():
    names = ["lambda", "lambda_", "lambda__", "p", "p_", "__debug__", "__debug___", "sum", "sum_", "block_h",
             "block_h_", "stage_1", "stage_1_", "match", "x_"]
    assert len({ident(n) for n in names}) == len(names)
    assert all(ident(n).isidentifier() for n in names)


def test_an_input_named_target_stays_apart_from_the_loss_target(monkeypatch):
    """The loss' target is named `target`: a plan input of that name once became the same value, and fc1
    read the loss target (no error). The target is named `target_` then (graph_values.step_input_names)."""
    code = _program("target", monkeypatch)
    assert "def step(rt, p, target, target_):" in code
    scope: dict = {}
    exec(code, scope)  # noqa: S102 - the program under test
    params = {ref: ref for ref in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")}
    loss = scope["step"](_Recorder(), params, "THE INPUT", "THE TARGET")
    ops = _ops_of(loss)
    assert ops["model_fc1"][0] == "THE INPUT" and "THE TARGET" in ops["mse_loss_diff"]
