"""Executing layout conversions (planlang.cost.layout) on torch.distributed.

Each rank holds the local piece of a global tensor laid out by a `Spec`; `redistribute` computes the
cheapest `conversion_path` and runs its steps with the functional collectives of
`torch.distributed._functional_collectives`, one mesh axis (one process group) per step:

    all_gather(a, d)      all-gather over a, concatenated along d in a-coordinate order
    shard(a, d)           local: keep chunk coords[a] (of size(a)) along d
    all_to_all(a, d, e)   split along e into size(a) chunks, chunk j to coordinate j, received pieces
                          concatenated along d in coordinate order
    all_reduce(a)         sum over a
    reduce_scatter(a, d)  sum over a, keep chunk coords[a] along d
    to_partial(a)         local: coordinate 0 of a keeps the value, the others hold zeros

Because an axis joins or leaves a dim always as its minor-most splitter, these local operations give
exactly the chunk index formula of layout.py for dims split by several axes.

Gradients follow the *logical* convention (DTensor's with replicated gradients): the gradient of a local
piece in layout L is the piece of the global gradient in L with partial axes read as replicated (every
partial piece receives the whole gradient, the global value being their sum). `backward` therefore takes,
on every rank, the dst piece of the global gradient and returns the src piece. With `(y * w_local).sum()`
as each rank's loss, every rank's src gradient is `w` sliced for src. Per step, in reverse order:

    all_gather(a, d)      local: keep chunk coords[a] along d (the gradient is replicated over a)
    shard(a, d)           all-gather over a along d
    all_to_all(a, d, e)   the reverse all-to-all (a from e back to d)
    all_reduce(a)         identity (each partial piece gets the whole gradient)
    reduce_scatter(a, d)  all-gather over a along d
    to_partial(a)         identity

`backward_collectives` lists what backward issues; it equals the cost model's `Path.backward` in issue
order (the two share the gradient convention documented in planlang.cost.layout).

A `recorder` (e.g. `ByteRecorder`) gets `record(kind, axes, full_bytes)` for each collective issued,
forward and backward, with the full size S of planlang.cost.comm: the gathered output of an all-gather,
the input of a reduce-scatter, the tensor of an all-reduce, the local tensor of an all-to-all.
"""
from __future__ import annotations

import math
from typing import Protocol

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable
from torch.distributed import _functional_collectives as funcol
from torch.distributed.device_mesh import init_device_mesh

from planlang.cost.comm import Collective
from planlang.cost.layout import Path, Step, apply_step, conversion_path, is_valid, local_shape, step_comms
from planlang.plan.complete import CompleteMesh
from planlang.plan.types import Mesh, Spec

# torch 2.13 renamed the *_tensor functional collectives to *_single (the old names warn)
_all_gather_fc = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
_reduce_scatter_fc = getattr(funcol, "reduce_scatter_single", None) or funcol.reduce_scatter_tensor


class Recorder(Protocol):
    def record(self, kind: Collective, axes: tuple[str, ...], full_bytes: int) -> None: ...


class ByteRecorder:
    """Collects `(kind, axes, full_bytes)` for every collective issued, in order."""

    def __init__(self) -> None:
        self.records: list[tuple[Collective, tuple[str, ...], int]] = []

    def record(self, kind: Collective, axes: tuple[str, ...], full_bytes: int) -> None:
        self.records.append((Collective(kind), tuple(axes), int(full_bytes)))

    def clear(self) -> None:
        self.records.clear()

    @property
    def total_bytes(self) -> int:
        return sum(b for _, _, b in self.records)

    def __len__(self) -> int:
        return len(self.records)


# ------------------------------------------------------------------------------ process groups
class MeshGroups:
    """The process groups of a planlang mesh for the current process (one per axis, via DeviceMesh).

    The default process group must be initialised with world size = the product of the axis sizes;
    ranks are laid out row-major over the axes in mesh order (DeviceMesh's convention)."""

    def __init__(self, mesh: CompleteMesh, device_type: str | None = None) -> None:
        sizes = mesh.shape
        if not all(s >= 1 for s in sizes):
            raise ValueError(f"mesh {mesh} has axis sizes that are not positive integers")
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised (call init_process_group first)")
        if math.prod(sizes) != dist.get_world_size():
            raise ValueError(f"mesh {mesh} has {math.prod(sizes)} devices, the world has {dist.get_world_size()}")
        if device_type is None:
            device_type = "cuda" if dist.get_backend() == "nccl" else "cpu"
        self.mesh = mesh
        self.device_mesh = init_device_mesh(device_type, sizes, mesh_dim_names=mesh.names)
        coord = self.device_mesh.get_coordinate()
        if coord is None:
            raise RuntimeError(f"rank {dist.get_rank()} is not part of mesh {mesh}")
        self.coords: dict[str, int] = dict(zip(mesh.names, coord))
        self._groups = {name: self.device_mesh.get_group(name) for name in mesh.names}
        self._sizes = dict(zip(mesh.names, sizes))
        me = dist.get_rank()
        for name, g in self._groups.items():  # the collectives below rely on group rank == coordinate
            if dist.get_group_rank(g, me) != self.coords[name]:
                raise RuntimeError(f"group rank of axis {name!r} differs from the mesh coordinate")

    def group(self, axis: str) -> dist.ProcessGroup:
        return self._groups[axis]

    def share_group(self, axis: str, other: "MeshGroups") -> None:
        """Use `other`'s process group for `axis` (the same ranks in both meshes: a stage of its own degrees
        talks to the others over one pipeline-axis group, planlang.runtime.stage_rows)."""
        me = dist.get_rank()
        g = other.group(axis)
        if dist.get_group_rank(g, me) != self.coords[axis] or other.size(axis) != self.size(axis):
            raise RuntimeError(f"axis {axis!r} holds other ranks in {other} than in {self}")
        self._groups[axis] = g

    def size(self, axis: str) -> int:
        return self._sizes[axis]

    def __repr__(self) -> str:
        return f"MeshGroups({self.mesh}, coords={self.coords})"


# ------------------------------------------------------------------------------ collectives (no autograd)
def _wait(t: torch.Tensor) -> torch.Tensor:
    return t.wait() if isinstance(t, funcol.AsyncCollectiveTensor) else t


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _record(recorder, kind: Collective, axis: str, full_bytes: int) -> None:
    if recorder is not None:
        recorder.record(kind, (axis,), full_bytes)


def _dim(step: Step) -> int:
    """The tensor dim of a step that has one (every kind but all_reduce and to_partial)."""
    if step.dim is None:
        raise ValueError(f"{step} has no dim")
    return step.dim


def _chunk(x: torch.Tensor, dim: int, n: int, i: int) -> torch.Tensor:
    size = x.shape[dim] // n
    return x.narrow(dim, i * size, size).clone()


def _all_gather(x, dim, axis, groups, recorder):
    out = _wait(_all_gather_fc(x.contiguous(), dim, groups.group(axis)))
    _record(recorder, Collective.ALL_GATHER, axis, _nbytes(out))
    return out


def _reduce_scatter(x, dim, axis, groups, recorder):
    _record(recorder, Collective.REDUCE_SCATTER, axis, _nbytes(x))
    return _wait(_reduce_scatter_fc(x.contiguous(), "sum", dim, groups.group(axis)))


def _all_reduce(x, axis, groups, recorder):
    _record(recorder, Collective.ALL_REDUCE, axis, _nbytes(x))
    return _wait(funcol.all_reduce(x.contiguous(), "sum", groups.group(axis)))


def _all_to_all(x, src_dim, dst_dim, axis, groups, recorder):
    """Move `axis` from minor-most splitter of src_dim to minor-most splitter of dst_dim."""
    n = groups.size(axis)
    _record(recorder, Collective.ALL_TO_ALL, axis, _nbytes(x))
    send = torch.stack(x.chunk(n, dim=dst_dim))  # [n, ...]: row j goes to coordinate j
    recv = _wait(funcol.all_to_all_single(send, None, None, groups.group(axis)))  # row i came from i
    return torch.cat(recv.unbind(0), dim=src_dim)


# ------------------------------------------------------------------------------ steps
def _forward(x, step: Step, groups, recorder):
    a, d, k = step.axis, step.dim, step.kind
    if k == "all_gather":
        return _all_gather(x, d, a, groups, recorder)
    if k == "shard":
        return _chunk(x, _dim(step), groups.size(a), groups.coords[a])
    if k == "all_to_all":
        return _all_to_all(x, d, step.dim2, a, groups, recorder)
    if k == "all_reduce":
        return _all_reduce(x, a, groups, recorder)
    if k == "reduce_scatter":
        return _reduce_scatter(x, d, a, groups, recorder)
    if k == "to_partial":
        return x.clone() if groups.coords[a] == 0 else torch.zeros_like(x)
    raise ValueError(f"unknown step kind {k!r}")


def _backward(g, step: Step, groups, recorder):
    a, d, k = step.axis, step.dim, step.kind
    if k == "all_gather":
        return _chunk(g, _dim(step), groups.size(a), groups.coords[a])
    if k in ("shard", "reduce_scatter"):
        return _all_gather(g, d, a, groups, recorder)
    if k == "all_to_all":
        return _all_to_all(g, step.dim2, d, a, groups, recorder)
    if k in ("all_reduce", "to_partial"):
        return g
    raise ValueError(f"unknown step kind {k!r}")


class _StepFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, step, groups, recorder):
        ctx.step, ctx.groups, ctx.recorder = step, groups, recorder
        return _forward(x, step, groups, recorder)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        return _backward(grad, ctx.step, ctx.groups, ctx.recorder), None, None, None


def _check_step(shape, before: Spec, step: Step, mesh: Mesh) -> None:
    a = step.axis
    if mesh.axis_size(a) is None:
        raise ValueError(f"step {step}: unknown axis or axis without a size")
    used = set(before.used_axes())
    k = step.kind
    for dim in (step.dim, step.dim2):
        if dim is not None and not 0 <= dim < len(shape):
            raise ValueError(f"step {step}: dim {dim} out of range for shape {list(shape)}")
    if k in ("all_gather", "all_to_all"):
        ok = step.dim is not None and before.axes_of(step.dim)[-1:] == (a,)
        ok = ok and (k == "all_gather" or (step.dim2 is not None and step.dim2 != step.dim))
    elif k in ("shard", "to_partial"):
        ok = a not in used and (k == "to_partial" or step.dim is not None)
    elif k in ("all_reduce", "reduce_scatter"):
        ok = a in before.partial and (k == "all_reduce" or step.dim is not None)
    else:
        raise ValueError(f"unknown step kind {k!r}")
    if not ok or not is_valid(shape, apply_step(before, step), mesh):
        raise ValueError(f"step {step} does not apply to layout {before} of shape {list(shape)}")


def execute_step(local: torch.Tensor, shape, before: Spec, step: Step, mesh: Mesh, groups: MeshGroups,
                 recorder: Recorder | None = None) -> torch.Tensor:
    """Run one transform on this rank's piece `local` of a global `shape` laid out as `before`;
    returns the piece for `apply_step(before, step)`. Differentiable (see the module docstring)."""
    shape = tuple(shape)
    if not is_valid(shape, before, mesh):
        raise ValueError(f"layout {before} is not valid for shape {list(shape)} on mesh {mesh}")
    want = local_shape(shape, before, mesh)
    if tuple(local.shape) != want:
        raise ValueError(f"local tensor has shape {list(local.shape)}, layout {before} needs {list(want)}")
    _check_step(shape, before, step, mesh)
    return _StepFunction.apply(local, step, groups, recorder)


def run_path(local: torch.Tensor, shape, path: Path, mesh: Mesh, groups: MeshGroups,
             recorder: Recorder | None = None) -> torch.Tensor:
    """Run the steps of a conversion path in order."""
    for before, step in zip(path.specs, path.steps):
        local = execute_step(local, shape, before, step, mesh, groups, recorder)
    return local


def redistribute(local: torch.Tensor, shape, src: Spec, dst: Spec, mesh: Mesh, groups: MeshGroups,
                 recorder: Recorder | None = None) -> torch.Tensor:
    """Convert this rank's piece of a global `shape` from layout `src` to layout `dst` along the cheapest
    `conversion_path` (priced with the tensor's element size). Returns `local` itself if src == dst."""
    path = conversion_path(tuple(shape), src, dst, mesh, itemsize=local.element_size())
    return run_path(local, shape, path, mesh, groups, recorder)


def backward_collectives(shape, path: Path, mesh: Mesh,
                         itemsize: int = 4) -> list[tuple[Collective, tuple[str, ...], int]]:
    """`(kind, axes, full_bytes)` of the collectives backward through `path` issues, in issue order
    (steps reversed): the same as `Path.backward` reversed."""
    out = []
    for before, step in reversed(list(zip(path.specs, path.steps))):
        _, b = step_comms(tuple(shape), before, step, mesh, itemsize)
        if b is not None:
            out.append((b.kind, b.axes, int(b.size_bytes)))
    return out
