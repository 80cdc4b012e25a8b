"""`planlang solve`: fill a plan's holes and write a complete plan back (map-memory-aware-auto-parallel
§5.3's two-stage solver, inside a search over whole plans that the estimator prices).

Stage 1 enumerates the coarse choices — the factorizations of the device count over the mesh axes left
`?` (fixed sizes are constraints) — with every other hole at a default (ZeRO 0, the smallest valid
microbatch count ≥ stages, stages balanced by the min–max partition DP over per-layer flops, replicated
specs, no checkpointing), and prices each candidate plan with planlang.model.price.estimate (per-device peak
memory by class and step time). Stage 2 refines the best meshes as map §5.3 does:

  1. the intra-op ILP (planlang.solve.intra_op, the plan's fixed specs as constraints) solved at memory
     budgets (1 + α)^n · M, n = 0 .. 9 (M the plan's budget), from the tightest up to the budget where
     the unconstrained optimum fits: each distinct set of specs is a candidate. A looser budget buys a
     faster sharding whose activations no longer fit; the checkpoint stage then wins the memory back;
  2. for each: microbatches by step time, the smallest ZeRO stage that fits, the pipeline partition
     (space.STAGE_METHODS, each priced), and — when the plan still does not fit — rotor's checkpointing
     DP (planlang.solve.checkpoint_plan) on the local model's chain of blocks with what the budget leaves;
  3. the fastest candidate within the budget (or the least memory / the product, by objective).

Every candidate is a plan value: the input's resolved plan with the candidate's choices substituted
(planlang.solve.substitute), checked by the rules `planlang check` runs (planlang.plan.checker.
check_resolution, the one entry point) and priced by a pure function of the plan value and the model's
facts (planlang.solve.pricing; the facts are computed once per solve, planlang.solve.facts). No plan
text is read or written during the search: the input is parsed once, and the best candidate's choices
are written into the input's text once, at the end (planlang.solve.holes) — the text resolves to the
value that was priced. Deterministic: candidates are enumerated and ties broken in a fixed order.

The pieces: classify.py (the holes), space.py (each choice's options, a candidate's fills), substitute.py (a
candidate as a plan value), facts.py and pricing.py (the model's facts, the price of a plan value), sweep.py
(the ILP's budget sweep), anytime.py (the clock, a cut's account), holes.py (the text written at the end).

Anytime (`time_limit`, a hard limit): the search first prices a seed (a mesh the model can run whose
parameters and optimizer states leave room in the budget, at the defaults; over budget, the same mesh at
its leanest too) whatever the limit, so it always holds a complete plan. After it, no candidate starts
once the deadline has passed or would pass while it is priced (the median of the last ones), one being
priced at the deadline is abandoned (anytime.Clock.interruptible), and the search ends with the best plan
so far, `Result.cut` and the header saying what was left unexplored (Infeasible too). Candidates the model
cannot run (PL362/PL365) or whose memory floor (pricing.memory_floor) is over the budget are never priced.
"""
from __future__ import annotations

import textwrap
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from planlang.lang.render import render
from planlang.plan import types as T
from planlang.plan.checker import check_resolution
from planlang.plan.complete import CompletePlan, complete
from planlang.plan.resolve import Resolver
from planlang.plan.units import format_bytes
from planlang.model.validation import Validated
from planlang.solve.anytime import REFINED, Clock, Cut, Where, mesh_words
from planlang.solve.checkpoint_values import Checkpoints
from planlang.solve.checkpoint_search import checkpointed
from planlang.solve.classify import TemplateArguments, classify
from planlang.solve.facts import SolveFacts, model_facts
from planlang.solve.gate import Gate, Infeasible
from planlang.solve.holes import Fill, HoleOutsidePlan, edit_key, fill_holes
from planlang.solve.pricing import Candidate, Steps, best, memory_floor, price_plan, price_steps
from planlang.solve.progress import Reporter, reporter
from planlang.solve.space import STAGE_METHODS, Choices, SolveError, Space, choices_of, factorizations
from planlang.solve.substitute import substitute
from planlang.solve.sweep import ALPHA, spec_sets

__all__ = ["ALPHA", "INFEASIBLE", "OBJECTIVES", "SEARCH_CUT", "Candidate", "Infeasible", "Result", "SolveError",
           "factorizations", "solve"]

OBJECTIVES = ("time", "memory", "balanced")

# the codes `planlang solve` reports: no candidate fits the budget (the checker's over-budget code), and
# a search --time-limit stopped (the plan written is the best priced before it)
INFEASIBLE = "PL560"
SEARCH_CUT = "PL561"


@dataclass
class Result:
    text: str
    best: Candidate
    tried: list[Candidate]
    notes: list[str]
    summary: list[str] = field(default_factory=list)  # the header written into `text`, without its `# `
    cut: str | None = None  # None when the search ran to the end, else what --time-limit left unexplored
    # candidates whose step time alone showed they cannot win (their memory was not priced): (choices,
    # step seconds), in the order met; the header counts them with `tried` (see docs/solve.md, Bounds)
    bounded: list[tuple[Choices, float]] = field(default_factory=list)
    elapsed: float = 0.0  # seconds from the clock's start (the CLI's: the command's) to the plan written
    seeded: float | None = None  # seconds from it to the anytime seed priced (None: none was)
    fills: list[Fill] = field(default_factory=list)  # what `text` writes at each hole, in the holes' order


class _Search:
    """One solve: the input read once (`resolution`), its holes (`holes`) and their options (`space`),
    the model's facts (built at the first candidate), the clock, and every candidate priced."""

    def __init__(self, path: str, objective: str, progress: Callable[[str], None] | Reporter, alpha: float = ALPHA,
                 time_limit: float | None = None, started: float | None = None, prune: bool = True,
                 validated: Validated | None = None, now: Callable[[], float] = time.monotonic, stage_method=None) -> None:
        if stage_method is not None and stage_method not in STAGE_METHODS:
            raise SolveError(f"unknown stage method {stage_method!r}; use one of {', '.join(STAGE_METHODS)}")
        self.methods = (stage_method,) if stage_method else STAGE_METHODS  # the first is the defaults' partition
        self.clock = Clock(time_limit, started, now)  # `now`: a fake clock in tests
        self.prune = prune and objective == "time"  # bounds by step time: the time objective only
        self.where = Where()
        self.path = path
        self.objective = objective
        self.report = reporter(progress)
        self.progress = self.report.message
        self.alpha = alpha
        if validated is not None and validated.resolution is not None:  # the CLI's validation: parsed once
            self.resolution, res = validated.resolution, validated.check
        else:
            self.resolution = Resolver().resolve_file(path)  # the only parse of a solve
            res = check_resolution(self.resolution, path)
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
        self._facts: SolveFacts | None = None
        self._priced: dict[tuple, Candidate | None] = {}  # a candidate's edits -> it, priced (None: not a plan)
        self._steps: dict[tuple, tuple[CompletePlan, Steps | None]] = {}  # edits -> value, its steps alone
        self._bounded: dict[tuple, tuple[Choices, float]] = {}  # edits -> choices, step
        self._shards: dict[tuple, tuple] = {}  # the candidates' shard rules, one object per value (`value`)
        budget = self.plan.budget.bytes if self.plan.budget is not None else None
        self._floored: set[tuple] = set()  # candidates over their memory floor (never priced)
        self.tight = False  # the seed's defaults did not fit: stage 1 prices each mesh at its leanest too
        self.mesh_floors: dict[int, int] = {}  # stage 1's mesh i -> its memory floor at ZeRO 0 (a plan's)
        self.last_floored = False  # the last candidate asked for: over its floor
        self.gate = Gate(self.resolution, path, budget, self.facts,
                         validated.facts if validated is not None else None)  # what is never priced
        arguments = TemplateArguments(self.plan, self.holes.arguments, res.modules, res.sources)
        self.space = Space(self.plan, self.holes, path, self.source, arguments, self.facts)

    def facts(self) -> SolveFacts:
        """The model's facts, computed once per solve (the first candidate builds them)."""
        if self._facts is None:
            self._facts = model_facts(self.plan)
        return self._facts

    # -- a candidate: a plan value, checked, priced
    def checked_value(self, fills: dict[str, Fill]) -> T.Plan | None:
        """The input's plan with these fills substituted, when the model-free rules accept it (the rules
        and the one entry point `planlang check` uses); None when they do not."""
        plan = substitute(self.plan, self.space.values(fills))
        res = check_resolution(replace(self.resolution, plan=plan), self.path)
        if res.errors:
            return None
        return None if self.gate.cannot_run(plan) is not None else plan

    def value(self, key: tuple, fills: dict[str, Fill]) -> CompletePlan | None:
        """The candidate's complete plan value, checked (None when the rules refuse it)."""
        if key in self._steps:
            return self._steps[key][0]
        plan = self.checked_value(fills)
        if plan is None:
            return None
        left = plan.holes()  # none: classify refused the holes it cannot fill
        if left:
            where = ", ".join(f"{x.what} at {x.span.line}:{x.span.col}" for x in left)
            raise SolveError(f"solve does not fill these holes yet: {where}; write their values")
        done = complete(plan)
        try:  # equal shard rules as one object: the estimator keeps a rule list's specs by its identity
            # (planlang.model.price.local_model.spec_for), and `complete` builds the list afresh per candidate
            shards = self._shards.setdefault(done.shards, done.shards)
        except TypeError:  # rules that do not hash: the candidate's own
            return done
        return done if shards is done.shards else replace(done, shards=shards)

    def steps(self, key: tuple, fills: dict[str, Fill]) -> Steps | None:
        """The candidate's step times alone (pricing.price_steps: the local model's profile, no simulated
        step), kept for its full pricing; None when it is not a plan or the profile cannot be made."""
        if key not in self._steps:
            plan = self.value(key, fills)
            if plan is None:
                return None
            try:
                got = price_steps(plan, self.facts())
            except Exception:  # noqa: BLE001 - the full pricing says why
                got = None
            self._steps[key] = (plan, got)
        return self._steps[key][1]

    def bounded_out(self, key: tuple, fills: dict[str, Fill], choices, beat: float) -> bool:
        """Whether the candidate's step alone exceeds `beat` (then it is recorded as bounded out): first
        without its program's collectives (a lower bound: each only adds to the step), then with them (the
        step price_plan will give; the program is lowered once and kept for the full pricing)."""
        steps = self.steps(key, fills)
        if steps is None:
            return False
        plan = self._steps[key][0]
        step = steps.lower(plan)
        if step <= beat and steps.low is None:
            steps = steps.with_lowered(plan, self.facts())
            self._steps[key] = (plan, steps)
            step = steps.lower(plan)
        if step <= beat:
            return False
        if key not in self._bounded:
            self._bounded[key] = (choices, step)
            self.progress(f"candidate {', '.join(f'{k}={v}' for k, v in choices)}: step "
                          f"{'' if steps.low is not None else 'at least '}"
                          f"{step * 1e3:.2f} ms > {beat * 1e3:.2f} ms, bounded out (memory not priced)")
        return True

    def price(self, fills: dict[str, Fill], choices: Choices,
              beat: float | None = None) -> Candidate | None:
        """The candidate, priced (None when it does not check or cannot be built). `beat`: a step time the
        caller compares the candidate with, having a plan that fits at that step: when the candidate's
        step alone exceeds it, the candidate cannot be chosen there nor win, and its memory is not priced
        (it is `bounded`, None here); see docs/solve.md, Bounds."""
        key = edit_key(self.source, self.path, list(fills.values()))
        self.last_floored = key in self._floored  # over its memory floor (gate), now or when first met
        if key in self._priced:  # the same plan reached by another route: priced once
            return self._priced[key]
        self.clock.check(self.clock.pricing_time())
        started = self.clock.now()
        if beat is not None and self.prune and self.bounded_out(key, fills, choices, beat):
            return None
        steps = self._steps[key][1] if key in self._steps else None  # its step alone, when priced
        self._priced[key] = None
        plan = self.value(key, fills)
        if plan is not None and self.gate.over_floor(plan, choices):
            self._floored.add(key)
            self.last_floored = True
        if plan is None or self.last_floored:
            return None
        facts = self.facts()
        try:
            if steps is not None:  # the program lowered once, for both
                steps = steps.with_lowered(plan, facts)
            priced = price_plan(plan, facts, steps.low if steps is not None else None)
        except Exception as e:  # noqa: BLE001 - a candidate the model cannot run: skip it, say why
            self.notes.append(f"skipped {', '.join(f'{k}={v}' for k, v in choices)}: {type(e).__name__}: {e}")
            return None
        self.notes.extend(priced.notes)
        if steps is not None and priced.steps != steps.steps(plan) and self.prune:
            # the step alone is the full pricing's step (estimate.estimate_steps) unless the local model's
            # simulation failed where its profile did not (the estimate then takes the unsharded model's):
            # else no more bounds in this search
            self.prune = False
            self.notes.append(f"bounds by step time stopped: {', '.join(f'{k}={v}' for k, v in choices)} priced at "
                              f"step {priced.step_time * 1e3:.6g} ms, its profile alone gave "
                              f"{max(steps.steps(plan)) * 1e3:.6g} ms")
        choices = self._bounded[key][0] if key in self._bounded else choices  # named as first met (as unbounded)
        c = Candidate(choices, plan, priced.peak, priced.step_time, priced.fits, priced.rows, priced.steps)
        self.tried.append(c)
        self._priced[key] = c
        self._bounded.pop(key, None)  # bounded where it could not win, priced where it was needed
        self.clock.durations.append(self.clock.now() - started)
        self.report.priced(c, self.best(self.tried))
        return c

    def beat(self, cur: Candidate | None) -> float | None:
        """The step a candidate compared with `cur` must not exceed to matter (None: every one matters)."""
        return cur.step_time if self.prune and cur is not None and cur.fits else None

    def price_at(self, assign: dict, micro: int | None, zero: int, specs: dict[int, T.Spec], ckpt: Checkpoints | None,
                 stages: str | None = None, beat: float | None = None) -> Candidate | None:
        """The candidate of these choices, priced (None when it does not check or cannot be built, or
        when its step exceeds `beat`: see `price`)."""
        self.last_floored, stages = False, stages or self.methods[0]
        try:
            fills = self.space.fills(assign, micro, zero, specs, ckpt, stages)
        except SolveError:
            raise
        except Exception as e:  # noqa: BLE001 - e.g. more stages than the model has layers to cut
            what = ", ".join(f"{k}={v}" for k, v in choices_of(assign, micro, zero, specs, ckpt, stages))
            self.notes.append(f"skipped {what}: {type(e).__name__}: {e}")
            return None
        return self.price(fills, choices_of(assign, micro, zero, specs, ckpt, stages), beat)

    def steps_at(self, assign: dict, micro: int | None) -> float | None:
        """Stage 1's candidate of this mesh: its step alone, without its program's collectives (a lower bound), or None."""
        try:
            fills = self.space.fills(assign, micro, 0, {}, None, self.methods[0])
        except SolveError:
            raise
        except Exception:  # noqa: BLE001 - price_at says why
            return None
        key = edit_key(self.source, self.path, list(fills.values()))
        if key in self._priced:
            c = self._priced[key]
            return None if c is None else c.step_time
        got = self.steps(key, fills)
        return None if got is None else got.lower(self._steps[key][0])

    def best(self, cands) -> Candidate | None:
        return best(cands, self.objective)

    def better(self, cur: Candidate, *others: Candidate | None) -> Candidate:
        """The best of `cur` and `others` (a candidate: `cur` is one)."""
        return best([cur, *others], self.objective) or cur

    # -- the two stages
    def run(self) -> Result:
        try:
            return self._run()
        except HoleOutsidePlan as e:
            raise SolveError(str(e)) from e

    def _run(self) -> Result:
        meshes = self.space.mesh_options()
        if self.holes.stages is not None and meshes:
            meshes = self.gate.shallow(meshes, self.space.stage_count)
        if not meshes:
            raise SolveError("no factorization of the device count splits the batch evenly over the data axes")
        self.progress(f"stage 1: {len(meshes)} mesh candidates (the first builds and simulates the model on meta)")
        self.report.plan_work(len(meshes) + min(REFINED, len(meshes)))
        self.where.stage1(meshes)
        cut = None
        chosen: Candidate | None
        try:
            self.clock.seeding = True  # the deadline waits until the seed holds a plan
            with self.clock.interruptible():  # past the deadline, the candidate in progress is abandoned
                chosen = self.stages(meshes, self.seed(meshes))
        except Cut:
            cut = self.where.account(self.clock, self.considered())
            chosen = self.best(self.tried)  # every candidate priced is a complete plan that checks
            if chosen is None and self.gate.floored is not None:
                raise self.gate.infeasible(self.tried, cut, self.notes) from None
            if chosen is None:
                raise SolveError(f"{cut}; no candidate plan was priced before it: raise --time-limit") from None
        return self.write(chosen, cut)

    def stages(self, meshes: list[dict], seeds: list[Candidate | None]) -> Candidate:
        """Stage 1 over the meshes, stage 2 over the best of them: the best candidate."""
        finals: list[Candidate | None] = []
        coarse: list[Candidate | None] = [None] * len(meshes)
        micros = [self.space.micro_options(a)[0] if self.holes.micro is not None else None for a in meshes]
        order = list(range(len(meshes)))
        if self.prune:  # the meshes by their step alone, fastest first (see docs/solve.md, Bounds)
            bound = []
            for i, (a, m) in enumerate(zip(meshes, micros)):
                # near --time-limit, the meshes left are priced in their order, unbounded (no profile
                # is made past the limit; the search is then cut at the next candidate)
                late = self.clock.deadline is not None and (
                    self.clock.now() + self.clock.pricing_time() > self.clock.deadline)
                bound.append(None if late or self.hopeless(i) else self.steps_at(a, m))
            # the meshes that cannot run or are over their memory floor (never priced) last, unprofiled;
            # tight: those whose floor leaves half the budget (as the seed's) before the others
            half = self.plan.budget.bytes / 2 if self.tight and self.plan.budget is not None else None
            order.sort(key=lambda i: (self.hopeless(i), half is not None and self.mesh_floors.get(i, 0) > half,
                                      bound[i] is not None, bound[i] or 0.0, i))
            self.where.stage1([meshes[i] for i in order])  # a cut's account lists the meshes in this order
        for n, i in enumerate(order):
            # only the REFINED best go on: a mesh slower than REFINED priced ones that fit cannot
            fast = sorted(c.step_time for c in coarse if c is not None and c.fits)
            beat = fast[REFINED - 1] if len(fast) >= REFINED else None
            # tight: the mesh at its leanest first, which the defaults must then beat on step alone
            lean = self.lean(meshes[i], beat) if self.tight else None
            if not (self.tight and self.last_floored):  # a floor reads neither microbatches nor checkpoints
                b = lean.step_time if lean is not None and lean.fits and (beat is None or lean.step_time < beat) else beat
                coarse[i] = self.best([self.least_zero(meshes[i], micros[i], {}, self.methods[0], b), lean])
            self.where.done(n + 1)
            self.report.advance(f"stage 1: mesh {n + 2} of {len(meshes)}" if n + 1 < len(meshes) else "")
        ranked = sorted([c for c in coarse if c is not None], key=lambda c: c.key(self.objective))
        if not ranked and not self.tried:
            raise self.gate.infeasible(self.tried, None, self.notes)
        refined = ranked[:REFINED]
        self.report.plan_work(len(meshes) + len(refined))
        self.where.stage2(meshes, [self.space.assign_of(c.choices) for c in refined])
        for i, c in enumerate(refined):
            assign = self.space.assign_of(c.choices)
            self.progress(f"stage 2: refining {mesh_words(assign)} (mesh {i + 1} of {len(refined)})")
            finals.append(self.refine(assign))
            self.where.done(i + 1)
            self.report.advance()
        chosen = self.best(finals + ranked + seeds + self.tried)
        if chosen is None:
            raise self.gate.infeasible(self.tried, None, self.notes)
        return chosen

    def write(self, chosen: Candidate | None, cut: str | None) -> Result:
        """The chosen candidate's choices written into the input's text, once, with the header (or
        Infeasible when it does not fit)."""
        if chosen is None or not chosen.fits:
            raise self.gate.infeasible(self.tried, cut, self.notes)
        # the candidates bounded out count as priced: their step time was, and it showed they cannot win
        header = [f"solved by `planlang solve --objective {self.objective}` ({self.considered()} candidate plans priced):"]
        steps = chosen.steps or tuple(r.step_time for r in chosen.rows)
        for r, step in zip(chosen.rows, steps):  # the step as the search priced it
            header.append(f"  {r.device}: peak {format_bytes(r.peak)} (parameters {format_bytes(r.parameters)}, "
                          f"activations {format_bytes(r.activations)}), step {step * 1e3:.2f} ms")
        if cut is not None:
            header += ["  " + line for line in textwrap.wrap(
                f"INCOMPLETE SEARCH: {cut}; this is the best plan priced before the cut", 106)]
        fills = list(self.space.fills_of(chosen).values())
        text = fill_holes(self.source, self.path, fills, header)
        if self.gate.summary():
            self.progress(str(self.gate.summary()))
        if self._bounded:
            self.progress(f"{len(self.tried)} candidates priced in full, {len(self._bounded)} by their step time "
                          "alone (bounded out: slower than a plan that fits)")
        seeded = None if self.clock.seeded is None else self.clock.since(self.clock.seeded)
        return Result(text, chosen, self.tried, self.notes, header, cut, list(self._bounded.values()), self.clock.since(),
                      seeded, fills)

    def considered(self) -> int:
        """Candidates priced: in full (`tried`), or by their step time alone (bounded out)."""
        return len(self.tried) + len(self._bounded)

    def least_zero(self, assign: dict, micro: int | None, specs: dict[int, T.Spec], stages: str,
                   beat: float | None, ckpt: Checkpoints | None = None) -> Candidate | None:
        """The candidate at ZeRO 0, or, when `zero = ?` and its memory floor is over the budget there, at
        the least ZeRO stage whose floor is not (the mesh stays in the search)."""
        c = self.price_at(assign, micro, 0, specs, ckpt, stages, beat)
        if c is not None or not self.last_floored or self.holes.zero is None:
            return c
        for zero in (1, 2, 3):
            c = self.price_at(assign, micro, zero, specs, ckpt, stages, beat)
            if c is not None or not self.last_floored:
                return c
        return None

    def hopeless(self, i: int) -> bool:
        """Stage 1's mesh `i` (in `meshes`, which seed_order scored): not a plan, or over its memory floor
        at ZeRO 0 when the plan writes its ZeRO stage (least_zero then prices nothing)."""
        if not self.mesh_floors or self.plan.budget is None:  # no budget: seed_order scored none
            return False
        floor = self.mesh_floors.get(i)
        return floor is None or self.holes.zero is None and floor > self.plan.budget.bytes

    def lean(self, assign: dict, beat: float | None) -> Candidate | None:
        """Stage 1's mesh at its leanest too, when the seed's defaults did not fit (`tight`) and the plan
        leaves `checkpoint ?`: every repeated block checkpointed (`every 1`) over the most microbatches (a
        pipeline's smallest bubble and least activations in flight); stage 2 refines the choices."""
        ckpts = self.space.ckpt_options()[:1] if self.holes.checkpoint is not None else []
        self.last_floored = False
        if not ckpts:
            return None
        micro = self.space.micro_options(assign)[-1] if self.holes.micro is not None else None
        return self.least_zero(assign, micro, {}, self.methods[0], beat, ckpts[0])

    def seed(self, meshes: list[dict]) -> list[Candidate | None]:
        """Anytime: a complete plan before anything else, priced whatever the time limit. The first mesh
        (in stage 1's order) that prices at the defaults; when that is over budget, the same mesh at its
        leanest as well (the most microbatches, ZeRO 3 or the highest stage that checks, every repeated
        block checkpointed), so that a cut search has a plan that fits when one is that easy to find."""
        out: list[Candidate | None] = []  # (run sets clock.seeding: no deadline until a plan is held)
        try:
            for assign in self.seed_order(meshes):
                micros = self.space.micro_options(assign) if self.holes.micro is not None else [None]
                first = self.price_at(assign, micros[0], 0, {}, None)
                if first is None and not self.last_floored:
                    continue  # not a plan, or one the model cannot run
                out.append(first)  # None: over its memory floor at ZeRO 0; ZeRO may bring it in
                if first is not None and first.fits:
                    break
                # exempt until it holds a plan that fits, or the mesh's leanest plan that does not
                # (a cut search writes it, or says how near it came)
                ckpts: list[Checkpoints | None] = list(self.space.ckpt_options()[:1]) if self.holes.checkpoint is not None else []
                zeros = (3, 1, 0) if self.holes.zero is not None else (0,)
                for zero in zeros:
                    for ckpt in ckpts or [None]:
                        lean = self.price_at(assign, micros[-1], zero, {}, ckpt)
                        out.append(lean)
                        if lean is not None:
                            break
                    if out[-1] is not None:
                        break
                if any(c is not None for c in out):
                    break
            self.tight = bool(out) and (out[0] is None or not out[0].fits)
        finally:
            self.clock.seeding = False
            self.clock.seeded = self.clock.now()
        return out

    def seed_order(self, meshes: list[dict]) -> list[dict]:
        """The meshes the seed tries: those the model can run whose memory floor at ZeRO 0 (pricing.
        memory_floor) leaves half the budget, the largest floor (the least sharded: fastest as a rule)
        first, then the others, the least floor first. The seed's plan should fit, and be fast."""
        budget = self.plan.budget.bytes if self.plan.budget is not None else None
        if budget is None:
            return meshes
        scored = []
        for i, assign in enumerate(meshes):
            try:
                micro = self.space.micro_options(assign)[0] if self.holes.micro is not None else None
                fills = self.space.fills(assign, micro, 0, {}, None, self.methods[0])
            except SolveError:
                raise
            except Exception:  # noqa: BLE001 - price_at says why, when the seed prices it
                continue
            plan = self.value(edit_key(self.source, self.path, list(fills.values())), fills)
            if plan is None:
                continue
            floor = memory_floor(plan, self.facts())
            self.mesh_floors[i] = floor
            scored.append(((0, -floor, i) if 2 * floor <= budget else (1, floor, i), assign))
        return [a for _, a in sorted(scored, key=lambda x: x[0])]

    def refine(self, assign: dict) -> Candidate | None:
        """Stage 2 for one mesh (map §5.3): for each spec set of the budget sweep, the other holes in
        turn — microbatches, pipeline partition, ZeRO, then checkpointing when it does not fit."""
        self.where.at("the intra-op ILP's budget sweep")
        sets = spec_sets(self, assign)
        cands = []
        for k, specs in enumerate(sets):
            self.where.at(f"spec set {k + 1} of {len(sets)}")
            cands.append(self.refine_specs(assign, specs))
        return self.best(cands)

    def refine_specs(self, assign: dict, specs: dict[int, T.Spec]) -> Candidate | None:
        h = self.holes

        def price(micro, zero, ckpt, stages, beat=None):
            return self.price_at(assign, micro, zero, specs, ckpt, stages, beat)

        micros = self.space.micro_options(assign) if h.micro is not None else [None]
        self.where.at("microbatches", within=True)
        cur = None
        if self.plan.pipeline is None and h.micro is not None:
            # gradient accumulation: more microbatches only shrink the activations (the same compute, the
            # program's collectives once more each): the smallest count that fits
            for m in micros:
                cur = self.best([cur, self.least_zero(assign, m, specs, self.methods[0], self.beat(cur))])
                if cur is not None and cur.fits:
                    break
        for m in micros[:3] if self.plan.pipeline is not None or h.micro is None else []:
            cur = self.best([cur, self.least_zero(assign, m, specs, self.methods[0], self.beat(cur))])
        if cur is None:
            return None
        ch = dict(cur.choices)
        micro = int(str(ch["microbatches"])) if ch["microbatches"] != "-" else None
        stages = self.methods[0]
        if h.stages is not None:
            self.where.at("the pipeline partition", within=True)
            for method in self.methods[1:]:
                try:
                    cur = self.better(cur, self.least_zero(assign, micro, specs, method, self.beat(cur)))
                except Exception as e:  # noqa: BLE001 - a partition the model's structure does not allow
                    self.notes.append(f"stage partition by {method} skipped: {e}")
            stages = str(dict(cur.choices)["stages"])  # a method name (space.choices_of)
        zero = 0
        if h.zero is not None:
            self.where.at("ZeRO", within=True)
            for z in (0, 1, 2, 3):
                c = price(micro, z, None, stages)
                if c is not None and self.objective != "memory" and c.fits:
                    cur, zero = c, z
                    break
                cur = self.better(cur, c)
            zero = int(dict(cur.choices).get("zero", 0))
        if self.space.inner_keys:
            self.where.at(", ".join(self.space.inner_keys), within=True)
            cur = self.vary(cur)
            assign = self.space.assign_of(cur.choices)
        if h.checkpoint is not None and not cur.fits:
            self.where.at("checkpointing", within=True)
            cur = self.better(cur, *checkpointed(self, assign, micro, zero, specs, stages, cur))
        return cur

    def vary(self, cur: Candidate) -> Candidate:
        """The choices the main search held at defaults (stage degrees, `every ?`, template arguments),
        each in turn over its options with the rest of the candidate fixed, priced; the best kept."""
        for key in self.space.inner_keys:
            base = cur
            for value in self.space.inner_options(key, base):
                choices = tuple((k, value if k == key else v) for k, v in base.choices)
                if choices == base.choices:
                    continue
                try:
                    fills = self.space.fills_of(choices)
                except Exception as e:  # noqa: BLE001 - a choice the partition cannot build
                    self.notes.append(f"skipped {key}={value}: {type(e).__name__}: {e}")
                    continue
                cur = self.better(cur, self.price(fills, choices, self.beat(cur)))
        return cur

def solve(path: str, objective: str = "time", progress: Callable[[str], None] | Reporter = lambda s: None, *,
          alpha: float = ALPHA, time_limit: float | None = None, started: float | None = None,
          prune: bool = True, validated: Validated | None = None, stage_method: str | None = None) -> Result:
    """Fill every hole of the plan at `path` (see the module docstring). `time_limit` bounds
    each intra-op ILP call by the seconds left and stops the search between candidates: the result is
    then the best plan priced so far (anytime), its `cut` and header say what was left unexplored, and
    Infeasible says the search was cut. The limit counts from `started` (a time.monotonic() value; the
    CLI passes its own start, so the limit bounds the whole command), else from the call. `progress` is
    a callable given each message and priced candidate as a line, or a planlang.solve.progress.Reporter.
    `prune=False`: every candidate met is priced in full (no bounds by step time; the same result, the
    tests compare them). `validated`: the plan at `path` as planlang.model.validation validated it (the
    CLI's), so the solve neither parses nor checks it again. `stage_method`: a `stages ?` hole is filled by
    that partition alone (one of space.STAGE_METHODS) instead of the best-priced of them all."""
    if objective not in OBJECTIVES:
        raise SolveError(f"unknown objective {objective!r}; use one of {', '.join(OBJECTIVES)}")
    return _Search(path, objective, progress, alpha, time_limit, started, prune, validated,
                   stage_method=stage_method).run()
