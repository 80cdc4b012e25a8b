"""`planlang solve`: fill a plan's holes and write a complete plan back (map-memory-aware-auto-parallel
§5.3's two-stage solver, inside a search over whole plans that the estimator prices).

Stage 1 enumerates the coarse choices — the factorizations of the device count over the mesh axes left
`?` (fixed sizes are constraints) — with every other hole at a default (ZeRO 0, the smallest valid
microbatch count ≥ stages, stages balanced by the min–max partition DP over per-layer flops, replicated
specs, no checkpointing), and prices each candidate plan with planlang.model.estimate (per-device peak
memory by class and step time). Stage 2 refines the best meshes as map §5.3 does:

  1. the intra-op ILP (planlang.solve.intra_op, the plan's fixed specs as constraints) solved at memory
     budgets (1 + α)^n · M, n = 0 .. 9 (M the plan's budget), from the tightest up to the budget where
     the unconstrained optimum fits: each distinct set of specs is a candidate. A looser budget buys a
     faster sharding whose activations no longer fit; the checkpoint stage then wins the memory back;
  2. for each: microbatches by step time, the smallest ZeRO stage that fits, the pipeline partition
     (min–max over flops, over saved activations, or SageMaker's tree partition, each priced), and —
     when the plan still does not fit — rotor's checkpointing DP (planlang.solve.checkpoint_plan) on the
     local model's chain of blocks with what the budget leaves for activations;
  3. the fastest candidate within the budget (or the least memory / the product, by objective).

Every candidate is a plan text that `planlang check` accepts, so what is written is what was priced.
A candidate's step time is the estimator's, or — when the caller passes `comm_time` (the CLI passes the
runtime's per-step traffic, planlang.runtime.traffic, through this hook so the solve layer does not
import the runtime) — the estimator's compute plus that communication. Deterministic: candidates are
enumerated and ties broken in a fixed order.

Anytime (`time_limit`): the search first prices a seed — the first mesh at the defaults, and when that
is over budget the same mesh at its leanest — whatever the limit, so that it always holds a complete
plan. A candidate is not started once the limit has passed or would pass while it is priced (the median
of the last ones); the search then ends with the best plan priced so far, `Result.cut` and the header
saying what was left unexplored (Infeasible says so too when nothing priced fits). An intra-op ILP call
the limit cuts keeps HiGHS's incumbent: that spec set is priced once past the limit.
"""
from __future__ import annotations

import itertools
import math
import textwrap
import time
from dataclasses import dataclass, field
from typing import Callable

from planlang.cost.comm import Collective, price
from planlang.lang import ast as A
from planlang.lang.render import render
from planlang.plan import types as T
from planlang.plan.checkpoints import checkpoint_groups
from planlang.plan.checker import check_file, check_text
from planlang.plan.complete import CompletePlan, complete
from planlang.plan.data import batch_axes, batch_dim, data_axes
from planlang.solve.checkpoint_plan import (NoChain, activation_budget, choose_checkpoints, leanest_checkpoints,
                                            no_recompute_peak, plan_chain, repeated_blocks)
from planlang.solve.holes import Fill, HoleOutsidePlan, fill_holes
from planlang.solve.progress import Reporter, reporter

OBJECTIVES = ("time", "memory", "balanced")


class SolveError(ValueError):
    """The plan cannot be solved (message names the cause and the fix)."""


# the codes `planlang solve` reports: no candidate fits the budget (the checker's over-budget code), and
# a search --time-limit stopped (the plan written is the best priced before it)
INFEASIBLE = "PL560"
SEARCH_CUT = "PL561"


class Infeasible(SolveError):
    def __init__(self, message: str, smallest_budget: int | None, cut: str | None = None) -> None:
        super().__init__(message)
        self.smallest_budget = smallest_budget
        self.cut = cut  # what the time limit left unexplored, when it cut the search


class _Cut(BaseException):
    """The search reached --time-limit. Internal: `_Search.run` ends the search there with the best plan
    priced so far. A BaseException, so the `except Exception` around candidates that may fail does not
    take it for one."""


@dataclass(frozen=True)
class Candidate:
    choices: tuple[tuple[str, str], ...]  # (what, value) in a fixed order, for tables and tie-breaks
    text: str
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


@dataclass
class Result:
    text: str
    best: Candidate
    tried: list[Candidate]
    notes: list[str]
    summary: list[str] = field(default_factory=list)  # the header written into `text`, without its `# `
    cut: str | None = None  # None when the search ran to the end, else what --time-limit left unexplored


# ------------------------------------------------------------------------------ holes of a plan
@dataclass
class _Holes:
    axes: list[tuple[str, T.Hole]] = field(default_factory=list)
    zero: T.Hole | None = None
    zero_axis: T.Hole | None = None
    micro: T.Hole | None = None
    stages: T.Hole | None = None
    # whole-spec holes (`shard P : ?`) and specs with `?` entries (`[_, ?]`), one per statement written
    specs: list[tuple[T.ShardRule, T.Hole | T.Spec]] = field(default_factory=list)
    checkpoint: T.Hole | None = None
    # `data X : ?` and `data X : [?, _]`: the statement and its holes, (dim, hole), dim -1 for the whole spec
    data: list[tuple[T.DataSpec, list[tuple[int, T.Hole]]]] = field(default_factory=list)
    pp_axis: T.Hole | None = None
    schedule: T.Hole | None = None
    chunks: T.Hole | None = None
    degrees: list[tuple[int, str, T.Hole]] = field(default_factory=list)  # (stage, axis, hole)
    every: list[T.Hole] = field(default_factory=list)  # `every ?`, a template's int argument `?` among them
    arguments: list[T.Hole] = field(default_factory=list)  # `apply t(?)` in the plan file, not an `every`
    unsupported: list[T.Hole] = field(default_factory=list)


def _key(hole: T.Hole) -> tuple[str, int]:
    return (hole.span.file, hole.span.start)


def _apply_holes(module) -> list:
    """The `?` arguments of every `apply` in a parsed plan file (at the top level, in `for` bodies and
    in template bodies)."""
    out = []

    def walk(stmts) -> None:
        for st in stmts:
            if isinstance(st, A.ApplyStmt):
                out.extend(a for a in (st.args or ()) if isinstance(a, A.Hole))
            elif isinstance(st, (A.ForStmt, A.TemplateDecl)):
                walk(st.body)

    walk(module.statements if module is not None else ())
    return out


def classify(plan: T.Plan, sources: dict | None = None, module=None) -> _Holes:
    """The plan's holes by what fills them. `sources` (path -> source file) tells a `?` written in a spec
    from an entry a template parameter given `?` left open; `module` (the plan file's parse) gives the
    `apply` arguments written `?`."""
    h = _Holes()
    known: set[int] = set()

    def literal(hole: T.Hole) -> bool:  # the hole is a `?` as written (not a parameter bound to `?`)
        src = (sources or {}).get(hole.span.file)
        return src is None or src.text[hole.span.start:hole.span.end].strip() == "?"

    if plan.mesh:
        for a in plan.mesh.axes:
            if T.is_hole(a.size):
                h.axes.append((a.name, a.size))  # type: ignore[arg-type]
                known.add(id(a.size))
    if plan.optimizer:
        if T.is_hole(plan.optimizer.zero_stage):
            h.zero = plan.optimizer.zero_stage  # type: ignore[assignment]
            known.add(id(h.zero))
        if T.is_hole(plan.optimizer.zero_axis):
            h.zero_axis = plan.optimizer.zero_axis  # type: ignore[assignment]
            known.add(id(h.zero_axis))
    for d in plan.data:
        if T.is_hole(d.spec):
            h.data.append((d, [(-1, d.spec)]))  # type: ignore[list-item]
            known.add(id(d.spec))
        elif d.spec.has_holes:
            h.data.append((d, [(i, x) for i, x in enumerate(d.spec.dims) if T.is_hole(x)]))  # type: ignore[misc]
            known.update(id(x) for x in d.spec.dims if T.is_hole(x))
    p = plan.pipeline
    if p is not None:
        for name, x in (("pp_axis", p.axis), ("schedule", p.schedule), ("micro", p.microbatches), ("stages", p.stages)):
            if T.is_hole(x):
                setattr(h, name, x)
                known.add(id(x))
        if isinstance(p.schedule, T.Schedule) and T.is_hole(p.schedule.chunks):
            h.chunks = p.schedule.chunks  # type: ignore[assignment]
            known.add(id(h.chunks))
        if not T.is_hole(p.stages):
            for st in p.stages:  # type: ignore[union-attr]
                for ax, v in st.degrees:
                    if T.is_hole(v):
                        h.degrees.append((st.index, ax, v))  # type: ignore[arg-type]
                        known.add(id(v))
    every_seen: set[tuple[str, int]] = set()
    for g in plan.checkpoints:
        if T.is_hole(g.every):
            if _key(g.every) not in every_seen:  # type: ignore[arg-type]
                every_seen.add(_key(g.every))  # type: ignore[arg-type]
                h.every.append(g.every)  # type: ignore[arg-type]
            known.add(id(g.every))
    h.arguments = [T.Hole("template argument", span=a.span) for a in _apply_holes(module)
                   if (a.span.file, a.span.start) not in every_seen]
    seen_spans = set()
    for r in plan.shards:
        spec = r.spec
        if T.is_hole(spec) or spec.has_holes:  # type: ignore[union-attr]
            entries = [spec] if T.is_hole(spec) else [x for x in spec.dims if T.is_hole(x)]  # type: ignore[union-attr]
            mine = [x for x in entries if literal(x)]
            if mine and (spec.span.start, spec.span.file) not in seen_spans:  # type: ignore[union-attr]
                seen_spans.add((spec.span.start, spec.span.file))  # type: ignore[union-attr]
                h.specs.append((r, spec))  # type: ignore[arg-type]
            known.update(id(x) for x in mine)
            if h.arguments:  # entries a template parameter given `?` left open: the argument fills them
                known.update(id(x) for x in entries if not literal(x))
    if plan.checkpoint_hole is not None:
        h.checkpoint = plan.checkpoint_hole
        known.add(id(h.checkpoint))
    h.unsupported = [x for x in plan.holes() if id(x) not in known]
    return h


def factorizations(n: int, k: int) -> list[tuple[int, ...]]:
    """Ordered k-tuples of positive integers with product n, in lexicographic order."""
    if k == 0:
        return [()] if n == 1 else []
    out = []
    for d in range(1, n + 1):
        if n % d == 0:
            out += [(d,) + rest for rest in factorizations(n // d, k - 1)]
    return out


# ------------------------------------------------------------------------------ the search
PP_AXIS, SCHEDULE, CHUNKS, DATA_AXES, DEGREES = (  # choices besides axis sizes (a space: no axis is named so)
    "pipeline axis", "pipeline schedule", "schedule chunks", "data axes", "stage degrees")
ALPHA = 0.25  # map §5.3's expansion coefficient: budgets M, 1.25 M, ..., 1.25^9 M (about 7.5 M)
SWEEP = 10
MAX_SPEC_SETS = 3  # spec sets of the sweep refined per mesh (each costs a round of estimates)
REFINED = 4  # meshes stage 2 refines: the stage-1 ranking prices replicated specs, which hides what
#             tensor parallelism gains, so more than the top two go on


class _Search:
    def __init__(self, path: str, objective: str, progress: Callable[[str], None] | Reporter,
                 comm_time: Callable[[CompletePlan], float] | None = None, alpha: float = ALPHA,
                 time_limit: float | None = None, started: float | None = None) -> None:
        self.t0 = time.monotonic() if started is None else started
        self.deadline = None if time_limit is None else self.t0 + time_limit
        self.time_limit = time_limit
        self._seeding = False  # the anytime seed is priced whatever the time limit
        self._overrun = 0  # candidates still priced past the deadline (a cut ILP's incumbent)
        self._durations: list[float] = []  # seconds each priced candidate took (to stop before the limit)
        self._where: dict = {"stage": 0}  # where the search is, for the cut's account of what it left

        self.path = path
        self.objective = objective
        self.report = reporter(progress)
        self.progress = self.report.message
        self.comm_time = comm_time
        self.alpha = alpha
        res = check_file(path)
        if res.errors or res.plan is None:
            raise SolveError(f"{path} has errors; fix them first:\n"
                             + render(list(res.diagnostics), res.sources, "concise"))
        self.plan = res.plan
        self.source = res.sources[path].text if path in res.sources else open(path).read()
        if self.plan.model is None:
            raise SolveError(f"{path} declares no model; `solve` needs one to price plans")
        if self.plan.mesh is None:
            raise SolveError(f"{path} has no mesh")
        self.holes = classify(self.plan, res.sources, res.modules.get(path))
        if self.holes.unsupported:
            where = ", ".join(f"{x.what} at {x.span.line}:{x.span.col}" for x in self.holes.unsupported)
            raise SolveError(f"solve does not fill these holes yet: {where}; write their values")
        self.tried: list[Candidate] = []
        self.notes: list[str] = []
        self._parts = None
        self._priced: dict[str, Candidate | None] = {}
        self._graph = None
        self._int_arguments = {i for i, x in enumerate(self.holes.arguments) if self._takes_int(x)}
        # the choices besides axis sizes a candidate carries (assign's keys; each has a space, no axis does)
        h = self.holes
        self.outer_keys = ([PP_AXIS] if h.pp_axis else []) + ([SCHEDULE] if h.schedule else []) + \
            ([CHUNKS] if h.chunks else []) + ([DATA_AXES] if self._data_choice() else [])
        self.inner_keys = ([DEGREES] if h.degrees else []) + [f"every {i}" for i in range(len(h.every))] + \
            [f"argument {i}" for i in range(len(h.arguments))]

    # -- pricing
    def price(self, fills: dict[str, Fill], choices: tuple[tuple[str, str], ...]) -> Candidate | None:
        # lazy: torch loads only when this runs
        from planlang.model.estimate import estimate_plan

        text = fill_holes(self.source, self.path, list(fills.values()))
        if text in self._priced:  # the same plan reached by another route: priced once
            return self._priced[text]
        self.check_deadline(self._pricing_time())
        started = time.monotonic()
        self._priced[text] = None
        res = check_text(text, self.path)
        if res.errors or res.plan is None:
            return None
        left = res.plan.holes()  # none: classify refused the holes it cannot fill
        if left:
            where = ", ".join(f"{x.what} at {x.span.line}:{x.span.col}" for x in left)
            raise SolveError(f"solve does not fill these holes yet: {where}; write their values")
        plan = complete(res.plan)
        try:
            rows = estimate_plan(plan)
        except Exception as e:  # noqa: BLE001 - a candidate the model cannot run: skip it, say why
            self.notes.append(f"skipped {', '.join(f'{k}={v}' for k, v in choices)}: {type(e).__name__}: {e}")
            return None
        budget = plan.budget.bytes if plan.budget is not None else None
        peak = max(r.peak for r in rows)
        steps = self.step_times(plan, rows)
        c = Candidate(choices, text, peak, max(steps), budget is None or peak <= budget, tuple(rows), steps)
        self.tried.append(c)
        self._priced[text] = c
        self._durations.append(time.monotonic() - started)
        self.report.priced(c, self.best(self.tried))
        return c

    def _pricing_time(self) -> float:
        """What pricing one more candidate is expected to take: the median of the last five priced (the
        first, which builds the model, aside once there are others)."""
        last = sorted(self._durations[1:][-5:] or self._durations[:1])
        return last[len(last) // 2] if last else 0.0

    def check_deadline(self, need: float = 0.0) -> None:
        """Raise _Cut once --time-limit has passed, or would pass in the `need` seconds the next step is
        expected to take (not while the anytime seed is priced; a cut ILP's incumbent is priced once
        past it)."""
        if self.deadline is None or self._seeding or time.monotonic() + need <= self.deadline:
            return
        if self._overrun > 0:
            self._overrun -= 1
            return
        raise _Cut()

    def step_time(self, plan: CompletePlan, rows) -> float:
        """The slowest device's step (see step_times)."""
        return max(self.step_times(plan, rows))

    def step_times(self, plan: CompletePlan, rows) -> tuple[float, ...]:
        """Each device class's step: the estimator's, or its compute plus the caller's per-step
        communication (`comm_time`) in place of the estimator's data-parallel all-reduce."""
        steps = tuple(r.step_time for r in rows)
        if self.comm_time is None:
            return steps
        try:
            comm = self.comm_time(plan)
        except Exception as e:  # noqa: BLE001 - e.g. a pipeline plan the traffic model does not lower
            self.notes.append(f"communication of one candidate not predicted ({type(e).__name__}: {e}); "
                              "its step time is the estimator's")
            return steps
        return tuple(r.step_time - _estimated_sync(plan, r) + comm for r in rows)

    def best(self, cands) -> Candidate | None:
        cands = [c for c in cands if c is not None]
        return min(cands, key=lambda c: c.key(self.objective)) if cands else None

    # -- defaults and options
    def device_count(self) -> int:
        mesh = self.plan.mesh
        fixed = math.prod(a.size for a in mesh.axes if not T.is_hole(a.size))  # type: ignore[misc]
        if mesh.device_count is not None:
            if mesh.device_count % fixed:
                raise SolveError(f"the fixed axis sizes ({fixed}) do not divide the mesh's {mesh.device_count} devices")
            return mesh.device_count // fixed
        if self.holes.axes:
            raise SolveError("the mesh leaves axis sizes `?` but not its device count; write `of N x DEVICE`")
        return 1

    def mesh_options(self) -> list[dict]:
        """Stage 1's candidates: each factorization of the devices over the `?` axes, times the choices
        that shape the rest of the search (pipeline axis, schedule, chunks, data axes), each with the
        other discrete choices at their defaults."""
        names = [n for n, _ in self.holes.axes]
        out = []
        for sizes in factorizations(self.device_count(), len(names)):
            for extra in self._outer_options(dict(zip(names, sizes))):
                assign = {**dict(zip(names, sizes)), **extra}
                if self._batch_divides(assign):
                    assign.update(self._inner_defaults(assign))
                    out.append(assign)
        return out

    def _batch_divides(self, assign: dict) -> bool:
        batch = {i.name: i.shape[batch_dim(i)] for i in self.plan.inputs if i.shape}
        return all(batch.get(inp, 1) % math.prod(self.size_of(assign, a) for a in axes) == 0
                   for inp, axes in self.input_data_axes(assign).items())

    def size_of(self, assign: dict, axis: str | None) -> int:
        for a in self.plan.mesh.axes:
            if a.name == axis:
                return assign.get(axis, a.size) if T.is_hole(a.size) else a.size  # type: ignore[return-value]
        return 1

    # the choices a hole other than an axis size adds to a candidate (keys of `assign`)
    def pp_axis(self, assign: dict) -> str | None:
        p = self.plan.pipeline
        if p is None:
            return None
        return assign.get(PP_AXIS) if T.is_hole(p.axis) else p.axis  # type: ignore[return-value]

    def schedule_of(self, assign: dict) -> tuple[str, int]:
        """The pipeline's schedule and chunks per rank (1 unless interleaved)."""
        p = self.plan.pipeline
        if p is None:
            return "", 1
        if T.is_hole(p.schedule):
            words = str(assign.get(SCHEDULE, "1f1b")).split()
            return words[0], int(words[2]) if len(words) == 3 else 1
        kind = p.schedule.kind  # type: ignore[union-attr]
        chunks = p.schedule.chunks  # type: ignore[union-attr]
        if T.is_hole(chunks):
            chunks = int(assign.get(CHUNKS, 2))
        return kind, chunks if kind == "interleaved" else 1  # type: ignore[return-value]

    def _written_axes(self) -> set[str]:
        """Axes a written spec uses: a parameter's, or an activation's on a dim other than the batch."""
        used: set[str] = set()
        for r in self.plan.shards:
            if isinstance(r.spec, T.Spec):
                dims = r.spec.dims if r.kind == "param" else r.spec.dims[1:]
                used.update(a for d in dims if not T.is_hole(d) for a in d)  # type: ignore[union-attr]
                used.update(r.spec.partial)
        return used

    def _data_choice(self) -> bool:
        """Is the batch split a choice: a `data` statement with a hole at the batch dim."""
        for d, holes in self.holes.data:
            bd = batch_dim(self.plan.input(d.input))
            if any(dim in (-1, bd) for dim, _ in holes):
                return True
        return False

    def input_data_axes(self, assign: dict) -> dict[str, tuple[str, ...]]:
        """Each `data` statement's input -> the axes its batch dim is split over (written or chosen)."""
        out = dict(batch_axes(self.plan))
        chosen = _axes_of_text(assign[DATA_AXES]) if DATA_AXES in assign else ()
        for d, _ in self.holes.data:
            out.setdefault(d.input, chosen)
        return out

    def data_axes_of(self, assign: dict) -> tuple[str, ...]:
        axes = {a for split in self.input_data_axes(assign).values() for a in split}
        return tuple(a for a in self.plan.mesh.names if a in axes)

    def _outer_options(self, sizes: dict) -> list[dict]:
        h, p = self.holes, self.plan.pipeline
        mesh = self.plan.mesh
        size = {a.name: self.size_of(sizes, a.name) for a in mesh.axes}
        pps: list[str | None] = [None]
        if h.pp_axis is not None:  # not an axis a written spec or data split uses (PL308)
            banned = self._written_axes() | {a for split in batch_axes(self.plan).values() for a in split}
            free = [a for a in mesh.names if a not in banned]
            pps = [a for a in free if size[a] > 1] or free[:1]  # type: ignore[assignment]
        schedules: list[str | None] = ["1f1b", "gpipe", "interleaved chunks 2"] if h.schedule is not None else [None]
        chunks: list[str | None] = ["2", "3", "4"] if h.chunks is not None else [None]
        out = []
        for pp in pps:
            for sched in schedules:
                for c in chunks:
                    extra: dict = {}
                    if pp is not None:
                        extra[PP_AXIS] = pp
                    if sched is not None:
                        extra[SCHEDULE] = sched
                    if c is not None:
                        extra[CHUNKS] = c
                    k = self.size_of(sizes, pp or self.pp_axis(sizes)) * self.schedule_of(extra)[1]
                    written = p.stages if p is not None and isinstance(p.stages, tuple) else None
                    if written is not None and k != len(written):
                        continue  # the stages written fix the stage count (PL401)
                    if DATA_AXES in self.outer_keys:
                        out += [{**extra, DATA_AXES: t} for t in self._data_options({**sizes, **extra})]
                    else:
                        out.append(extra)
        return out

    def _data_options(self, assign: dict) -> list[str]:
        """The data axes' candidates: every set (in mesh order) of axes of size > 1 that are not the
        pipeline's, not used by a written spec nor on another dim of a `data` spec; or none."""
        written = batch_axes(self.plan)
        if written:  # every input splits its batch over the same axes: one input's written split fixes it
            return [_axes_text(next(iter(written.values())))]
        banned = self._written_axes() | {self.pp_axis(assign)}
        for d, _ in self.holes.data:
            if isinstance(d.spec, T.Spec):
                banned.update(d.spec.used_axes())
        free = [a for a in self.plan.mesh.names if a not in banned and self.size_of(assign, a) > 1]
        sets = [c for n in range(len(free), -1, -1) for c in itertools.combinations(free, n)]
        return [_axes_text(c) for c in sets]

    def _inner_defaults(self, assign: dict) -> dict:
        """The values the main search holds the other discrete choices at: each stage's degree at the
        mesh's size (when that adds up), `every 1`, a template argument at the first axis that is neither
        the pipeline's nor a data axis."""
        out: dict = {}
        if self.holes.degrees:
            opts = self._degree_options(assign)
            same = ",".join(str(self.size_of(assign, ax)) for _, ax, _ in self.holes.degrees)
            out[DEGREES] = same if same in opts or not opts else opts[0]
        for i in range(len(self.holes.every)):
            out[f"every {i}"] = "1"
        for i in range(len(self.holes.arguments)):
            out[f"argument {i}"] = self._argument_options(i, assign)[0]
        return out

    def _degree_options(self, assign: dict) -> list[str]:
        """Per-stage degrees for the `with AXIS = ?` holes (in their order, comma-joined): divisors of the
        device count whose stages' devices add up to the mesh (PL410)."""
        p, h = self.plan.pipeline, self.holes
        mesh = self.plan.mesh
        total = math.prod(self.size_of(assign, a.name) for a in mesh.axes)
        pp = self.pp_axis(assign)
        divisors = [d for d in range(1, total + 1) if total % d == 0]
        out = []
        for values in itertools.islice(itertools.product(divisors, repeat=len(h.degrees)), 4096):
            chosen = {(st, ax): v for (st, ax, _), v in zip(h.degrees, values)}
            devices = 0
            for st in p.stages:  # type: ignore[union-attr]
                given = dict(st.degrees)
                devices += math.prod(chosen.get((st.index, a.name), given.get(a.name, self.size_of(assign, a.name)))
                                     for a in mesh.axes if a.name != pp)  # type: ignore[misc]
            if devices == total:
                out.append(",".join(map(str, values)))
        return out

    def _argument_options(self, i: int, assign: dict) -> list[str]:
        """A template's `?` argument: the mesh's axes but the pipeline's, those that are not data axes
        first (an int parameter: 1, 2, 4)."""
        if i in self._int_arguments:
            return ["1", "2", "4"]
        pp, data = self.pp_axis(assign), set(self.data_axes_of(assign))
        axes = [a for a in self.plan.mesh.names if a != pp]
        first = [a for a in axes if a not in data and self.size_of(assign, a) > 1]
        return first + [a for a in axes if a not in first]

    def _takes_int(self, hole: T.Hole) -> bool:
        """Does the template parameter given this `?` take an int (an axis name there is PL207)?"""
        q = self.source.rfind("?", hole.span.start, hole.span.end)
        if q < 0 or self.plan.mesh is None:
            return False
        res = check_text(self.source[:q] + self.plan.mesh.names[0] + self.source[q + 1:], self.path)
        return any(d.code == "PL207" for d in res.diagnostics)

    def _every_options(self, i: int, cand: Candidate) -> list[str]:
        """`every ?`: each divisor of the number of modules a group statement selects, when every group
        it cuts lies inside one pipeline stage of the candidate."""
        facts = self.parts().facts
        names, order = list(facts.all_modules), list(facts.order)
        hole = self.holes.every[i]
        groups = [g for g in self.plan.checkpoints
                  if isinstance(g.every, T.Hole) and _key(g.every) == _key(hole)]
        runs = checkpoint_groups([_with_every(g, None) for g in groups], names, order)
        n = max((len(r) for r in runs), default=1)
        stage_sets: list[list[str]] = []
        plan = check_text(cand.text, self.path).plan
        if plan is not None and plan.pipeline is not None and isinstance(plan.pipeline.stages, tuple):
            stage_sets = [[m for sel in st.modules for m in sel.select(names)] for st in plan.pipeline.stages]

        def stage(m: str) -> int:
            return next((k for k, ms in enumerate(stage_sets) if any(m == s or m.startswith(s + ".") for s in ms)), -1)

        out = []
        for k in range(1, n + 1):
            if n % k:
                continue
            cut = checkpoint_groups([_with_every(g, k) for g in groups], names, order)
            if all(len({stage(m) for m in grp}) <= 1 for grp in cut):
                out.append(str(k))
        return out or ["1"]

    def inner_options(self, key: str, cand: Candidate) -> list[str]:
        assign = self._assign_of(cand.choices)
        if key == DEGREES:
            return self._degree_options(assign)
        if key.startswith("every "):
            return self._every_options(int(key.split()[1]), cand)
        return self._argument_options(int(key.split()[1]), assign)

    def _assign_of(self, choices) -> dict:
        keys = set(self.outer_keys) | set(self.inner_keys)
        out: dict = {}
        for k, v in choices:
            if k.startswith("axis "):
                out[k[len("axis "):]] = int(v)
            elif k in keys:
                out[k] = v
        return out

    def local_batch(self, assign: dict) -> int:
        b = min((i.shape[batch_dim(i)] for i in self.plan.inputs if i.shape), default=1)
        for a in self.data_axes_of(assign):
            b //= self.size_of(assign, a)
        return max(b, 1)

    def micro_options(self, assign: dict) -> list[int]:
        pp = self.size_of(assign, self.pp_axis(assign))
        kind, chunks = self.schedule_of(assign)
        lb = self.local_batch(assign)
        opts = [m for m in range(1, lb + 1) if lb % m == 0 and m >= pp * max(chunks, 1)
                and (kind != "interleaved" or m % pp == 0)]  # interleaved: a multiple of the ranks (PL402)
        return opts or [lb]

    def parts(self):
        if self._parts is None:
            # lazy: torch loads only when this runs
            from planlang.solve.pipeline_stages import plan_layers

            self._parts = plan_layers(self.plan, divide=1)
        return self._parts

    STAGE_METHODS = ("flops", "activations", "tree")

    def stage_text(self, assign: dict, micro: int, method: str = "flops") -> str:
        """Stage lines for the pipeline hole: the min–max partition of per-layer flops or saved
        activations (planlang.solve.partition), or SageMaker's tree partition of the module hierarchy."""
        # lazy: torch loads only when this runs
        from planlang.solve.pipeline_stages import balanced_stages, tree_stages

        k = self.size_of(assign, self.pp_axis(assign)) * max(self.schedule_of(assign)[1], 1)
        if method == "tree":
            choices = tree_stages(self.plan, k, parts=self.parts())
        else:
            choices = balanced_stages(self.plan, k, cost=method, parts=self.parts())
        return "\n" + "\n".join(str(c) for c in choices) + "\n"

    def base_fills(self, assign: dict, micro: int | None, zero: int, specs: dict[int, str],
                   ckpt: str | None, stages: str = "flops") -> dict[str, Fill]:
        h = self.holes
        fills: dict[str, Fill] = {}
        for name, hole in h.axes:
            fills[f"axis {name}"] = Fill(hole, str(assign[name]))
        for key, hole in ((PP_AXIS, h.pp_axis), (SCHEDULE, h.schedule), (CHUNKS, h.chunks)):
            if hole is not None:
                fills[key] = Fill(hole, str(assign[key]))
        for j, (d, holes) in enumerate(h.data):
            inp = self.plan.input(d.input)
            bd, axes = batch_dim(inp), _axes_text(self.input_data_axes(assign).get(d.input, ()))
            for dim, hole in holes:
                if dim < 0:  # the whole spec: the batch dim over the data axes, the others whole
                    rank = len(inp.shape) if inp is not None else 1
                    text = "[" + ", ".join(axes if i == bd else "_" for i in range(rank)) + "]"
                else:
                    text = axes if dim == bd else "_"
                fills[f"data {j} {dim}"] = Fill(hole, text)
        if h.degrees:
            for (_, _, hole), v in zip(h.degrees, str(assign[DEGREES]).split(",")):
                fills[f"degree {_key(hole)}"] = Fill(hole, v)
        for i, hole in enumerate(h.every):
            fills[f"every {i}"] = Fill(hole, str(assign[f"every {i}"]))
        for i, hole in enumerate(h.arguments):
            fills[f"argument {i}"] = Fill(hole, str(assign[f"argument {i}"]))
        if h.zero is not None:
            fills["zero"] = Fill(h.zero, str(zero))
        if h.zero_axis is not None:
            fills["zero axis"] = Fill(h.zero_axis, self._data_axis(assign))
        if h.micro is not None:
            fills["microbatches"] = Fill(h.micro, str(micro))
        if h.stages is not None:
            fills["stages"] = Fill(h.stages, self.stage_text(assign, micro or 1, stages))
        for k, (rule, hole) in enumerate(h.specs):
            text = specs.get(k, _replicated_text(len(self._shape_of(rule))))
            if T.is_hole(hole):
                fills[f"spec {k}"] = Fill(hole, text)
            else:  # a spec with `?` entries: each entry from the chosen spec
                entries = _entries_of(text)
                for d, x in enumerate(hole.dims):  # type: ignore[union-attr]
                    if T.is_hole(x) and self._literal(x):
                        fills[f"spec {k} {d}"] = Fill(x, entries[d])
        if h.checkpoint is not None:
            fills["checkpoint"] = Fill(h.checkpoint, ckpt) if ckpt else \
                Fill(h.checkpoint, "", drop_line="checkpoint: none (planlang solve: the plan fits without recomputation)")
        return fills

    def _literal(self, hole: T.Hole) -> bool:
        return hole.span.file != self.path or self.source[hole.span.start:hole.span.end].strip() == "?"

    def _data_axis(self, assign: dict) -> str:
        axes = self.data_axes_of(assign)
        return axes[0] if axes else self.plan.mesh.names[0]

    def _shape_of(self, rule: T.ShardRule) -> tuple[int, ...]:
        """The global shape of what a rule shards: its (first) parameter, or the module's output or input."""
        facts = self.parts().facts
        if rule.kind == "param":
            hits = rule.target.select(list(facts.params))
            if not hits:
                raise SolveError(f"`{rule.target}` matches no parameter of the model")
            return tuple(facts.params[hits[0]][0])
        for m in rule.target.select(list(facts.all_modules)):
            call = facts.calls.get(m)
            shape = None if call is None else call.output if rule.kind == "output" else \
                (call.inputs[0] if call.inputs else None)
            if shape is not None:
                return tuple(shape)
        raise SolveError(f"`{rule.kind} of {rule.target}` matches no module the model runs")

    def spec_options(self, rule: T.ShardRule, assign: dict) -> list[str]:
        """Candidate specs: replicated, or one axis (not a data or the pipeline axis) splitting one dim it
        divides (an activation's batch dim aside: the data axes split it). A spec with `?` entries keeps
        its written entries; each `?` is `_` or an axis the spec does not use that divides its dim."""
        shape = self._shape_of(rule)
        skip = {self.pp_axis(assign)} | set(self.data_axes_of(assign))
        axes = [a for a in self.plan.mesh.names if a not in skip and self.size_of(assign, a) > 1]
        spec = next(s for r, s in self.holes.specs if r is rule)
        if T.is_hole(spec):
            first = 0 if rule.kind == "param" else 1
            opts = [_replicated_text(len(shape))]
            for a in axes:
                for d in range(first, len(shape)):
                    if shape[d] % self.size_of(assign, a) == 0:
                        opts.append("[" + ", ".join(a if i == d else "_" for i in range(len(shape))) + "]")
            return opts
        used = set(spec.used_axes())  # type: ignore[union-attr]
        per_dim: list[list[str]] = []
        for d, x in enumerate(spec.dims):  # type: ignore[union-attr]
            if not T.is_hole(x):
                per_dim.append([_axes_text(x)])  # type: ignore[arg-type]
            elif not self._literal(x):
                per_dim.append(["?"])  # a template argument's entry: the argument fills it
            else:
                n = shape[d] if d < len(shape) else 1
                per_dim.append(["_"] + [a for a in axes if a not in used and n % self.size_of(assign, a) == 0])
        opts = []
        for combo in itertools.product(*per_dim):
            holes = [e for e, x in zip(combo, spec.dims) if T.is_hole(x)]  # type: ignore[union-attr]
            named = [e for e in holes if e not in ("_", "?")]
            if len(named) == len(set(named)):
                tail = f" partial({', '.join(spec.partial)})" if spec.partial else ""  # type: ignore[union-attr]
                opts.append("[" + ", ".join(combo) + "]" + tail)
        return opts

    def ckpt_options(self) -> list[str]:
        """`every k` groups over the model's longest list of repeated blocks (pipeline plans, whose
        activations the chain of the whole model does not describe per stage)."""
        # lazy: torch loads only when this runs
        from planlang.model.checks import to_plan_name

        found = repeated_blocks([n for n in self.parts().facts.all_modules if n])
        if found is None:
            return []
        head, n = found
        sel = to_plan_name(head) + "[*]"
        return [f"{sel} every {k}" for k in (1, 2, 4) if k <= n] + [f"{sel}"]

    # -- the two stages
    def run(self) -> Result:
        try:
            return self._run()
        except HoleOutsidePlan as e:
            raise SolveError(str(e)) from e

    def _run(self) -> Result:
        meshes = self.mesh_options()
        if not meshes:
            raise SolveError("no factorization of the device count splits the batch evenly over the data axes")
        self.progress(f"stage 1: {len(meshes)} mesh candidates (the first builds and simulates the model on meta)")
        self.report.plan_work(len(meshes) + min(REFINED, len(meshes)))
        self._where = {"stage": 1, "meshes": meshes, "done": 0}
        finals: list[Candidate | None] = []
        ranked: list[Candidate] = []
        cut = None
        try:
            seeds = self.seed(meshes)
            coarse = []
            for i, assign in enumerate(meshes):
                micro = self.micro_options(assign)[0] if self.holes.micro is not None else None
                coarse.append(self.price_at(assign, micro, 0, {}, None))
                self._where["done"] = i + 1
                self.report.advance(f"stage 1: mesh {i + 2} of {len(meshes)}" if i + 1 < len(meshes) else "")
            ranked = sorted([c for c in coarse if c is not None], key=lambda c: c.key(self.objective))
            if not ranked:
                raise SolveError("no candidate plan could be priced: " + "; ".join(self.notes[-3:]))
            refined = ranked[:REFINED]
            self.report.plan_work(len(meshes) + len(refined))
            self._where = {"stage": 2, "meshes": meshes, "refined": [self._assign_of(c.choices) for c in refined],
                           "done": 0, "phase": ""}
            for i, c in enumerate(refined):
                assign = self._assign_of(c.choices)
                mesh = _mesh_words(assign)
                self.progress(f"stage 2: refining {mesh} (mesh {i + 1} of {len(refined)})")
                finals.append(self.refine(assign))
                self._where["done"] = i + 1
                self.report.advance()
            best = self.best(finals + ranked + seeds)
        except _Cut:
            cut = self.cut_account()
            best = self.best(self.tried)  # every candidate priced is a complete plan that checks
            if best is None:
                raise SolveError(f"{cut}; no candidate plan was priced before it: raise --time-limit") from None
        # lazy: torch loads only when this runs
        from planlang.model.estimate import format_bytes

        if not best.fits:
            smallest = min(self.tried, key=lambda c: c.peak)
            within = "" if cut is None else f" among the candidates priced before the cut ({cut})"
            raise Infeasible(f"no plan fits the budget{within}; the smallest peak found is "
                             f"{format_bytes(smallest.peak)} per device ({smallest}); raise the budget to at least "
                             "that or add devices" + ("" if cut is None else ", or raise --time-limit"),
                             smallest.peak, cut)
        header = [f"solved by `planlang solve --objective {self.objective}` ({len(self.tried)} candidate plans priced):"]
        steps = best.steps or tuple(r.step_time for r in best.rows)
        for r, step in zip(best.rows, steps):  # the step as the search priced it (with `comm_time`'s traffic)
            header.append(f"  {r.device}: peak {format_bytes(r.peak)} (parameters {format_bytes(r.parameters)}, "
                          f"activations {format_bytes(r.activations)}), step {step * 1e3:.2f} ms")
        if cut is not None:
            header += ["  " + line for line in textwrap.wrap(
                f"INCOMPLETE SEARCH: {cut}; this is the best plan priced before the cut", 106)]
        text = fill_holes(self.source, self.path, list(self._fills_of(best).values()), header)
        return Result(text, best, self.tried, self.notes, header, cut)

    def seed(self, meshes: list[dict]) -> list[Candidate | None]:
        """Anytime: a complete plan before anything else, priced whatever the time limit. The first mesh
        (in stage 1's order) that prices at the defaults; when that is over budget, the same mesh at its
        leanest as well (the most microbatches, ZeRO 3 or the highest stage that checks, every repeated
        block checkpointed), so that a cut search has a plan that fits when one is that easy to find."""
        out: list[Candidate | None] = []
        self._seeding = True
        try:
            for assign in meshes:
                micros = self.micro_options(assign) if self.holes.micro is not None else [None]
                first = self.price_at(assign, micros[0], 0, {}, None)
                if first is None:
                    continue
                out.append(first)
                if first.fits:
                    break
                ckpts = self.ckpt_options()[:1] if self.holes.checkpoint is not None else []
                zeros = (3, 1, 0) if self.holes.zero is not None else (0,)
                for zero in zeros:
                    for ckpt in ckpts or [None]:
                        lean = self.price_at(assign, micros[-1], zero, {}, ckpt)
                        out.append(lean)
                        if lean is not None:
                            break
                    if out[-1] is not None:
                        break
                break
        finally:
            self._seeding = False
        return out

    def cut_account(self) -> str:
        """What the time limit left unexplored: candidates priced, meshes priced and refined, and the
        choices not tried."""
        w = self._where
        meshes = w.get("meshes", [])
        said = [f"search cut by --time-limit {self.time_limit:g} s (at {time.monotonic() - self.t0:.1f} s) "
                f"after {len(self.tried)} candidate plans priced"]
        if w["stage"] <= 1:
            done = w.get("done", 0)
            said.append(f"stage 1 tried {done} of {len(meshes)} meshes" + _not_tried(meshes[done:], "not tried"))
            said.append(f"stage 2 (intra-op ILP specs, microbatches, stage partitions, ZeRO, checkpointing) "
                        f"refined none of up to {min(REFINED, len(meshes))} meshes")
        else:
            refined, done = w["refined"], w["done"]
            said.append(f"stage 1 tried all {len(meshes)} meshes")
            now = f"; cut while refining {_mesh_words(refined[done])}" + (f" at {w['phase']}" if w.get("phase") else "")
            said.append(f"stage 2 refined {done} of {len(refined)} meshes"
                        + (now if done < len(refined) else "") + _not_tried(refined[done + 1:], "not refined"))
        return "; ".join(said)

    def price_at(self, assign: dict, micro: int | None, zero: int, specs: dict[int, str], ckpt: str | None,
                 stages: str = "flops") -> Candidate | None:
        """The candidate of these choices, priced (None when it does not check or cannot be built)."""
        try:
            fills = self.base_fills(assign, micro, zero, specs, ckpt, stages)
        except SolveError:
            raise
        except Exception as e:  # noqa: BLE001 - e.g. more stages than the model has layers to cut
            what = ", ".join(f"{k}={v}" for k, v in _choices(assign, micro, zero, specs, ckpt, stages))
            self.notes.append(f"skipped {what}: {type(e).__name__}: {e}")
            return None
        return self.price(fills, _choices(assign, micro, zero, specs, ckpt, stages))

    def refine(self, assign: dict) -> Candidate:
        """Stage 2 for one mesh (map §5.3): for each spec set of the budget sweep, the other holes in
        turn — microbatches, pipeline partition, ZeRO, then checkpointing when it does not fit."""
        self.at("the intra-op ILP's budget sweep")
        sets = self.spec_sets(assign)
        cands = []
        for k, specs in enumerate(sets):
            self.at(f"spec set {k + 1} of {len(sets)}")
            cands.append(self.refine_specs(assign, specs))
        return self.best(cands)

    def at(self, phase: str, within: bool = False) -> None:
        """Where stage 2 is (`within` the current spec set), for the account of a cut search."""
        if self._where.get("stage") == 2:
            base = self._where["phase"].split(": ")[0] if within else ""
            self._where["phase"] = f"{base}: {phase}" if base else phase

    def refine_specs(self, assign: dict, specs: dict[int, str]) -> Candidate | None:
        h = self.holes

        def price(micro, zero, ckpt, stages):
            return self.price_at(assign, micro, zero, specs, ckpt, stages)

        micros = self.micro_options(assign) if h.micro is not None else [None]
        self.at("microbatches", within=True)
        cur = None
        for m in micros[:3]:
            cur = self.best([cur, price(m, 0, None, "flops")])
        if cur is None:
            return None
        ch = dict(cur.choices)
        micro = int(ch["microbatches"]) if ch["microbatches"] != "-" else None
        stages = "flops"
        if h.stages is not None:
            self.at("the pipeline partition", within=True)
            for method in self.STAGE_METHODS[1:]:
                try:
                    cur = self.best([cur, price(micro, 0, None, method)])
                except Exception as e:  # noqa: BLE001 - a partition the model's structure does not allow
                    self.notes.append(f"stage partition by {method} skipped: {e}")
            stages = dict(cur.choices)["stages"]
        zero = 0
        if h.zero is not None:
            self.at("ZeRO", within=True)
            for z in (0, 1, 2, 3):
                c = price(micro, z, None, stages)
                if c is not None and self.objective != "memory" and c.fits:
                    cur, zero = c, z
                    break
                cur = self.best([cur, c])
            zero = int(dict(cur.choices).get("zero", 0))
        if self.inner_keys:
            self.at(", ".join(self.inner_keys), within=True)
            cur = self.vary(cur)
            assign = self._assign_of(cur.choices)
        if h.checkpoint is not None and not cur.fits:
            self.at("checkpointing", within=True)
            cur = self.best([cur] + self.checkpointed(assign, micro, zero, specs, stages, cur))
        return cur

    def vary(self, cur: Candidate) -> Candidate:
        """The choices the main search held at defaults (stage degrees, `every ?`, template arguments),
        each in turn over its options with the rest of the candidate fixed, priced; the best kept."""
        for key in self.inner_keys:
            base = cur
            for value in self.inner_options(key, base):
                choices = tuple((k, value if k == key else v) for k, v in base.choices)
                if choices == base.choices:
                    continue
                try:
                    fills = self._fills_of(choices)
                except Exception as e:  # noqa: BLE001 - a choice the partition cannot build
                    self.notes.append(f"skipped {key}={value}: {type(e).__name__}: {e}")
                    continue
                cur = self.best([cur, self.price(fills, choices)])
        return cur

    def checkpointed(self, assign, micro, zero, specs, stages, base: Candidate) -> list[Candidate | None]:
        """Checkpoint candidates for a plan that does not fit: rotor's groups (planlang.solve.
        checkpoint_plan) for the activation budget the estimator leaves, tightened by the estimator's
        overshoot until the plan fits (three tries); pipeline plans and models without a chain of
        blocks take the `every k` grid."""
        # lazy: numpy loads only when this runs
        from planlang.solve.rotor import InfeasibleBudget as ChainTooBig

        def price(ckpt):
            return self.price_at(assign, micro, zero, specs, ckpt, stages)

        out: list[Candidate | None] = []
        budget = self.plan.budget.bytes if self.plan.budget is not None else None
        if self.plan.pipeline is None and budget is not None:
            try:
                plan = complete(check_text(base.text, self.path).plan)  # a priced candidate: no holes
                linear, head = plan_chain(plan)
                # the chain holds activations only: what the budget leaves after parameters, gradients,
                # optimizer states and buffers, and never more than the chain needs without recomputation
                room = min(activation_budget(max(base.rows, key=lambda r: r.peak), budget), no_recompute_peak(linear))
                over = base.peak - budget
                seen: set[tuple[str, ...]] = set()
                for _ in range(3):
                    try:
                        choice = choose_checkpoints(linear, max(room, 1), head)
                    except ChainTooBig as e:  # the leanest grouping, to report how close it comes
                        choice = leanest_checkpoints(linear, head, e.exact_min_budget)
                    self.progress(f"rotor: {choice} for {room / 2**20:.3g} MiB of activations "
                                  f"(+{choice.recompute_seconds * 1e3:.3g} ms recomputation)")
                    if choice.lines in seen:
                        break
                    seen.add(choice.lines)
                    c = price(choice.hole_text or None) if choice.lines else None
                    out.append(c)
                    if c is not None and c.fits or room <= 0:
                        break
                    over = c.peak - budget if c is not None else over
                    room -= max(over, 1)  # the estimator's overshoot comes off the chain's budget
                if any(c is not None and c.fits for c in out):
                    return out
            except (NoChain, ChainTooBig) as e:
                self.notes.append(f"rotor: {e}")
        for opt in self.ckpt_options():
            c = price(opt)
            out.append(c)
            if c is not None and c.fits:
                break
        return out

    # -- specs: the intra-op ILP over a budget sweep
    def spec_sets(self, assign: dict) -> list[dict[int, str]]:
        """Spec sets for the spec holes: the intra-op ILP's solutions at budgets (1 + α)^n · M (map
        §5.3), distinct ones in order of increasing budget, ending with the unconstrained optimum; a
        spec with `?` entries is restricted to the layouts that keep its written entries. If the ILP
        cannot run on this model, each hole's option the estimator prices best. Activation holes
        (`output of`, `input of`) and holes with one option are not the ILP's: each option is priced
        with the first set's parameter specs, and the best joins every set."""
        h = self.holes
        if not h.specs:
            return [{}]
        opts = {k: self.spec_options(rule, assign) for k, (rule, _) in enumerate(h.specs)}
        if all(len(o) == 1 for o in opts.values()):
            return [{k: o[0] for k, o in opts.items()}]
        params = [k for k, (rule, _) in enumerate(h.specs) if rule.kind == "param" and len(opts[k]) > 1]
        sets: list[dict[int, str]] | None = None
        if params:
            try:
                sets = self._ilp_spec_sets(assign, params)
            except Exception as e:  # noqa: BLE001 - fall back to pricing each option as a whole plan
                self.notes.append(f"intra-op ILP did not run ({type(e).__name__}: {e}); spec options priced by the "
                                  "estimator")
        if sets is None:
            specs: dict[int, str] = {}
            for k in params:
                specs[k] = self._priced_spec(k, assign, specs, opts[k])
            sets = [specs]
        for k in (k for k in range(len(h.specs)) if k not in params):
            sets[0][k] = opts[k][0] if len(opts[k]) == 1 else self._priced_spec(k, assign, sets[0], opts[k])
            for other in sets[1:]:
                other[k] = sets[0][k]
        return sets

    def _ilp_problem(self, assign: dict[str, int]):
        """The intra-op problem for this mesh (the graph is traced once per solve)."""
        # lazy: torch loads only when this runs
        from planlang.model.load import guess_targets, meta_inputs, plan_loss
        from planlang.model.opgraph import op_graph
        from planlang.solve.intra_op import build_problem, problem_args

        fills = self.base_fills(assign, self.micro_options(assign)[0] if self.holes.micro is not None else None,
                                0, {}, None)
        fills = {key: f for key, f in fills.items() if not key.startswith("spec ")}
        res = check_text(fill_holes(self.source, self.path, list(fills.values())), self.path)
        if res.errors or res.plan is None:
            raise SolveError("the candidate plan does not check")
        plan = res.plan
        if self._graph is None:
            model = self.parts().module
            inputs = meta_inputs(plan.inputs)
            loss = plan_loss(plan)
            targets = guess_targets(model, loss, inputs) if loss else None
            self._graph = op_graph(model, inputs, loss, targets) if targets is not None else op_graph(model, inputs)
        args = problem_args(plan, self._graph)
        budget = args.pop("budget")
        return build_problem(self._graph, **args), budget

    def _ilp_options(self):
        """Solver options: the time left before the solve's deadline bounds each ILP call."""

        # lazy: numpy loads only when this runs
        from planlang.solve.ilp import SolveOptions

        if self.deadline is None:
            return SolveOptions()
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise _Cut()
        return SolveOptions(time_limit=max(1.0, left))

    def _ilp_spec_sets(self, assign: dict, which: list[int]) -> list[dict[int, str]]:
        # lazy: numpy loads only when this runs
        from planlang.solve.ilp import InfeasibleBudget, SolveTimeout, solve as ilp_solve
        from planlang.solve.intra_op import decode

        def solve_ilp(instance, objective):
            try:
                result = ilp_solve(instance, objective, self._ilp_options())
            except SolveTimeout:  # bounded by the time left: the search's limit is reached
                raise _Cut() from None
            if result.status != "optimal":  # HiGHS's incumbent at the time limit: kept, priced, and said
                self._overrun = 1
                self.notes.append(f"intra-op ILP stopped at its time limit with a {result.status} solution "
                                  f"(objective {result.value:.4g}, bound {result.bound})")
                self.progress(self.notes[-1])
            return result

        def cut_short(found: list) -> None:
            """The limit came in the middle of the sweep: the solutions found so far (an incumbent
            among them) go on, and the first of them is priced past the limit."""
            if not found:
                raise _Cut()
            self._overrun = 1
            self.notes.append(f"intra-op ILP cut by --time-limit after {len(found)} solve(s); the first spec set "
                              "found is priced past the limit")
            self.progress(self.notes[-1])

        self.check_deadline()  # tracing the op graph and building the problem take seconds on a large model
        problem, budget = self._ilp_problem(assign)
        if self.objective != "time":
            # memory: min-memory-redundancy-ilp's objective (memory redundancy + α · volume, eq. 4–8);
            # balanced: the ILP's time × memory trade-off; neither needs the time objective's sweep. The
            # time objective's specs go on too: memory redundancy alone is indifferent between layouts
            # of equal size (a column split where Megatron's row split would do), and the estimator,
            # which prices whole plans, decides
            out = []
            for objective in (self.objective, "time"):
                try:
                    sol = decode(problem, solve_ilp(problem.instance.with_budget(
                        budget if objective != "time" else None), objective))
                except _Cut:
                    cut_short(out)
                    break
                specs = {k: self._spec_text(k, sol, assign) for k in which}
                self.progress(f"intra-op ILP ({objective}, {len(problem.kinds)} nodes): "
                              + ", ".join(f"{self.holes.specs[k][0].target} : {v}" for k, v in specs.items()))
                if specs not in out:
                    out.append(specs)
            return out
        free = decode(problem, solve_ilp(problem.instance.with_budget(None), "time"))
        sols = []
        if budget is not None:
            for n in range(SWEEP):
                b = budget * (1 + self.alpha) ** n
                if free.result.metrics.peak <= b:
                    break  # this budget and every larger one give the unconstrained optimum
                try:
                    sols.append((b, decode(problem, solve_ilp(problem.instance.with_budget(b), "time"))))
                except InfeasibleBudget:
                    continue
                except _Cut:
                    cut_short([free] + sols)
                    break
        sols.append((None, free))
        out: list[dict[int, str]] = []
        for b, sol in sols:
            specs = {k: self._spec_text(k, sol, assign) for k in which}
            where = "unconstrained" if b is None else f"budget {b / 2**30:.3g} GiB"
            self.progress(f"intra-op ILP ({where}, {len(problem.kinds)} nodes): "
                          + ", ".join(f"{self.holes.specs[k][0].target} : {v}" for k, v in specs.items())
                          + f"; {sol.result.metrics.time * 1e3:.3g} ms, peak {sol.result.metrics.peak / 2**20:.4g} MiB")
            if specs not in out:
                out.append(specs)
        if len(out) > MAX_SPEC_SETS:  # the tightest, the unconstrained optimum, and one between
            out = [out[0], out[len(out) // 2], out[-1]]
        return out

    def _spec_text(self, k: int, sol, assign: dict) -> str:
        rule, hole = self.holes.specs[k]
        hits = rule.target.select(list(sol.params))
        if not hits:
            raise SolveError(f"the ILP chose no spec for {rule.target}")
        spec = sol.params[hits[0]]
        # parameters stay whole over data and pipeline axes (ZeRO is the plan's way to shard over data)
        drop = set(self.data_axes_of(assign)) | {self.pp_axis(assign)}
        chosen = [tuple(a for a in spec.axes_of(d) if a not in drop) for d in range(spec.rank)]
        if T.is_hole(hole):
            return str(T.Spec(tuple(chosen)))
        used = set(hole.used_axes())  # type: ignore[union-attr]
        entries = []
        for d, x in enumerate(hole.dims):  # type: ignore[union-attr]
            if not T.is_hole(x):
                entries.append(_axes_text(x))  # type: ignore[arg-type]
            elif not self._literal(x):
                entries.append("?")
            else:
                entries.append(_axes_text(tuple(a for a in chosen[d] if a not in used)))
        tail = f" partial({', '.join(hole.partial)})" if hole.partial else ""  # type: ignore[union-attr]
        return "[" + ", ".join(entries) + "]" + tail

    def _priced_spec(self, k: int, assign: dict, fixed: dict[int, str], opts: list[str]) -> str:
        """Each option priced as a whole plan by the estimator; the best under the objective."""
        micro = self.micro_options(assign)[0] if self.holes.micro is not None else None
        priced = [(self.price_at(assign, micro, 0, {**fixed, k: opt}, None), i, opt) for i, opt in enumerate(opts)]
        priced = [(c.key(self.objective), i, opt) for c, i, opt in priced if c is not None]
        return min(priced)[2] if priced else opts[0]

    def _fills_of(self, choices) -> dict[str, Fill]:
        if isinstance(choices, Candidate):
            choices = choices.choices
        ch = dict(choices)
        assign = self._assign_of(choices)
        micro = int(ch["microbatches"]) if ch.get("microbatches", "-") != "-" else None
        specs = {int(k[len("spec "):]): v for k, v in ch.items() if k.startswith("spec ")}
        ckpt = ch.get("checkpoint")
        return self.base_fills(assign, micro, int(ch.get("zero", 0)), specs, None if ckpt in (None, "none") else ckpt,
                               ch.get("stages", "flops"))


def _estimated_sync(plan: CompletePlan, row) -> float:
    """The data-parallel gradient all-reduce the estimator adds to a row's step time (estimate._step_time:
    the stage's local parameter bytes over the data axes of size > 1)."""
    mesh = plan.mesh
    if mesh is None or mesh.device is None or not mesh.device.flops:
        return 0.0
    axes = data_axes(plan, trivial=False)
    if not axes:
        return 0.0
    opt = plan.optimizer
    zero = opt.zero_stage if opt else 0
    zero_n = (mesh.axis_size(opt.zero_axis) or 1) if opt and opt.zero_axis is not None else 1
    p_bytes = row.parameters * (zero_n if zero >= 3 else 1)
    return price(Collective.ALL_REDUCE, mesh, axes, p_bytes).seconds


def _mesh_words(assign: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in assign.items()) or "the mesh as written"


def _not_tried(assigns: list[dict], what: str, shown: int = 4) -> str:
    if not assigns:
        return ""
    words = " | ".join(_mesh_words(a) for a in assigns[:shown])
    more = f" and {len(assigns) - shown} more" if len(assigns) > shown else ""
    return f" ({what}: {words}{more})"


def _replicated_text(rank: int) -> str:
    return "[" + ", ".join("_" for _ in range(rank)) + "]"


def _axes_text(axes: tuple[str, ...]) -> str:
    """A spec entry: `_`, an axis, or a tuple of axes (major to minor)."""
    return "_" if not axes else axes[0] if len(axes) == 1 else "(" + ", ".join(axes) + ")"


def _axes_of_text(text: str) -> tuple[str, ...]:
    text = text.strip().strip("()")
    return tuple(a.strip() for a in text.split(",") if a.strip() and a.strip() != "_")


def _entries_of(spec_text: str) -> list[str]:
    """The entries of a spec's text (`[_, (dp, tp)] partial(tp)` -> `_`, `(dp, tp)`)."""
    inner = spec_text[spec_text.index("[") + 1:spec_text.rindex("]")]
    out, depth, cur = [], 0, ""
    for ch in inner:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return out + [cur.strip()] if cur.strip() else out


def _with_every(g: T.CheckpointGroup, every: int | None) -> T.CheckpointGroup:
    return T.CheckpointGroup(g.modules, every, per=g.per, span=g.span, origin=g.origin)


def _choices(assign, micro, zero, specs, ckpt, stages="flops") -> tuple[tuple[str, str], ...]:
    out = [(f"axis {k}" if " " not in k else k, str(v)) for k, v in assign.items()]
    out.append(("microbatches", "-" if micro is None else str(micro)))
    out.append(("stages", stages))
    out.append(("zero", str(zero)))
    out += [(f"spec {k}", v) for k, v in sorted(specs.items())]
    out.append(("checkpoint", ckpt or "none"))
    return tuple(out)


def solve(path: str, objective: str = "time", progress: Callable[[str], None] | Reporter = lambda s: None, *,
          comm_time: Callable[[CompletePlan], float] | None = None, alpha: float = ALPHA,
          time_limit: float | None = None, started: float | None = None) -> Result:
    """Fill every hole of the plan at `path` (see the module docstring). `comm_time(plan)`, when given,
    prices a candidate's per-step communication in seconds (the slowest device); `time_limit` bounds
    each intra-op ILP call by the seconds left and stops the search between candidates: the result is
    then the best plan priced so far (anytime), its `cut` and header say what was left unexplored, and
    Infeasible says the search was cut. The limit counts from `started` (a time.monotonic() value; the
    CLI passes its own start, so the limit bounds the whole command), else from the call. `progress` is
    a callable given each message and priced candidate as a line, or a planlang.solve.progress.Reporter."""
    if objective not in OBJECTIVES:
        raise SolveError(f"unknown objective {objective!r}; use one of {', '.join(OBJECTIVES)}")
    return _Search(path, objective, progress, comm_time, alpha, time_limit, started).run()

