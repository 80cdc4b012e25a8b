"""The data axes of a plan: the mesh axes that split the batch, defined once for the checker, the
estimator, the solver and the runtime.

An input's batch dim is the dim its `input` declaration names `batch`, else dim 0. An axis splitting
another dim (a sequence over `sp`) is not a data axis: gradients are not summed over it for data
parallelism and ZeRO does not shard over it. Every input must split its batch over the same axes.
"""
from __future__ import annotations

import math

from . import types as T


def batch_dim(inp: T.Input | None) -> int:
    """The batch dim of an input: the dim named `batch`, else dim 0."""
    if inp is not None:
        for i, (name, _) in enumerate(inp.dims):
            if name == "batch":
                return i
    return 0


def batch_axes(plan: T.Plan) -> dict[str, tuple[str, ...]]:
    """Each `data` statement's input -> the axes its batch dim is split over (in the spec's order).
    Statements whose batch entry is still a hole `?` are left out."""
    out: dict[str, tuple[str, ...]] = {}
    for d in plan.data:
        if not isinstance(d.spec, T.Spec):
            continue
        bd = batch_dim(plan.input(d.input))
        if bd >= d.spec.rank or T.is_hole(d.spec.dims[bd]):
            continue
        out[d.input] = d.spec.axes_of(bd)
    return out


def batch_split_conflict(plan: T.Plan) -> str | None:
    """Why the inputs' batch splits disagree (None when they agree)."""
    found: dict[frozenset, str] = {}
    for name, axes in batch_axes(plan).items():
        found.setdefault(frozenset(axes), name)
    if len(found) <= 1:
        return None
    desc = "; ".join(f"{name}: {', '.join(sorted(a)) or 'none'}" for a, name in found.items())
    return (f"the inputs split their batch dims over different axes ({desc}); "
            "split every input's batch dim over the same data axes")


def data_axes(plan: T.Plan, *, trivial: bool = True) -> tuple[str, ...]:
    """The axes the batch is split over, in mesh order (empty: no data parallelism). `trivial=False`
    leaves out axes of size 1 (splitting over one device is no split). When inputs disagree (see
    `batch_split_conflict`) the union is returned."""
    if plan.mesh is None:
        return ()
    axes = {a for split in batch_axes(plan).values() for a in split}
    return tuple(a for a in plan.mesh.names if a in axes and (trivial or (plan.mesh.axis_size(a) or 1) > 1))


def data_degree(plan: T.Plan) -> int:
    """How many ways the batch is split: the product of the data axes' sizes (1 where a size is a hole)."""
    if plan.mesh is None:
        return 1
    sizes = [plan.mesh.axis_size(a) for a in data_axes(plan)]
    return math.prod(s for s in sizes if isinstance(s, int))


def with_data_axes(spec: T.Spec, axes: tuple[str, ...]) -> T.Spec:
    """An activation spec as the runtime lays the value out: the plan's data axes `axes` on its batch dim
    (dim 0) in front of what the spec puts there, unless the spec names one of them (docs/language.md
    §14.1: the data axes are implicit on the batch dim of every activation). So under `data x : [dp, _]`
    `[tp, _]` is `[(dp, tp), _]`: its dim 0 must divide by dp * tp. A hole at dim 0 is left to the solver."""
    if not spec.dims or not axes or T.is_hole(spec.dims[0]) or any(a in spec.used_axes() for a in axes):
        return spec
    first = tuple(axes) + tuple(spec.axes_of(0))
    return T.Spec((first,) + tuple(spec.dims[1:]), spec.partial, span=spec.span, dim_spans=spec.dim_spans,
                  partial_spans=spec.partial_spans)


def activation_layout(plan: T.Plan, spec: T.Spec) -> T.Spec:
    """`spec`, the spec of an activation of `plan`, with the plan's data axes of more than one device on
    its batch dim (`with_data_axes`): the layout the runtime gives the value."""
    return with_data_axes(spec, data_axes(plan, trivial=False))


def tensor_axes(plan: T.Plan) -> tuple[str, ...]:
    """The axes of more than one device that a `shard` spec splits over and that are neither data axes
    nor the pipeline axis (tensor parallelism), in mesh order. A pipeline plan with any runs its stages
    from the lowered program (planlang.runtime.program_pipeline)."""
    if plan.mesh is None:
        return ()
    skip = set(data_axes(plan)) | ({plan.pipeline.axis} if plan.pipeline is not None else set())
    used = {a for rule in plan.shards if isinstance(rule.spec, T.Spec) for a in rule.spec.used_axes()}
    return tuple(a for a in plan.mesh.names if a in used and a not in skip
                 and (plan.mesh.axis_size(a) or 1) > 1)
