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
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

from planlang.cost.comm import Collective, price
from planlang.lang.render import render
from planlang.plan import types as T
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


class Infeasible(SolveError):
    def __init__(self, message: str, smallest_budget: int | None) -> None:
        super().__init__(message)
        self.smallest_budget = smallest_budget


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


# ------------------------------------------------------------------------------ holes of a plan
@dataclass
class _Holes:
    axes: list[tuple[str, T.Hole]] = field(default_factory=list)
    zero: T.Hole | None = None
    zero_axis: T.Hole | None = None
    micro: T.Hole | None = None
    stages: T.Hole | None = None
    specs: list[tuple[T.ShardRule, T.Hole]] = field(default_factory=list)
    checkpoint: T.Hole | None = None
    unsupported: list[T.Hole] = field(default_factory=list)


def classify(plan: T.Plan) -> _Holes:
    h = _Holes()
    known: set[int] = set()
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
    p = plan.pipeline
    if p is not None:
        if T.is_hole(p.microbatches):
            h.micro = p.microbatches  # type: ignore[assignment]
            known.add(id(h.micro))
        if T.is_hole(p.stages):
            h.stages = p.stages  # type: ignore[assignment]
            known.add(id(h.stages))
    seen_spans = set()
    for r in plan.shards:
        if T.is_hole(r.spec) and (r.spec.span.start, r.spec.span.file) not in seen_spans:  # type: ignore[union-attr]
            seen_spans.add((r.spec.span.start, r.spec.span.file))  # type: ignore[union-attr]
            h.specs.append((r, r.spec))  # type: ignore[arg-type]
        if T.is_hole(r.spec):
            known.add(id(r.spec))
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
ALPHA = 0.25  # map §5.3's expansion coefficient: budgets M, 1.25 M, ..., 1.25^9 M (about 7.5 M)
SWEEP = 10
MAX_SPEC_SETS = 3  # spec sets of the sweep refined per mesh (each costs a round of estimates)
REFINED = 4  # meshes stage 2 refines: the stage-1 ranking prices replicated specs, which hides what
#             tensor parallelism gains, so more than the top two go on


class _Search:
    def __init__(self, path: str, objective: str, progress: Callable[[str], None] | Reporter,
                 comm_time: Callable[[CompletePlan], float] | None = None, alpha: float = ALPHA,
                 time_limit: float | None = None) -> None:
        self.deadline = None if time_limit is None else time.monotonic() + time_limit
        self.time_limit = time_limit

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
        self.holes = classify(self.plan)
        if self.holes.unsupported:
            where = ", ".join(f"{x.what} at {x.span.line}:{x.span.col}" for x in self.holes.unsupported)
            raise SolveError(f"solve does not fill these holes yet: {where}; write their values")
        self.tried: list[Candidate] = []
        self.notes: list[str] = []
        self._parts = None
        self._priced: dict[str, Candidate | None] = {}
        self._graph = None

    # -- pricing
    def price(self, fills: dict[str, Fill], choices: tuple[tuple[str, str], ...]) -> Candidate | None:
        # lazy: torch loads only when this runs
        from planlang.model.estimate import estimate_plan

        if self.deadline is not None and time.monotonic() > self.deadline:
            raise SolveError(f"the search ran past --time-limit {self.time_limit:g} s; raise it or fix more choices")
        text = fill_holes(self.source, self.path, list(fills.values()))
        if text in self._priced:  # the same plan reached by another route: priced once
            return self._priced[text]
        self._priced[text] = None
        res = check_text(text, self.path)
        if res.errors or res.plan is None:
            return None
        plan = complete(res.plan)  # every hole is filled (classify refused the holes it cannot fill)
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
        self.report.priced(c, self.best(self.tried))
        return c

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

    def mesh_options(self) -> list[dict[str, int]]:
        names = [n for n, _ in self.holes.axes]
        batch = {i.name: i.shape[batch_dim(i)] for i in self.plan.inputs if i.shape}
        split = batch_axes(self.plan)
        out = []
        for sizes in factorizations(self.device_count(), len(names)):
            assign = dict(zip(names, sizes))
            size = {a.name: assign.get(a.name, a.size) for a in self.plan.mesh.axes}
            ok = all(batch.get(inp, 1) % math.prod(size[a] for a in axes) == 0 for inp, axes in split.items())
            if ok:
                out.append(assign)
        return out

    def size_of(self, assign: dict[str, int], axis: str) -> int:
        for a in self.plan.mesh.axes:
            if a.name == axis:
                return assign.get(axis, a.size) if T.is_hole(a.size) else a.size  # type: ignore[return-value]
        return 1

    def local_batch(self, assign: dict[str, int]) -> int:
        b = min((i.shape[0] for i in self.plan.inputs if i.shape), default=1)
        for d in self.plan.data:
            if isinstance(d.spec, T.Spec) and d.spec.dims and not T.is_hole(d.spec.dims[0]):
                for a in d.spec.dims[0]:
                    b //= self.size_of(assign, a)
                break
        return max(b, 1)

    def micro_options(self, assign: dict[str, int]) -> list[int]:
        p = self.plan.pipeline
        pp = self.size_of(assign, p.axis) if p is not None and isinstance(p.axis, str) else 1
        chunks = p.schedule.chunks if p is not None and isinstance(p.schedule, T.Schedule) and \
            isinstance(p.schedule.chunks, int) else 1
        lb = self.local_batch(assign)
        opts = [m for m in range(1, lb + 1) if lb % m == 0 and m >= pp * max(chunks, 1)]
        return opts or [lb]

    def parts(self):
        if self._parts is None:
            # lazy: torch loads only when this runs
            from planlang.solve.pipeline_stages import plan_layers

            self._parts = plan_layers(self.plan, divide=1)
        return self._parts

    STAGE_METHODS = ("flops", "activations", "tree")

    def stage_text(self, assign: dict[str, int], micro: int, method: str = "flops") -> str:
        """Stage lines for the pipeline hole: the min–max partition of per-layer flops or saved
        activations (planlang.solve.partition), or SageMaker's tree partition of the module hierarchy."""
        # lazy: torch loads only when this runs
        from planlang.solve.pipeline_stages import balanced_stages, tree_stages

        p = self.plan.pipeline
        pp = self.size_of(assign, p.axis)
        chunks = p.schedule.chunks if isinstance(p.schedule, T.Schedule) and isinstance(p.schedule.chunks, int) else 1
        k = pp * max(chunks, 1)
        if method == "tree":
            choices = tree_stages(self.plan, k, parts=self.parts())
        else:
            choices = balanced_stages(self.plan, k, cost=method, parts=self.parts())
        return "\n" + "\n".join(str(c) for c in choices) + "\n"

    def base_fills(self, assign: dict[str, int], micro: int | None, zero: int, specs: dict[int, str],
                   ckpt: str | None, stages: str = "flops") -> dict[str, Fill]:
        h = self.holes
        fills: dict[str, Fill] = {}
        for name, hole in h.axes:
            fills[f"axis {name}"] = Fill(hole, str(assign[name]))
        if h.zero is not None:
            fills["zero"] = Fill(h.zero, str(zero))
        if h.zero_axis is not None:
            fills["zero axis"] = Fill(h.zero_axis, self._data_axis())
        if h.micro is not None:
            fills["microbatches"] = Fill(h.micro, str(micro))
        if h.stages is not None:
            fills["stages"] = Fill(h.stages, self.stage_text(assign, micro or 1, stages))
        for k, (rule, hole) in enumerate(h.specs):
            fills[f"spec {k}"] = Fill(hole, specs.get(k, _replicated_text(self._rank_of(rule))))
        if h.checkpoint is not None:
            fills["checkpoint"] = Fill(h.checkpoint, ckpt) if ckpt else \
                Fill(h.checkpoint, "", drop_line="checkpoint: none (planlang solve: the plan fits without recomputation)")
        return fills

    def _data_axis(self) -> str:
        for d in self.plan.data:
            if isinstance(d.spec, T.Spec) and d.spec.dims and d.spec.axes_of(0):
                return d.spec.axes_of(0)[0]
        return self.plan.mesh.names[0]

    def _rank_of(self, rule: T.ShardRule) -> int:
        facts = self.parts().facts
        hits = rule.target.select(list(facts.params))
        if not hits:
            raise SolveError(f"`{rule.target}` matches no parameter of the model")
        return len(facts.params[hits[0]][0])

    def spec_options(self, rule: T.ShardRule, assign: dict[str, int]) -> list[str]:
        facts = self.parts().facts
        shape = facts.params[rule.target.select(list(facts.params))[0]][0]
        p = self.plan.pipeline
        skip = {p.axis} if p is not None and isinstance(p.axis, str) else set()
        skip |= {a for d in self.plan.data if isinstance(d.spec, T.Spec) for a in d.spec.used_axes()}
        axes = [a for a in self.plan.mesh.names if a not in skip and self.size_of(assign, a) > 1]
        opts = [_replicated_text(len(shape))]
        for a in axes:
            for d in range(len(shape)):
                if shape[d] % self.size_of(assign, a) == 0:
                    opts.append("[" + ", ".join(a if i == d else "_" for i in range(len(shape))) + "]")
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
        coarse = []
        for i, assign in enumerate(meshes):
            micro = self.micro_options(assign)[0] if self.holes.micro is not None else None
            fills = self.base_fills(assign, micro, 0, {}, None)
            coarse.append(self.price(fills, _choices(assign, micro, 0, {}, None)))
            self.report.advance(f"stage 1: mesh {i + 2} of {len(meshes)}" if i + 1 < len(meshes) else "")
        ranked = sorted([c for c in coarse if c is not None], key=lambda c: c.key(self.objective))
        if not ranked:
            raise SolveError("no candidate plan could be priced: " + "; ".join(self.notes[-3:]))
        refined = ranked[:REFINED]
        self.report.plan_work(len(meshes) + len(refined))
        finals = []
        for i, c in enumerate(refined):
            assign = {k[len("axis "):]: int(v) for k, v in c.choices if k.startswith("axis ")}
            mesh = ', '.join(f'{k}={v}' for k, v in assign.items()) or 'the mesh as written'
            self.progress(f"stage 2: refining {mesh} (mesh {i + 1} of {len(refined)})")
            finals.append(self.refine(assign))
            self.report.advance()
        best = self.best(finals + ranked)
        # lazy: torch loads only when this runs
        from planlang.model.estimate import format_bytes

        if not best.fits:
            smallest = min(self.tried, key=lambda c: c.peak)
            raise Infeasible(f"no plan fits the budget; the smallest peak found is {format_bytes(smallest.peak)} "
                             f"per device ({smallest}); raise the budget to at least that or add devices",
                             smallest.peak)
        header = [f"solved by `planlang solve --objective {self.objective}` ({len(self.tried)} candidate plans priced):"]
        steps = best.steps or tuple(r.step_time for r in best.rows)
        for r, step in zip(best.rows, steps):  # the step as the search priced it (with `comm_time`'s traffic)
            header.append(f"  {r.device}: peak {format_bytes(r.peak)} (parameters {format_bytes(r.parameters)}, "
                          f"activations {format_bytes(r.activations)}), step {step * 1e3:.2f} ms")
        text = fill_holes(self.source, self.path, list(self._fills_of(best).values()), header)
        return Result(text, best, self.tried, self.notes, header)

    def refine(self, assign: dict[str, int]) -> Candidate:
        """Stage 2 for one mesh (map §5.3): for each spec set of the budget sweep, the other holes in
        turn — microbatches, pipeline partition, ZeRO, then checkpointing when it does not fit."""
        cands = [self.refine_specs(assign, specs) for specs in self.spec_sets(assign)]
        return self.best(cands)

    def refine_specs(self, assign: dict[str, int], specs: dict[int, str]) -> Candidate | None:
        h = self.holes

        def price(micro, zero, ckpt, stages):
            return self.price(self.base_fills(assign, micro, zero, specs, ckpt, stages),
                              _choices(assign, micro, zero, specs, ckpt, stages))

        micros = self.micro_options(assign) if h.micro is not None else [None]
        cur = None
        for m in micros[:3]:
            cur = self.best([cur, price(m, 0, None, "flops")])
        if cur is None:
            return None
        ch = dict(cur.choices)
        micro = int(ch["microbatches"]) if ch["microbatches"] != "-" else None
        stages = "flops"
        if h.stages is not None:
            for method in self.STAGE_METHODS[1:]:
                try:
                    cur = self.best([cur, price(micro, 0, None, method)])
                except Exception as e:  # noqa: BLE001 - a partition the model's structure does not allow
                    self.notes.append(f"stage partition by {method} skipped: {e}")
            stages = dict(cur.choices)["stages"]
        zero = 0
        if h.zero is not None:
            for z in (0, 1, 2, 3):
                c = price(micro, z, None, stages)
                if c is not None and self.objective != "memory" and c.fits:
                    cur, zero = c, z
                    break
                cur = self.best([cur, c])
            zero = int(dict(cur.choices).get("zero", 0))
        if h.checkpoint is not None and not cur.fits:
            cur = self.best([cur] + self.checkpointed(assign, micro, zero, specs, stages, cur))
        return cur

    def checkpointed(self, assign, micro, zero, specs, stages, base: Candidate) -> list[Candidate | None]:
        """Checkpoint candidates for a plan that does not fit: rotor's groups (planlang.solve.
        checkpoint_plan) for the activation budget the estimator leaves, tightened by the estimator's
        overshoot until the plan fits (three tries); pipeline plans and models without a chain of
        blocks take the `every k` grid."""
        # lazy: numpy loads only when this runs
        from planlang.solve.rotor import InfeasibleBudget as ChainTooBig

        def price(ckpt):
            return self.price(self.base_fills(assign, micro, zero, specs, ckpt, stages),
                              _choices(assign, micro, zero, specs, ckpt, stages))

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
    def spec_sets(self, assign: dict[str, int]) -> list[dict[int, str]]:
        """Spec sets for the spec holes: the intra-op ILP's solutions at budgets (1 + α)^n · M (map
        §5.3), distinct ones in order of increasing budget, ending with the unconstrained optimum. If
        the ILP cannot run on this model, each hole's option the estimator prices best."""
        h = self.holes
        if not h.specs:
            return [{}]
        if all(len(self.spec_options(rule, assign)) == 1 for rule, _ in h.specs):
            return [{k: self.spec_options(rule, assign)[0] for k, (rule, _) in enumerate(h.specs)}]
        try:
            return self._ilp_spec_sets(assign)
        except Exception as e:  # noqa: BLE001 - fall back to pricing each option as a whole plan
            self.notes.append(f"intra-op ILP did not run ({type(e).__name__}: {e}); spec options priced by the "
                              "estimator")
        specs: dict[int, str] = {}
        for k, (rule, _) in enumerate(h.specs):
            specs[k] = self._priced_spec(k, rule, assign, specs, self.spec_options(rule, assign))
        return [specs]

    def _ilp_problem(self, assign: dict[str, int]):
        """The intra-op problem for this mesh (the graph is traced once per solve)."""
        # lazy: torch loads only when this runs
        from planlang.model.load import guess_targets, meta_inputs, plan_loss
        from planlang.model.opgraph import op_graph
        from planlang.solve.intra_op import build_problem, problem_args

        fills = self.base_fills(assign, 1 if self.holes.micro is not None else None, 0, {}, None)
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
            raise SolveError("the search ran past --time-limit; raise it or fix more choices")
        return SolveOptions(time_limit=max(1.0, left))

    def _ilp_spec_sets(self, assign: dict[str, int]) -> list[dict[int, str]]:
        # lazy: numpy loads only when this runs
        from planlang.solve.ilp import InfeasibleBudget, SolveTimeout, solve as ilp_solve
        from planlang.solve.intra_op import decode

        def solve_ilp(instance, objective):
            try:
                result = ilp_solve(instance, objective, self._ilp_options())
            except SolveTimeout as e:
                raise SolveError(f"the intra-op ILP found no sharding within --time-limit ({e}); raise the limit "
                                 "or fix more specs") from e
            if result.status != "optimal":
                self.notes.append(f"intra-op ILP stopped at its time limit with a {result.status} solution "
                                  f"(objective {result.value:.4g}, bound {result.bound})")
            return result

        problem, budget = self._ilp_problem(assign)
        if self.objective != "time":
            # memory: min-memory-redundancy-ilp's objective (memory redundancy + α · volume, eq. 4–8);
            # balanced: the ILP's time × memory trade-off; neither needs the time objective's sweep. The
            # time objective's specs go on too: memory redundancy alone is indifferent between layouts
            # of equal size (a column split where Megatron's row split would do), and the estimator,
            # which prices whole plans, decides
            out = []
            for objective in (self.objective, "time"):
                sol = decode(problem, solve_ilp(problem.instance.with_budget(budget if objective != "time" else None),
                                                objective))
                specs = {k: self._spec_text(rule, sol) for k, (rule, _) in enumerate(self.holes.specs)}
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
        sols.append((None, free))
        out: list[dict[int, str]] = []
        for b, sol in sols:
            specs = {k: self._spec_text(rule, sol) for k, (rule, _) in enumerate(self.holes.specs)}
            where = "unconstrained" if b is None else f"budget {b / 2**30:.3g} GiB"
            self.progress(f"intra-op ILP ({where}, {len(problem.kinds)} nodes): "
                          + ", ".join(f"{self.holes.specs[k][0].target} : {v}" for k, v in specs.items())
                          + f"; {sol.result.metrics.time * 1e3:.3g} ms, peak {sol.result.metrics.peak / 2**20:.4g} MiB")
            if specs not in out:
                out.append(specs)
        if len(out) > MAX_SPEC_SETS:  # the tightest, the unconstrained optimum, and one between
            out = [out[0], out[len(out) // 2], out[-1]]
        return out

    def _spec_text(self, rule: T.ShardRule, sol) -> str:
        hits = rule.target.select(list(sol.params))
        if not hits:
            raise SolveError(f"the ILP chose no spec for {rule.target}")
        spec = sol.params[hits[0]]
        # parameters stay whole over data and pipeline axes (ZeRO is the plan's way to shard over data)
        p = self.plan.pipeline
        drop = {a for d in self.plan.data if isinstance(d.spec, T.Spec) for a in d.spec.used_axes()}
        drop |= {p.axis} if p is not None and isinstance(p.axis, str) else set()
        return str(T.Spec(tuple(tuple(a for a in spec.axes_of(d) if a not in drop) for d in range(spec.rank))))

    def _priced_spec(self, k: int, rule: T.ShardRule, assign: dict[str, int], fixed: dict[int, str],
                     opts: list[str]) -> str:
        """Each option priced as a whole plan by the estimator; the best under the objective."""
        micro = self.micro_options(assign)[0] if self.holes.micro is not None else None
        priced = [(self.price(self.base_fills(assign, micro, 0, {**fixed, k: opt}, None),
                              _choices(assign, micro, 0, {**fixed, k: opt}, None)), i, opt)
                  for i, opt in enumerate(opts)]
        priced = [(c.key(self.objective), i, opt) for c, i, opt in priced if c is not None]
        return min(priced)[2] if priced else opts[0]

    def _fills_of(self, c: Candidate) -> dict[str, Fill]:
        ch = dict(c.choices)
        assign = {k[len("axis "):]: int(v) for k, v in ch.items() if k.startswith("axis ")}
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


def _replicated_text(rank: int) -> str:
    return "[" + ", ".join("_" for _ in range(rank)) + "]"


def _choices(assign, micro, zero, specs, ckpt, stages="flops") -> tuple[tuple[str, str], ...]:
    out = [(f"axis {k}", str(v)) for k, v in assign.items()]
    out.append(("microbatches", "-" if micro is None else str(micro)))
    out.append(("stages", stages))
    out.append(("zero", str(zero)))
    out += [(f"spec {k}", v) for k, v in sorted(specs.items())]
    out.append(("checkpoint", ckpt or "none"))
    return tuple(out)


def solve(path: str, objective: str = "time", progress: Callable[[str], None] | Reporter = lambda s: None, *,
          comm_time: Callable[[CompletePlan], float] | None = None, alpha: float = ALPHA,
          time_limit: float | None = None) -> Result:
    """Fill every hole of the plan at `path` (see the module docstring). `comm_time(plan)`, when given,
    prices a candidate's per-step communication in seconds (the slowest device); `time_limit` bounds
    each intra-op ILP call by the seconds left and stops the search between candidates. `progress` is a
    callable given each message and priced candidate as a line, or a planlang.solve.progress.Reporter."""
    if objective not in OBJECTIVES:
        raise SolveError(f"unknown objective {objective!r}; use one of {', '.join(OBJECTIVES)}")
    return _Search(path, objective, progress, comm_time, alpha, time_limit).run()

