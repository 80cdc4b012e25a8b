"""The model-free rules of the budget, the optimizer, ZeRO and precision: the budget against the device,
ZeRO's stage and axis, the optimizer's arguments, the precision fields against the device, what data
parallelism supports (FSDP2's axes against the specs)."""
from __future__ import annotations

from typing import Iterator

from planlang.lang import ast as A
from planlang.lang.diagnostics import Diagnostic, Label
from planlang.lang.fixes import replace as replace_fix

from . import types as T
from .data import batch_axes, batch_split_conflict, data_axes
from .parallel import fsdp_mesh_axes
from .optimizers import NO_FSDP, WHOLE_MATRIX, argument_problems
from .resolve import diag
from .units import format_bytes
from .rule_sites import site_and_labels, writes_any

Diags = Iterator[Diagnostic]


# ------------------------------------------------------------------------------ memory and optimizer
def budget_fits_device(ctx) -> Diags:
    """PL501 budget above device memory; PL505 no budget."""
    plan = ctx.plan
    dev = plan.mesh.device if plan.mesh else None
    if plan.budget and dev and plan.budget.bytes > dev.memory:
        yield diag("PL501", f"budget {format_bytes(plan.budget.bytes)} exceeds the {format_bytes(dev.memory)} "
                   f"of `{dev.name}`", plan.budget.span, labels=[Label(dev.span, "device declared here")],
                   help=f"use at most {format_bytes(dev.memory)}")
    if plan.budget is None and plan.mesh is not None and plan.model is not None and not writes_any(ctx, A.BudgetDecl):
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
        master_written = "master" in dict(prec.field_spans)
        # unsafe: f32 master weights take more memory than the plan budgeted
        yield diag("PL512", f"master weights in {prec.master} are narrower than the {prec.params} parameters",
                   prec.span_of("master"), help="write `master = f32`",
                   fix=replace_fix(prec.span_of("master"), "master = f32", "write `master = f32`", safe=False)
                   if master_written else None)
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
    (planlang.plan.parallel.fsdp_mesh_axes, which the runtime's ZeRO pass reads as `CompletePlan.dims.fsdp`)."""
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
    arranged = fsdp_mesh_axes(mesh.names, axes, z)
    if arranged is None:
        rest = [a for a in axes if a != z]
        yield diag("PL507", f"ZeRO-{opt.zero_stage} over `{z}` with the batch also split over {', '.join(rest)}: "
                   f"FSDP2 replicates over at most one more data axis, listed before `{z}` in the mesh",
                   opt.span, help=f"split the batch over `{z}` only, or declare {rest[0]} before {z} in the mesh"
                   + (f" and split it over {rest[0]} and {z} alone" if len(rest) > 1 else ""))
        return
    fsdp = set(arranged)
    for rule in plan.shards:
        split = [a for a in rule.spec.used_axes() if a in fsdp] if isinstance(rule.spec, T.Spec) else []
        if rule.kind == "param" and split:
            site, labels = site_and_labels(rule.span, rule.origin)
            yield diag("PL507", f"`{rule}` splits a parameter over `{split[0]}`, which ZeRO-{opt.zero_stage} "
                       f"shards with FSDP2 already", site, labels=labels + [Label(opt.span, "ZeRO declared here")],
                       help=f"take `{split[0]}` out of the spec: ZeRO-{opt.zero_stage} shards the parameter over it")
            return
