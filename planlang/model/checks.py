"""Model-aware checks: the plan against the real module tree and tensor shapes (traced on meta).

Registered into the checker's rule list with `needs_model=True`; they read `ctx.facts["model"]`, a
`ModuleFacts` (planlang.model.capture.trace). `model_facts_for(plan)` builds it, or returns a load diagnostic.
Their codes sit in the model-aware slots (x60–x89) of each range; like every code, their entries (name,
severity, title, explanation) are in the table of planlang.lang.codes.
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from typing import Iterator

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils._python_dispatch import TorchDispatchMode

from planlang.lang.diagnostics import Diagnostic, Label, Severity, did_you_mean
from planlang.plan import types as T
from planlang.plan.checker import CheckResult, RULES, Rule, check_resolution
from planlang.plan.checkpoints import checkpoint_groups
from planlang.plan.complete import complete
from planlang.plan.resolve import Resolution, Resolver, diag
from planlang.plan.rules import site_and_labels
from planlang.plan.selection import Selection, covered_modules, to_plan_name

from planlang.plan.data import activation_layout, data_degree, tensor_axes
from planlang.plan.units import format_bytes

from .price.estimate import estimate_plan
from .capture.load import EXIT_HELP, ModelLoadError, build_model, exited, guess_targets, meta_inputs, no_exit, plan_loss
from .program.lowering import Fallback, LoweringError, lower, mark_checkpoints
from .capture.opgraph import op_graph
from .program.pipeline_program import cut_program, microbatch_plan
from .program.stages import OUT_SPEC, StageSplitError, split_stages
from .capture.trace import ModuleFacts, bind_inputs, meta_or_fake, probe_modules
from .price.weight_gathers import WeightGather, weight_gathers
from .program.zero_units import block_ranges


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
    """PL360 unknown paths, PL363 module-only targets, PL361 rank, PL362 divisibility."""
    facts, plan = _facts(ctx), ctx.plan
    mesh = plan.mesh
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
            shapes = [(to_plan_name(h), facts.params[h][0]) for h in hits]
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
                    shapes.append((f"{rule.kind} of {to_plan_name(h)}", shape))
        if not isinstance(rule.spec, T.Spec):
            continue
        # an activation is laid out with the data axes on its batch dim (implicit in its spec): the runtime
        # needs that layout to divide, not only the spec as written
        laid = rule.spec if rule.kind == "param" or mesh is None else activation_layout(plan, rule.spec)
        for name, shape in shapes[:1] + [s for s in shapes[1:] if s[1] != shapes[0][1]]:
            if rule.spec.rank != len(shape):
                yield diag("PL361", f"`{name}` has {len(shape)} dims {list(shape)}, but the spec {rule.spec} has "
                           f"{rule.spec.rank}", where, labels=labels,
                           help="write one entry per dim (`_` for dims that are not split)")
                break
            if mesh is None:
                continue
            for d, n in enumerate(shape):
                ar = _dims_arith(laid, d, mesh)
                if ar and n % ar[0] and laid.axes_of(d) != rule.spec.axes_of(d):
                    yield diag("PL362", f"`{name}` {list(shape)}: dim {d} is {n}, not divisible by {ar[1]} = {ar[0]} "
                               f"(the data axes split the batch dim of every activation: {rule.spec} is laid out as "
                               f"{laid})", where, labels=labels,
                               help=f"use a batch that is a multiple of {ar[0]}, or move "
                                    f"{', '.join(rule.spec.axes_of(d))} to another dim of the spec")
                elif ar and n % ar[0]:
                    yield diag("PL362", f"`{name}` {list(shape)}: dim {d} is {n}, not divisible by {ar[1]} = {ar[0]}",
                               where, labels=labels,
                               help=f"split dim {d} over axes whose sizes divide {n}, or leave it `_`")


@dataclass
class ModelFacts(ModuleFacts):
    """The probed facts plus what the rules read off the module objects: each attention module's heads
    (module name -> (heads, key/value heads or None))."""

    heads: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    failures: list["LoweringFailure"] = field(default_factory=list)  # facts the probe could not compute


_HEAD_ATTRS = ("num_heads", "n_head", "n_heads", "heads", "num_attention_heads")
_KV_ATTRS = ("num_key_value_heads", "n_kv_heads", "num_kv_heads")


def _count(obj, names: tuple[str, ...]) -> int | None:
    for a in names:
        v = getattr(obj, a, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def attention_heads(module: nn.Module) -> dict[str, tuple[int, int | None]]:
    """Modules that declare a head count (`heads`, `num_heads`, `n_head`, ...: the examples, torch's
    MultiheadAttention, Hugging Face's attention modules, which may keep it in their `config`)."""
    out = {}
    for name, m in module.named_modules():
        if not name:
            continue
        heads, kv = _count(m, _HEAD_ATTRS), _count(m, _KV_ATTRS)
        cfg = getattr(m, "config", None)
        if heads is None and cfg is not None and "attention" in type(m).__name__.lower():
            heads, kv = _count(cfg, ("num_attention_heads", "n_head")), _count(cfg, _KV_ATTRS)
        if heads is not None:
            out[name] = (heads, kv if kv != heads else None)
    return out


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
    whose size does not divide its heads (or key/value heads)."""
    facts, plan = _facts(ctx), ctx.plan
    heads = getattr(facts, "heads", None)
    if not heads or plan.mesh is None:
        return
    scopes = {_heads_scope(n): (n, h, kv) for n, (h, kv) in heads.items()}
    params = list(facts.params)
    seen = set()
    for rule in plan.shards:
        if not isinstance(rule.spec, T.Spec):
            continue
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
            for d in dims:
                ar = _dims_arith(rule.spec, d, plan.mesh) if d < rule.spec.rank else None
                if ar is None or ar[0] == 1 or shape[d] % ar[0]:
                    continue  # not split, or PL362's
                n = ar[0]
                bad = [(c, what) for c, what in ((h, "heads"), (kv, "key/value heads")) if c and c % n]
                where, labels = site_and_labels(rule.span, rule.origin)
                if not bad or (where, bad[0], n) in seen:
                    continue  # one diagnostic per statement (a template applied to every block: its line)
                seen.add((where, bad[0], n))
                c, what = bad[0]
                yield diag("PL365", f"`{rule.target}` splits dim {d} of `{to_plan_name(name)}` {list(shape)} over "
                           f"{ar[1]} = {n}, but `{to_plan_name(attn)}` has {c} {what}, not a multiple of {n}",
                           where, labels=labels,
                           help=f"split over axes whose sizes divide {c}, or give the model a multiple of {n} {what}")
                break


def pipeline_stages(ctx) -> Iterator[Diagnostic]:
    """PL360 unknown stage paths, PL460 coverage, PL461 overlap, PL462 order, PL463 shared params."""
    facts, p = _facts(ctx), ctx.plan.pipeline
    if p is None or not isinstance(p.stages, tuple):
        return
    names = facts.all_modules
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
        stages = {stage_of.get(n.rsplit(".", 1)[0]) for n in group} - {None}
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
    estimates = ctx.facts.get("estimate") or []
    limit = plan.budget.bytes if plan.budget else (plan.mesh.device.memory if plan.mesh and plan.mesh.device else None)
    if limit is None:
        return
    span = plan.budget.span if plan.budget else plan.mesh.span  # type: ignore[union-attr]
    for e in estimates:
        if e.peak > limit:
            parts = (f"parameters {format_bytes(e.parameters)} + optimizer {format_bytes(e.optimizer)} + "
                     f"buffers {format_bytes(e.buffers)} + max(activations {format_bytes(e.activations)} + "
                     f"transient, gradients {format_bytes(e.gradients)} + optimizer step)")
            yield diag("PL560", f"{e.device}: estimated peak {format_bytes(e.peak)} exceeds {format_bytes(limit)}",
                       span, notes=[parts], help="shard more (tp, ZeRO), checkpoint, or add pipeline stages")


def batch_split(ctx) -> Iterator[Diagnostic]:
    """PL364: ops the lowering runs on the whole batch although the plan splits it (facts["lowering"]: the
    program's fallbacks, when the plan was lowered)."""
    fallbacks = ctx.facts.get("lowering") or []
    data = [d for d in ctx.plan.data if d.span is not None]
    span = data[0].span if data else ctx.plan.model.span  # type: ignore[union-attr]
    for fb in fallbacks:
        where = f"in `{to_plan_name(fb.module)}`" if fb.module else "at the model's top level"
        yield diag("PL364", f"`{fb.target}` {where} runs on the whole batch: its inputs are gathered over "
                            f"{', '.join(fb.axes)} ({format_bytes(fb.gathered_bytes)} per rank per step) and it "
                            f"is repeated on every rank there", span,
                   help="rewrite the op with one planlang has a rule for, or run it outside data parallelism; "
                        "`planlang explain PL364`")


def zero_units(ctx) -> Iterator[Diagnostic]:
    """PL468: a repeated block ZeRO-2/3 leaves in the root FSDP2 unit (facts["root_blocks"]: block -> why,
    from the lowering), whose parameters are then gathered with the root's for the whole step."""
    left = ctx.facts.get("root_blocks") or {}
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
    """PL466: a BatchNorm in a pipeline that runs more than one microbatch."""
    p = ctx.plan.pipeline
    norms = _facts(ctx).batch_norms
    mb = p.microbatches if p is not None else None
    if p is None or not norms or not isinstance(mb, int) or mb <= 1:
        return
    names = ", ".join(f"`{to_plan_name(n)}`" for n in norms[:3]) + (f" and {len(norms) - 3} more" if len(norms) > 3 else "")
    yield diag("PL466", f"{len(norms)} BatchNorm module(s) ({names}) normalize each of the {mb} microbatches "
                        "on its own, not the batch", p.span,
               help="use `schedule gpipe microbatches 1` (1F1B needs a microbatch per stage), replace BatchNorm with "
                    "GroupNorm or LayerNorm, or accept "
                    "per-microbatch statistics")


@dataclass(frozen=True)
class LoweringFailure:
    """A fact `check --model` needed and could not compute (PL369), as data: `stage` is "graph" (the op
    graph of the model cannot be built), "lower" (no strategy for the layouts the plan gives an op),
    "targets" (the loss accepts no targets planlang makes) or "estimate" (the lowered program's memory);
    `op` and `module` name the op being lowered, when known."""

    stage: str
    cause: str
    op: str | None = None
    module: str | None = None

    @classmethod
    def of(cls, err: BaseException, stage: str | None = None) -> "LoweringFailure":
        """The failure `err` is: the op it was raised for is the innermost `node` the op-graph builder or
        the lowering was working on (their loops name it so; the exception's message may not)."""
        op = module = None
        found = None
        tb = err.__traceback__
        while tb is not None:
            f = tb.tb_frame
            if f.f_globals.get("__name__", "").startswith("planlang.model.") and "node" in f.f_locals:
                found = f.f_locals["node"]
            tb = tb.tb_next
        spec = getattr(found, "op", None)
        if hasattr(spec, "kind"):  # an OpNode of the graph: the lowering's
            op = str(spec.attr("target", spec.kind)) if spec.kind == "opaque" else spec.kind
            module, stage = found.module, stage or "lower"
        elif found is not None and hasattr(found, "target"):  # an fx node: building the graph
            op = getattr(found.target, "__name__", str(found.target))
            stage = stage or "graph"
        return cls(stage or "lower", f"{type(err).__name__}: {err}", op, module)


class NoTargets(Exception):
    """The loss (`found`: where) accepts none of the targets planlang makes (load.target_candidates)."""

    def __init__(self, found: str):
        super().__init__(f"{found} accepts none of the targets planlang makes for it (the model's integer input, "
                         "class indices over the output's leading dims, the output's shape, one value per sample)")
        self.found = found


_FAILURE_HELP = {
    "graph": "planlang cannot build this model's op graph: rewrite the construct in the model (`planlang lower` "
             "shows the program once it lowers), or report it",
    "lower": "every rank would raise this when the plan is applied: split this op's inputs another way (the "
             "statement marked), rewrite the op in the model, or report it",
    "targets": "make the loss take the output and targets shaped as docs/byom.md says (the model's integer "
               "input, class indices, the output's shape, or one value per sample)",
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
    the lowering's: facts["failures"])."""
    facts = ctx.facts.get("model")
    seen = set()
    for f in [*(getattr(facts, "failures", None) or []), *(ctx.facts.get("failures") or [])]:
        if (f.stage, f.cause) not in seen:
            seen.add((f.stage, f.cause))
            yield failure_diagnostic(ctx.plan, facts, f)


def failure_diagnostic(plan, facts, f: LoweringFailure) -> Diagnostic:
    """PL369 for one failure: what could not be computed, the op and where it runs, the exception."""
    where = "" if f.module is None else f" in `{to_plan_name(f.module)}`" if f.module else " at the top level"
    what = {"targets": "the plan's loss cannot be traced", "estimate": "the plan's memory cannot be estimated"
            }.get(f.stage, "the plan cannot be lowered")
    op = f": `{f.op}`{where} fails" if f.op else ""
    span, labels = _failure_site(plan, facts, f)
    return diag("PL369", f"{what}{op}: {f.cause}", span, labels=labels, help=_FAILURE_HELP[f.stage])


def weight_gathers_rule(ctx) -> Iterator[Diagnostic]:
    """PL366: a parameter the plan splits that the lowered program converts every step (facts["gathers"]:
    weight_gathers.WeightGather, from `lowering_facts`): all-gathered back to whole, or moved to another
    split, because the op reading it has no strategy for the stored layout. One diagnostic per shard
    statement (a template applied to every block: its line), naming the parameters, the op and the bytes."""
    gathers = ctx.facts.get("gathers") or ()
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


MODEL_RULES = (
    Rule("shard_targets", ("PL360", "PL361", "PL362", "PL363"), shard_targets, needs_model=True),
    Rule("attention_head_splits", ("PL365",), attention_head_splits, needs_model=True),
    Rule("pipeline_stages", ("PL360", "PL460", "PL461", "PL462", "PL463"), pipeline_stages, needs_model=True),
    Rule("checkpoint_paths", ("PL360", "PL464", "PL465"), checkpoint_paths, needs_model=True),
    Rule("memory_budget", ("PL560",), memory_budget, needs_model=True),
    Rule("batch_split", ("PL364",), batch_split, needs_model=True),
    Rule("zero_units", ("PL468",), zero_units, needs_model=True),
    Rule("batch_norm_microbatches", ("PL466",), batch_norm_microbatches, needs_model=True),
    Rule("weight_gathers", ("PL366",), weight_gathers_rule, needs_model=True),
    Rule("unlowerable", ("PL369",), unlowerable, needs_model=True),
)
ALL_RULES = RULES + MODEL_RULES  # the model-free rules first, in their order, then the model-aware ones


def validate(res: Resolution, path: str, facts: ModuleFacts | None = None, estimate=None,
             fallbacks: list[Fallback] | None = None, root_blocks: dict[str, str] | None = None,
             failures: list[LoweringFailure] | None = None,
             gathers: list[WeightGather] | None = None):
    """The one validation of a resolved plan, for every command and the language server: every rule,
    the model-aware ones when the model's `facts` are given (PL560 when its `estimate` is, PL364 when
    the lowering's `fallbacks` are, PL468 when its `root_blocks` are: `lowering_facts`; PL369 for the
    lowering's and the estimate's `failures`)."""
    extra = {"model": facts} if facts is not None else {}
    if facts is not None and estimate is not None:
        extra["estimate"] = estimate
    if facts is not None and fallbacks is not None:
        extra["lowering"] = fallbacks
    if facts is not None and root_blocks:
        extra["root_blocks"] = root_blocks
    if facts is not None and gathers:
        extra["gathers"] = gathers
    if facts is not None and failures:
        extra["failures"] = failures
    return check_resolution(res, path, extra or None, ALL_RULES)


aten = torch.ops.aten


class StrictMeta(TorchDispatchMode):
    """What the meta kernels let through and the CPU and CUDA kernels refuse, raised while the model is
    probed on meta (so that PL261 reports it before anything launches):

      - a matrix product or convolution of operands of different dtypes (an f64 or integer input into
        f32 weights: meta's mm and convolution do not compare dtypes);
      - an embedding lookup past the end of its table with indices made by `arange` (positions: a
        sequence longer than the model's position embedding; meta tensors hold no values, but an
        arange's largest value is known from its arguments and kept through views);
      - a negative log-likelihood (cross-entropy) loss whose class indices are not int64."""

    PRODUCTS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default, aten.mv.default,
                aten.addmv.default, aten.dot.default, aten.convolution.default}
    VIEWS = {aten.unsqueeze.default, aten.view.default, aten._unsafe_view.default, aten.expand.default,
             aten.slice.Tensor, aten.reshape.default, aten.clone.default, aten._to_copy.default, aten.alias.default,
             aten.lift_fresh.default, aten.detach.default}

    def __init__(self):
        super().__init__()
        self._top: dict[int, tuple[weakref.ref, int]] = {}  # id(tensor) -> (the tensor, its largest value)

    def _largest(self, t) -> int | None:
        entry = self._top.get(id(t)) if isinstance(t, torch.Tensor) else None
        return entry[1] if entry is not None and entry[0]() is t else None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.PRODUCTS:
            dtypes = sorted({str(a.dtype).removeprefix("torch.") for a in args if isinstance(a, torch.Tensor)})
            if len(dtypes) > 1:
                raise RuntimeError(f"{func.overloadpacket.__name__} of {' and '.join(dtypes)} tensors: the CPU and "
                                   "CUDA kernels need operands of one dtype")
        if func.overloadpacket in (aten.nll_loss_forward, aten.nll_loss2d_forward) and len(args) >= 2:
            if isinstance(args[1], torch.Tensor) and args[1].dtype != torch.int64:
                raise RuntimeError(f"the loss's class indices are {str(args[1].dtype).removeprefix('torch.')} (the "
                                   "targets `planlang verify` makes: an integer input itself for a language model); "
                                   "the CPU and CUDA kernels need int64")
        if func.overloadpacket is aten.embedding and len(args) >= 2:
            top = self._largest(args[1])
            if top is not None and top >= args[0].shape[0]:
                raise IndexError(f"position {top} is past the end of an embedding of {args[0].shape[0]} rows "
                                 "(the input is longer than the model's positions)")
        out = func(*args, **kwargs)
        if func.overloadpacket is aten.arange and isinstance(out, torch.Tensor) and out.numel():
            nums = [a for a in args if isinstance(a, (int, float))]
            start, end, step = (0, nums[0], 1) if len(nums) == 1 else (nums[0], nums[1], nums[2] if len(nums) > 2 else 1)
            last = start + (out.numel() - 1) * step
            self._top[id(out)] = (weakref.ref(out), int(max(start, last)))
        elif isinstance(out, torch.Tensor) and args and self._largest(args[0]) is not None:
            top = self._largest(args[0])
            shift = args[1] * kwargs.get("alpha", 1) if len(args) > 1 and isinstance(args[1], (int, float)) else None
            if func in self.VIEWS:
                self._top[id(out)] = (weakref.ref(out), top)
            elif func.overloadpacket in (aten.add, aten.sub) and shift is not None:  # positions + an offset
                self._top[id(out)] = (weakref.ref(out), int(top + (shift if func.overloadpacket is aten.add else -shift)))
        return out


def _loss_on_verify_targets(module: nn.Module, plan: T.Plan) -> None:
    """The plan's loss (load.plan_loss: its model module's `loss`, else the model's `loss` method) on the
    targets `planlang verify` and `planlang.apply` make (planlang.model.capture.load.guess_targets), under
    StrictMeta: what their first step would raise; NoTargets when the loss takes none of the targets made
    for it (apply would refuse the plan)."""
    loss = plan_loss(plan, module)
    if loss is None:
        return
    found = f"the `loss` method of {type(module).__name__}" if getattr(loss, "__self__", None) is module \
        else f"`loss` of `{plan.model.module}`"
    inputs = meta_inputs(plan.inputs)
    targets = guess_targets(module, loss, inputs)
    if targets is None:
        raise NoTargets(found)
    if not targets:
        return

    def run():
        args, kwargs = bind_inputs(module, inputs)
        with torch.no_grad():
            loss(module(*args, **kwargs), *targets)

    with StrictMeta():
        meta_or_fake(run)


def model_facts_for(plan: T.Plan) -> tuple[ModelFacts | None, list[Diagnostic]]:
    """Build the plan's model on meta and probe it; a PL26x diagnostic instead when that fails (PL368 when
    the model's code exits the process). A loss no target fits is a failure in the facts (PL369)."""

    if plan.model is None:
        return None, []
    try:
        module = build_model(plan.model, plan.path)
        with no_exit(), StrictMeta():  # the forward is the model's code too: it must not end planlang
            probed = probe_modules(module, meta_inputs(plan.inputs))
        facts = ModelFacts(**vars(probed), heads=attention_heads(module))
        try:
            with no_exit():
                _loss_on_verify_targets(module, plan)
        except NoTargets as err:  # a fact of the plan, not a failed probe: the other checks still run
            facts.failures = [LoweringFailure("targets", str(err))]
    except ModelLoadError as err:
        return None, [diag(err.code, err.message, plan.model.span, help=err.help)]
    except SystemExit as err:  # sys.exit or os._exit in the forward or the loss
        return None, [diag("PL368", f"running the model on the declared inputs exited the process: {exited(err)}",
                           plan.model.span, help=EXIT_HELP)]
    except Exception as err:  # the model's forward failed on the declared inputs
        return None, [diag("PL261", f"running the model on the declared inputs raised {type(err).__name__}: {err}",
                           plan.model.span, help="check the `input` declarations: names, dtypes and shapes",
                           labels=[Label(i.span, "declared here") for i in plan.inputs[:1]])]
    return facts, []


@dataclass(frozen=True)
class Lowered:
    """What `check --model` reads off the runtime's lowering of a plan: the ops run on the whole batch
    (PL364) and, under ZeRO-2/3, the repeated blocks left in the root FSDP2 unit with why (PL468); or
    why it cannot be lowered (PL369: a fact check cannot compute is an error, never a silent pass)."""

    fallbacks: list[Fallback]
    root_blocks: dict[str, str]
    gathers: tuple[WeightGather, ...] = field(default=(), kw_only=True)  # sharded weights moved every step (PL366)
    failure: LoweringFailure | None = None


def lowering_facts(plan) -> Lowered | None:
    """The runtime's lowering of this complete plan, from the same op graph and lowering `planlang.apply`
    runs (every plan without a pipeline: apply lowers it whatever its axes); None for a pipeline plan
    (`stage_split_diagnostics` cuts those). A failure is the Lowered's `failure`: the run would raise it."""
    if plan.pipeline is not None:
        return None
    try:
        model = build_model(plan.model, plan.path)
        prog = _lowered(model, plan)
        opt, mesh = plan.optimizer, plan.mesh
        zero = opt is not None and opt.zero_stage >= 2 and opt.zero_axis is not None and \
            (mesh.axis_size(opt.zero_axis) or 1) > 1
        return Lowered(prog.fallbacks, block_ranges(model, prog)[1] if zero else {},
                       gathers=tuple(weight_gathers(prog, plan)))
    except ModelLoadError:
        return None  # the model facts report it (PL26x, PL368)
    except Exception as err:  # noqa: BLE001 - the model's op or the plan's layouts: PL369 names which
        return Lowered([], {}, LoweringFailure.of(err, "targets" if isinstance(err, NoTargets) else None))


def stage_split_diagnostics(plan) -> list[Diagnostic]:
    """The pipeline's stages cut out of the model (on meta) as the runtime will cut them; a failure is a
    diagnostic now instead of an error after launch (PL467, or the checker's code for the same cause)."""
    p = plan.pipeline
    if p is None:
        return []
    if tensor_axes(plan):  # pipeline x tensor parallelism: the runtime cuts the lowered program
        return _program_cut_diagnostics(plan)
    try:
        model = build_model(plan.model, plan.path)
        cut = split_stages(model, plan)
    except StageSplitError as err:
        return [diag(err.code or "PL467", err.message, p.span, help=err.help)]
    except ModelLoadError:
        return []  # reported by the model facts
    norms = [n for n, m in model.named_modules() if isinstance(m, _BatchNorm)]
    if norms and getattr(cut[-1], OUT_SPEC, None) is not None and data_degree(plan) > 1:
        # torch.export's cut inlines BatchNorm: the runtime cannot give it the data-parallel statistics
        return [diag("PL466", f"{len(norms)} BatchNorm module(s) (`{to_plan_name(norms[0])}`...) run inlined in "
                              "stages cut by torch.export: each data-parallel rank normalizes its own samples",
                     p.span, help="make the model traceable by torch.fx between its stage modules, replace "
                                  "BatchNorm with GroupNorm or LayerNorm, or accept per-rank statistics")]
    return []


def _lowered(model: nn.Module, plan):
    """The plan's program as planlang.apply lowers it (NoTargets when no targets fit the loss, as apply
    refuses the plan then)."""
    inputs = meta_inputs(plan.inputs)
    loss = plan_loss(plan, model)
    targets = guess_targets(model, loss, inputs) if loss is not None else ()
    if targets is None:
        raise NoTargets("the plan's loss")
    graph = op_graph(model, inputs, loss, tuple(targets)) if loss is not None else op_graph(model, inputs)
    prog = lower(graph, plan)
    prog.checkpoint_groups = mark_checkpoints(prog, plan)
    return prog


def _program_cut_diagnostics(plan) -> list[Diagnostic]:
    """PL467 when the plan's program (one microbatch, lowered as planlang.apply lowers it) cannot be cut
    into its stages (planlang.model.program.pipeline_program: data flowing backwards, a checkpoint group across a
    boundary, the loss outside the last stage)."""
    p = plan.pipeline
    try:
        prog = _lowered(build_model(plan.model, plan.path), microbatch_plan(plan))
        cut_program(prog, plan)
    except LoweringError as err:
        return [diag("PL467", str(err), p.span, help="keep whole modules in each stage in the model's execution "
                                                    "order, each checkpoint group inside one stage; `planlang "
                                                    "lower --rank R` prints the stages rank R runs")]
    except ModelLoadError:
        return []  # reported by the model facts
    except Exception as err:  # noqa: BLE001 - an op the lowering cannot lower: the run would raise it
        return [failure_diagnostic(plan, None, LoweringFailure.of(err, "targets" if isinstance(err, NoTargets)
                                                                  else None))]
    return []


def check_with_model(path: str, text: str | None = None, search_paths: tuple[str, ...] = (), program=None):
    """`planlang check --model`: the model-free checks plus the model-aware ones (of `text`, named
    `path`, when given: standard input). `program`: how the estimate behind PL560 measures a plan's
    lowered program (planlang.runtime.program_memory.measure; see estimate_plan)."""

    resolver = Resolver(search_paths=search_paths)
    res = resolver.resolve_file(path) if text is None else resolver.resolve_text(text, path)
    if res.plan is None or res.plan.model is None:
        return validate(res, path)
    facts, diags = model_facts_for(res.plan)
    extra = {}
    if facts is not None and res.plan.mesh is not None and not res.plan.holes() and not facts.failures and not any(
            d.severity is Severity.ERROR for d in res.diagnostics):
        lowered = lowering_facts(complete(res.plan))
        if lowered is not None:
            extra["fallbacks"], extra["root_blocks"] = lowered.fallbacks, lowered.root_blocks
            extra["gathers"] = list(lowered.gathers)
            extra["failures"] = [lowered.failure] if lowered.failure is not None else []
        if not extra.get("failures"):  # the estimate measures the same lowered program: one error is enough
            try:
                extra["estimate"] = estimate_plan(complete(res.plan), facts=facts, program=program)  # probed once
            except ModelLoadError:
                pass  # the model facts report it
            except Exception as err:  # noqa: BLE001 - the budget cannot be checked: PL369, never a silent pass
                extra["failures"] = [LoweringFailure.of(err, "estimate")]
    result = validate(res, path, facts, extra.get("estimate"), extra.get("fallbacks"), extra.get("root_blocks"),
                      extra.get("failures"),
                      gathers=extra.get("gathers"))
    if facts is not None and res.plan.mesh is not None and not res.plan.holes() and not result.errors:
        diags = diags + stage_split_diagnostics(complete(res.plan))  # only what the checks could not tell
    if diags:
        result = CheckResult(result.path, tuple(diags) + result.diagnostics, result.sources, result.plan,
                             result.modules, result.suppressed)
    return result
