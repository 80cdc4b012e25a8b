"""Pricing a candidate: a pure function of the plan value and the model's facts (planlang.solve.facts).
No text: the candidate is a `CompletePlan` the search built by substituting its choices into the input's
plan (planlang.solve.substitute).

A candidate's peak and step time are the estimator's (planlang.model.price.estimate, whose step is
planlang.model.price.step_time's: compute, the lowered program's collectives, the gradient sums and ZeRO's
collectives with what overlaps, the pipeline's bubble) — the figures `planlang estimate` prints for the
solved plan. The search prices a candidate's step in two steps (`Steps`): from the local model's profile
alone (a lower bound: every collective left out only lowers it), then with its lowered program's
collectives, and only then its memory.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from planlang.model.program.shared_lowering import shared_lowerings
from planlang.plan.complete import CompletePlan, CompleteSchedule
from planlang.plan.stage_meshes import heterogeneous, shape_plans, stage_plan, stage_shapes
from planlang.plan import types as T

from .facts import SolveFacts
from .space import Choices


@dataclass(frozen=True)
class Priced:
    rows: tuple  # planlang.model.price.estimate.DeviceEstimate, one per device class
    steps: tuple[float, ...]  # each row's step seconds
    peak: int  # the largest device's peak bytes
    fits: bool
    notes: tuple[str, ...] = ()  # what the pricing could not do as asked (the program not lowered)

    @property
    def step_time(self) -> float:
        """The slowest device's step."""
        return max(self.steps)


@dataclass(frozen=True)
class CandidateTraffic:
    """A candidate's lowered-program collectives (planlang.model.price.step_time.lowered_traffic: one Traffic
    per model stage; None for a pipeline that runs the model's modules), or `note`, why it could not be
    lowered (its gradient sums are then priced from its parameters)."""

    traffic: tuple | dict | None  # a dict by stage sizes of each shape's (stages of their own degrees)
    note: str = ""

    def for_estimate(self):
        """What planlang.model.price.estimate.estimate_plan takes as `traffic`."""
        if self.note:
            return self.note
        if isinstance(self.traffic, dict):
            return {k: None if v is None else list(v) for k, v in self.traffic.items()}
        return list(self.traffic) if self.traffic is not None else None


def lowered(plan: CompletePlan, facts: SolveFacts) -> CandidateTraffic:
    """The candidate's program lowered with the solve's op graph and model, and its collectives; once per
    plan value (`_same_program`) in a solve."""
    # lazy: torch loads only when this runs
    from planlang.model.price.step_time import lowered_traffic

    key = _same_program(plan)
    if key is not None and key in facts.lowered:
        return facts.lowered[key]
    try:
        graph = facts.op_graph(plan) if plan.pipeline is None else None
        # candidates that differ only in what the lowering does not read (checkpoint groups, ZeRO, stages,
        # schedule) share one lowering (planlang.model.program.shared_lowering); their collectives differ
        with shared_lowerings(facts.programs):
            if heterogeneous(plan):  # each stage shape's program (planlang.model.price.stage_meshes)
                shapes = {sizes: lowered_traffic(sp, None, facts.layers.module)  # type: ignore[attr-defined]
                          for sizes, sp in shape_plans(plan).items()}
                out = CandidateTraffic({k: None if v is None else tuple(v) for k, v in shapes.items()})
            else:
                got = lowered_traffic(plan, graph, facts.layers.module)  # type: ignore[attr-defined]
                out = CandidateTraffic(None if got is None else tuple(got))
    except Exception as e:  # noqa: BLE001 - e.g. a layout the lowering refuses; priced without its program
        out = CandidateTraffic(None, f"{type(e).__name__}: {e}")
    if key is not None:
        facts.lowered[key] = out
    return out


# the schedule every pipeline's key holds (see _same_program)
_ANY_SCHEDULE = CompleteSchedule("1f1b")


def _same_program(plan: CompletePlan) -> CompletePlan | None:
    """The plan value as its lowered program reads it: a pipeline's program (one microbatch's, cut into its
    stages: planlang.model.price.step_time.lowered_traffic) and its collectives read the pipeline's stages and
    microbatches, never its schedule, so candidates that differ only there (gpipe and 1f1b over the same
    stages) share it (tests/solve/test_shared_lowering.py lowers each afresh); a pipeline of one stage holds
    the whole model however its stage is written (the stage methods write `h` or `h[0..12]`), so its stage is
    left out. None when the value does not hash."""
    p = plan.pipeline
    key = plan if p is None else replace(plan, pipeline=replace(
        p, schedule=_ANY_SCHEDULE, stages=() if len(p.stages) == 1 else p.stages))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def price_plan(plan: CompletePlan, facts: SolveFacts, low: CandidateTraffic | None = None) -> Priced:
    """Each device class's peak and step for `plan`. Raises what the estimator raises for a plan the
    model cannot run (the search skips such a candidate and says why). `low`: its lowered program's
    collectives when the caller has them (else lowered here)."""
    # lazy: torch loads only when this runs
    from planlang.model.price.estimate import estimate_plan

    low = low if low is not None else lowered(plan, facts)
    rows = estimate_plan(plan, facts=facts.modules, cache=facts.estimates, traffic=low.for_estimate())
    budget = plan.budget.bytes if plan.budget is not None else None
    peak = max(r.peak for r in rows)
    notes = (f"one candidate's program could not be lowered ({low.note}); its step is priced without its "
             "collectives",) if low.note else ()
    return Priced(tuple(rows), tuple(r.step_time for r in rows), peak, budget is None or peak <= budget, notes)


@dataclass(frozen=True)
class Steps:
    """A candidate's step times priced without its memory (price_steps): what the step-time model needs
    of the local model's profile (planlang.model.price.estimate.StepInputs) and — once `with_lowered` has
    lowered its program — its collectives, which price_plan then reuses. Each figure is priced once per plan
    value (`_memo`): the search asks for a candidate's bound when it orders the meshes and again when it
    prices it, and for its step when it bounds it and again when it checks the full pricing against it."""

    inputs: object  # planlang.model.price.estimate.StepInputs
    low: CandidateTraffic | None = None  # None: not lowered yet
    _memo: dict = field(default_factory=dict, compare=False, repr=False)

    def lower(self, plan: CompletePlan) -> float:
        """The slowest row's step as price_plan gives it, or, before the program is lowered, a lower
        bound on it (the step without the program's collectives)."""
        if self.low is None:
            return self._once("bound", plan, lambda: max(st.total for st in self.inputs.lower_bound(plan)))  # type: ignore[attr-defined]
        return max(self.steps(plan))

    def steps(self, plan: CompletePlan) -> tuple[float, ...]:
        """Each row's step as price_plan gives it (its program lowered)."""
        low = self.low if self.low is not None else CandidateTraffic(None, "not lowered")
        traffic = low.for_estimate()
        return self._once("steps", plan, lambda: tuple(
            st.total for st in self.inputs.steps(plan, traffic if not isinstance(traffic, str) else None)))  # type: ignore[attr-defined]

    def _once(self, what: str, plan: CompletePlan, price: Callable[[], Any]) -> Any:
        try:
            key = (what, plan)
            if key in self._memo:
                return self._memo[key]
        except TypeError:  # a plan value that does not hash: priced each time
            return price()
        got = self._memo[key] = price()
        return got

    def with_lowered(self, plan: CompletePlan, facts: SolveFacts) -> "Steps":
        """These steps with the program's collectives (itself once lowered)."""
        return self if self.low is not None else Steps(self.inputs, lowered(plan, facts))


def price_steps(plan: CompletePlan, facts: SolveFacts) -> Steps | None:
    """The candidate's step inputs from the profile of the local model alone
    (planlang.model.price.estimate.estimate_steps: no simulated step, no memory), its program not yet lowered;
    None when the estimator cannot profile the local model."""
    # lazy: torch loads only when this runs
    from planlang.model.price.estimate import estimate_steps

    inputs = estimate_steps(plan, facts=facts.modules, cache=facts.estimates)
    return None if inputs is None else Steps(inputs)


@dataclass(frozen=True)
class Candidate:
    """A priced candidate: its choices (in a fixed order, for tables and tie-breaks), the plan value
    that was priced, and the price."""

    choices: Choices  # (what, value)
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
        from planlang.model.price.estimate import format_bytes

        return f"{what}: peak {format_bytes(self.peak)}, step {self.step_time * 1e3:.2f} ms" + ("" if self.fits else " (over budget)")


def best(cands, objective: str) -> Candidate | None:
    """The best candidate under the objective (None when there is none); ties: the first."""
    cands = [c for c in cands if c is not None]
    return min(cands, key=lambda c: c.key(objective)) if cands else None


def memory_floor(plan: CompletePlan, facts: SolveFacts) -> int:
    """A lower bound on the candidate's peak bytes per device from its parameters alone: the heaviest
    pipeline rank's local parameters (its stages': several under interleaving) (sharded by its specs; by ZeRO-3 too), their gradients (in the
    parameters' dtype; sharded by ZeRO >= 2), optimizer states (sharded by ZeRO >= 1) and, under mixed
    precision without FSDP, the master copy — what every estimate of the plan holds at once at least
    (planlang.model.price.estimate: parameters + optimizer states + buffers (the gradient buckets) +
    the larger of backward's and the optimizer step's memory, which holds the gradients). Computed from
    shapes, no simulation: a candidate whose floor is over the budget is never priced. Stages of their own
    degrees: each stage's floor on its own sizes (planlang.plan.stage_meshes.stage_plan)."""
    if heterogeneous(plan):
        by_shape: dict = {}  # stage sizes -> the floors of that shape's plan, each once
        out = 0
        for s, sizes in enumerate(stage_shapes(plan)):
            if sizes not in by_shape:
                by_shape[sizes] = _floors(stage_plan(plan, s), facts)
            out = max(out, by_shape[sizes].get(s, 0))
        return out
    return max(_floors(plan, facts).values(), default=0)


def _floors(plan: CompletePlan, facts: SolveFacts) -> dict:
    """`memory_floor` of each pipeline rank (by its stage under one stage per rank; None without a pipeline)."""
    # lazy: torch loads only when this runs
    from planlang.model.price.zero_peaks import STATE_ELEMENTS

    params = _local_params(plan, facts)
    opt, prec = plan.optimizer, plan.precision
    zero = opt.zero_stage if opt else 0
    zero_n = plan.dims.zero_shards
    states = STATE_ELEMENTS.get(opt.name, 2) if opt else 0
    master = prec.bytes("master") if prec.mixed else 4
    copy = prec.mixed and prec.master_copy and not (zero >= 2 and zero_n > 1)  # estimate's MasterWeights
    # a chunked schedule: a rank holds every one of its stages' parameters at once (planlang.plan.placement:
    # model stage s on rank s mod p, or in a V)
    pipe = plan.pipeline
    ranks = len(pipe.stages) // pipe.schedule.chunks if pipe is not None and pipe.schedule.kind in T.CHUNKED \
        and pipe.schedule.chunks > 1 else 0
    placed = T.stage_ranks(pipe.schedule.kind, ranks, pipe.schedule.chunks) if ranks and pipe is not None else ()
    stages: dict = {}
    # every parameter counted as trained (a parameter the loss does not reach, BERT's pooler under an MLM
    # loss, gets no gradient or state in the estimate: the floor is then above it by that parameter's share)
    for p in params.values():
        n = math.prod(p.local)
        own = (prec.bytes("params") if prec.mixed else p.itemsize) * n
        held = own // zero_n if zero >= 3 else own
        grads = own // zero_n if zero >= 2 else own
        state = states * n * master
        state = state // zero_n if zero >= 1 else state
        state += master * n if copy else 0
        for s in {placed[s] if placed and s is not None else s for s in p.stages or (None,)}:
            stages[s] = stages.get(s, 0) + held + grads + state
    return stages


def _local_params(plan: CompletePlan, facts: SolveFacts) -> dict:
    """planlang.model.price.local_model.local_params' parameters, in two parts kept for the solve: each
    parameter's stages (they read only the pipeline's stages: every mesh of a pp degree shares them) and its
    local shape (only the shard rules and the mesh)."""
    # lazy: torch loads only when this runs
    from planlang.model.price.local_model import local_params

    p = plan.pipeline
    try:
        key = (None if p is None else (p.axis, p.stages), plan.shards, plan.mesh)
        hash(key)
    except TypeError:  # a value that does not hash: computed whole
        return local_params(plan, facts.modules)[1]
    if key[0] not in facts.param_stages:
        facts.param_stages[key[0]] = {n: q.stages for n, q in local_params(plan, facts.modules)[1].items()}
    stages = facts.param_stages[key[0]]
    if key[1:] not in facts.local_shapes:
        facts.local_shapes[key[1:]] = local_params(replace(plan, pipeline=None), facts.modules)[1]
    return {n: replace(q, stages=stages[n]) for n, q in facts.local_shapes[key[1:]].items()}
