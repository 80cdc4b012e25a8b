"""A plan without holes, typed as one: what the layers after validation (estimator, runtime, report) take.

`Plan` and its parts type every value the solver may choose as `X | Hole`; only the solver reads holes.
`complete(plan)` checks that none is left and returns a `CompletePlan`: the same plan, field for field,
whose parts are the narrowed subclasses below (a mesh axis size is an `int`, the optimizer's ZeRO stage
an `int` and its axis a `str` or None, a pipeline's axis, schedule, microbatches and stages concrete, a
shard rule's or data statement's spec a `Spec`). With holes it raises `IncompletePlan`, naming each hole
and where it is.

Each `CompleteX` is a subclass of `X` with narrowed annotations and no new state, so a `CompletePlan` is a
`Plan` and everything that reads a plan (the checks, `plan.data`'s helpers, `Spec.local_shape(.., mesh)`)
takes it unchanged. Specs are not subclassed: specs are compared by value with the specs the cost model
and the runtime build, and a dataclass compares equal only to its own class. `complete` checks that no
spec dim is a hole, so on a `CompletePlan` every `spec.dims[i]` is a tuple of axis names (`axes_of`,
`used_axes` and `placements` read them without holes).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields
from typing import TypeVar

from .parallel import ParallelDims
from .types import (
    Accumulation, Axis, CheckpointGroup, DataSpec, Hole, Mesh, ModelRef, Optimizer, Pipeline, Plan, Schedule, ShardRule, Spec, Stage,
)


@dataclass(frozen=True)
class CompleteAxis(Axis):
    size: int


@dataclass(frozen=True)
class CompleteMesh(Mesh):
    axes: tuple[CompleteAxis, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(a.size for a in self.axes)

    @property
    def has_holes(self) -> bool:
        return False

    @property
    def size(self) -> int:
        """Number of devices: the declared count, else the product of the axis sizes."""
        return self.device_count if self.device_count is not None else math.prod(self.shape)

    def axis(self, name: str) -> CompleteAxis | None:
        return next((a for a in self.axes if a.name == name), None)

    def size_of(self, name: str) -> int:
        """The size of axis `name`; KeyError when the mesh has no such axis (the checker refuses one, PL201)."""
        a = self.axis(name)
        if a is None:
            raise KeyError(f"mesh {self.name} has no axis `{name}`")
        return a.size


@dataclass(frozen=True)
class CompleteDataSpec(DataSpec):
    spec: Spec


@dataclass(frozen=True)
class CompleteShardRule(ShardRule):
    spec: Spec


@dataclass(frozen=True)
class CompleteSchedule(Schedule):
    chunks: int = 1


@dataclass(frozen=True)
class CompleteStage(Stage):
    degrees: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class CompletePipeline(Pipeline):
    axis: str
    schedule: CompleteSchedule
    microbatches: int
    stages: tuple[CompleteStage, ...]


@dataclass(frozen=True)
class CompleteAccumulation(Accumulation):
    microbatches: int


@dataclass(frozen=True)
class CompleteCheckpointGroup(CheckpointGroup):
    every: int | None = None


@dataclass(frozen=True)
class CompleteOptimizer(Optimizer):
    zero_stage: int = 0
    zero_axis: str | None = None


@dataclass(frozen=True)
class CompletePlan(Plan):
    """A `Plan` with no holes (build one with `complete`)."""

    mesh: CompleteMesh | None = None
    optimizer: CompleteOptimizer | None = None
    data: tuple[CompleteDataSpec, ...] = ()
    shards: tuple[CompleteShardRule, ...] = ()
    pipeline: CompletePipeline | None = None
    checkpoints: tuple[CompleteCheckpointGroup, ...] = ()
    checkpoint_hole: None = None
    accumulation: CompleteAccumulation | None = None

    def holes(self) -> list[Hole]:
        return []

    @functools.cached_property
    def dims(self) -> ParallelDims:
        """The plan's parallel dimensions (planlang.plan.parallel), computed on first use and kept: the
        data, tensor and pipeline axes, the ZeRO stage and axis, the axes FSDP2 shards over, the sizes."""
        opt, p = self.optimizer, self.pipeline
        return ParallelDims.of(self, tuple(zip(self.mesh.names, self.mesh.shape)) if self.mesh is not None else (),
                               p.axis if p is not None else None, opt.zero_stage if opt is not None else 0,
                               opt.zero_axis if opt is not None else None)

    @property
    def microbatches(self) -> int:
        """Microbatches one step runs in sequence on each rank: the pipeline's, else the top-level
        `microbatches` (gradient accumulation), else 1. The batch each runs is the per-rank batch divided
        by it; gradients are summed across ranks once per step either way."""
        if self.pipeline is not None:
            return self.pipeline.microbatches
        return self.accumulation.microbatches if self.accumulation is not None else 1


class IncompletePlan(ValueError):
    """`complete` met holes: `holes` lists them; the message names each with its location."""

    def __init__(self, plan: Plan, holes: list[Hole]) -> None:
        where = "; ".join(f"{h.what} at {h.span}" for h in holes)
        super().__init__(f"{plan.path} has {len(holes)} holes (`?`): {where}; "
                         f"run `planlang solve {plan.path}` first")
        self.plan, self.holes = plan, holes


_C = TypeVar("_C")


def _as(cls: type[_C], value, **narrowed) -> _C:
    """`value` (a dataclass) as `cls`, a narrowed subclass of its class: every field kept, `narrowed`
    replacing some."""
    return cls(**{f.name: getattr(value, f.name) for f in fields(value)} | narrowed)


def complete(plan: Plan) -> CompletePlan:
    """`plan` as a `CompletePlan` (the plan itself when it is one); `IncompletePlan` when it has holes.
    Only holes are checked: validate the plan first (planlang.plan.checker)."""
    if isinstance(plan, CompletePlan):
        return plan
    holes = plan.holes()
    if holes:
        raise IncompletePlan(plan, holes)
    # below, no value is a Hole (plan.holes() visits every place one can be), so the narrowing holds
    mesh = None
    if plan.mesh is not None:
        mesh = _as(CompleteMesh, plan.mesh, axes=tuple(_as(CompleteAxis, a) for a in plan.mesh.axes))
    pipeline = None
    if plan.pipeline is not None:
        p = plan.pipeline
        if isinstance(p.stages, Hole):  # never: plan.holes() has it
            raise IncompletePlan(plan, [p.stages])
        pipeline = _as(CompletePipeline, p, schedule=_as(CompleteSchedule, p.schedule),
                       stages=tuple(_as(CompleteStage, st) for st in p.stages))
    return _as(CompletePlan, plan,
               mesh=mesh,
               optimizer=None if plan.optimizer is None else _as(CompleteOptimizer, plan.optimizer),
               data=tuple(_as(CompleteDataSpec, d) for d in plan.data),
               shards=tuple(_as(CompleteShardRule, r) for r in plan.shards),
               pipeline=pipeline,
               checkpoints=tuple(_as(CompleteCheckpointGroup, g) for g in plan.checkpoints),
               accumulation=None if plan.accumulation is None else _as(CompleteAccumulation, plan.accumulation))


def plan_mesh(plan: CompletePlan) -> CompleteMesh:
    """The plan's mesh; a ValueError naming the fix when it declares none (running a plan needs one)."""
    if plan.mesh is None:
        raise ValueError("the plan declares no mesh; add `mesh NAME of N x DEVICE { AXIS = N ... }`")
    return plan.mesh


def plan_model(plan: CompletePlan) -> ModelRef:
    """The plan's model; a ValueError when it declares none (building, lowering and running need one)."""
    if plan.model is None:
        raise ValueError("the plan declares no model")
    return plan.model


def world_size(plan: CompletePlan) -> int:
    """The plan's device count (the processes that run it)."""
    return math.prod(plan_mesh(plan).shape)
