"""`planlang report PLAN -o DIR`: charts and a page about one plan.

    write_report("examples/gpt2/gpt2_3d.plan", "out/")  ->  [out/memory.png, out/memory.svg,
        out/schedule.png, out/schedule.svg, out/report.json, out/index.html]

- memory.{png,svg}: each device class's estimated peak, stacked by memory class, with the budget line;
- schedule.{png,svg}: the pipeline schedule (GPipe, 1F1B or interleaved) the estimate's step time was read
  from (planlang.model.price.step_time), with its bubble; not drawn for a plan without a pipeline or
  without the device's throughput (the page says why);
- report.json: the numbers behind both charts; index.html: the plan's summary, the charts and the tables.

`report_command` (the CLI) also prints one line per device class (estimated peak against the budget, or
the device's memory) and, on stderr, a warning for each over it. The exit code stays 0: the report was
written, and showing where too much memory goes is its point; `planlang check --model` is the gate that
fails (PL560).

Layers: this sits on top of planlang.model (like the CLI); matplotlib is imported only to draw.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Iterable

from .build import ReportData, ReportError, build_report_data
from .charts import draw_memory, draw_schedule
from .page import memory_limit, render_page
from planlang.plan.units import format_bytes as fb

__all__ = ["FORMATS", "ReportData", "ReportError", "build_report_data", "memory_summary", "report_command",
           "write_report"]

FORMATS = ("png", "svg", "pdf")


def _formats(formats: Iterable[str] | str) -> tuple[str, ...]:
    if isinstance(formats, str):
        formats = [f for f in formats.replace(" ", "").split(",") if f]
    out = tuple(dict.fromkeys(f.lower().lstrip(".") for f in formats))
    bad = [f for f in out if f not in FORMATS]
    if bad or not out:
        raise ReportError(f"unknown image format {', '.join(bad) or '(none given)'}; "
                          f"use one or more of {', '.join(FORMATS)}, e.g. --format png,svg")
    return out


def report_json(data: ReportData) -> dict:
    """The numbers behind the charts (bytes and seconds). Each device's `step_time` and `step` are the
    estimate's; the schedule's `makespan` is the span of its forwards and backwards (a rank's step adds
    the gradient sums after it), `forward` and `backward` each stage's time for one microbatch, and each
    of its `boxes` [kind, stage, rank, microbatch, start, end], kind "F", "B", (a split backward's weight
    gradient: zero_bubble, zbv, dualpipev) "W" or (dualpipev's whole backward) "BW"."""
    sched = data.schedule
    sim = sched.simulated if sched is not None else None
    return {
        "plan": data.plan.path,
        "budget": data.plan.budget.bytes if data.plan.budget else None,
        "devices": [r.as_dict() | {"bar": dict(b.segments), "peak_phase": b.phase}
                    for r, b in zip(data.estimates, data.bars)],
        "schedule": None if sched is None or sim is None else {
            "kind": sim.kind, "ranks": sim.ranks, "chunks": sim.chunks, "microbatches": sim.microbatches,
            "makespan": sim.makespan, "bubble_ratio": sim.bubble_ratio,
            "forward": list(sched.forward), "backward": list(sched.backward),
            "boxes": [[b.kind, b.stage, b.rank, b.microbatch, b.start, b.end] for b in sim.boxes]},
        "schedule_note": data.schedule_note,
    }


def write_report(plan_path: str, out_dir: str, formats=("png", "svg")) -> list[Path]:
    """Check and estimate `plan_path`, draw its charts in each of `formats` and write index.html into
    `out_dir` (created if needed). Returns the files written. Raises ReportError for a plan that fails to
    check, has holes or whose model fails to load."""
    fmts = _formats(formats)
    return _write_into(build_report_data(plan_path), out_dir, fmts)


def _write_into(data: ReportData, out_dir: str, fmts: tuple[str, ...]) -> list[Path]:
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ReportError(f"cannot create {out}: {err}") from err
    try:
        return _write(data, out, fmts)
    except OSError as err:
        raise ReportError(f"cannot write the report into {out}: {err}") from err


def _bar_labels(data: ReportData) -> list[str]:
    """x labels of the memory bars: the estimator's device class (a pipeline rank, with the stages it
    holds, under a chunked schedule), and the device count when one class stands for every device."""
    plan = data.plan
    if len(data.bars) == 1 and data.bars[0].device == "all devices" and plan.mesh is not None and plan.mesh.size:
        return [f"each of the {plan.mesh.size} devices"]
    return [b.device.replace(" (", "\n(") for b in data.bars]


def _write(data: ReportData, out: Path, fmts: tuple[str, ...]) -> list[Path]:
    sim = data.schedule.simulated if data.schedule is not None else None
    limit, what = memory_limit(data.plan)
    note = "" if sim is None or sim.chunks == 1 else (
        f"each pipeline rank holds {sim.chunks} stages; the estimate (and each bar) is of one stage, so a rank's "
        "memory is that of its stages together")
    title = f"{data.name}: estimated peak memory per device"
    written = draw_memory(data.bars, limit, what, title, out / "memory", fmts, _bar_labels(data), note)
    images = {"memory": "memory"}
    if sim is not None:
        kind = data.plan.pipeline.schedule if data.plan.pipeline is not None else sim.kind
        title = f"{data.name}: {kind} schedule, {sim.ranks} pipeline ranks × {sim.microbatches} microbatches"
        written += draw_schedule(sim, title, out / "schedule", fmts)
        images["schedule"] = "schedule"
    else:  # a chart left from an earlier report into this folder would contradict the page
        for f in FORMATS:
            (out / f"schedule.{f}").unlink(missing_ok=True)
    (out / "report.json").write_text(json.dumps(report_json(data), indent=1) + "\n", encoding="utf-8")
    (out / "index.html").write_text(render_page(data, images, fmts), encoding="utf-8")
    return written + [out / "report.json", out / "index.html"]


def _device_labels(data: ReportData) -> list[str]:
    """The bars' labels on one line (`stage 1 (rank 1)`, `each of the 4 devices`)."""
    return [label.replace("\n", " ") for label in _bar_labels(data)]


def memory_summary(data: ReportData) -> tuple[list[str], list[str]]:
    """One line per device class (its estimated peak against the limit the chart draws: the budget, else
    the device's memory), and a warning for each device class over that limit."""

    limit, what = memory_limit(data.plan)
    lines, warnings = [], []
    for label, bar in zip(_device_labels(data), data.bars):
        head = f"{label}: estimated peak {fb(bar.peak)} (in the {bar.phase})"
        if limit is None:
            lines.append(f"{head}; no budget or device memory to compare with")
        elif bar.peak <= limit:
            share = bar.peak / limit
            lines.append(f"{head}, {what} {fb(limit)}: fits ({'under 1%' if share < 0.01 else f'{share:.0%}'} of it)")
        else:
            over = f"over by {fb(bar.peak - limit)} (+{(bar.peak - limit) / limit:.0%})"
            lines.append(f"{head}, {what} {fb(limit)}: {over}")
            warnings.append(f"{label} is over its {what}: estimated peak {fb(bar.peak)} against {fb(limit)}, {over}")
    return lines, warnings


def report_command(plan: str, out_dir: str, formats: str | Iterable[str] = "png,svg") -> int:
    """The body of `planlang report PLAN -o DIR [--format png,svg]`: prints what it wrote and each device
    class's estimated peak against the budget on stdout, a warning per device class over it on stderr;
    or a clear error (diagnostics first) on stderr. Returns the exit code: 0 written (over budget or
    not: `planlang check --model` is the gate), 2 not written."""
    try:
        fmts = _formats(formats)
        data = build_report_data(str(plan))
        files = _write_into(data, str(out_dir), fmts)
    except ReportError as err:
        if err.details:
            sys.stderr.write(err.details if err.details.endswith("\n") else err.details + "\n")
        sys.stderr.write(f"planlang: error: {err.message}\n")
        return 2
    for f in files:
        sys.stdout.write(f"wrote {f}\n")
    lines, warnings = memory_summary(data)
    for line in lines:
        sys.stdout.write(line + "\n")
    sys.stdout.flush()
    for w in warnings:
        sys.stderr.write(f"planlang: warning: {w}; {Path(out_dir) / 'index.html'} shows where the memory goes\n")
    return 0
