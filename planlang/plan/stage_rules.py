"""The model-free rules of pipelines and checkpoint groups: the schedule against the axis and the
microbatches, stage ranges and degrees, selections that match nothing, checkpoint statements."""
from __future__ import annotations

import bisect
import math
from typing import Iterator

from planlang.lang.diagnostics import Diagnostic, Fix, Label
from planlang.lang.fixes import replace as replace_fix

from . import types as T
from .resolve import diag
from .data import batch_axes
from .selection import index_range
from .stage_meshes import heterogeneous, position_chunks, stage_shapes
from .rule_sites import site_and_labels

Diags = Iterator[Diagnostic]


# ------------------------------------------------------------------------------ pipeline
def _drop_chunks(ctx, sched: T.Schedule) -> Fix | None:
    """`1f1b chunks 2` as `1f1b`: safe, chunks mean nothing to gpipe and 1f1b (none when the span is not
    that text, e.g. a `?` for the chunks)."""
    src = ctx.sources.get(sched.span.file)
    text = src.text[sched.span.start:sched.span.end] if src is not None else ""
    if not (text.startswith(sched.kind) and text[len(sched.kind):].split()[:1] == ["chunks"]):
        return None
    return replace_fix(sched.span, sched.kind, "remove `chunks`")


def pipeline_schedule(ctx) -> Diags:
    """PL401 stages vs axis size; PL402 interleaved divisibility; PL403 bubbles; PL404 chunks (the V
    shapes zbv and dualpipev: exactly `chunks 2`, so that `Schedule.chunks` is their stages per rank as it is
    every chunked schedule's); PL411; PL416 1F1B with fewer microbatches than stages, dualpipev with fewer
    than its 2p model stages (the runtime refuses both; zbv takes any, as torch's ScheduleZBVZeroBubble);
    PL419 a split backward with checkpoint groups."""
    plan = ctx.plan
    p = plan.pipeline
    if p is None:
        return
    size = plan.mesh.axis_size(p.axis) if plan.mesh and isinstance(p.axis, str) else None
    sched = p.schedule if isinstance(p.schedule, T.Schedule) else None
    chunks = sched.chunks if sched and isinstance(sched.chunks, int) else None
    if sched is not None:
        if sched.kind in T.V_SHAPED:  # two stages per rank, always: `chunks 2`, written
            if sched.chunks != 2 and not T.is_hole(sched.chunks):
                yield diag("PL404", f"the {sched.kind} schedule holds exactly two stages per rank: it needs "
                           f"`chunks 2`", sched.span, help=f"write `schedule {sched.kind} chunks 2`")
        elif sched.kind in T.CHUNKED:
            least = T.MIN_CHUNKS[sched.kind]
            if (sched.chunks == 1 and least > 1) or (chunks is not None and chunks < least):
                other = "1f1b" if sched.kind == "interleaved" else "gpipe"  # what one chunk per rank would be
                yield diag("PL404", f"the {sched.kind} schedule needs `chunks N` with N >= {least}", sched.span,
                           help=f"write `schedule {sched.kind} chunks {max(2, least)}`"
                           + ("" if least == 1 else f", or use `{other}`"))
        elif sched.kind in ("gpipe", "1f1b") and sched.chunks != 1:
            yield diag("PL404", f"`chunks` does not apply to `{sched.kind}`", sched.span,
                       help="remove `chunks`, or use `schedule interleaved chunks N` (or `looped_bfs chunks N`)",
                       fix=_drop_chunks(ctx, sched))
    m = p.microbatches if isinstance(p.microbatches, int) else None
    if m is not None and m < 1:
        yield diag("PL411", f"microbatches is {m}", p.span, help="use at least 1 microbatch")
        m = None
    if isinstance(p.stages, tuple) and size is not None:
        # (a V shape holds two stages per rank whatever its chunks say, a hole included)
        per_device = T.stages_per_rank(sched.kind, chunks or 2) if sched and (chunks or sched.kind in T.V_SHAPED) else 1
        want = size * per_device
        if len(p.stages) != want:
            arithmetic = f"{p.axis}({size})" + (f" * chunks({per_device})" if per_device > 1 else "")
            yield diag("PL401", f"the pipeline has {len(p.stages)} stages but {arithmetic} = {want} are needed", p.span,
                       labels=[Label(st.span, f"stage {st.index}") for st in p.stages[:1]],
                       help=f"write {want} `stage` lines, or change the size of `{p.axis}`")
    if size is not None and m is not None and sched is not None:
        if sched.kind in ("interleaved", "zero_bubble") and m % size:
            yield diag("PL402", f"{sched.kind} needs microbatches divisible by {p.axis}({size}), "
                       f"but {m} % {size} = {m % size}", p.span,
                       help=f"use {((m // size) + 1) * size} microbatches")
        elif sched.kind == "dualpipev" and m < 2 * size:  # torch's ScheduleDualPipeV refuses fewer
            yield diag("PL416", f"dualpipev needs at least as many microbatches as model stages "
                       f"({m} < 2 * {p.axis}({size}) = {2 * size})", p.span,
                       help=f"use `microbatches {2 * size}` or more, or `schedule zbv chunks 2`")
        elif m < size and sched.kind == "1f1b":
            yield diag("PL416", f"1f1b needs at least as many microbatches as stages ({m} < {size})", p.span,
                       help=f"use `microbatches {size}` or more, or `schedule gpipe`")
        elif m < size:
            # GPipe's bubble (p − 1)/(m + p − 1); the chunked and V schedules' is their simulation's (estimate)
            idle = (f"every step idles {size - 1}/{m + size - 1} of the time" if sched.kind == "gpipe" else
                    "each rank idles while the pipeline fills and drains (`planlang estimate` gives the bubble)")
            yield diag("PL403", f"{m} microbatch{'' if m == 1 else 'es'} for {size} stages: {idle}", p.span,
                       help=f"use at least {size} microbatches")
    if sched is not None and sched.kind in T.SPLIT_BACKWARD and ctx.plan.checkpoints:
        group = ctx.plan.checkpoints[0]
        yield diag("PL419", f"{sched.kind} recomputes a checkpoint group once in each weight-gradient group of "
                   "its W: the estimate undercounts its peak there", group.span,
                   labels=[Label(sched.span, f"schedule {sched.kind}")],
                   help="remove the checkpoint groups, or use `schedule interleaved` with them")


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
    """PL410: per-stage sub-mesh degrees name non-pipeline axes and add up to the device count; PL418: stages
    of their own degrees that the runtime cannot run as written (planlang.plan.stage_meshes)."""
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
    sched = p.schedule
    if total is None or any(isinstance(v, T.Hole) for st in p.stages for _, v in st.degrees) \
            or not isinstance(sched, T.Schedule) or not isinstance(sched.chunks, int):
        return
    # a chunked schedule's `chunks` stages share each pipeline rank's devices: they are counted once
    per_rank = T.stages_per_rank(sched.kind, sched.chunks)
    others = [a for a in mesh.axes if a.name != p.axis]
    counts = []
    for st in p.stages:
        given = dict(st.degrees)
        sizes = [given.get(a.name, a.size) for a in others]
        if any(isinstance(s, T.Hole) for s in sizes):
            return
        counts.append(math.prod(sizes))
    if sum(counts) != total * per_rank:
        arithmetic = " + ".join(str(c) for c in counts) + (f", over {per_rank} chunks per rank," if per_rank > 1 else "")
        yield diag("PL410", f"the stages use {arithmetic} = {sum(counts) // per_rank} devices, but the mesh has "
                   f"{total}", p.span, help="adjust the `with` degrees so the stages' devices add up to the mesh")
        return
    if heterogeneous(plan):
        yield from _runnable_degrees(plan, counts, per_rank)


def _runnable_degrees(plan: T.Plan, counts: list[int], per_rank: int) -> Diags:
    """PL418: stages of their own degrees run one stage per pipeline rank, each on that rank's devices, with
    the pipeline axis first in the mesh and every position holding the same rows at each stage boundary
    (planlang.plan.stage_meshes)."""
    p, mesh = plan.pipeline, plan.mesh
    assert p is not None and mesh is not None and isinstance(p.stages, tuple) and isinstance(p.schedule, T.Schedule)
    odd = [st for st in p.stages if st.degrees]
    site = odd[0].span if odd else p.span
    if per_rank > 1:
        yield diag("PL418", f"`{p.schedule.kind}` holds {per_rank} stages on each pipeline rank; stages of their own "
                   "degrees run one stage per rank", site,
                   help="use `schedule 1f1b`, `gpipe` or `zero_bubble` (one chunk), or remove the `with` degrees")
        return
    n = counts[0] if counts else 0
    uneven = [(st, c) for st, c in zip(p.stages, counts) if c != sum(counts) // len(counts)]
    if uneven:
        st, c = uneven[0]
        yield diag("PL418", f"stage {st.index} runs on {c} devices, but each pipeline rank has "
                   f"{sum(counts) // len(counts)}: stages of different device counts are not run yet", st.span,
                   help="give every stage the same number of devices (the product of its degrees), trading "
                        "data for tensor parallelism within it")
        return
    if mesh.axes[0].name != p.axis:
        yield diag("PL418", f"the pipeline axis `{p.axis}` is not the mesh's first axis: stages of their own degrees "
                   "lay their sizes over the devices of one pipeline rank, which needs the pipeline axis outermost",
                   p.span, help=f"declare `{p.axis}` first in the mesh")
        return
    batch = next(iter(batch_axes(plan).values()), ())
    chunks = [position_chunks(sh, p.axis, batch) for sh in stage_shapes(plan)]
    for a, b in zip(range(len(chunks)), range(1, len(chunks))):
        if chunks[a] != chunks[b]:
            k = next(i for i in range(n) if chunks[a][i] != chunks[b][i])
            yield diag("PL418", f"device {k} of a pipeline rank holds rows {chunks[a][k]} of {n} of each microbatch "
                       f"in stage {a} but rows {chunks[b][k]} in stage {b}: the stages' data axes are laid out "
                       "differently over the rank's devices", p.stages[b].span,
                       help="declare the data axes before the other axes in the mesh, so that each replica's "
                            "devices are adjacent in every stage")
            return


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
