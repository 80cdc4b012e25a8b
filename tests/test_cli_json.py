"""`--format json` of `solve`, `verify` and `lower` (planlang.cli.model): stdout is one JSON object and nothing
else, with its schema version and what the command's help documents. In process (typer's runner: torch is
loaded once for all three; verify's workers are torchrun's processes), on the small plans the other tests
use (solve: tests/solve/test_solve_output.py's partial MLP; lower: the MLP under dp x tp of tests/runtime;
verify: one step of a 2-process data-parallel MLP over gloo)."""
from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from planlang.cli import app
from planlang.cli.model import SCHEMA_VERSION, _step_checks
from planlang.plan.checker import check_text
from tests.solve.test_solve_output import PARTIAL

REPO = Path(__file__).resolve().parents[1]
MLP_DP2 = """\
use hardware
model mlp = "examples.mlp.model:build"(in_features = 16, hidden = 32, out_features = 8)
input x : f32[batch = 8, features = 16]
mesh ranks of 2 x hardware.cpu {
    dp = 2 over hardware.loopback
}
budget 1 GiB per device
optimizer adamw(lr = 0.001)
data x : [dp, _]
"""


def planlang(*args: str, monkeypatch):
    monkeypatch.chdir(REPO)
    out = CliRunner().invoke(app, list(args), env={"PLANLANG_BACKEND": "gloo"}, catch_exceptions=False)
    return out, json.loads(out.stdout)  # the whole of stdout is the object


def test_solve_json_holds_the_plan_its_figures_and_diagnostics(tmp_path, monkeypatch):
    path = tmp_path / "mlp_partial.plan"
    path.write_text(PARTIAL)
    out, got = planlang("solve", str(path), "--format", "json", monkeypatch=monkeypatch)
    assert out.exit_code == 0, out.stderr
    assert (got["schema_version"], got["command"], got["status"], got["objective"]) == (SCHEMA_VERSION, "solve",
                                                                                        "solved", "time")
    res = check_text(got["plan"], str(path))  # the complete plan, as the text format writes it
    assert not res.errors and res.plan is not None and not res.plan.holes()
    best = got["best"]
    assert best["fits"] and best["peak_bytes"] == max(d["peak"] for d in best["devices"])
    assert best["step_time_s"] == max(d["step_time"] for d in best["devices"])
    assert {"axis dp", "axis tp", "zero"} <= set(best["choices"])
    mesh = res.plan.mesh
    assert mesh is not None and {a.name: str(a.size) for a in mesh.axes} == {
        "dp": best["choices"]["axis dp"], "tp": best["choices"]["axis tp"]}
    assert got["summary"] and all(f"# {line}" in got["plan"] for line in got["summary"])
    assert got["candidates"]["priced"] >= 1 and got["elapsed_s"] > 0
    assert isinstance(got["diagnostics"], list) and all({"code", "severity", "message"} <= set(d)
                                                        for d in got["diagnostics"])


def test_lower_json_holds_the_program_of_the_rank(monkeypatch):
    out, got = planlang("lower", "tests/runtime/plans/mlp_dp2_tp2.plan", "--rank", "3", "--format", "json",
                        monkeypatch=monkeypatch)
    assert out.exit_code == 0, out.stderr
    assert (got["schema_version"], got["command"], got["kind"], got["rank"]) == (SCHEMA_VERSION, "lower", "program", 3)
    assert got["world_size"] == 4 and got["mesh"] == {"dp": 2, "tp": 2} and got["coords"] == {"dp": 1, "tp": 1}
    assert not got["pipeline"]
    assert got["text"].startswith("# planlang lower: tests/runtime/plans/mlp_dp2_tp2.plan — rank 3 (dp=1, tp=1)")
    assert "def step(" in got["text"] and got["lines"] == got["text"].count("\n")


def test_verify_json_holds_each_steps_checks_and_the_verdict(tmp_path, monkeypatch, capfd):
    path = tmp_path / "mlp_dp2.plan"
    path.write_text(MLP_DP2)
    out, got = planlang("verify", str(path), "--steps", "1", "--quiet", "--format", "json", monkeypatch=monkeypatch)
    workers = capfd.readouterr()  # what torchrun's processes wrote to the file descriptors
    assert out.exit_code == 0, out.stderr + workers.err[-3000:]
    assert (got["schema_version"], got["command"], got["verdict"], got["exit_code"]) == (SCHEMA_VERSION, "verify",
                                                                                         "PASS", 0)
    assert got["world_size"] == 2 and got["steps"] == 1 and len(got["checks"]) == 1
    assert got["dropout_off"] == 0  # an MLP without dropout: nothing turned off
    step = got["checks"][0]
    assert step["step"] == 0 and step["loss"]["plan"] > 0
    for kind in ("loss", "gradient", "parameter"):
        assert step[kind]["ok"] and step[kind]["error"] <= step[kind]["bound"]
    assert "PASS" in workers.err and "PASS" not in workers.out  # the workers' table, moved off stdout


def test_a_step_whose_error_is_above_its_bound_is_not_ok():
    row = {"step": 2, "loss_plan": 1.0, "loss_reference": 1.0, "loss_rel_err": 0.0, "loss_bound": 1e-5,
           "grad_rel_err": 3e-4, "grad_bound": 1e-5, "worst_grad": "fc1.weight", "param_rel_err": 1e-6,
           "param_bound": 1e-5, "worst_param": "fc2.bias"}
    got = _step_checks(row)
    assert got["loss"]["ok"] and got["parameter"]["ok"] and not got["gradient"]["ok"]
    assert got["gradient"] == {"error": 3e-4, "bound": 1e-5, "ok": False, "worst": "fc1.weight"}
