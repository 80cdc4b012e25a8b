"""Gather what a report shows: the checked plan, its estimate, the memory bars and the pipeline schedule.

The plan is checked as `planlang check --model` does (model-free rules, then the model-aware ones with
the estimate), except that an over-budget estimate (PL560) does not stop the report: showing where the
memory goes is the point. Any other error does, with the diagnostics rendered for the user.

The step time and the schedule are the estimate's (planlang.model.price.step_time, as `planlang estimate`
prices them): each row's step, and the pipeline's schedule simulated from each stage's forward and
backward of one microbatch. The report simulates nothing of its own.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from planlang.lang.diagnostics import Diagnostic, Severity
from planlang.plan.complete import CompletePlan, IncompletePlan, complete

from .memory import MemoryBar, memory_bar
from planlang.lang.render import render

if TYPE_CHECKING:  # the estimate's modules import torch; the report loads them only when it estimates
    from planlang.model.price.estimate import DeviceEstimate
    from planlang.model.price.step_time import PipelineSchedule

OVER_BUDGET = "PL560"


class ReportError(Exception):
    """The plan cannot be reported on: `message` says why and what to do; `details` is rendered
    diagnostics (or empty)."""

    def __init__(self, message: str, details: str = ""):
        super().__init__(message)
        self.message, self.details = message, details


@dataclass(frozen=True)
class ReportData:
    plan: CompletePlan
    estimates: tuple[DeviceEstimate, ...]  # one per device class, each with its step time
    bars: tuple[MemoryBar, ...]
    schedule: PipelineSchedule | None  # the estimate's: stage times per microbatch and the simulated schedule
    diagnostics: tuple[Diagnostic, ...] = ()  # what the check found and did not stop the report
    schedule_note: str = ""  # why there is no schedule chart
    sources: dict = field(default_factory=dict, compare=False, repr=False)

    def __str__(self) -> str:
        return f"report of {self.plan.path}: {len(self.bars)} device classes" + (
            f", {self.schedule.simulated}" if self.schedule else "")

    @property
    def name(self) -> str:
        return Path(self.plan.path).name.removesuffix(".plan")


def _render(diags, sources) -> str:
    return render(list(diags), sources, "human") if diags else ""


def _checked_plan(path: str):
    """Resolve and run the model-free checks; a ReportError unless the plan is complete and clean."""
    # lazy: lark loads only when this runs
    from planlang.plan.checker import check_resolution
    from planlang.plan.resolve import Resolver

    if not Path(path).is_file():
        raise ReportError(f"no such file: {path}")
    try:
        resolution = Resolver().resolve_file(path)
    except (OSError, UnicodeDecodeError) as err:
        raise ReportError(f"cannot read {path}: {err}") from err
    result = check_resolution(resolution, path)
    if result.errors or result.plan is None:
        raise ReportError(f"{path} has errors; fix them first (`planlang check {path}`)",
                          _render(result.diagnostics, result.sources))
    plan = result.plan
    if plan.model is None:
        raise ReportError(f"{path} declares no model; a report needs one (add a `model` statement)")
    try:
        return resolution, complete(plan)
    except IncompletePlan as err:
        raise ReportError(f"{path} has {len(err.holes)} holes (`?`); solve it first (`planlang solve {path}`)") from err


def _schedule(plan: CompletePlan, rows) -> tuple[PipelineSchedule | None, str]:
    """The schedule the estimate's step time was read from, or why there is none to draw."""
    if plan.pipeline is None:
        return None, "The plan has no pipeline, so there is no schedule to draw."
    sched = rows[0].schedule if rows else None
    if sched is None:
        return None, ("The mesh's device declares no compute throughput (flops), so neither the step time nor "
                      "the pipeline schedule can be priced.")
    return sched, ""


def build_report_data(path: str) -> ReportData:
    """Check `path` (with its model) and estimate it: memory, step time and the pipeline's schedule, read
    from the one validation (planlang.model.validation.validate_plan), which estimates the plan once."""
    resolution, plan = _checked_plan(path)
    # lazy: torch loads only when this runs
    from planlang.model.validation import validate_plan
    from planlang.runtime.program_memory import measure

    checked = validate_plan(resolution, path, measure)
    sources = dict(checked.check.sources)
    if checked.facts is None:
        raise ReportError(f"the model of {path} cannot be loaded", _render(checked.diagnostics, sources))
    blocking = [d for d in checked.diagnostics if d.severity is Severity.ERROR and d.code != OVER_BUDGET]
    if blocking:
        raise ReportError(f"{path} has errors; fix them first (`planlang check --model {path}`)",
                          _render(blocking, sources))
    if not checked.estimate:
        raise ReportError(f"{path} could not be estimated; `planlang check --model {path}` says why")
    rows = checked.estimate
    bars = tuple(memory_bar(r, r.step_temporaries) for r in rows)
    sched, note = _schedule(plan, rows)
    return ReportData(plan, tuple(rows), bars, sched, tuple(checked.diagnostics), note, sources)
