"""The model-free checks of a resolved plan, each a pure function `CheckContext -> diagnostics`.

The order of `RULES` (bottom of this file) is the order diagnostics are produced in; each rule states
the codes it may emit. The model-aware rules are planlang.model.checks.MODEL_RULES (run with these by its `validate`).
"""
from __future__ import annotations

import bisect
import math
from typing import Iterator

from planlang.lang import ast as A
from planlang.lang.diagnostics import Diagnostic, Label, did_you_mean
from planlang.lang.source import Span

from . import types as T
from .data import batch_axes, batch_dim, batch_split_conflict, data_axes
from .optimizers import NO_FSDP, WHOLE_MATRIX, argument_problems
from .resolve import diag
from .selection import Selection, index_range
from .shard_overlaps import plan_name, shard_overlaps
from .units import format_bytes

Diags = Iterator[Diagnostic]


def site_and_labels(span: Span, origin: tuple[Span, ...]) -> tuple[Span, list[Label]]:
    """Point at the user's line: the outermost apply/for site, with a label at the template line."""
    if not origin:
        return span, []
    site = T.user_site(span, origin)
    if site == span:  # the statement is in the user's file (a `for` body, a local template)
        return span, [Label(origin[-1], "expanded from here")]
    return site, [Label(span, "from this line of the template")]


def _spec_sites(plan: T.Plan):
    """(spec, statement, origin, kind) for every spec in the plan: a `DataSpec` or a `ShardRule`.
    A plan has a spec per line of a big file: the statement's span (`.span`) and `_what` are only
    worked out for a diagnostic."""
    for d in plan.data:
        if isinstance(d.spec, T.Spec):
            yield d.spec, d, (), "data"
    for r in plan.shards:
        if isinstance(r.spec, T.Spec):
            yield r.spec, r, r.origin, r.kind


def _what(statement) -> str:
    """How a diagnostic names the spec of a `DataSpec` or `ShardRule`."""
    if isinstance(statement, T.DataSpec):
        return f"data spec of `{statement.input}`"
    return f"spec of `{statement.target}`"


def _entry_span(spec: T.Spec, i: int) -> Span:
    return spec.dim_spans[i] if i < len(spec.dim_spans) else spec.span


def _partial_span(spec: T.Spec, j: int) -> Span:
    return spec.partial_spans[j] if j < len(spec.partial_spans) else spec.span


# ------------------------------------------------------------------------------ mesh
def mesh_shape(ctx) -> Diags:
    """PL302 sizes >= 1, PL301 product vs declared count, PL304/PL312 holes need a divisible count."""
    mesh = ctx.plan.mesh
    if mesh is None:
        return
    fixed = [a for a in mesh.axes if isinstance(a.size, int)]
    for a in fixed:
        if a.size < 1:
            yield diag("PL302", f"axis `{a.name}` has size {a.size}", a.span, help="use a size of at least 1")
    if any(a.size < 1 for a in fixed):
        return
    prod = math.prod(a.size for a in fixed)
    arithmetic = " * ".join(f"{a.name}({a.size})" for a in fixed)
    if mesh.has_holes:
        if mesh.device_count is None:
            yield diag("PL304", f"mesh `{mesh.name}` has axes of unknown size but no device count", mesh.span,
                       help=f"write `mesh {mesh.name} of N x <device> {{ ... }}` with the number of devices")
        elif mesh.device_count % prod:
            yield diag("PL312", f"{mesh.device_count} devices are not divisible by {arithmetic} = {prod}",
                       mesh.span, help="change a fixed axis size so it divides the device count")
    elif mesh.device_count is not None and prod != mesh.device_count:
        yield diag(
            "PL301", f"mesh axes give {arithmetic} = {prod} devices, but {mesh.device_count} are declared",
            mesh.span, labels=[Label(a.span, f"size {a.size}") for a in fixed],
            help=f"make the axis sizes multiply to {mesh.device_count}, or write `?` for the solver",
        )


def axis_links(ctx) -> Diags:
    """PL309: an axis over no link cannot be priced."""
    mesh = ctx.plan.mesh
    if mesh is None:
        return
    for a in mesh.axes:
        if a.link is None and a.link_ref is None and not (isinstance(a.size, int) and a.size == 1):
            yield diag("PL309", f"axis `{a.name}` has no link", a.span,
                       help=f"write `{a.name} = {a.size} over hardware.nvlink3` (or another link)")


def _axis_refs(plan: T.Plan):
    """Every axis the plan names, in order, as (axis, owner, which, origin): the name stands in entry
    `which` of the spec `owner`, in its partial(...) list at `-1 - which` when negative, or `which` is
    None and the span is the owner's. A big plan names an axis per spec entry: spans are only worked
    out (`_ref_span`) for a diagnostic."""
    for spec, _, origin, _ in _spec_sites(plan):
        for i, d in enumerate(spec.dims):
            if isinstance(d, tuple):
                for ax in d:
                    yield ax, spec, i, origin
        for j, ax in enumerate(spec.partial):
            yield ax, spec, -1 - j, origin
    p = plan.pipeline
    if p is not None:
        if isinstance(p.axis, str):
            yield p.axis, p, None, ()
        if isinstance(p.stages, tuple):
            for st in p.stages:
                for ax, _ in st.degrees:
                    yield ax, st, None, ()
    if plan.optimizer is not None and isinstance(plan.optimizer.zero_axis, str):
        yield plan.optimizer.zero_axis, plan.optimizer, None, ()


def _ref_span(owner, which: int | None) -> Span:
    if which is None:
        return owner.span
    return _entry_span(owner, which) if which >= 0 else _partial_span(owner, -1 - which)


def _writes(ctx, *kinds: type) -> bool:
    """Whether the plan's own file has a statement of one of `kinds` (one that failed to resolve
    leaves no value in the plan, and its error already said why: 'no mesh' or 'no budget' would be a
    second diagnostic for the same mistake)."""
    module = ctx.modules.get(ctx.plan.path)
    return module is not None and any(isinstance(s, kinds) for s in module.statements)


def axis_names(ctx) -> Diags:
    """PL311 no mesh at all; PL201 every axis named anywhere must be a mesh axis."""
    plan, mesh = ctx.plan, ctx.plan.mesh
    refs = _axis_refs(plan)
    if mesh is None and _writes(ctx, A.MeshDecl, A.MeshAlias):
        return
    if mesh is None:
        for ax, owner, which, origin in refs:
            where, labels = site_and_labels(_ref_span(owner, which), origin)
            yield diag("PL311", f"axis `{ax}` is used but the plan declares no mesh", where, labels=labels,
                       help="declare one: `mesh cluster of 8 x hardware.a100_80g { dp = 2; tp = 4 }`")
            break
        return
    names = set(mesh.names)
    for ax, owner, which, origin in refs:
        if ax not in names:
            where, labels = site_and_labels(_ref_span(owner, which), origin)
            guess = did_you_mean(ax, mesh.names)
            yield diag("PL201", f"unknown axis `{ax}`", where, labels=labels,
                       help=(f"did you mean `{guess}`?" if guess else "") +
                       f"{' ' if guess else ''}mesh `{mesh.name}` has axes {', '.join(mesh.names) or '(none)'}")


# ------------------------------------------------------------------------------ specs
def spec_axes(ctx) -> Diags:
    """PL303 an axis twice in one spec; PL307 partial outside activations; PL308 the pipeline axis."""
    plan = ctx.plan
    pp = plan.pipeline.axis if plan.pipeline and isinstance(plan.pipeline.axis, str) else None
    for spec, statement, origin, kind in _spec_sites(plan):
        used = spec.used_axes()
        twice = len(set(used)) < len(used)
        partial_param = bool(spec.partial) and kind not in ("output", "input")
        over_pp = pp is not None and pp in used and pp not in spec.partial
        if not (twice or partial_param or over_pp):
            continue
        where, labels = site_and_labels(statement.span, origin)
        what = _what(statement)
        for ax in sorted({a for a in used if used.count(a) > 1}):
            yield diag("PL303", f"axis `{ax}` appears twice in the {what}: {spec}", where if origin else spec.span,
                       labels=labels, help="name each axis once; split one dim over two axes with a tuple `(dp, tp)`")
        if partial_param:
            yield diag("PL307", f"the {what} is partial over {', '.join(spec.partial)}, but only activations can be",
                       where if origin else spec.span, labels=labels,
                       help="remove `partial(...)`; write it on `output of MODULE` instead")
        if over_pp:
            yield diag("PL308", f"the {what} splits a dim over the pipeline axis `{pp}`",
                       where if origin else spec.span, labels=labels,
                       help="the pipeline axis separates stages; use another axis")


def conflicting_shards(ctx) -> Diags:
    """PL310: the same target (or input) with two different specs; with the model's names
    (`ctx.facts["model"]`), also two statements whose selections overlap on a parameter or module."""
    # kind -> target -> the first rule for it (selections are equal exactly when their texts are)
    seen: dict[str, dict[Selection, T.ShardRule]] = {}
    for r in ctx.plan.shards:
        by_target = seen.get(r.kind)
        if by_target is None:
            by_target = seen[r.kind] = {}
        first = by_target.get(r.target)
        if first is None:
            by_target[r.target] = r
        elif first.spec != r.spec:
            yield diag("PL310", f"`{r.target}` is sharded twice: {first.spec} and {r.spec}", r.site,
                       labels=[Label(first.site, f"first sharded as {first.spec} here")],
                       help="keep one shard statement for each target")
    yield from _overlapping_shards(ctx)
    first_data: dict[str, T.DataSpec] = {}
    for d in ctx.plan.data:
        if d.input in first_data and first_data[d.input].spec != d.spec:
            f = first_data[d.input]
            yield diag("PL310", f"input `{d.input}` has two data specs: {f.spec} and {d.spec}", d.span,
                       labels=[Label(f.span, "first given here")], help="keep one `data` statement per input")
        first_data.setdefault(d.input, d)


def _overlapping_shards(ctx) -> Diags:
    """PL310 at the later of two statements that select the same real parameter (or module) with
    different specs: the language has no precedence between them (docs/language.md §14.1), so neither
    may silently win. Needs the model's names; the statements' texts alone cannot tell."""
    facts = ctx.facts.get("model")
    if facts is None:
        return
    names = {"param": list(facts.params), "output": list(facts.all_modules), "input": list(facts.all_modules)}
    seen = set()
    for o in shard_overlaps(ctx.plan.shards, names):
        later, earlier = o.later, o.earlier
        where, labels = site_and_labels(later.span, later.origin)
        first, _ = site_and_labels(earlier.span, earlier.origin)
        if (where, first) in seen:
            continue  # a template applied to every block: one diagnostic for its lines
        seen.add((where, first))
        shown = ", ".join(f"`{plan_name(n)}`" for n in o.names[:4]) + (
            f" and {len(o.names) - 4} more" if len(o.names) > 4 else "")
        yield diag("PL310", f"{shown} {'is' if len(o.names) == 1 else 'are'} sharded twice: {earlier.spec} by "
                            f"`{earlier}` (line {first.line}) and {later.spec} by `{later}`", where,
                   labels=labels + [Label(first, f"`{earlier.target}` selects {'it' if len(o.names) == 1 else 'them'} "
                                                 f"too, as {earlier.spec}")],
                   help=f"no statement takes precedence: write `{earlier.target}` as the names that need "
                        f"{earlier.spec}, without {'it' if len(o.names) == 1 else 'these'}, or give both "
                        "statements the same spec")


def data_specs(ctx) -> Diags:
    """PL306 rank of a data spec; PL305 divisibility of each split dim (batch also by microbatches)."""
    plan, mesh = ctx.plan, ctx.plan.mesh
    micro = plan.pipeline.microbatches if plan.pipeline and isinstance(plan.pipeline.microbatches, int) else None
    for d in plan.data:
        inp = plan.input(d.input)
        if inp is None or not isinstance(d.spec, T.Spec):
            continue
        if d.spec.rank != len(inp.dims):
            yield diag("PL306", f"input `{inp.name}` has {len(inp.dims)} dims ({', '.join(k for k, _ in inp.dims)}) "
                       f"but its data spec has {d.spec.rank} entr{'y' if d.spec.rank == 1 else 'ies'}", d.spec.span,
                       labels=[Label(inp.span, "declared here")],
                       help="write one entry per dim, `_` for dims that are not split")
            continue
        if mesh is None:
            continue
        batch = batch_dim(inp)
        for i, (dim, size) in enumerate(inp.dims):
            factors = [(ax, mesh.axis_size(ax)) for ax in d.spec.axes_of(i)]
            if any(f is None for _, f in factors):
                continue
            if i == batch and micro:
                factors.append(("microbatches", micro))
            total = math.prod(f for _, f in factors)
            if factors and size % total:
                arithmetic = " * ".join(f"{a}({f})" for a, f in factors)
                yield diag("PL305", f"{dim} {size} is not divisible by {arithmetic} = {total}",
                           _entry_span(d.spec, i), labels=[Label(inp.span, f"{dim} = {size} declared here")],
                           help=f"make {dim} a multiple of {total}, or split it over fewer devices")
    # an input no `data` statement splits still goes through the pipeline in microbatches of its batch
    if not micro:
        return
    split = {d.input for d in plan.data}
    for inp in plan.inputs:
        if inp.name in split or not inp.dims:
            continue
        dim, size = inp.dims[batch_dim(inp)]
        if isinstance(size, int) and size % micro:
            yield diag("PL305", f"{dim} {size} is not divisible by microbatches({micro})", inp.span,
                       help=f"make {dim} a multiple of {micro}, or use fewer microbatches")


# ------------------------------------------------------------------------------ pipeline
def pipeline_schedule(ctx) -> Diags:
    """PL401 stages vs axis size; PL402 interleaved divisibility; PL403 bubbles; PL404 chunks; PL411;
    PL416 1F1B with fewer microbatches than stages (the runtime refuses it)."""
    plan = ctx.plan
    p = plan.pipeline
    if p is None:
        return
    size = plan.mesh.axis_size(p.axis) if plan.mesh and isinstance(p.axis, str) else None
    sched = p.schedule if isinstance(p.schedule, T.Schedule) else None
    chunks = sched.chunks if sched and isinstance(sched.chunks, int) else None
    if sched is not None:
        if sched.kind == "interleaved":
            if sched.chunks == 1 or (chunks is not None and chunks < 2):
                yield diag("PL404", "the interleaved schedule needs `chunks N` with N >= 2", sched.span,
                           help="write `schedule interleaved chunks 2`, or use `1f1b`")
        elif sched.kind in ("gpipe", "1f1b") and sched.chunks != 1:
            yield diag("PL404", f"`chunks` does not apply to `{sched.kind}`", sched.span,
                       help="remove `chunks`, or use `schedule interleaved chunks N`")
    m = p.microbatches if isinstance(p.microbatches, int) else None
    if m is not None and m < 1:
        yield diag("PL411", f"microbatches is {m}", p.span, help="use at least 1 microbatch")
        m = None
    if isinstance(p.stages, tuple) and size is not None:
        per_device = chunks if sched and sched.kind == "interleaved" and chunks else 1
        want = size * per_device
        if len(p.stages) != want:
            arithmetic = f"{p.axis}({size})" + (f" * chunks({per_device})" if per_device > 1 else "")
            yield diag("PL401", f"the pipeline has {len(p.stages)} stages but {arithmetic} = {want} are needed", p.span,
                       labels=[Label(st.span, f"stage {st.index}") for st in p.stages[:1]],
                       help=f"write {want} `stage` lines, or change the size of `{p.axis}`")
    if size is not None and m is not None and sched is not None:
        if sched.kind == "interleaved" and m % size:
            yield diag("PL402", f"interleaved needs microbatches divisible by {p.axis}({size}), "
                       f"but {m} % {size} = {m % size}", p.span,
                       help=f"use {((m // size) + 1) * size} microbatches")
        elif m < size and sched.kind == "1f1b":
            yield diag("PL416", f"1f1b needs at least as many microbatches as stages ({m} < {size})", p.span,
                       help=f"use `microbatches {size}` or more, or `schedule gpipe`")
        elif m < size:
            yield diag("PL403", f"{m} microbatch{'' if m == 1 else 'es'} for {size} stages: every step idles "
                       f"{size - 1}/{m + size - 1} of the time", p.span,
                       help=f"use at least {size} microbatches")


def stage_ranges(ctx) -> Diags:
    """PL406 overlap and PL407 order of stages written as index ranges of one container."""
    p = ctx.plan.pipeline
    if p is None or not isinstance(p.stages, tuple):
        return
    last: dict[str, tuple[int, int | None, T.Stage]] = {}
    for st in p.stages:
        for sel in st.modules:
            rng = index_range(sel)
            if rng is None:
                continue
            prefix, a, b = rng
            if prefix in last:
                pa, pb, pst = last[prefix]
                if pst.index != st.index and (pb is None or a < pb):
                    if a < pa:
                        yield diag("PL407", f"stage {st.index} holds `{sel}`, which runs before stage {pst.index}'s "
                                   f"`{prefix}[{pa}:{'' if pb is None else pb}]`", sel.span,
                                   labels=[Label(pst.span, f"stage {pst.index}")],
                                   help="list stages in execution order")
                    else:
                        yield diag("PL406", f"`{sel}` overlaps `{prefix}[{pa}:{'' if pb is None else pb}]` "
                                   f"of stage {pst.index}", sel.span, labels=[Label(pst.span, f"stage {pst.index}")],
                                   help="give each module to exactly one stage")
            last[prefix] = (a, b, st)


def empty_selections(ctx) -> Diags:
    """PL408: `h[a:b]` with a >= b selects nothing."""
    for sel, statement, origin in _selections(ctx.plan):
        for seg in sel.segments:
            for s in seg.sels:
                if s.kind == "slice" and s.a is not None and s.b is not None and s.a >= s.b:
                    where, labels = site_and_labels(sel.span if sel.span.line else statement.span, origin)
                    yield diag("PL408", f"`{seg}` selects nothing: {s.a} >= {s.b}", where, labels=labels,
                               help=f"write `[{s.a}:{s.a + 1}]` or a larger range")


def _selections(plan: T.Plan):
    """(selection, its statement, origin) for every module selection of the plan, in order."""
    for r in plan.shards:
        yield r.target, r, r.origin
    for g in plan.checkpoints:
        for m in g.modules:
            yield m, g, g.origin
    if plan.pipeline and isinstance(plan.pipeline.stages, tuple):
        for st in plan.pipeline.stages:
            for m in st.modules:
                yield m, st, ()


def stage_degrees(ctx) -> Diags:
    """PL410: per-stage sub-mesh degrees name non-pipeline axes and add up to the device count."""
    plan = ctx.plan
    p, mesh = plan.pipeline, plan.mesh
    if p is None or mesh is None or not isinstance(p.stages, tuple) or not any(st.degrees for st in p.stages):
        return
    for st in p.stages:
        for ax, _ in st.degrees:
            if ax == p.axis:
                yield diag("PL410", f"stage {st.index} sets the degree of the pipeline axis `{ax}`", st.span,
                           help="per-stage degrees apply to the other axes")
    total = mesh.size
    if total is None or any(isinstance(v, T.Hole) for st in p.stages for _, v in st.degrees):
        return
    others = [a for a in mesh.axes if a.name != p.axis]
    counts = []
    for st in p.stages:
        given = dict(st.degrees)
        sizes = [given.get(a.name, a.size) for a in others]
        if any(isinstance(s, T.Hole) for s in sizes):
            return
        counts.append(math.prod(sizes))
    if sum(counts) != total:
        arithmetic = " + ".join(str(c) for c in counts)
        yield diag("PL410", f"the stages use {arithmetic} = {sum(counts)} devices, but the mesh has {total}", p.span,
                   help="adjust the `with` degrees so the stages' devices add up to the mesh")


def checkpoint_statements(ctx) -> Diags:
    """PL409 every >= 1; PL405 groups inside one stage; PL413 disjoint groups (index ranges)."""
    plan = ctx.plan
    stage_of: dict[str, list[tuple[int, int | None, int]]] = {}
    if plan.pipeline and isinstance(plan.pipeline.stages, tuple):
        for st in plan.pipeline.stages:
            for sel in st.modules:
                rng = index_range(sel)
                if rng:
                    stage_of.setdefault(rng[0], []).append((rng[1], rng[2], st.index))
    seen: dict[str, _Ranges] = {}
    for g in plan.checkpoints:
        if isinstance(g.every, int) and g.every < 1:
            yield diag("PL409", f"`every {g.every}` groups nothing", g.site, help="use `every 1` or more")
        for sel in g.modules:
            rng = index_range(sel)
            if rng is None:
                continue
            prefix, a, b = rng
            if g.every is None:
                hits = {s for (sa, sb, s) in stage_of.get(prefix, []) if (b is None or sa < b) and (sb is None or a < sb)}
                if len(hits) > 1:
                    where, labels = site_and_labels(g.span, g.origin)
                    yield diag("PL405", f"checkpoint group `{sel}` spans stages {', '.join(map(str, sorted(hits)))}",
                               where, labels=labels,
                               help="split the group at the stage boundary, or use `every N`")
            ranges = seen.get(prefix)
            if ranges is None:
                ranges = seen[prefix] = _Ranges()
            pg = ranges.first_overlap(a, b)
            if pg is not None:
                where, labels = site_and_labels(g.span, g.origin)
                if pg is g:
                    yield diag("PL413", f"`{sel}` overlaps another selection of the same checkpoint group",
                               where, labels=labels, help="make the selections disjoint")
                else:
                    yield diag("PL413", f"`{sel}` is already in the checkpoint group at line {pg.site.line}",
                               where, labels=labels + [Label(pg.site, "first group")],
                               help="make the groups disjoint")
            ranges.add(a, b, g, overlapped=pg is not None)


class _Ranges:
    """The index ranges [a, b) (b None: to the end) of one container that checkpoint groups hold, in the
    order they were added, and the first added that overlaps a new one. While they are disjoint (as in a
    valid plan, however many) that is a bisect over them sorted by start; after an overlap, a scan."""

    def __init__(self) -> None:
        self.added: list[tuple[int, int | None, T.CheckpointGroup]] = []
        self.disjoint = True
        self.starts: list[int] = []  # while disjoint: the ranges sorted; their ends increase too
        self.ends: list[float] = []  # b, or infinity
        self.order: list[int] = []  # index in `added`

    def first_overlap(self, a: int, b: int | None) -> T.CheckpointGroup | None:
        """The group of the first range added that overlaps [a, b) (by the test below), or None."""
        if not self.disjoint:
            for pa, pb, pg in self.added:
                if (pb is None or a < pb) and (b is None or pa < b):
                    return pg
            return None
        hi = len(self.starts) if b is None else bisect.bisect_left(self.starts, b)  # the ranges starting before b
        lo = bisect.bisect_right(self.ends, a, 0, hi)  # of those, the ones ending after a
        if lo >= hi:
            return None
        return self.added[min(self.order[lo:hi])][2]

    def add(self, a: int, b: int | None, g: T.CheckpointGroup, overlapped: bool) -> None:
        self.added.append((a, b, g))
        if not self.disjoint:
            return
        if overlapped or (b is not None and a >= b):  # an empty range overlaps by the test above too
            self.disjoint = False
            return
        k = bisect.bisect_left(self.starts, a)
        self.starts.insert(k, a)
        self.ends.insert(k, math.inf if b is None else b)
        self.order.insert(k, len(self.added) - 1)


# ------------------------------------------------------------------------------ memory and optimizer
def budget_fits_device(ctx) -> Diags:
    """PL501 budget above device memory; PL505 no budget."""
    plan = ctx.plan
    dev = plan.mesh.device if plan.mesh else None
    if plan.budget and dev and plan.budget.bytes > dev.memory:
        yield diag("PL501", f"budget {format_bytes(plan.budget.bytes)} exceeds the {format_bytes(dev.memory)} "
                   f"of `{dev.name}`", plan.budget.span, labels=[Label(dev.span, "device declared here")],
                   help=f"use at most {format_bytes(dev.memory)}")
    if plan.budget is None and plan.mesh is not None and plan.model is not None and not _writes(ctx, A.BudgetDecl):
        yield diag("PL505", "the plan has no memory budget; memory checks use the device's memory",
                   plan.model.span, help="add `budget 40 GiB per device`")


def zero_sharding(ctx) -> Diags:
    """PL502 stage 0-3; PL503 an axis for stages >= 1; PL504 the axis should split the data."""
    opt = ctx.plan.optimizer
    if opt is None:
        return
    if isinstance(opt.zero_stage, int) and opt.zero_stage not in (0, 1, 2, 3):
        yield diag("PL502", f"ZeRO stage {opt.zero_stage} does not exist", opt.span,
                   help="1: optimizer state, 2: + gradients, 3: + parameters")
        return
    if isinstance(opt.zero_stage, int) and opt.zero_stage and opt.zero_axis is None:
        yield diag("PL503", f"ZeRO stage {opt.zero_stage} has no axis", opt.span,
                   help=f"write `zero = {opt.zero_stage} over dp`")
    # (with no `data` statement at all the batch is split over no axis: a ZeRO axis is then no data axis)
    if isinstance(opt.zero_axis, str) and ctx.plan.mesh and ctx.plan.mesh.axis(opt.zero_axis):
        axes = data_axes(ctx.plan)
        known = len(batch_axes(ctx.plan)) == len(ctx.plan.data)  # a `?` batch split: the solver's to choose
        if known and opt.zero_axis not in axes:
            yield diag("PL504", f"ZeRO over `{opt.zero_axis}`, which splits no input's batch", opt.span,
                       help=f"shard optimizer state over a data axis: {', '.join(axes) or 'none'}")


def optimizer_arguments(ctx) -> Diags:
    """PL506: an optimizer argument its torch class does not take or would refuse; PL508: an optimizer
    that cannot step the sharded parameters ZeRO-2/3 gives it (planlang.plan.optimizers)."""
    opt = ctx.plan.optimizer
    if opt is None:
        return
    for problem, fix in argument_problems(opt.name, opt.kwargs):
        yield diag("PL506", problem, opt.span, help=fix)
    mesh = ctx.plan.mesh
    size = mesh.axis_size(opt.zero_axis) if mesh is not None and isinstance(opt.zero_axis, str) else None
    if opt.name in NO_FSDP and opt.zero_stage in (2, 3) and isinstance(size, int) and size > 1:
        yield diag("PL508", f"`{opt.name}` cannot step ZeRO-{opt.zero_stage}'s sharded parameters: "
                   f"{NO_FSDP[opt.name]}", opt.span,
                   help=f"use `zero = 1 over {opt.zero_axis}` (whole parameters per rank), or another optimizer")
    if opt.name in WHOLE_MATRIX and mesh is not None:
        split = next((r for r in ctx.plan.shards if r.kind == "param" and isinstance(r.spec, T.Spec)
                      and r.spec.rank >= 2 and any((mesh.axis_size(a) or 1) > 1 for d in (-2, -1)
                                                   for a in r.spec.axes_of(r.spec.rank + d))), None)
        if split is not None:
            yield diag("PL508", f"`{opt.name}` cannot step a matrix split over its last two dims: "
                       f"{WHOLE_MATRIX[opt.name]}", opt.span,
                       labels=[Label(split.site, f"`{split.target}` split as {split.spec} here")],
                       help="use another optimizer (adamw steps each element on its own), or keep the last two "
                            "dims of every parameter whole")


def precision_support(ctx) -> Diags:
    """The optimizer block's precision fields (planlang.plan.types.Precision): PL509 a dtype no step is kept
    in; PL510 the device declares no `flops.<compute>`; PL511 f16 without loss scaling; PL512 master
    weights narrower than the parameters; PL513 compute wider than the parameters. (PL514, loss scaling
    in a pipeline, is retired: the pipeline runtime scales each microbatch's loss.)"""
    opt = ctx.plan.optimizer
    prec = opt.precision if opt is not None else None
    if prec is None:
        return
    bad = [k for k in ("params", "compute", "reduce", "master") if getattr(prec, k) not in T.PRECISION_DTYPES]
    written = dict(prec.field_spans)
    for k in dict.fromkeys(k if k in written else "precision" if "precision" in written else "params" for k in bad):
        value = getattr(prec, "params" if k == "precision" else k)
        yield diag("PL509", f"`{k}` cannot be {value}", prec.span_of(k), help="use f32, bf16 or f16")
    if bad:
        return
    width = {"f16": 2, "bf16": 2, "f32": 4}
    if width[prec.master] < width[prec.params] or (width[prec.master] == width[prec.params] != 4
                                                   and prec.master != prec.params):
        yield diag("PL512", f"master weights in {prec.master} are narrower than the {prec.params} parameters",
                   prec.span_of("master"), help=f"write `master = f32`")
    if width[prec.compute] > width[prec.params] or (width[prec.compute] == width[prec.params] != 4
                                                    and prec.compute != prec.params):
        yield diag("PL513", f"compute in {prec.compute} is wider than the {prec.params} parameters",
                   prec.span_of("compute"), help=f"write `params = f32` (autocast to {prec.compute}) or "
                   f"`compute = {prec.params}`")
    if "f16" in (prec.params, prec.compute) and prec.loss_scale is None:
        yield diag("PL511", "f16 training without loss scaling", prec.span,
                   help="add `loss_scale = dynamic` to the optimizer block")
    dev = ctx.plan.mesh.device if ctx.plan.mesh is not None else None
    if dev is not None and dev.flops_for(prec.compute) is None:
        declared = ", ".join(f"flops.{d}" for d, _ in dev.flops) or "no flops"
        yield diag("PL510", f"device `{dev.name}` declares no `flops.{prec.compute}` for the plan's {prec.compute} "
                   f"compute (it declares {declared})", prec.span_of("compute" if "compute" in
                   dict(prec.field_spans) else "precision"), labels=[Label(dev.span, "device declared here")],
                   help=f"add `flops.{prec.compute} = ...` to device `{dev.name}`")


def data_parallel_support(ctx) -> Diags:
    """What the runtime runs of data parallelism in a pipeline: PL313 inputs that split their batch over
    different axes; PL415 ZeRO-2/3 in a pipeline with the batch over more than its ZeRO axis; without a
    pipeline, PL507 ZeRO-2/3 data axes FSDP2 cannot arrange, or a parameter split over them."""
    plan = ctx.plan
    conflict = batch_split_conflict(plan)
    if conflict:
        first = next(d for d in plan.data if isinstance(d.spec, T.Spec))
        yield diag("PL313", conflict, first.spec.span or first.span,
                   help="split every input's batch dim over the same axes (the data axes)")
    if plan.pipeline is None and plan.mesh is not None and not conflict:
        yield from _fsdp_axes(plan)
    if plan.pipeline is None or plan.mesh is None:
        return
    data = data_axes(plan)
    big = {a for a in plan.mesh.names if (plan.mesh.axis_size(a) or 1) > 1} - {plan.pipeline.axis}  # PL308's
    opt = plan.optimizer
    if opt is not None and opt.zero_stage in (2, 3) and isinstance(opt.zero_axis, str) and opt.zero_axis in big:
        big_data = [a for a in data if a in big]
        if opt.zero_axis in data and big_data != [opt.zero_axis]:
            yield diag("PL415", f"ZeRO-{opt.zero_stage} in a pipeline shards each stage with FSDP2 over "
                       f"`{opt.zero_axis}` alone; this plan splits the batch over {', '.join(big_data)}", opt.span,
                       help=f"split the batch over `{opt.zero_axis}` only, or use `zero = 1 over {opt.zero_axis}`")

def _fsdp_axes(plan: T.Plan) -> Diags:
    """PL507: ZeRO-2/3 without a pipeline shards with FSDP2 over the ZeRO axis, replicated over at most one
    more data axis that comes before it in the mesh (HSDP), and over parameters no `shard` splits there
    (planlang.runtime.data_parallel.fsdp_mesh and the ZeRO pass of planlang.runtime.apply)."""
    opt, mesh = plan.optimizer, plan.mesh
    assert mesh is not None
    if opt is None or opt.zero_stage not in (2, 3) or not isinstance(opt.zero_axis, str):
        return
    z = opt.zero_axis
    if not isinstance(mesh.axis_size(z), int) or mesh.axis_size(z) == 1 or len(batch_axes(plan)) != len(plan.data):
        return  # no FSDP at all, or a `?` the solver fills
    axes = data_axes(plan)  # size-1 axes included, as the runtime counts them
    if z not in axes:
        return  # PL504
    rest = [a for a in axes if a != z]
    if rest and (len(rest) > 1 or mesh.names.index(rest[0]) > mesh.names.index(z)):
        yield diag("PL507", f"ZeRO-{opt.zero_stage} over `{z}` with the batch also split over {', '.join(rest)}: "
                   f"FSDP2 replicates over at most one more data axis, listed before `{z}` in the mesh",
                   opt.span, help=f"split the batch over `{z}` only, or declare {rest[0]} before {z} in the mesh"
                   + (f" and split it over {rest[0]} and {z} alone" if len(rest) > 1 else ""))
        return
    fsdp = set(rest) | {z}
    for rule in plan.shards:
        split = [a for a in rule.spec.used_axes() if a in fsdp] if isinstance(rule.spec, T.Spec) else []
        if rule.kind == "param" and split:
            site, labels = site_and_labels(rule.span, rule.origin)
            yield diag("PL507", f"`{rule}` splits a parameter over `{split[0]}`, which ZeRO-{opt.zero_stage} "
                       f"shards with FSDP2 already", site, labels=labels + [Label(opt.span, "ZeRO declared here")],
                       help=f"take `{split[0]}` out of the spec: ZeRO-{opt.zero_stage} shards the parameter over it")
            return


RULES = [
    # (function, codes it may emit) — run in this order
    (mesh_shape, ("PL301", "PL302", "PL304", "PL312")),
    (axis_links, ("PL309",)),
    (axis_names, ("PL201", "PL311")),
    (spec_axes, ("PL303", "PL307", "PL308")),
    (conflicting_shards, ("PL310",)),
    (data_specs, ("PL305", "PL306")),
    (pipeline_schedule, ("PL401", "PL402", "PL403", "PL404", "PL411", "PL416")),
    (stage_ranges, ("PL406", "PL407")),
    (empty_selections, ("PL408",)),
    (stage_degrees, ("PL410",)),
    (checkpoint_statements, ("PL405", "PL409", "PL413")),
    (budget_fits_device, ("PL501", "PL505")),
    (zero_sharding, ("PL502", "PL503", "PL504")),
    (optimizer_arguments, ("PL506", "PL508")),
    (precision_support, ("PL509", "PL510", "PL511", "PL512", "PL513")),
    (data_parallel_support, ("PL313", "PL415", "PL507")),
]
