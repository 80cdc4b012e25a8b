"""`planlang solve`: fill a plan's holes and write a complete plan back (map §5.3's two stages, as a
search over whole plans that the estimator prices).

Stage 1 enumerates the coarse choices — the factorizations of the device count over the mesh axes left
`?` (fixed sizes are constraints) — with every other hole at a default (ZeRO 0, the smallest valid
microbatch count ≥ stages, stages balanced by the min–max partition DP over per-layer flops, replicated
specs, no checkpointing), and prices each candidate plan with planlang.model.estimate (per-device peak
memory by class and step time). Stage 2 takes the best candidates and settles the fine choices in turn:
spec holes by the intra-op ILP on the model's op graph (planlang.solve.intra_op, the plan's fixed specs
as constraints; each option priced by the estimator if the ILP cannot run), microbatches by estimated
step time, the ZeRO stage as the smallest
that fits the budget, checkpointing (`every k` groups of the model's repeated blocks) only when the plan
does not fit without it. Every candidate is a plan text that `planlang check` accepts, so what is
written is what was priced. Deterministic: candidates are enumerated and ties broken in a fixed order.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from planlang.plan import types as T
from planlang.solve.holes import Fill, fill_holes

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

    def key(self, objective: str) -> tuple:
        if objective == "memory":
            return (not self.fits, self.peak, self.step_time)
        if objective == "balanced":
            return (not self.fits, self.peak * self.step_time)
        return (not self.fits, self.step_time, self.peak)

    def __str__(self) -> str:
        what = ", ".join(f"{k}={v}" for k, v in self.choices)
        from planlang.model.estimate import format_bytes

        return f"{what}: peak {format_bytes(self.peak)}, step {self.step_time * 1e3:.2f} ms" + ("" if self.fits else " (over budget)")


@dataclass
class Result:
    text: str
    best: Candidate
    tried: list[Candidate]
    notes: list[str]


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
class _Search:
    def __init__(self, path: str, objective: str, progress: Callable[[str], None]) -> None:
        from planlang.plan.checker import check_file

        self.path = path
        self.objective = objective
        self.progress = progress
        res = check_file(path)
        if res.errors or res.plan is None:
            from planlang.lang.render import render

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

    # -- pricing
    def price(self, fills: dict[str, Fill], choices: tuple[tuple[str, str], ...]) -> Candidate | None:
        from planlang.model.estimate import estimate_plan
        from planlang.plan.checker import check_text

        text = fill_holes(self.source, self.path, list(fills.values()))
        res = check_text(text, self.path)
        if res.errors or res.plan is None:
            return None
        try:
            rows = estimate_plan(res.plan)
        except Exception as e:  # noqa: BLE001 - a candidate the model cannot run: skip it, say why
            self.notes.append(f"skipped {', '.join(f'{k}={v}' for k, v in choices)}: {type(e).__name__}: {e}")
            return None
        budget = res.plan.budget.bytes if res.plan.budget is not None else None
        peak = max(r.peak for r in rows)
        step = max(r.step_time for r in rows)
        c = Candidate(choices, text, peak, step, budget is None or peak <= budget, tuple(rows))
        self.tried.append(c)
        self.progress(str(c))
        return c

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
        batch = {i.name: i.shape[0] for i in self.plan.inputs if i.shape}
        data_axes = {d.input: [a for a in (d.spec.dims[0] if isinstance(d.spec, T.Spec) and d.spec.dims
                                           and not T.is_hole(d.spec.dims[0]) else ())]
                     for d in self.plan.data}
        out = []
        for sizes in factorizations(self.device_count(), len(names)):
            assign = dict(zip(names, sizes))
            size = {a.name: assign.get(a.name, a.size) for a in self.plan.mesh.axes}
            ok = all(batch.get(inp, 1) % math.prod(size[a] for a in axes) == 0 for inp, axes in data_axes.items())
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
            from planlang.solve.pipeline_stages import plan_layers

            self._parts = plan_layers(self.plan, divide=1)
        return self._parts

    def stage_text(self, assign: dict[str, int], micro: int) -> str:
        from planlang.solve.pipeline_stages import balanced_stages

        p = self.plan.pipeline
        pp = self.size_of(assign, p.axis)
        chunks = p.schedule.chunks if isinstance(p.schedule, T.Schedule) and isinstance(p.schedule.chunks, int) else 1
        choices = balanced_stages(self.plan, pp * max(chunks, 1), parts=self.parts())
        return "\n" + "\n".join(str(c) for c in choices) + "\n"

    def base_fills(self, assign: dict[str, int], micro: int | None, zero: int, specs: dict[int, str],
                   ckpt: str | None) -> dict[str, Fill]:
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
            fills["stages"] = Fill(h.stages, self.stage_text(assign, micro or 1))
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
        """`every k` groups over the model's longest list of repeated blocks."""
        facts = self.parts().facts
        lists: dict[str, int] = {}
        for name in facts.all_modules:
            head, _, last = name.rpartition(".")
            if last.isdigit() and "." not in name[len(head) + 1:]:
                lists[head] = lists.get(head, 0) + 1
        if not lists:
            return []
        head = max(lists, key=lambda k: (lists[k], k))
        from planlang.model.checks import to_plan_name

        sel = to_plan_name(head) + "[*]"
        n = lists[head]
        return [f"{sel} every {k}" for k in (1, 2, 4) if k <= n] + [f"{sel}"]

    # -- the two stages
    def run(self) -> Result:
        from planlang.solve.holes import HoleOutsidePlan

        try:
            return self._run()
        except HoleOutsidePlan as e:
            raise SolveError(str(e)) from e

    def _run(self) -> Result:
        meshes = self.mesh_options()
        if not meshes:
            raise SolveError("no factorization of the device count splits the batch evenly over the data axes")
        self.progress(f"stage 1: {len(meshes)} mesh candidates")
        coarse = []
        for assign in meshes:
            micro = self.micro_options(assign)[0] if self.holes.micro is not None else None
            fills = self.base_fills(assign, micro, 0, {}, None)
            coarse.append(self.price(fills, _choices(assign, micro, 0, {}, None)))
        ranked = sorted([c for c in coarse if c is not None], key=lambda c: c.key(self.objective))
        if not ranked:
            raise SolveError("no candidate plan could be priced: " + "; ".join(self.notes[-3:]))
        finals = []
        for c in ranked[:2]:
            assign = {k[len("axis "):]: int(v) for k, v in c.choices if k.startswith("axis ")}
            finals.append(self.refine(assign))
        best = self.best(finals + ranked)
        if not best.fits:
            from planlang.model.estimate import format_bytes

            smallest = min(self.tried, key=lambda c: c.peak)
            raise Infeasible(f"no plan fits the budget; the smallest peak found is {format_bytes(smallest.peak)} "
                             f"per device ({smallest}); raise the budget to at least that or add devices",
                             smallest.peak)
        from planlang.model.estimate import format_bytes

        header = [f"solved by `planlang solve --objective {self.objective}` ({len(self.tried)} candidate plans priced):"]
        for r in best.rows:
            header.append(f"  {r.device}: peak {format_bytes(r.peak)} (parameters {format_bytes(r.parameters)}, "
                          f"activations {format_bytes(r.activations)}), step {r.step_time * 1e3:.2f} ms")
        text = fill_holes(self.source, self.path, list(self._fills_of(best).values()), header)
        return Result(text, best, self.tried, self.notes)

    def refine(self, assign: dict[str, int]) -> Candidate:
        """Stage 2 for one mesh: specs, microbatches, ZeRO, checkpointing in that order."""
        h = self.holes
        specs: dict[int, str] = {}
        for k, (rule, _) in enumerate(h.specs):
            specs[k] = self.choose_spec(k, rule, assign, specs)
        micros = self.micro_options(assign) if h.micro is not None else [None]
        cur = None
        for m in micros[:3]:
            cur = self.best([cur, self.price(self.base_fills(assign, m, 0, specs, None), _choices(assign, m, 0, specs, None))])
        micro = dict(cur.choices).get("microbatches") if cur else None
        micro = int(micro) if micro not in (None, "-") else None
        zero = 0
        if h.zero is not None:
            for z in (0, 1, 2, 3):
                c = self.price(self.base_fills(assign, micro, z, specs, None), _choices(assign, micro, z, specs, None))
                if c is not None and (self.objective != "memory" and c.fits):
                    cur, zero = c, z
                    break
                cur = self.best([cur, c])
            zero = int(dict(cur.choices).get("zero", 0))
        if h.checkpoint is not None and cur is not None and not cur.fits:
            for opt in self.ckpt_options():
                c = self.price(self.base_fills(assign, micro, zero, specs, opt), _choices(assign, micro, zero, specs, opt))
                cur = self.best([cur, c])
                if c is not None and c.fits:
                    break
        return cur

    def choose_spec(self, k: int, rule: T.ShardRule, assign: dict[str, int], fixed: dict[int, str]) -> str:
        """The intra-op ILP's spec for the hole's parameters (planlang.solve.intra_op, map §5.1: the plan's
        fixed specs are constraints, the other holes free); if the ILP cannot run on this model, the
        option the estimator prices best."""
        opts = self.spec_options(rule, assign)
        if len(opts) == 1:
            return opts[0]
        try:
            return self._ilp_spec(rule, assign, fixed)
        except Exception as e:  # noqa: BLE001 - fall back to pricing each option by lowering it
            self.notes.append(f"intra-op ILP for {rule.target} did not run ({type(e).__name__}: {e}); "
                              "options priced by the estimator")
        return self._priced_spec(k, rule, assign, fixed, opts)

    def _ilp_spec(self, rule: T.ShardRule, assign: dict[str, int], fixed: dict[int, str]) -> str:
        from planlang.model.load import guess_targets, meta_inputs, plan_loss
        from planlang.model.opgraph import op_graph
        from planlang.plan.checker import check_text
        from planlang.solve.intra_op import problem_args, solve_intra_op

        fills = self.base_fills(assign, 1 if self.holes.micro is not None else None, 0, fixed, None)
        fills = {key: f for key, f in fills.items() if not (key.startswith("spec ") and int(key[5:]) not in fixed)}
        res = check_text(fill_holes(self.source, self.path, list(fills.values())), self.path)
        if res.errors or res.plan is None:
            raise SolveError("the candidate plan does not check")
        plan = res.plan
        model = self.parts().module
        inputs = meta_inputs(plan.inputs)
        loss = plan_loss(plan)
        targets = guess_targets(model, loss, inputs) if loss else None
        graph = op_graph(model, inputs, loss, targets) if targets is not None else op_graph(model, inputs)
        sol = solve_intra_op(graph, **problem_args(plan, graph), objective="time")
        hits = rule.target.select(list(sol.params))
        if not hits:
            raise SolveError(f"the ILP chose no spec for {rule.target}")
        spec = sol.params[hits[0]]
        # parameters stay whole over data and pipeline axes (ZeRO is the plan's way to shard over data)
        p = self.plan.pipeline
        drop = {a for d in self.plan.data if isinstance(d.spec, T.Spec) for a in d.spec.used_axes()}
        drop |= {p.axis} if p is not None and isinstance(p.axis, str) else set()
        kept = T.Spec(tuple(tuple(a for a in spec.axes_of(d) if a not in drop) for d in range(spec.rank)))
        text = str(kept)
        self.progress(f"spec {rule.target} : {text} (intra-op ILP, {len(graph.nodes)} ops)")
        return text

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
        return self.base_fills(assign, micro, int(ch.get("zero", 0)), specs, None if ckpt in (None, "none") else ckpt)


def _replicated_text(rank: int) -> str:
    return "[" + ", ".join("_" for _ in range(rank)) + "]"


def _choices(assign, micro, zero, specs, ckpt) -> tuple[tuple[str, str], ...]:
    out = [(f"axis {k}", str(v)) for k, v in assign.items()]
    out.append(("microbatches", "-" if micro is None else str(micro)))
    out.append(("zero", str(zero)))
    out += [(f"spec {k}", v) for k, v in sorted(specs.items())]
    out.append(("checkpoint", ckpt or "none"))
    return tuple(out)


def solve(path: str, objective: str = "time", progress: Callable[[str], None] = lambda s: None) -> Result:
    if objective not in OBJECTIVES:
        raise SolveError(f"unknown objective {objective!r}; use one of {', '.join(OBJECTIVES)}")
    return _Search(path, objective, progress).run()

