"""Stages of their own degrees at run time (planlang.plan.stage_meshes): the rows a stage boundary moves.

Each pipeline rank's devices run its stage's program, lowered from `stage_plan(plan, s)` on the stage's own
DeviceMesh (`stage_groups`). Device k of stage s sends to device k of stage s + 1 (the pipeline axis'
process groups pair them), so both must mean the same rows by what they pass: a stage's replica (its data
coordinates) holds its rows of each microbatch, and its devices along the stage's other axes (tensor
parallelism: each holds the replica's rows whole) each pass on their share of them, cut in mesh order
(`position_chunks`). At a boundary between stages of different degrees:

- the sending stage cuts its output to the device's share (`_Share`; backward: the shares' gradients
  gathered again, so each device holds the whole gradient of its replicated output, as the program's
  backward expects);
- the receiving stage gathers its replica's rows from its devices' shares (`_Gather`; backward: the
  device's own share of the gradient, which the program leaves whole on each of them).

A value not split over the batch (every device holds it whole: position embeddings of shape [1, s, h])
passes as it is. A replica's microbatch is the concatenation of its devices' shares of that microbatch:
the first stage's inputs and the last stage's targets are put in that order (`microbatch_major`) before
the schedule cuts them into microbatches.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from planlang.model.program.lowering import Program
from planlang.model.program.pipeline_program import ProgramCut
from planlang.plan.complete import CompleteMesh, CompletePlan, plan_mesh
from planlang.plan.data import batch_axes
from planlang.plan.stage_meshes import shape_plans, share_axes
from planlang.plan.types import Spec

from .pipeline import PipelineError
from .redistribute import MeshGroups, redistribute


def stage_groups(plan: CompletePlan, device_type: str) -> tuple[int, dict[tuple[int, ...], MeshGroups]]:
    """(this rank's stage, the MeshGroups of every distinct stage shape, by its mesh's sizes). Every rank builds every shape's
    DeviceMesh, in stage order: creating a process group is collective over the world."""
    out: dict[tuple[int, ...], MeshGroups] = {}
    for sp in shape_plans(plan).values():
        mesh = plan_mesh(sp)
        out[mesh.shape] = MeshGroups(mesh, device_type)
    p = plan.pipeline
    assert p is not None
    # one pipeline-axis process group for all: stages of different shapes talk over it (the same ranks in
    # every shape, the pipeline axis being the first), and a collective needs one communicator
    first = next(iter(out.values()))
    for g in out.values():
        g.share_group(p.axis, first)
    return first.coords[p.axis], out


@dataclass(frozen=True)
class ShareAxis:
    """One axis a stage's replica cuts its rows over: its process group, size and this device's coordinate."""

    name: str
    group: dist.ProcessGroup
    size: int
    coord: int


def share_axes_of(plan: CompletePlan, groups: MeshGroups) -> tuple[ShareAxis, ...]:
    """This device's axes of planlang.plan.stage_meshes.share_axes under its stage's plan: those a replica's
    rows are shared out over at a boundary, in mesh order."""
    return tuple(ShareAxis(a, groups.group(a), groups.size(a), groups.coords[a]) for a in share_axes(plan))


class _Gather(torch.autograd.Function):
    """The replica's rows from its devices' shares along one axis (dim 0, in coordinate order); backward:
    this device's share of the (whole, on every device) gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, axis: ShareAxis) -> torch.Tensor:
        ctx.axis = axis
        parts = [torch.empty_like(x) for _ in range(axis.size)]
        dist.all_gather(parts, x.contiguous(), group=axis.group)
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        a = ctx.axis
        return grad.chunk(a.size, dim=0)[a.coord].contiguous(), None


class _Share(torch.autograd.Function):
    """This device's share of the replica's rows along one axis; backward: the shares' gradients gathered,
    so the replicated output's gradient is whole on every device again."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, axis: ShareAxis) -> torch.Tensor:
        ctx.axis = axis
        return x.chunk(axis.size, dim=0)[axis.coord].contiguous()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        a = ctx.axis
        parts = [torch.empty_like(grad) for _ in range(a.size)]
        dist.all_gather(parts, grad.contiguous(), group=a.group)
        return torch.cat(parts, dim=0), None


@dataclass(frozen=True)
class Move:
    """One value at a stage boundary of this stage: its global shape, its layout in the stage's program and
    the plain layout it crosses in (`crossing`: dim 0 over the batch's data axes when `batched`, the rest
    whole, no partial axes), converted by planlang.runtime.redistribute (autograd included)."""

    name: str
    shape: tuple[int, ...]
    layout: Spec
    crossing: Spec
    batched: bool

    def __str__(self) -> str:
        return f"{self.name}: {self.layout} <-> {self.crossing}{' by rows' if self.batched else ''}"


@dataclass(frozen=True)
class StageRows:
    """What one stage does at its boundaries: each input (`inputs[i]`, None: as received) gathered from
    its devices' shares over `axes` and converted to the stage's layout, and each output (`outputs[j]`)
    converted to its crossing layout and cut to this device's share. `mesh`, `groups`: the stage's own."""

    inputs: tuple[Move | None, ...]
    outputs: tuple[Move | None, ...]
    axes: tuple[ShareAxis, ...] = ()
    mesh: CompleteMesh | None = None
    groups: MeshGroups | None = None

    def __str__(self) -> str:
        over = " x ".join(f"{a.name}({a.size})" for a in self.axes) or "nothing"
        return (f"rows shared over {over}: {sum(m is not None for m in self.inputs)} inputs in, "
                f"{sum(m is not None for m in self.outputs)} outputs out")

    def _convert(self, x: torch.Tensor, shape, src: Spec, dst: Spec) -> torch.Tensor:
        if src == dst:
            return x
        assert self.mesh is not None and self.groups is not None
        return redistribute(x, shape, src, dst, self.mesh, self.groups)

    def convert_inputs(self, xs: tuple) -> tuple:
        out = []
        for x, mv in zip(xs, self.inputs + (None,) * (len(xs) - len(self.inputs))):
            if mv is not None:
                if mv.batched:  # the innermost axis first: its devices hold adjacent shares (row-major)
                    for a in reversed(self.axes):
                        x = _Gather.apply(x, a)
                x = self._convert(x, mv.shape, mv.crossing, mv.layout)
            out.append(x)
        return tuple(out)

    def convert_outputs(self, ys: tuple) -> tuple:
        out = []
        for y, mv in zip(ys, self.outputs + (None,) * (len(ys) - len(self.outputs))):
            if mv is not None:
                y = self._convert(y, mv.shape, mv.layout, mv.crossing)
                if mv.batched:
                    for a in self.axes:
                        y = _Share.apply(y, a)
            out.append(y)
        return tuple(out)


def microbatch_major(t: torch.Tensor, shares: int, microbatches: int) -> torch.Tensor:
    """A replica's rows (its `shares` devices' shares one after another, each cut into `microbatches`) put
    microbatch by microbatch, so that the schedule's cut into microbatches gives microbatch i as the
    concatenation of every share's microbatch i: what the stage boundaries gather and share out."""
    if shares == 1 or t.dim() == 0:
        return t
    n = t.shape[0]
    if n % (shares * microbatches):
        raise PipelineError(f"a batch of {n} rows does not split into {shares} shares of {microbatches} microbatches",
                            f"use a batch per replica that is a multiple of {shares * microbatches}")
    rest = tuple(t.shape[1:])
    return t.reshape((shares, microbatches, n // (shares * microbatches)) + rest).transpose(0, 1).reshape((n,) + rest)


def _crossing(shape: tuple[int, ...], batched: bool, batch: tuple[str, ...]) -> Spec:
    return Spec(tuple((tuple(batch) if batched and i == 0 else ()) for i in range(len(shape))))


def boundary_rows(plans: list[CompletePlan], progs: list[Program], cuts: list[ProgramCut]) -> list[StageRows | None]:
    """For each stage s (its own plan, program and cut), how its boundaries with stages of other degrees
    convert what crosses (None: nothing to convert). A value crosses by rows when either stage splits its
    dim 0 over a data axis (the batch), else whole. A PipelineError when the two stages' programs send and
    receive different values. The share axes, mesh and groups are filled in on the rank (`with_axes`)."""
    n = len(plans)
    moves: list[tuple[list[Move | None], list[Move | None]]] = [([], []) for _ in range(n)]
    for s in range(n - 1):
        sent, got = cuts[s].stages[s].outputs, cuts[s + 1].stages[s + 1].inputs
        if tuple(sent) != tuple(got):
            raise PipelineError(f"stage {s} sends ({', '.join(sent)}) under its degrees but stage {s + 1} receives "
                                f"({', '.join(got)}) under its own", "give the two stages the same degrees")
        same = plan_mesh(plans[s]).shape == plan_mesh(plans[s + 1]).shape
        for v in sent:
            if same:
                moves[s][1].append(None)
                moves[s + 1][0].append(None)
                continue
            sides = (s, s + 1)
            batches = [next(iter(batch_axes(plans[k]).values()), ()) for k in sides]
            sizes = [dict(zip(plan_mesh(plans[k]).names, plan_mesh(plans[k]).shape)) for k in sides]
            layouts = [progs[k].layouts[v] for k in sides]
            batched = any(lay.dims and any(a in b and sz.get(a, 1) > 1 for a in lay.axes_of(0))
                          for lay, b, sz in zip(layouts, batches, sizes))
            shape = tuple(progs[s].graph.values[v].shape)
            for k, lay, b, sz, side in zip(sides, layouts, batches, sizes, (1, 0)):
                # a data axis of one device splits nothing: a layout never names it (conversion_path's specs)
                split = tuple(a for a in b if sz.get(a, 1) > 1)
                moves[k][side].append(Move(v, shape, lay, _crossing(shape, batched, split), batched))
    return [StageRows(tuple(ins), tuple(outs)) if any(ins) or any(outs) else None for ins, outs in moves]


def with_axes(rows: StageRows | None, plan: CompletePlan, groups: MeshGroups) -> StageRows | None:
    """`rows` of this rank's stage with its share axes, mesh and groups."""
    if rows is None:
        return None
    return StageRows(rows.inputs, rows.outputs, share_axes_of(plan, groups), plan.mesh, groups)
