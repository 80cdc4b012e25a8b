"""Model-aware checks: the plan against the real module tree and tensor shapes (traced on meta).

Each is a rule of the checker's list that names the facts it reads (`needs`); planlang.model.validation
computes those facts once per plan and runs `validate`. Their codes sit in the model-aware slots
(x60–x89) of each range; like every code, their entries (name, severity, title, explanation) are in the
table of planlang.lang.codes.
"""
from __future__ import annotations

import math
from typing import Iterator, Sequence

import torch

from planlang.lang.diagnostics import Diagnostic, Label, did_you_mean
from planlang.plan import types as T
from planlang.plan.checker import CheckResult, RULES, Rule, check_resolution
from planlang.plan.checkpoints import checkpoint_groups
from planlang.plan.data import activation_layout, data_degree, tensor_axes
from planlang.plan.resolve import Resolution, diag
from planlang.plan.rule_sites import site_and_labels
from planlang.plan.selection import Selection, covered_modules, stage_targets, to_plan_name
from planlang.plan.units import format_bytes

from .capture.trace import ModuleFacts
from .capture.valueless import VALUE_HELP
from .facts import LoweringFailure
from .stage_sites import stage_sites


def _suggest(sel: Selection, names: list[str]) -> str:
    plan_names = [to_plan_name(n) for n in names]
    guess = did_you_mean(str(sel), plan_names)
    if guess:
        return f"did you mean `{guess}`?"
    # the longest prefix that exists, and what is under it
    parts = str(sel).split(".")
    for k in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:k])
        under = [p for p in plan_names if p.startswith(prefix + ".") and p.count(".") == prefix.count(".") + 1]
        if under:
            return f"`{prefix}` has: " + ", ".join(x.rsplit(".", 1)[1] for x in under[:10])
    return "run `planlang inspect` to list the model's modules"


def _facts(ctx) -> ModuleFacts:
    return ctx.facts["model"]


def _dims_arith(spec: T.Spec, dim: int, mesh: T.Mesh) -> tuple[int, str] | None:
    axes = spec.axes_of(dim)
    sizes = [(a, mesh.axis_size(a)) for a in axes]
    if not axes or any(s is None for _, s in sizes):
        return None
    return math.prod(s for _, s in sizes), " * ".join(f"{a}({s})" for a, s in sizes)  # type: ignore[misc]


def shard_targets(ctx) -> Iterator[Diagnostic]:
    """PL360 unknown paths, PL363 module-only targets, PL361 rank, PL362 divisibility (under the sizes each
    target runs on: a stage's own degrees, planlang.model.stage_sites)."""
    facts, plan = _facts(ctx), ctx.plan
    site_of = stage_sites(plan, facts)
    modules = facts.all_modules
    params = list(facts.params)
    for rule in plan.shards:
        where, labels = site_and_labels(rule.span, rule.origin)
        if rule.kind == "param":
            hits = rule.target.select(params)
            if not hits:
                if rule.target.select(modules):
                    yield diag("PL363", f"`{rule.target}` is a module; shard its parameters", where, labels=labels,
                               help=f"for example `shard {rule.target}.weight : ...`")
                else:
                    yield diag("PL360", f"`{rule.target}` matches no parameter of the model", where, labels=labels,
                               help=_suggest(rule.target, params))
                continue
            shapes = [(to_plan_name(h), facts.params[h][0], h) for h in hits]
        else:
            hits = rule.target.select(modules)
            if not hits:
                yield diag("PL360", f"`{rule.target}` matches no module of the model", where, labels=labels,
                           help=_suggest(rule.target, modules))
                continue
            shapes = []
            for h in hits:
                call = facts.calls.get(h)
                if call is None:
                    continue  # never runs in forward: nothing to shard
                shape = call.output if rule.kind == "output" else (call.inputs[0] if call.inputs else None)
                if shape is not None:
                    shapes.append((f"{rule.kind} of {to_plan_name(h)}", shape, h))
        if not isinstance(rule.spec, T.Spec):
            continue
        yield from _divisible(rule, [(name, shape, site_of(h)) for name, shape, h in shapes], where, labels)


def _divisible(rule: T.ShardRule, shapes: list, where, labels) -> Iterator[Diagnostic]:
    """PL361 and PL362 for `rule`'s targets: (name, shape, the stage_sites.Site it runs on)."""
    assert isinstance(rule.spec, T.Spec)
    by_site: dict[str, list] = {}
    for name, shape, site in shapes:  # under each distinct site, the first and those of other shapes
        group = by_site.setdefault(site.prefix, [])
        if not group or shape != group[0][1]:
            group.append((name, shape, site))
    for group in by_site.values():
        site = group[0][2]
        mesh = site.plan.mesh
        # an activation is laid out with the data axes on its batch dim (implicit in its spec): the runtime
        # needs that layout to divide, not only the spec as written
        laid = rule.spec if rule.kind == "param" or mesh is None else activation_layout(site.plan, rule.spec)
        for name, shape, _ in group:
            if rule.spec.rank != len(shape):
                yield diag("PL361", f"`{name}` has {len(shape)} dims {list(shape)}, but the spec {rule.spec} has "
                           f"{rule.spec.rank}", where, labels=labels,
                           help="write one entry per dim (`_` for dims that are not split)")
                return
            if mesh is None:
                continue
            for d, n in enumerate(shape):
                ar = _dims_arith(laid, d, mesh)
                if ar and n % ar[0] and laid.axes_of(d) != rule.spec.axes_of(d):
                    yield diag("PL362", f"{site.prefix}`{name}` {list(shape)}: dim {d} is {n}, not divisible by "
                               f"{ar[1]} = {ar[0]} "
                               f"(the data axes split the batch dim of every activation: {rule.spec} is laid out as "
                               f"{laid})", where, labels=labels,
                               help=f"use a batch that is a multiple of {ar[0]}, or move "
                                    f"{', '.join(rule.spec.axes_of(d))} to another dim of the spec")
                elif ar and n % ar[0]:
                    yield diag("PL362", f"{site.prefix}`{name}` {list(shape)}: dim {d} is {n}, not divisible by "
                               f"{ar[1]} = {ar[0]}",
                               where, labels=labels,
                               help=f"split dim {d} over axes whose sizes divide {n}, or leave it `_`")








def _heads_scope(name: str) -> str:
    """What a head count covers: the outermost enclosing module named like attention (BERT's
    `attention` holds `self`, which counts the heads, and `output`, the row-parallel projection), else
    the module itself."""
    parts = name.split(".")
    for k in range(1, len(parts) + 1):
        last = parts[k - 1].lower()
        if "attn" in last or "attention" in last:
            return ".".join(parts[:k])
    return name


def attention_head_splits(ctx) -> Iterator[Diagnostic]:
    """PL365: a shard splits an attention module's weights (or its activations' features) over axes
    whose size does not divide its heads (or key/value heads), under the sizes it runs on (its stage's)."""
    facts, plan = _facts(ctx), ctx.plan
    heads = getattr(facts, "heads", None)
    if not heads or plan.mesh is None:
        return
    site_of = stage_sites(plan, facts)
    scopes = {_heads_scope(n): (n, h, kv) for n, (h, kv) in heads.items()}
    params = list(facts.params)
    seen = set()
    for rule in plan.shards:
        if not isinstance(rule.spec, T.Spec):
            continue
        hits: list[tuple[str, tuple[int, ...], Sequence[int]]]  # (name, shape, the dims to check)
        if rule.kind == "param":
            hits = [(h, facts.params[h][0], range(len(facts.params[h][0]))) for h in rule.target.select(params)]
        else:  # an activation: its last dim holds the features
            hits = []
            for h in rule.target.select(facts.all_modules):
                call = facts.calls.get(h)
                shape = None if call is None else call.output if rule.kind == "output" else (
                    call.inputs[0] if call.inputs else None)
                if shape:
                    hits.append((h, shape, [len(shape) - 1]))
        for name, shape, dims in hits:
            scope = next((s for s in scopes if name == s or name.startswith(s + ".")), None)
            if scope is None:
                continue
            attn, h, kv = scopes[scope]
            site = site_of(name)
            assert site.plan.mesh is not None
            for d in dims:
                ar = _dims_arith(rule.spec, d, site.plan.mesh) if d < rule.spec.rank else None
                if ar is None or ar[0] == 1 or shape[d] % ar[0]:
                    continue  # not split, or PL362's
                n = ar[0]
                bad = [(c, what) for c, what in ((h, "heads"), (kv, "key/value heads")) if c and c % n]
                where, labels = site_and_labels(rule.span, rule.origin)
                if not bad or (where, bad[0], n) in seen:
                    continue  # one diagnostic per statement (a template applied to every block: its line)
                seen.add((where, bad[0], n))
                c, what = bad[0]
                yield diag("PL365", f"{site.prefix}`{rule.target}` splits dim {d} of `{to_plan_name(name)}` "
                           f"{list(shape)} over {ar[1]} = {n}, but `{to_plan_name(attn)}` has {c} {what}, not a multiple of {n}",
                           where, labels=labels,
                           help=f"split over axes whose sizes divide {c}, or give the model a multiple of {n} {what}")
                break


def pipeline_stages(ctx) -> Iterator[Diagnostic]:
    """PL360 unknown stage paths, PL460 coverage, PL461 overlap, PL462 order, PL463 shared params."""
    facts, p = _facts(ctx), ctx.plan.pipeline
    if p is None or not isinstance(p.stages, tuple):
        return
    names = stage_targets(facts.all_modules, facts.params)
    stage_of: dict[str, int] = {}
    for st in p.stages:
        for sel in st.modules:
            if not sel.select(names):
                yield diag("PL360", f"stage {st.index}: `{sel}` matches no module of the model", sel.span or st.span,
                           help=_suggest(sel, names))
        held = covered_modules(st.modules, names)
        # in the model's order, so the module named is the same on every run (a set's order follows
        # string hashing); a module two stages claim stays with the first, and the stage still holds
        # the rest (stopping at the overlap made its other modules 'in no stage')
        overlap = [m for m in names if m in held and stage_of.get(m, st.index) != st.index]
        if overlap:
            m = overlap[0]
            yield diag("PL461", f"`{to_plan_name(m)}` is in stages {stage_of[m]} and {st.index}", st.span,
                       help="give each module to one stage")
        for m in names:
            if m in held:
                stage_of.setdefault(m, st.index)
    # every module that runs and has no running child (the leaves of the call tree), and every module
    # that owns parameters directly, must be in a stage
    owners = {n.rsplit(".", 1)[0] if "." in n else "" for n in facts.params}
    leaves = [m for m in facts.order if not any(o.startswith(m + ".") for o in facts.order)]
    needed = leaves + [m for m in facts.order if m in owners and m not in leaves]
    missing = [m for m in facts.order if m in needed and m not in stage_of]
    if missing:
        shown = ", ".join(to_plan_name(m) for m in missing[:6]) + (" ..." if len(missing) > 6 else "")
        yield diag("PL460", f"{len(missing)} module{'s' if len(missing) != 1 else ''} in no stage: {shown}", p.span,
                   help="add them to the stage they run in")
    # a parameter of the root module itself is in no module a stage can hold: the plan names it
    roots = [n for n in facts.params if "." not in n and facts.canonical(n) == n and n not in stage_of]
    if roots:
        yield diag("PL460", f"parameter{'s' if len(roots) > 1 else ''} {', '.join(f'`{n}`' for n in roots)} of the "
                            "root module in no stage", p.span,
                   help=f"name {'them' if len(roots) > 1 else 'it'} in the stage whose code reads "
                        f"{'them' if len(roots) > 1 else 'it'}: `stage ..., {roots[0]}`")
    last = -1
    for m in facts.order:
        s = stage_of.get(m)
        if s is None:
            continue
        if s < last:
            yield diag("PL462", f"`{to_plan_name(m)}` (stage {s}) runs after modules of stage {last}", p.span,
                       help="stages must follow execution order")
            break
        last = s
    for group in facts.shared:
        stages = {stage_of[m] for m in (n.rsplit(".", 1)[0] for n in group) if m in stage_of}
        if len(stages) > 1:
            shape, dtype = facts.params[group[0]]
            size = math.prod(shape) * torch.empty((), dtype=getattr(torch, dtype)).element_size()
            yield diag("PL463", f"{' and '.join(to_plan_name(n) for n in group)} are one parameter but sit in stages "
                       f"{', '.join(map(str, sorted(stages)))}: each of those stages keeps a copy, and their "
                       f"gradients are summed over `{p.axis}` every step ({format_bytes(size)})", p.span,
                       help="put the modules that share it in one stage to save the copy and the sum, or untie "
                            "the parameter in the model")


def checkpoint_paths(ctx) -> Iterator[Diagnostic]:
    """PL360 unknown paths, PL464 contiguity, PL465 one stage per group."""
    facts, plan = _facts(ctx), ctx.plan
    names = facts.all_modules
    stage_of: dict[str, int] = {}
    if plan.pipeline and isinstance(plan.pipeline.stages, tuple):
        for st in plan.pipeline.stages:
            for m in covered_modules(st.modules, names):
                stage_of[m] = st.index
    for g in plan.checkpoints:
        where, labels = site_and_labels(g.span, g.origin)
        picked: list[str] = []
        for sel in g.modules:
            hits = sel.select(names)
            if not hits:
                yield diag("PL360", f"`{sel}` matches no module of the model", where, labels=labels,
                           help=_suggest(sel, names))
            picked += hits
        if not picked:
            continue
        # every group the statement makes (`every N` runs, one per `per` scope), as the runtime recomputes them
        for group in checkpoint_groups([g], names, facts.order):
            stages = {stage_of[m] for m in group if m in stage_of}
            if len(stages) > 1:
                shown = ", ".join(to_plan_name(m) for m in group[:4]) + (" ..." if len(group) > 4 else "")
                yield diag("PL465", f"checkpoint group {shown} spans stages {', '.join(map(str, sorted(stages)))}",
                           where, labels=labels, help="split the group at the stage boundary"
                           + (" (choose `every` so that groups end where stages do)" if g.every is not None else ""))
                break
        if g.every is not None or g.per is not None:
            continue
        parents = {m.rsplit(".", 1)[0] if "." in m else "" for m in picked}
        if len(parents) == 1:
            parent = parents.pop()
            siblings = [m for m in facts.order if (m.rsplit(".", 1)[0] if "." in m else "") == parent]
            idx = sorted(siblings.index(m) for m in picked if m in siblings)
            if idx and idx[-1] - idx[0] + 1 != len(idx):
                gap = siblings[idx[0] + next(i for i, k in enumerate(range(idx[0], idx[-1] + 1)) if k not in idx)]
                yield diag("PL464", f"checkpoint group skips `{to_plan_name(gap)}`", where, labels=labels,
                           help="a group is consecutive modules; split it into two groups")


def memory_budget(ctx) -> Iterator[Diagnostic]:
    """PL560: every device's estimated peak within the budget (or the device memory)."""

    plan = ctx.plan
    estimates = ctx.facts["estimate"]
    limit = plan.budget.bytes if plan.budget else (plan.mesh.device.memory if plan.mesh and plan.mesh.device else None)
    if limit is None:
        return
    span = plan.budget.span if plan.budget else plan.mesh.span
    for e in estimates:
        if e.peak > limit:
            # the gradient buckets (the gradients' own storage, held the whole step) are named as such
            held = (f"gradient buckets {format_bytes(e.grad_buckets)} + buffers {format_bytes(e.buffers - e.grad_buckets)}"
                    if e.grad_buckets else f"buffers {format_bytes(e.buffers)}")
            parts = (f"parameters {format_bytes(e.parameters)} + optimizer {format_bytes(e.optimizer)} + "
                     f"{held} + max(activations {format_bytes(e.activations)} + "
                     f"transient, gradients {format_bytes(e.gradients)} + optimizer step)")
            yield diag("PL560", f"{e.device}: estimated peak {format_bytes(e.peak)} exceeds {format_bytes(limit)}",
                       span, notes=[parts], help="shard more (tp, ZeRO), checkpoint, or add pipeline stages")


def batch_split(ctx) -> Iterator[Diagnostic]:
    """PL364: ops the lowering runs on the whole batch although the plan splits it (facts["lowered"]: the
    program's fallbacks)."""
    fallbacks = ctx.facts["lowered"].fallbacks
    data = [d for d in ctx.plan.data if d.span is not None]
    span = data[0].span if data else ctx.plan.model.span
    for fb in fallbacks:
        yield diag("PL364", fb.message(to_plan_name), span,
                   help="rewrite the op with one planlang has a rule for, or run it outside data parallelism; "
                        "`planlang explain PL364`")


def model_axes_replicated(ctx) -> Iterator[Diagnostic]:
    """PL367: opaque ops the lowering runs whole over axes other than the data axes (facts["lowered"]:
    the program's `replicated`), their inputs gathered and their compute repeated there."""
    span = ctx.plan.model.span  # the model's op, not a statement of the plan
    for rep in ctx.facts["lowered"].replicated:
        yield diag("PL367", rep.message(to_plan_name), span,
                   help="write the op as ops planlang has rules for, or keep its inputs whole over those axes; "
                        "`planlang explain PL367`")


def zero_units(ctx) -> Iterator[Diagnostic]:
    """PL468: a repeated block ZeRO-2/3 leaves in the root FSDP2 unit (facts["lowered"].root_blocks: block
    -> why), whose parameters are then gathered with the root's for the whole step."""
    left = ctx.facts["lowered"].root_blocks
    opt = ctx.plan.optimizer
    if not left or opt is None:
        return
    names = list(left)
    shown = ", ".join(f"`{to_plan_name(n)}` ({left[n]})" for n in names[:3])
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    yield diag("PL468", f"ZeRO-{opt.zero_stage} keeps {len(names)} repeated block(s) in the root FSDP2 unit, "
                        f"gathered with it for the whole step: {shown}{more}", opt.span,
               help="a block is a unit of its own when its instructions run together and its parameters are "
                    "its own; `planlang explain PL468`")


def batch_norm_microbatches(ctx) -> Iterator[Diagnostic]:
    """PL466: a BatchNorm in a step of more than one microbatch (a pipeline's, or gradient accumulation's)."""
    p = ctx.plan.pipeline
    src = p if p is not None else ctx.plan.accumulation
    norms = _facts(ctx).batch_norms
    mb = src.microbatches if src is not None else None
    if src is None or not norms or not isinstance(mb, int) or mb <= 1:
        return
    names = ", ".join(f"`{to_plan_name(n)}`" for n in norms[:3]) + (f" and {len(norms) - 3} more" if len(norms) > 3 else "")
    first = ("use `schedule gpipe microbatches 1` (1F1B needs a microbatch per stage)" if p is not None
             else "use `microbatches 1` (the whole per-rank batch at once)")
    yield diag("PL466", f"{len(norms)} BatchNorm module(s) ({names}) normalize each of the {mb} microbatches "
                        "on its own, not the batch", src.span,
               help=f"{first}, replace BatchNorm with GroupNorm or LayerNorm, or accept per-microbatch statistics")



_FAILURE_HELP = {
    "graph": "planlang cannot build this model's op graph: rewrite the construct in the model (`planlang lower` "
             "shows the program once it lowers), or report it",
    "lower": "every rank would raise this when the plan is applied: split this op's inputs another way (the "
             "statement marked), rewrite the op in the model, or report it",
    "targets": "make the loss take the output and targets shaped as docs/byom.md says (the model's integer "
               "input, class indices, the output's shape, or one value per sample)",
    "loss-read": VALUE_HELP + "; a check of the targets' values belongs in the data pipeline",
    "estimate": "the budget cannot be checked; report it with the plan",
}


def _failure_site(plan, facts, f: LoweringFailure):
    """Where a failure is the user's to fix: the first shard statement over a parameter of the module the
    op runs in (a template's application for its lines), else the budget for an estimate, else the model."""
    model_span = plan.model.span
    if f.stage == "lower" and f.module is not None and facts is not None:
        inside = [n for n in facts.params if not f.module or n.startswith(f.module + ".")]
        for rule in plan.shards:
            if rule.kind == "param" and rule.target.select(inside):
                where, labels = site_and_labels(rule.span, rule.origin)
                return where, labels + [Label(model_span, "the op is in this model")]
    if f.stage == "estimate" and plan.budget is not None:
        return plan.budget.span, [Label(model_span, "the model")]
    return model_span, []


def unlowerable(ctx) -> Iterator[Diagnostic]:
    """PL369: what `check --model` could not compute about the plan, each failure once (the probe's and
    lowering's and the estimate's: facts["failures"])."""
    facts = ctx.facts["model"]
    seen = set()
    for f in [*facts.failures, *ctx.facts["failures"]]:
        if (f.stage, f.cause) not in seen:
            seen.add((f.stage, f.cause))
            yield failure_diagnostic(ctx.plan, facts, f)


def failure_diagnostic(plan, facts, f: LoweringFailure) -> Diagnostic:
    """PL369 for one failure: what could not be computed, the op and where it runs, the exception."""
    where = "" if f.module is None else f" in `{to_plan_name(f.module)}`" if f.module else " at the top level"
    what = {"targets": "the plan's loss cannot be traced", "loss-read": "the plan's loss cannot be traced",
            "estimate": "the plan's memory cannot be estimated"}.get(f.stage, "the plan cannot be lowered")
    op = f": `{f.op}`{where} fails" if f.op else ""
    span, labels = _failure_site(plan, facts, f)
    return diag("PL369", f"{what}{op}: {f.cause}", span, labels=labels, help=_FAILURE_HELP[f.stage])


def weight_gathers_rule(ctx) -> Iterator[Diagnostic]:
    """PL366: a parameter the plan splits that the lowered program converts every step (facts["gathers"]:
    weight_gathers.WeightGather, from `lowering_facts`): all-gathered back to whole, or moved to another
    split, because the op reading it has no strategy for the stored layout. One diagnostic per shard
    statement (a template applied to every block: its line), naming the parameters, the op and the bytes."""
    gathers = ctx.facts["lowered"].gathers
    plan = ctx.plan
    by_site: dict = {}
    for g in gathers:
        rule = next((r for r in reversed(plan.shards) if r.kind == "param" and r.target.matches(g.param)), None)
        where, labels = site_and_labels(rule.span, rule.origin) if rule is not None else (plan.model.span, [])
        by_site.setdefault(where, (labels, []))[1].append(g)
    for where, (labels, gs) in by_site.items():
        g = gs[0]
        what = "all-gathered back to whole" if g.whole else f"converted to {g.to}"
        more = f" (and {len(gs) - 1} more parameter(s) of this statement, {format_bytes(sum(x.bytes for x in gs))} " \
               "in all)" if len(gs) > 1 else ""
        at = f" in `{to_plan_name(g.module)}`" if g.module else ""
        why = "which has no sharding rule" if g.opaque else "which has no strategy for its stored layout"
        fix = (f"`{g.op}` runs on whole values: write it in the model as ops planlang has rules for, or report "
               "it" if g.opaque else
               f"shard `{to_plan_name(g.param)}` so that `{g.op}` has a strategy for it (split a dim the op keeps "
               "whole)")
        yield diag("PL366", f"`{to_plan_name(g.param)}` {list(g.shape)}, stored as {g.stored}, is {what} every step "
                            f"for `{g.op}`{at}, {why} ({', '.join(g.steps)}: {format_bytes(g.bytes)} per rank per "
                            f"step){more}", where, labels=labels,
                   help=f"{fix}; or leave it replicated: the gathered weight costs the communication and the memory "
                        "the split was meant to save (`planlang lower` shows the conversion)")




def stage_split(ctx) -> Iterator[Diagnostic]:
    """PL467 (or the checker's code for the same cause) when the pipeline's stages cannot be cut out of the
    model as the runtime cuts them, PL466 when the cut inlines BatchNorm under data parallelism, PL369
    when an op of the cut program cannot be lowered (facts["stage_cut"]: validation.StageCut)."""
    cut = ctx.facts["stage_cut"]
    p = ctx.plan.pipeline
    if cut.error is not None:
        code, message, help = cut.error
        yield diag(code, message, p.span, help=help)
    if cut.failure is not None:
        yield failure_diagnostic(ctx.plan, None, cut.failure)
    if cut.inlined_norms:
        norms = cut.inlined_norms
        yield diag("PL466", f"{len(norms)} BatchNorm module(s) (`{to_plan_name(norms[0])}`...) run inlined in "
                            "stages cut by torch.export: each data-parallel rank normalizes its own samples",
                   p.span, help="make the model traceable by torch.fx between its stage modules, replace "
                                "BatchNorm with GroupNorm or LayerNorm, or accept per-rank statistics")


# The model-aware rules, in three phases, each rule with the facts it reads (planlang.model.validation
# computes each once): "model" (facts.ModelFacts), "failures" (what could not be computed: PL369),
# "lowered" (validation.Lowered: the program's fallbacks, ZeRO's root blocks, gathered weights),
# "estimate" (the estimator's rows), "stage_cut" (validation.StageCut). A phase runs only on a plan the
# phases before it accepted: lowering or cutting a plan with errors would restate them (PL369 beside the
# error that causes it). A rule whose facts were not computed does not run.
MODEL_RULES = (  # the plan against the probed model
    Rule("shard_targets", ("PL360", "PL361", "PL362", "PL363"), shard_targets, needs=("model",)),
    Rule("attention_head_splits", ("PL365",), attention_head_splits, needs=("model",)),
    Rule("pipeline_stages", ("PL360", "PL460", "PL461", "PL462", "PL463"), pipeline_stages, needs=("model",)),
    Rule("checkpoint_paths", ("PL360", "PL464", "PL465"), checkpoint_paths, needs=("model",)),
    Rule("batch_norm_microbatches", ("PL466",), batch_norm_microbatches, needs=("model",)),
    Rule("unlowerable", ("PL369",), unlowerable, needs=("model", "failures")),
)
PROGRAM_RULES = (  # the plan's lowered program and its estimate
    Rule("memory_budget", ("PL560",), memory_budget, needs=("model", "estimate")),
    Rule("batch_split", ("PL364",), batch_split, needs=("model", "lowered")),
    Rule("model_axes_replicated", ("PL367",), model_axes_replicated, needs=("model", "lowered")),
    Rule("zero_units", ("PL468",), zero_units, needs=("model", "lowered")),
    Rule("weight_gathers", ("PL366",), weight_gathers_rule, needs=("model", "lowered")),
    Rule("unlowerable", ("PL369",), unlowerable, needs=("model", "failures")),
)
STAGE_RULES = (  # the pipeline's stages as the runtime cuts them
    Rule("stage_split", ("PL466", "PL467", "PL369"), stage_split, needs=("model", "stage_cut")),
)
PHASES = (RULES + MODEL_RULES, PROGRAM_RULES, STAGE_RULES)
ALL_RULES = RULES + MODEL_RULES + PROGRAM_RULES[:-1] + STAGE_RULES  # every rule once, in order (docs, explain)


def validate(res: Resolution, path: str, facts: dict | None = None, rules=PHASES[0],
             resolution: bool = True) -> CheckResult:
    """`rules` over a resolved plan (the first phase: the model-free and model rules), the model-aware
    ones with the `facts` they need (planlang.model.validation computes them; without them only the
    model-free rules run). `resolution`: include the resolver's diagnostics (the first phase does)."""
    return check_resolution(res, path, facts, rules, resolution)
