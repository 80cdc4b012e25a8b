"""`write_report` end to end on small plans: the files it writes, the numbers behind the memory bars
and the step time against the estimator's, and clear errors for plans it cannot report on."""
from __future__ import annotations

import dataclasses
import json
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest

from planlang.report import ReportError, build_report_data, report_command, write_report

ROOT = Path(__file__).resolve().parents[2]
MLP_2D = ROOT / "examples" / "mlp" / "mlp_2d.plan"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

TINY = """\
use hardware

model gpt2 = "examples.gpt2.model:build"(layers = 2, hidden = 64, heads = 2, vocab = 128, seq = 32)
input idx : i64[batch = 16, seq = 32]

mesh cluster of 4 x hardware.a100_80g {
    pp = 2 over hardware.infiniband_200g
    dp = 2 over hardware.nvlink3
}
budget BUDGET per device
optimizer adamw

data idx : [dp, _]

pipeline over pp schedule gpipe microbatches 4 {
    stage wte, wpe, drop, h[0:1]
    stage h[1:2], ln_f, lm_head
}
"""


def _plan(folder: Path, name: str, text: str) -> str:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    d = tmp_path_factory.mktemp("plans")
    return {
        "tiny": _plan(d, "tiny_pipe.plan", TINY.replace("BUDGET", "1 GiB")),
        "over": _plan(d, "tiny_over.plan", TINY.replace("BUDGET", "1 MiB")),
        "syntax": _plan(d, "broken.plan", "mesh m of 4 x {\n"),
        "noimport": _plan(d, "noimport.plan", TINY.replace("BUDGET", "1 GiB").replace(
            "examples.gpt2.model:build", "no_such_package.model:build")),
        "nospeed": _plan(d, "nospeed.plan", TINY.replace("BUDGET", "1 GiB").replace(
            "mesh cluster of 4 x hardware.a100_80g", "device toy {\n    memory = 8 GiB\n}\nmesh cluster of 4 x toy").replace(
            "schedule gpipe microbatches 4", "schedule 1f1b microbatches 8")),
        "holes": _plan(d, "holes.plan", TINY.replace("BUDGET", "1 GiB").replace("microbatches 4", "microbatches ?")),
    }


@pytest.fixture(scope="module")
def tiny_report(plans, tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny_report")
    return out, write_report(plans["tiny"], str(out))


@pytest.fixture(scope="module")
def tiny_data(plans):
    return build_report_data(plans["tiny"])


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.refs: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            self.refs.append(a["src"])
        if tag == "a" and a.get("href"):
            self.refs.append(a["href"])

    def handle_data(self, data):
        self.text.append(data)


def _check_files(out: Path, files: list[Path], stems: list[str]) -> _Links:
    names = sorted(f.name for f in files)
    assert names == sorted([f"{s}.{x}" for s in stems for x in ("png", "svg")] + ["report.json", "index.html"])
    for f in files:
        assert f.parent == out and f.stat().st_size > 0
    for s in stems:
        assert (out / f"{s}.png").read_bytes()[:8] == PNG_MAGIC
        root = ET.parse(out / f"{s}.svg").getroot()
        assert root.tag.endswith("svg")
    page = _Links()
    page.feed((out / "index.html").read_text(encoding="utf-8"))
    for s in stems:
        assert f"{s}.png" in page.refs and f"{s}.svg" in page.refs
    for ref in page.refs:  # self-contained: every reference is one of the files written
        assert (out / ref).is_file(), ref
    return page


def test_report_of_a_pipeline_plan_writes_both_charts_and_the_page(tiny_report):
    out, files = tiny_report
    page = _check_files(out, files, ["memory", "schedule"])
    text = " ".join(page.text)
    for word in ("world size", "budget", "stage 0", "stage 1", "gpipe", "bubble"):
        assert word in text
    data = json.loads((out / "report.json").read_text())
    sched = data["schedule"]
    assert sched["kind"] == "gpipe" and sched["ranks"] == 2 and sched["microbatches"] == 4
    assert len(sched["boxes"]) == 2 * 2 * 4  # a forward and a backward per stage and microbatch


def test_report_without_pipeline_draws_no_schedule_and_says_so(tmp_path):
    files = write_report(str(MLP_2D), str(tmp_path / "mlp"), formats="png,svg")
    page = _check_files(tmp_path / "mlp", files, ["memory"])
    assert not list((tmp_path / "mlp").glob("schedule.*"))
    assert "no pipeline" in " ".join(page.text)
    data = json.loads((tmp_path / "mlp" / "report.json").read_text())
    assert data["schedule"] is None
    # mlp_2d has no pipeline: its peak is measured from rank 0's lowered program run on meta
    # (planlang.runtime.program_memory), in the phase where it happened; the bar is the classes the
    # estimate keeps (parameters, optimizer state, buffers) and what the step added
    (dev,) = data["devices"]
    assert dev["peak_phase"] in ("backward", "optimizer step")
    assert dev["bar"]["activations"] == dev["activations"] > 0
    assert dev["bar"]["parameters"] == dev["parameters"] and dev["bar"]["optimizer state"] == dev["optimizer"]
    assert sum(dev["bar"].values()) == dev["peak"]


def test_memory_bars_equal_the_estimators_numbers(tiny_data, tiny_report):
    from planlang.model.price.estimate import estimate_plan
    from planlang.runtime.program_memory import measure

    data = tiny_data
    rows = estimate_plan(data.plan, program=measure)  # a separate run of the estimator, as the report runs it
    assert [r.as_dict() for r in data.estimates] == [r.as_dict() for r in rows]
    written = json.loads((tiny_report[0] / "report.json").read_text())["devices"]
    assert len(data.bars) == len(rows) == len(written) == 2
    for bar, row, dev in zip(data.bars, rows, written):
        assert bar.device == row.device
        assert bar.height == row.peak == sum(dev["bar"].values())
        assert dict(bar.segments) == dev["bar"]
        assert bar.segment("parameters") == row.parameters
        assert bar.segment("optimizer state") == row.optimizer
        assert bar.segment("buffers") == row.buffers - row.grad_buckets
        assert bar.segment("gradient buckets") == row.grad_buckets
        if bar.phase == "backward":
            assert bar.segment("activations") == row.activations
            assert 0 <= bar.segment("backward transient") <= row.transient
        else:
            assert bar.segment("gradients") == row.gradients
            assert 0 <= bar.segment("optimizer-step temporaries") <= row.transient


def test_schedule_is_the_one_the_estimates_step_time_was_read_from(tiny_data, tiny_report):
    data = tiny_data
    sched = data.schedule
    assert sched is not None and all(r.schedule == sched for r in data.estimates)  # nothing simulated again
    for i, row in enumerate(data.estimates):
        assert (sched.forward[i] + sched.backward[i]) * 4 == pytest.approx(row.stage_times[0])  # 4 microbatches
        # a rank's step: the schedule's span plus the sums after its last backward; its bubble is idle time
        assert row.step.total == pytest.approx(sched.simulated.makespan + row.step.exposed)
        assert row.step.bubble == pytest.approx(sched.simulated.makespan - row.stage_times[0])
    written = json.loads((tiny_report[0] / "report.json").read_text())
    assert written["schedule"]["makespan"] == sched.simulated.makespan
    assert written["schedule"]["forward"] == list(sched.forward)
    assert [d["step_time"] for d in written["devices"]] == [r.step_time for r in data.estimates]
    page = (tiny_report[0] / "index.html").read_text()
    assert "no bubble" not in page and "Simulated step" not in page
    for row in data.estimates:  # one step time per row, its bubble beside it
        assert f"{row.step_time * 1e3:.3g} ms" in page and f"{row.step.bubble * 1e3:.3g} ms" in page


def test_a_dualpipev_report_places_its_stages_in_a_v(tmp_path):
    """dualpipev over pp(2): 4 model stages, rank r holding stages r and 3 - r; the page's stage table, the
    bars and the chart say so, and report.json's boxes carry its whole backwards ("BW")."""
    text = TINY.replace("BUDGET", "1 GiB").replace("schedule gpipe microbatches 4", "schedule dualpipev chunks 2 "
                                                   "microbatches 4").replace(
        "    stage wte, wpe, drop, h[0:1]\n    stage h[1:2], ln_f, lm_head\n",
        "    stage wte, wpe, drop\n    stage h[0:1]\n    stage h[1:2]\n    stage ln_f, lm_head\n")
    out = tmp_path / "out"
    write_report(_plan(tmp_path, "v.plan", text), str(out), "svg")
    page = (out / "index.html").read_text(encoding="utf-8")
    ranks = re.findall(r"<tr><td>(\d)</td><td class=num>(\d)</td>", page)
    assert ranks == [("0", "0"), ("1", "1"), ("2", "1"), ("3", "0")]
    sched = json.loads((out / "report.json").read_text())["schedule"]
    assert sched["kind"] == "dualpipev" and {b[0] for b in sched["boxes"]} == {"F", "B", "W", "BW"}
    assert {(b[1], b[2]) for b in sched["boxes"]} == {(0, 0), (1, 1), (2, 1), (3, 0)}  # (stage, rank)
    chart = (out / "schedule.svg").read_text(encoding="utf-8")
    assert "(stages 0, 3)" in chart and "(stages 1, 2)" in chart and "whole backward (B+W)" in chart


@pytest.mark.parametrize("which", ["pipeline", "no pipeline"])
def test_the_reports_step_time_is_the_estimates(which, plans):
    """The step time the report shows is `planlang estimate`'s for the same plan, row by row."""
    from planlang.model.price.estimate import estimate_plan
    from planlang.runtime.program_memory import measure

    data = build_report_data(plans["tiny"] if which == "pipeline" else str(MLP_2D))
    rows = estimate_plan(data.plan, program=measure)  # as `planlang estimate` runs it
    assert [r.step_time for r in data.estimates] == [r.step_time for r in rows]
    assert [r.step for r in data.estimates] == [r.step for r in rows]
    assert all(r.step_time > 0 for r in rows)
    if which == "pipeline":
        assert data.schedule == rows[0].schedule and data.schedule is not None
        assert all(r.step.bubble > 0 for r in rows)
    else:
        assert data.schedule is None and [r.step.bubble for r in rows] == [0.0]


def test_a_device_without_throughput_has_no_step_time_and_no_schedule(plans, tmp_path):
    files = write_report(plans["nospeed"], str(tmp_path), formats=["png"])
    assert sorted(f.name for f in files) == ["index.html", "memory.png", "report.json"]
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["schedule"] is None and "no compute throughput" in data["schedule_note"]
    assert "no compute throughput" in (tmp_path / "index.html").read_text()


def test_an_over_budget_plan_is_reported_with_the_overflow(plans, tmp_path):
    files = write_report(plans["over"], str(tmp_path), formats=["svg"])
    assert sorted(f.name for f in files) == ["index.html", "memory.svg", "report.json", "schedule.svg"]
    html = (tmp_path / "index.html").read_text()
    assert "over by" in html and "PL560" in html
    data = json.loads((tmp_path / "report.json").read_text())
    assert all(d["peak"] > data["budget"] for d in data["devices"])


@pytest.mark.parametrize("which,expected", [
    ("syntax", "has errors; fix them first"),
    ("noimport", "cannot be loaded"),
    ("holes", "holes (`?`); solve it first"),
])
def test_plans_that_cannot_be_reported_give_a_clear_error(plans, which, expected, tmp_path, capsys):
    with pytest.raises(ReportError, match=expected.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        write_report(plans[which], str(tmp_path))
    assert report_command(plans[which], str(tmp_path)) == 2
    err = capsys.readouterr().err
    assert "planlang: error: " in err and "Traceback" not in err
    if which == "noimport":
        assert "PL260" in err and "no_such_package" in err
    if which == "syntax":
        assert "PL1" in err
    assert not list(tmp_path.iterdir())  # nothing written


def test_unknown_format_and_missing_file(plans, tmp_path, capsys):
    with pytest.raises(ReportError, match="unknown image format gif"):
        write_report(plans["tiny"], str(tmp_path), formats=("png", "gif"))
    assert report_command(str(tmp_path / "nope.plan"), str(tmp_path)) == 2
    assert "no such file" in capsys.readouterr().err


def test_report_command_prints_each_devices_peak_and_warns_over_budget(plans, tmp_path, capsys):
    """A plan whose stages are estimated at 1.9 and 2.2 times the budget: the report is written (exit
    0, as for any report), with one line per stage on stdout and a warning per stage on stderr."""
    assert report_command(plans["over"], str(tmp_path), "svg") == 0
    out, err = capsys.readouterr()
    data = json.loads((tmp_path / "report.json").read_text())
    lines = [line for line in out.splitlines() if not line.startswith("wrote ")]
    assert len(lines) == 2 and len(out.splitlines()) == 2 + 4  # memory.svg, schedule.svg, report.json, index.html
    warnings = err.splitlines()
    assert len(warnings) == 2
    for i, (line, warning, dev) in enumerate(zip(lines, warnings, data["devices"])):
        over = (dev["peak"] - data["budget"]) / data["budget"]
        assert line.startswith(f"stage {i}: estimated peak ") and "budget 1 MiB: over by " in line
        assert f"(+{over:.0%})" in line
        assert warning.startswith(f"planlang: warning: stage {i} is over its budget: estimated peak ")
        assert f"(+{over:.0%})" in warning and str(tmp_path / "index.html") in warning


def test_memory_summary_of_a_plan_that_fits(tiny_data):
    from planlang.report import memory_summary

    lines, warnings = memory_summary(tiny_data)
    assert warnings == []
    assert lines == [f"stage {i}: estimated peak {b.peak / 2**20:.2f} MiB (in the backward), budget 1 GiB: "
                     "fits (under 1% of it)" for i, b in enumerate(tiny_data.bars)]


@pytest.mark.parametrize("plan", ["gpt2_dp2_zero3_blocks", "gpt2_dp2_zero2_blocks"])
def test_a_zero_per_block_plan_is_reported_with_bars_that_add_up(plan):
    # ZeRO-2/3 per block: the estimate's peak comes from the simulated parts of the step plus what FSDP2
    # holds there; its classes must still add up to the peak the bar shows (memory_bar raises otherwise)
    from planlang.report.build import build_report_data

    data = build_report_data(f"tests/runtime/plans/{plan}.plan")
    assert [bar.height for bar in data.bars] == [row.peak for row in data.estimates]


def test_gradient_buckets_are_drawn_and_named_as_such():
    # a bucketed pipeline keeps its gradients in persistent buckets, counted in the estimate's buffers: the
    # bar draws them as a segment of their own, the page's table as gradients, PL560's note by name
    from planlang.model.checks import memory_budget
    from planlang.report.build import build_report_data
    from types import SimpleNamespace

    from planlang.plan.units import format_bytes

    data = build_report_data("tests/runtime/plans/gpt2_3d_cpu.plan")
    assert all(r.grad_buckets > 0 and r.gradients == 0 for r in data.estimates)
    for bar, row in zip(data.bars, data.estimates):
        assert bar.segment("gradient buckets") == row.grad_buckets
        assert bar.segment("buffers") == row.buffers - row.grad_buckets
    tiny = dataclasses.replace(data.plan, budget=dataclasses.replace(data.plan.budget, bytes=1)) \
        if data.plan.budget is not None else None
    ctx = SimpleNamespace(plan=tiny or data.plan, facts={"estimate": data.estimates})
    if tiny is None:  # no budget in the plan: the device's memory is the limit; give a tiny device
        mesh = data.plan.mesh
        ctx.plan = dataclasses.replace(data.plan, mesh=dataclasses.replace(
            mesh, device=dataclasses.replace(mesh.device, memory=1)))
    (d, *_) = list(memory_budget(ctx))
    row = data.estimates[0]
    assert d.code == "PL560"
    assert f"gradient buckets {format_bytes(row.grad_buckets)}" in d.notes[0]
    assert f"buffers {format_bytes(row.buffers - row.grad_buckets)}" in d.notes[0]
