"""The model-free checks of a resolved plan, each a pure function `CheckContext -> diagnostics`.

The order of `RULES` (bottom of this file) is the order diagnostics are produced in; each rule states
the codes it may emit. The mesh, spec and data rules are here; the pipeline and checkpoint rules in
stage_rules.py, the budget, optimizer and precision rules in optimizer_rules.py, where a diagnostic points
in rule_sites.py. The model-aware rules are planlang.model.checks' (run after these by
planlang.model.validation, in their phases).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Iterator

from planlang.lang import ast as A
from planlang.lang.diagnostics import Diagnostic, Label, did_you_mean
from planlang.lang.fixes import did_you_mean_fix
from planlang.lang.lexical import scan

from . import types as T
from .data import batch_dim
from .resolve import diag
from .selection import Selection
from .shard_overlaps import plan_name, shard_overlaps
from .stage_meshes import describe, heterogeneous, stage_shapes, with_sizes
from .rule_sites import site_and_labels, spec_sites, statement_kind, entry_span, axis_refs, ref_span, writes_any
from .stage_rules import pipeline_schedule, stage_ranges, empty_selections, stage_degrees, checkpoint_statements
from .accumulation_rules import accumulation_statement, step_microbatches
from .optimizer_rules import budget_fits_device, zero_sharding, optimizer_arguments, precision_support, data_parallel_support

Diags = Iterator[Diagnostic]


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


def axis_names(ctx) -> Diags:
    """PL311 no mesh at all; PL201 every axis named anywhere must be a mesh axis."""
    plan, mesh = ctx.plan, ctx.plan.mesh
    refs = axis_refs(plan)
    if mesh is None and writes_any(ctx, A.MeshDecl, A.MeshAlias):
        return
    if mesh is None:
        for ax, owner, which, origin in refs:
            where, labels = site_and_labels(ref_span(owner, which), origin)
            yield diag("PL311", f"axis `{ax}` is used but the plan declares no mesh", where, labels=labels,
                       help="declare one: `mesh cluster of 8 x hardware.a100_80g { dp = 2; tp = 4 }`")
            break
        return
    names = set(mesh.names)
    for ax, owner, which, origin in refs:
        if ax not in names:
            where, labels = site_and_labels(ref_span(owner, which), origin)
            guess = did_you_mean(ax, mesh.names)
            # a fix only where the name is written in the user's file: not through a template or loop
            # (the name there is a parameter)
            word = None if origin or guess is None else _the_word(ctx, ref_span(owner, which), ax)
            yield diag("PL201", f"unknown axis `{ax}`", where, labels=labels,
                       help=(f"did you mean `{guess}`?" if guess else "") +
                       f"{' ' if guess else ''}mesh `{mesh.name}` has axes {', '.join(mesh.names) or '(none)'}",
                       fix=did_you_mean_fix(word, ax, guess, mesh.names) if word is not None else None)


def _the_word(ctx, span, word: str):
    """The span of `word` where it stands once in `span` (a spec entry, a pipeline or optimizer
    statement), outside comments and strings; None when it stands there never or more than once."""
    src = ctx.sources.get(span.file)
    if src is None:
        return None
    hits = [(a, b) for kind, a, b in scan(src.text, span.start, span.end) if kind == "word" and src.text[a:b] == word]
    return src.span(*hits[0]) if len(hits) == 1 else None


# ------------------------------------------------------------------------------ specs
def spec_axes(ctx) -> Diags:
    """PL303 an axis twice in one spec; PL307 partial outside activations; PL308 the pipeline axis."""
    plan = ctx.plan
    pp = plan.pipeline.axis if plan.pipeline and isinstance(plan.pipeline.axis, str) else None
    for spec, statement, origin, kind in spec_sites(plan):
        used = spec.used_axes()
        twice = len(set(used)) < len(used)
        partial_param = bool(spec.partial) and kind not in ("output", "input")
        over_pp = pp is not None and pp in used and pp not in spec.partial
        if not (twice or partial_param or over_pp):
            continue
        where, labels = site_and_labels(statement.span, origin)
        what = statement_kind(statement)
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
    """PL306 rank of a data spec; PL305 divisibility of each split dim (batch also by the microbatches of
    a pipeline or of a top-level `microbatches`, labelled where the plan says them)."""
    plan, mesh = ctx.plan, ctx.plan.mesh
    micro, micro_at = step_microbatches(plan)
    micro_label = [Label(micro_at, f"{micro} microbatches per step")] if micro and micro_at is not None else []
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
            by_micro = i == batch and bool(micro)
            if by_micro:
                factors.append(("microbatches", micro))
            total = math.prod(f for _, f in factors)
            if factors and size % total:
                arithmetic = " * ".join(f"{a}({f})" for a, f in factors)
                yield diag("PL305", f"{dim} {size} is not divisible by {arithmetic} = {total}",
                           entry_span(d.spec, i), labels=[Label(inp.span, f"{dim} = {size} declared here")]
                           + (micro_label if by_micro else []),
                           help=f"make {dim} a multiple of {total}, or split it over fewer devices"
                                + (" or into fewer microbatches" if by_micro else ""))
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
                       labels=micro_label, help=f"make {dim} a multiple of {micro}, or use fewer microbatches")


def stage_data_specs(ctx) -> Diags:
    """PL305 and PL313/PL415/PL507 under each stage's own degrees (`stage ... with dp = 4`): the batch split
    over the stage's data axes and the microbatches, and what data parallelism runs on the stage's sizes;
    PL305 for a batch that does not cut into an equal share per device of a pipeline rank for each
    microbatch, what a boundary between stages of different degrees passes on (planlang.plan.stage_meshes)."""
    plan = ctx.plan
    p, mesh = plan.pipeline, plan.mesh
    if not heterogeneous(plan) or mesh is None or p is None or not isinstance(p.stages, tuple):
        return
    own = tuple((a.name, a.size) for a in mesh.axes)
    seen = {own}
    shapes = stage_shapes(plan)
    split = False
    for s, sizes in enumerate(shapes):
        if sizes in seen:
            continue
        seen.add(sizes)
        wrote = describe(plan, sizes)
        sub = dataclasses.replace(ctx, plan=with_sizes(plan, sizes))
        for d in (*data_specs(sub), *data_parallel_support(sub)):
            split = split or d.code == "PL305"
            yield dataclasses.replace(d, message=f"in stage {s} ({wrote}): {d.message}",
                                      labels=tuple(d.labels) + (Label(p.stages[s].span, f"stage {s} runs on {wrote}"),))
    micro, pp = p.microbatches, mesh.axis_size(p.axis)
    if split or not isinstance(micro, int) or not isinstance(pp, int) or not isinstance(mesh.size, int):
        return
    devices = mesh.size // pp
    counts = {math.prod(n for a, n in sh if a != p.axis) for sh in shapes}
    if counts != {devices} or all(a == b for a, b in zip(shapes, shapes[1:])):
        return  # PL410 / PL418 said why the stages do not run; or no boundary moves rows
    for d in plan.data:
        inp = plan.input(d.input)
        if inp is None or not isinstance(d.spec, T.Spec) or d.spec.rank != len(inp.dims):
            continue
        b = batch_dim(inp)
        dim, size = inp.dims[b]
        if d.spec.axes_of(b) and isinstance(size, int) and size % (devices * micro):
            yield diag("PL305", f"{dim} {size} is not divisible by the {devices} devices of a pipeline rank * "
                       f"microbatches({micro}) = {devices * micro}: at a boundary between stages of different "
                       "degrees each device passes on an equal share of each microbatch's rows",
                       entry_span(d.spec, b), labels=[Label(inp.span, f"{dim} = {size} declared here")],
                       help=f"make {dim} a multiple of {devices * micro}, or use fewer microbatches")


RULES = [
    # (function, codes it may emit) — run in this order
    (mesh_shape, ("PL301", "PL302", "PL304", "PL312")),
    (axis_links, ("PL309",)),
    (axis_names, ("PL201", "PL311")),
    (spec_axes, ("PL303", "PL307", "PL308")),
    (conflicting_shards, ("PL310",)),
    (data_specs, ("PL305", "PL306")),
    (pipeline_schedule, ("PL401", "PL402", "PL403", "PL404", "PL411", "PL416", "PL419")),
    (accumulation_statement, ("PL411", "PL417")),
    (stage_ranges, ("PL406", "PL407")),
    (empty_selections, ("PL408",)),
    (stage_degrees, ("PL410", "PL418")),
    (stage_data_specs, ("PL305",)),
    (checkpoint_statements, ("PL405", "PL409", "PL413")),
    (budget_fits_device, ("PL501", "PL505")),
    (zero_sharding, ("PL502", "PL503", "PL504")),
    (optimizer_arguments, ("PL506", "PL508")),
    (precision_support, ("PL509", "PL510", "PL511", "PL512", "PL513")),
    (data_parallel_support, ("PL313", "PL415", "PL507")),
]
