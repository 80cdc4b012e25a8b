"""`planlang diff A B`: the pure comparison of two plans' numbers (planlang.report.diff.compare), its
table and JSON, and the command on two example plans (data parallelism against ZeRO-1 of the same MLP)."""
from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from planlang.report.diff import MEMORY, PEAK_DEVICE, Collectives, PlanSide, compare, diff_json, render_diff

REPO = Path(__file__).resolve().parents[2]
DP = "examples/mlp/mlp_dp.plan"


def side(path: str, text: str = "mesh m\n", *, devices=("all devices",), scale: float = 1.0,
         collectives=None, note: str = "") -> PlanSide:
    memory = {d: {k: int((i + 1) * 1024 * scale) + 1024 * n for i, k in enumerate(MEMORY)}
              for n, d in enumerate(devices)}
    return PlanSide(path, text, memory, {d: 0.01 * scale for d in devices}, collectives, note)


def test_rows_carry_both_values_their_difference_and_ratio():
    d = compare(side("a.plan"), side("b.plan", scale=0.5))
    opt = d.row("memory", "optimizer", "all devices")
    assert (opt.a, opt.b) == (3 * 1024, 1536)
    assert opt.delta == -1536 and opt.ratio == 0.5
    assert [r.what for r in d.rows if r.section == "memory"] == list(MEMORY)
    assert d.row("time", "step").ratio == 0.5
    assert d.pairing == {"all devices": ("all devices", "all devices")}


def test_devices_pair_by_name_else_the_peak_device_of_each():
    same = compare(side("a", devices=("stage 0", "stage 1")), side("b", devices=("stage 0", "stage 1")))
    assert set(same.pairing) == {"stage 0", "stage 1"}
    other = compare(side("a"), side("b", devices=("stage 0", "stage 1")))
    assert other.pairing == {PEAK_DEVICE: ("all devices", "stage 1")}  # stage 1 has the larger peak
    assert any("different device classes" in n for n in other.notes)


def test_collectives_by_kind_and_axes_a_kind_only_one_plan_issues():
    a = side("a", collectives={("all_reduce", "dp"): Collectives(2, 1000.0, 0.001)})
    b = side("b", collectives={("all_reduce", "dp"): Collectives(2, 500.0, 0.0005),
                               ("all_gather", "tp"): Collectives(4, 64.0, 0.0001)})
    d = compare(a, b)
    assert d.row("collectives", "all_reduce[dp] bytes").ratio == 0.5
    gather = d.row("collectives", "all_gather[tp] calls")
    assert gather.a is None and gather.b == 4 and gather.ratio is None  # new in B
    assert d.row("collectives", "total calls").delta == 4


def test_a_plan_whose_traffic_is_not_modelled_says_why():
    d = compare(side("a", collectives={}), side("b", note="the plan has a pipeline"))
    assert not [r for r in d.rows if r.section == "collectives"]
    assert d.notes == ("collectives not compared: plan B (b): the plan has a pipeline",)


def test_text_diff_is_unified_over_the_formatted_texts():
    d = compare(side("a.plan", "mesh m\nbudget 1 GiB per device\n"), side("b.plan", "mesh m\nbudget 2 GiB per device\n"))
    assert d.text_diff.splitlines()[:2] == ["--- a.plan", "+++ b.plan"]
    assert "-budget 1 GiB per device" in d.text_diff and "+budget 2 GiB per device" in d.text_diff
    assert compare(side("a"), side("b")).text_diff == ""


def test_json_and_table():
    coll = {("all_reduce", "dp,tp"): Collectives(1, 8.0, 1e-6)}
    d = compare(side("a [x].plan", collectives=coll), side("b.plan", scale=2, collectives=coll))
    data = json.loads(json.dumps(diff_json(d)))
    assert data["a"] == "a [x].plan" and data["rows"][0]["ratio"] == 2.0
    out = io.StringIO()
    render_diff(d, Console(file=out, width=200, no_color=True))
    text = out.getvalue()
    # paths and kind[axes] are printed as they are, not read as rich markup
    assert "A a [x].plan" in text and "all_reduce[dp,tp] bytes" in text
    assert "2.000x" in text and "+1 KiB" in text


# ------------------------------------------------------------------------------ the command
def planlang(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "planlang.cli", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=300)


def test_diff_of_data_parallel_and_zero1(tmp_path):
    zero = tmp_path / "mlp_zero1.plan"
    text = (REPO / DP).read_text()
    old = "optimizer adamw(lr = 0.001, weight_decay = 0.01)\n"
    assert old in text
    zero.write_text(text.replace(old, "optimizer adamw(lr = 0.001, weight_decay = 0.01) { zero = 1 over rank }\n"))
    out = planlang("diff", DP, str(zero), "--format", "json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    rows = {(r["section"], r["what"]): r for r in d["rows"]}
    # ZeRO-1 shards the optimizer state over the 4 ranks; parameters and gradients stay whole
    assert rows["memory", "optimizer"]["b"] < rows["memory", "optimizer"]["a"]
    assert rows["memory", "parameters"]["delta"] == 0 and rows["memory", "gradients"]["delta"] == 0
    assert rows["memory", "peak"]["b"] < rows["memory", "peak"]["a"]
    assert rows["collectives", "all_reduce[rank] calls"]["a"] >= 1
    assert "+    zero = 1 over rank" in d["text_diff"]

    table = planlang("diff", DP, str(zero))
    assert table.returncode == 0, table.stderr
    assert "optimizer" in table.stdout and "0.500x" in table.stdout and "all_reduce[rank] bytes" in table.stdout
    assert max(len(line) for line in table.stdout.splitlines()) <= 200


def test_invalid_plans_give_coded_diagnostics_for_both_and_no_traceback(tmp_path):
    bad = tmp_path / "bad.plan"
    bad.write_text((REPO / DP).read_text().replace("data x : [rank, _]", "data x : [nope, _]"))
    out = planlang("diff", str(bad), str(tmp_path / "missing.plan"))
    assert out.returncode == 2 and out.stdout == ""
    assert "error[PL2" in out.stderr and "no such file" in out.stderr  # both plans reported
    assert "Traceback" not in out.stderr
