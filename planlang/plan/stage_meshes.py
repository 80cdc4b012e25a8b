"""Stages of their own degrees (heterogeneous stages, CAPTURE's and Alpa's sub-meshes): the one definition
of what a `stage ... with dp = 4, tp = 1` runs as.

A pipeline rank's devices are the same set whatever its stage's degrees: the ranks whose coordinate on the
pipeline axis is the stage's (the pipeline axis is the mesh's first, PL418), n = mesh size / p of them. A
stage of its own degrees lays its own sizes of the other axes over those n devices, row-major in mesh
order, as the mesh lays its sizes. Everything per stage then comes from one plan:

- `stage_plan(plan, s)`: the plan with the mesh's sizes replaced by stage s's and no `with` left, the
  plan the estimate prices stage s with and the runtime lowers stage s's program from (one per distinct
  shape, `stage_shapes`);
- `position_chunks(sizes, batch)`: which rows of a microbatch each of a pipeline rank's n devices (its
  position: the k-th of the rank's devices in rank order) holds at a stage boundary. A stage's replica
  holds the rows its data coordinates select (`data x : [dp, _]`, planlang.cost.layout.local_slices); at
  the boundary each device of the replica passes on its share of them, cut over the stage's other axes in
  mesh order, so that device k of stage s sends to device k of stage s + 1 (the pipeline axis' process
  groups, torch's point-to-point pairs) exactly the rows device k of stage s + 1 takes. The checker
  refuses degrees under which two stages disagree on a position's rows (PL418).
"""
from __future__ import annotations

import dataclasses
import functools
import math

from . import types as T
from .data import batch_axes
from .complete import CompleteMesh, CompletePipeline, CompletePlan, CompleteStage


def stage_sizes(plan: T.Plan, index: int) -> tuple[tuple[str, int], ...] | None:
    """(axis, size) of the mesh in mesh order as stage `index` runs: its `with` degrees over the mesh's
    sizes. None while a size or degree is a hole."""
    mesh, p = plan.mesh, plan.pipeline
    if mesh is None or p is None or not isinstance(p.stages, tuple) or index >= len(p.stages):
        return None
    given = dict(p.stages[index].degrees)
    out = []
    for a in mesh.axes:
        n = given.get(a.name, a.size)
        if not isinstance(n, int):
            return None
        out.append((a.name, n))
    return tuple(out)


def stage_shapes(plan: T.Plan) -> tuple[tuple[tuple[str, int], ...], ...]:
    """Each stage's sizes (`stage_sizes`), stage by stage; () while any is a hole or without stages."""
    p = plan.pipeline
    if p is None or not isinstance(p.stages, tuple):
        return ()
    shapes = [stage_sizes(plan, s) for s in range(len(p.stages))]
    return () if any(sh is None for sh in shapes) else tuple(sh for sh in shapes if sh is not None)


def describe(plan: T.Plan, sizes: tuple[tuple[str, int], ...]) -> str:
    """`dp = 4, tp = 1`: a stage's sizes of the axes other than the pipeline's, as diagnostics say them."""
    axis = plan.pipeline.axis if plan.pipeline is not None else None
    return ", ".join(f"{a} = {n}" for a, n in sizes if a != axis)


def heterogeneous(plan: T.Plan) -> bool:
    """Whether some stage runs on degrees other than the mesh's sizes."""
    mesh = plan.mesh
    if mesh is None:
        return False
    own = tuple((a.name, a.size) for a in mesh.axes)
    return any(sh != own for sh in stage_shapes(plan))


def with_sizes(plan: T.Plan, sizes: tuple[tuple[str, int], ...]) -> T.Plan:
    """`plan` on a mesh of these axis sizes, no stage keeping a `with`: how every stage of those degrees runs."""
    mesh, p = plan.mesh, plan.pipeline
    assert mesh is not None
    size = dict(sizes)
    new_mesh = dataclasses.replace(mesh, axes=tuple(dataclasses.replace(a, size=size[a.name]) for a in mesh.axes),
                                   device_count=None)
    if p is None or not isinstance(p.stages, tuple):
        return dataclasses.replace(plan, mesh=new_mesh)
    pipeline = dataclasses.replace(p, stages=tuple(dataclasses.replace(st, degrees=()) for st in p.stages))
    return dataclasses.replace(plan, mesh=new_mesh, pipeline=pipeline)


@functools.lru_cache(maxsize=64)
def stage_plan(plan: CompletePlan, index: int) -> CompletePlan:
    """`plan` as stage `index` runs it: the mesh's sizes are the stage's degrees and no stage keeps a
    `with` (every stage of this plan runs on these sizes; only stage `index`'s part of it is used). The plan
    itself when it is not heterogeneous."""
    if not heterogeneous(plan):
        return plan
    sizes = stage_sizes(plan, index)
    assert sizes is not None, "a complete pipeline plan"
    out = with_sizes(plan, sizes)
    assert isinstance(out, CompletePlan) and isinstance(out.mesh, CompleteMesh) \
        and isinstance(out.pipeline, CompletePipeline) and all(isinstance(st, CompleteStage) for st in out.pipeline.stages)
    return out


def shape_plans(plan: CompletePlan) -> dict[tuple[tuple[str, int], ...], CompletePlan]:
    """Each distinct stage shape's plan (`stage_plan` of its first stage), by the stage's sizes, in stage
    order: what the estimate prices, validation lowers and every rank of the runtime builds, once a shape."""
    out: dict[tuple[tuple[str, int], ...], CompletePlan] = {}
    for s, sizes in enumerate(stage_shapes(plan)):
        if sizes not in out:
            out[sizes] = stage_plan(plan, s)
    return out


def share_axes(plan: T.Plan) -> tuple[str, ...]:
    """The axes a replica's rows are shared out over at a boundary, under `plan`'s sizes (a stage's plan):
    those of more than one device other than the pipeline axis and the batch's data axes, in mesh order
    (`position_chunks` cuts a replica's rows over them)."""
    mesh, p = plan.mesh, plan.pipeline
    batch = {a for axes in batch_axes(plan).values() for a in axes}
    if mesh is None:
        return ()
    return tuple(a.name for a in mesh.axes if (p is None or a.name != p.axis) and a.name not in batch
                 and isinstance(a.size, int) and a.size > 1)


def shares(plan: T.Plan) -> int:
    """How many devices of a replica share its rows at a boundary under `plan`'s sizes (`share_axes`)."""
    assert plan.mesh is not None
    return math.prod(plan.mesh.axis_size(a) or 1 for a in share_axes(plan))


def position_chunks(sizes: tuple[tuple[str, int], ...], pipeline: str, batch: tuple[str, ...]) -> tuple[int, ...]:
    """For each position k of a pipeline rank (its k-th device in rank order), the index of the chunk of a
    microbatch's rows it holds at a stage boundary, the rows cut into n = (devices per pipeline rank)
    equal chunks. `sizes`: the stage's (axis, size) in mesh order; `batch`: the axes the batch dim is split
    over, in the data spec's order (the first outermost, as local_slices). A replica's rows are cut further
    over the stage's other axes of more than one device, in mesh order."""
    others = [(a, n) for a, n in sizes if a != pipeline]
    total = math.prod(n for _, n in others)
    size = dict(others)
    out = []
    for k in range(total):
        coords, rest = {}, k
        for a, n in reversed(others):  # row-major over the stage's sizes, the last axis fastest
            coords[a] = rest % n
            rest //= n
        replica = 0
        for a in batch:
            replica = replica * size.get(a, 1) + coords.get(a, 0)
        share = 0
        for a, n in others:
            if a not in batch:
                share = share * n + coords[a]
        within = total // math.prod(size.get(a, 1) for a in batch)
        out.append(replica * within + share)
    return tuple(out)
