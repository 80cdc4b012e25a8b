"""`planlang report PLAN -o DIR`: charts and a page about one plan.

    write_report("examples/gpt2/gpt2_3d.plan", "out/")  ->  [out/memory.png, out/memory.svg,
        out/schedule.png, out/schedule.svg, out/report.json, out/index.html]

- memory.{png,svg}: each device class's estimated peak, stacked by memory class, with the budget line;
- schedule.{png,svg}: the pipeline schedule (GPipe, 1F1B or interleaved) simulated from the per-stage
  times, with its bubble; not drawn for a plan without a pipeline (the page says so);
- report.json: the numbers behind both charts; index.html: the plan's summary, the charts and the tables.

Layers: this sits on top of planlang.model (like the CLI); matplotlib is imported only to draw.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Iterable

from .build import ReportData, ReportError, build_report_data

__all__ = ["FORMATS", "ReportData", "ReportError", "build_report_data", "report_command", "write_report"]

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
    """The numbers behind the charts (bytes and seconds)."""
    sim = data.schedule
    return {
        "plan": data.plan.path,
        "budget": data.plan.budget.bytes if data.plan.budget else None,
        "devices": [r.as_dict() | {"bar": dict(b.segments), "peak_phase": b.phase}
                    for r, b in zip(data.estimates, data.bars)],
        "schedule": None if sim is None else {
            "kind": sim.kind, "ranks": sim.ranks, "chunks": sim.chunks, "microbatches": sim.microbatches,
            "step": sim.makespan, "bubble_ratio": sim.bubble_ratio,
            "time_unit": "s" if data.stage_times and data.stage_times.measured else "forward",
            "boxes": [[b.kind, b.stage, b.rank, b.microbatch, b.start, b.end] for b in sim.boxes]},
        "schedule_note": data.schedule_note,
    }


def write_report(plan_path: str, out_dir: str, formats=("png", "svg")) -> list[Path]:
    """Check and estimate `plan_path`, draw its charts in each of `formats` and write index.html into
    `out_dir` (created if needed). Returns the files written. Raises ReportError for a plan that fails to
    check, has holes or whose model fails to load."""
    fmts = _formats(formats)
    data = build_report_data(plan_path)
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
    """x labels of the memory bars: the estimator's device class, with its rank when ranks hold several
    stages, and the device count when one class stands for every device."""
    plan, sim = data.plan, data.schedule
    if sim is not None and sim.chunks > 1:
        return [f"{b.device}\n(rank {i % sim.ranks})" for i, b in enumerate(data.bars)]
    if len(data.bars) == 1 and data.bars[0].device == "all devices" and plan.mesh is not None and plan.mesh.size:
        return [f"each of the {plan.mesh.size} devices"]
    return [b.device for b in data.bars]


def _write(data: ReportData, out: Path, fmts: tuple[str, ...]) -> list[Path]:
    from .charts import draw_memory, draw_schedule
    from .page import memory_limit, render_page

    sim = data.schedule
    limit, what = memory_limit(data.plan)
    note = "" if sim is None or sim.chunks == 1 else (
        f"each pipeline rank holds {sim.chunks} stages; the estimate (and each bar) is of one stage, so a rank's "
        "memory is that of its stages together")
    title = f"{data.name}: estimated peak memory per device"
    written = draw_memory(data.bars, limit, what, title, out / "memory", fmts, _bar_labels(data), note)
    images = {"memory": "memory"}
    if sim is not None:
        title = (f"{data.name}: {data.plan.pipeline.schedule} schedule, "  # type: ignore[union-attr]
                 f"{sim.ranks} pipeline ranks × {sim.microbatches} microbatches")
        written += draw_schedule(sim, bool(data.stage_times and data.stage_times.measured), title,
                                 out / "schedule", fmts)
        images["schedule"] = "schedule"
    else:  # a chart left from an earlier report into this folder would contradict the page
        for f in FORMATS:
            (out / f"schedule.{f}").unlink(missing_ok=True)
    (out / "report.json").write_text(json.dumps(report_json(data), indent=1) + "\n", encoding="utf-8")
    (out / "index.html").write_text(render_page(data, images, fmts), encoding="utf-8")
    return written + [out / "report.json", out / "index.html"]


def report_command(plan: str, out_dir: str, formats: str | Iterable[str] = "png,svg") -> int:
    """The body of `planlang report PLAN -o DIR [--format png,svg]`: prints what it wrote, or a clear
    error (diagnostics first) on stderr. Returns the exit code: 0 written, 2 not written."""
    try:
        files = write_report(str(plan), str(out_dir), formats)
    except ReportError as err:
        if err.details:
            sys.stderr.write(err.details if err.details.endswith("\n") else err.details + "\n")
        sys.stderr.write(f"planlang: error: {err.message}\n")
        return 2
    for f in files:
        sys.stdout.write(f"wrote {f}\n")
    return 0
