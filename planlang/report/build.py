"""Gather what a report shows: the checked plan, its estimate, the memory bars and the simulated schedule.

The plan is checked as `planlang check --model` does (model-free rules, then the model-aware ones with
the estimate), except that an over-budget estimate (PL560) does not stop the report: showing where the
memory goes is the point. Any other error does, with the diagnostics rendered for the user.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from planlang.lang.diagnostics import Diagnostic, Severity
from planlang.plan.complete import CompletePlan, IncompletePlan, complete

from .memory import MemoryBar, memory_bar
from planlang.cost.schedule import ScheduleError, SimulatedSchedule, simulate
from planlang.lang.render import render

# A backward pass needs about twice the forward's FLOPs (gradients for both the input and the weights;
# Narayanan et al. 2021's FLOP count). The estimator gives one compute time per stage, so the schedule
# splits it 1 : 2.
FORWARD_SHARE = 1 / 3
OVER_BUDGET = "PL560"


class ReportError(Exception):
    """The plan cannot be reported on: `message` says why and what to do; `details` is rendered
    diagnostics (or empty)."""

    def __init__(self, message: str, details: str = ""):
        super().__init__(message)
        self.message, self.details = message, details


@dataclass(frozen=True)
class StageTimes:
    """Per-microbatch forward and backward time of each model stage, in seconds (or in units of a
    forward when `measured` is False: the estimator had no device throughput)."""

    forward: tuple[float, ...]
    backward: tuple[float, ...]
    measured: bool

    def __str__(self) -> str:
        unit = "s" if self.measured else " units"
        return ", ".join(f"stage {i}: F {f:.3g}{unit} B {b:.3g}{unit}"
                         for i, (f, b) in enumerate(zip(self.forward, self.backward)))


@dataclass(frozen=True)
class ReportData:
    plan: CompletePlan
    estimates: tuple  # planlang.model.price.estimate.DeviceEstimate, one per device class
    bars: tuple[MemoryBar, ...]
    schedule: SimulatedSchedule | None
    stage_times: StageTimes | None
    diagnostics: tuple[Diagnostic, ...] = ()  # what the check found and did not stop the report
    schedule_note: str = ""  # why there is no schedule chart
    sources: dict = field(default_factory=dict, compare=False, repr=False)

    def __str__(self) -> str:
        return f"report of {self.plan.path}: {len(self.bars)} device classes" + (
            f", {self.schedule}" if self.schedule else "")

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


def stage_times(microbatches: int, steps: list[float]) -> StageTimes:
    """Per-microbatch forward/backward time of each stage from the estimator's per-stage compute time
    (`steps`, each covering all microbatches), split FORWARD_SHARE : rest; equal times when the estimate
    has no usable time."""
    m = microbatches
    measured = all(isinstance(t, float) and math.isfinite(t) and t > 0 for t in steps)
    per_micro = [t / m for t in steps] if measured else [1 / FORWARD_SHARE] * len(steps)
    return StageTimes(tuple(t * FORWARD_SHARE for t in per_micro),
                      tuple(t * (1 - FORWARD_SHARE) for t in per_micro), measured)


def _schedule(plan: CompletePlan, rows) -> tuple[SimulatedSchedule | None, StageTimes | None, str]:
    p = plan.pipeline
    if p is None:
        return None, None, "The plan has no pipeline, so there is no schedule to draw."
    kind = p.schedule.kind
    chunks = p.schedule.chunks if kind == "interleaved" else 1
    # each model stage's step time, from the rows of the pipeline ranks holding it
    per_stage = {s: t for r in rows for s, t in zip(r.stages, r.stage_times)}
    if sorted(per_stage) != list(range(len(p.stages))):
        return None, None, "The estimate has no per-stage figures, so the schedule cannot be simulated."
    times = stage_times(p.microbatches, [per_stage[s] for s in range(len(p.stages))])
    try:
        sim = simulate(kind, list(times.forward), list(times.backward), p.microbatches, chunks)
    except ScheduleError as err:
        return None, times, f"The schedule cannot be simulated: {err}."
    return sim, times, ""


def build_report_data(path: str) -> ReportData:
    """Check `path` (with its model), estimate it and simulate its pipeline schedule."""
    resolution, plan = _checked_plan(path)
    # lazy: torch loads only when this runs
    from planlang.model.checks import model_facts_for, validate
    from planlang.model.price.estimate import estimate_plan
    from planlang.model.capture.load import ModelLoadError
    from planlang.runtime.program_memory import measure

    facts, load_diags = model_facts_for(plan)
    if load_diags or facts is None:
        raise ReportError(f"the model of {path} cannot be loaded", _render(load_diags, resolution.sources))
    try:
        rows = estimate_plan(plan, facts=facts, program=measure)
    except ModelLoadError as err:
        raise ReportError(f"the model of {path} cannot be loaded: {err.message}\n  help: {err.help}") from err
    except Exception as err:  # the model's own code failed on the plan's local shapes: the user's to fix
        raise ReportError(f"estimating {path} failed: the model raised {type(err).__name__}: {err}\n"
                          f"  help: `planlang check --model {path}` and `planlang inspect {path}` show what the "
                          "model sees") from err
    checked = validate(resolution, path, facts, rows)
    blocking = [d for d in checked.diagnostics if d.severity is Severity.ERROR and d.code != OVER_BUDGET]
    if blocking:
        raise ReportError(f"{path} has errors; fix them first (`planlang check --model {path}`)",
                          _render(blocking, checked.sources))
    bars = tuple(memory_bar(r, r.step_temporaries) for r in rows)
    sim, times, note = _schedule(plan, rows)
    return ReportData(plan, tuple(rows), bars, sim, times, tuple(checked.diagnostics), note, dict(checked.sources))
