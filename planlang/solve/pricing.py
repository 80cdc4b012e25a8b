"""Pricing a candidate: a pure function of the plan value and the model's facts (planlang.solve.facts),
plus the caller's communication model. No text: the candidate is a `CompletePlan` the search built by
substituting its choices into the input's plan (planlang.solve.substitute).

A candidate's step time is the estimator's, or — when the caller passes `comm_time` (the CLI passes the
runtime's per-step traffic, planlang.runtime.traffic, through this hook so the solve layer does not
import the runtime) — the estimator's compute plus that communication in place of the estimator's
data-parallel all-reduce.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from planlang.cost.comm import Collective, price
from planlang.plan.complete import CompletePlan
from planlang.plan.data import data_axes

from .facts import ModelFacts


@dataclass(frozen=True)
class Priced:
    rows: tuple  # planlang.model.estimate.DeviceEstimate, one per device class
    steps: tuple[float, ...]  # each row's step seconds, as priced (with `comm_time`'s traffic)
    peak: int  # the largest device's peak bytes
    fits: bool
    notes: tuple[str, ...] = ()  # what the pricing could not do as asked (communication not predicted)

    @property
    def step_time(self) -> float:
        """The slowest device's step."""
        return max(self.steps)


def price_plan(plan: CompletePlan, facts: ModelFacts,
               comm_time: Callable[[CompletePlan], float] | None = None, comm: "Comm | None" = None) -> Priced:
    """Each device class's peak and step for `plan`. Raises what the estimator raises for a plan the
    model cannot run (the search skips such a candidate and says why). `comm`: `comm_time`'s answer
    for this plan when the caller has it already (price_steps)."""
    # lazy: torch loads only when this runs
    from planlang.model.estimate import estimate_plan

    rows = estimate_plan(plan, facts=facts.modules, cache=facts.estimates)
    budget = plan.budget.bytes if plan.budget is not None else None
    peak = max(r.peak for r in rows)
    steps, notes = step_times(plan, rows, comm_time, comm)
    return Priced(tuple(rows), steps, peak, budget is None or peak <= budget, notes)


@dataclass(frozen=True)
class Comm:
    """`comm_time(plan)`: its seconds, or the note saying why it failed on this plan."""

    seconds: float | None
    note: str = ""


def communication(plan: CompletePlan, comm_time) -> Comm:
    try:
        return Comm(comm_time(plan))
    except Exception as e:  # noqa: BLE001 - e.g. a pipeline plan the traffic model does not lower
        return Comm(None, f"communication of one candidate not predicted ({type(e).__name__}: {e}); "
                          "its step time is the estimator's")


@dataclass(frozen=True)
class Steps:
    """A candidate's step times priced without its memory (price_steps): each row's (estimator step,
    parameter bytes) from the local model's profile, and — once `with_comm` has asked `comm_time` — its
    answer, which price_plan then reuses."""

    rows: tuple[tuple[float, int], ...]
    comm: Comm | None = None  # None: not asked (or no `comm_time`)

    def lower(self, plan: CompletePlan, comm_time) -> float:
        """The slowest row's step as price_plan gives it, or, when `comm_time`'s traffic is not priced
        yet, a lower bound on it: the estimator's step without its data-parallel all-reduce (the
        traffic, never negative, replaces that all-reduce)."""
        if comm_time is None:
            return max(step for step, _ in self.rows)
        if self.comm is None:
            return max(step - sync_seconds(plan, params) for step, params in self.rows)
        return max(self.steps(plan))

    def steps(self, plan: CompletePlan) -> tuple[float, ...]:
        """Each row's step as price_plan gives it (with the traffic when it was asked for)."""
        if self.comm is None or self.comm.seconds is None:
            return tuple(step for step, _ in self.rows)
        return tuple(step - sync_seconds(plan, params) + self.comm.seconds for step, params in self.rows)

    def with_comm(self, plan: CompletePlan, comm_time) -> "Steps":
        """These steps with `comm_time`'s traffic priced (itself without a `comm_time` or once asked)."""
        if comm_time is None or self.comm is not None:
            return self
        return Steps(self.rows, communication(plan, comm_time))


def price_steps(plan: CompletePlan, facts: ModelFacts) -> Steps | None:
    """Each device class's estimator step for `plan` from the profile of the local model alone
    (planlang.model.estimate.estimate_steps: no simulated step, no memory), the traffic not yet priced;
    None when the estimator cannot profile the local model."""
    # lazy: torch loads only when this runs
    from planlang.model.estimate import estimate_steps

    rows = estimate_steps(plan, facts=facts.modules, cache=facts.estimates)
    return None if rows is None else Steps(rows)


def step_times(plan: CompletePlan, rows, comm_time=None,
               comm: Comm | None = None) -> tuple[tuple[float, ...], tuple[str, ...]]:
    """Each device class's step: the estimator's, or its compute plus the caller's per-step
    communication (`comm_time`, or its answer `comm`) in place of the estimator's data-parallel
    all-reduce; and a note when `comm_time` failed on this plan."""
    steps = tuple(r.step_time for r in rows)
    if comm_time is None:
        return steps, ()
    comm = comm if comm is not None else communication(plan, comm_time)
    if comm.seconds is None:
        return steps, (comm.note,)
    return tuple(r.step_time - estimated_sync(plan, r) + comm.seconds for r in rows), ()


def estimated_sync(plan: CompletePlan, row) -> float:
    """The data-parallel gradient all-reduce the estimator adds to a row's step time (estimate._step_time:
    the stage's local parameter bytes over the data axes of size > 1)."""
    return sync_seconds(plan, row.parameters)


def sync_seconds(plan: CompletePlan, parameters: int) -> float:
    """estimated_sync for a row whose parameters class is `parameters` bytes."""
    mesh = plan.mesh
    if mesh is None or mesh.device is None or not mesh.device.flops:
        return 0.0
    axes = data_axes(plan, trivial=False)
    if not axes:
        return 0.0
    opt = plan.optimizer
    zero = opt.zero_stage if opt else 0
    zero_n = (mesh.axis_size(opt.zero_axis) or 1) if opt and opt.zero_axis is not None else 1
    p_bytes = parameters * (zero_n if zero >= 3 else 1)
    return price(Collective.ALL_REDUCE, mesh, axes, p_bytes).seconds


@dataclass(frozen=True)
class Candidate:
    """A priced candidate: its choices (in a fixed order, for tables and tie-breaks), the plan value
    that was priced, and the price."""

    choices: tuple[tuple[str, str], ...]  # (what, value)
    plan: CompletePlan = field(compare=False, repr=False)
    peak: int  # the largest device's peak bytes
    step_time: float  # the slowest device's step seconds
    fits: bool
    rows: tuple = field(default=(), compare=False, repr=False)
    steps: tuple[float, ...] = field(default=(), compare=False, repr=False)  # each row's step, as priced

    def key(self, objective: str) -> tuple:
        if objective == "memory":
            return (not self.fits, self.peak, self.step_time)
        if objective == "balanced":
            return (not self.fits, self.peak * self.step_time)
        return (not self.fits, self.step_time, self.peak)

    def __str__(self) -> str:
        what = ", ".join(f"{k}={v}" for k, v in self.choices)
        # lazy: torch loads only when this runs
        from planlang.model.estimate import format_bytes

        return f"{what}: peak {format_bytes(self.peak)}, step {self.step_time * 1e3:.2f} ms" + ("" if self.fits else " (over budget)")


def best(cands, objective: str) -> Candidate | None:
    """The best candidate under the objective (None when there is none); ties: the first."""
    cands = [c for c in cands if c is not None]
    return min(cands, key=lambda c: c.key(objective)) if cands else None
