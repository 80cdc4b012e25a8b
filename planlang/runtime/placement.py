"""How a planlang `Spec` maps to DTensor placements, the layout record of one parameter, and `shard_parameters`
(every parameter of a model replaced by its local piece under a lowered program).

The runtime keeps every parameter as a plain local tensor (this device's piece under its Spec); these
helpers give the DTensor view of it for torch's own tools (DCP, FSDP2 interop, tests with DTensor as the
oracle). Our chunk convention (layout.py: a dim split by axes (a, b) is indexed coord[a]*size(b)+coord[b])
equals DTensor's when the axes of a dim are listed in mesh order, which `to_placements` requires.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.distributed.tensor import Partial, Replicate, Shard

from planlang.model.capture.opgraph import dtype_name
from planlang.model.program.head_blocks import block_factor, blocked_order
from planlang.cost.layout import local_slices
from planlang.plan.types import Mesh, Spec

if TYPE_CHECKING:
    from planlang.model.program.head_blocks import Blocked
    from planlang.model.program.lowering import Program


@dataclass(frozen=True)
class ParamLayout:
    """One parameter of the parallel model: its fully-qualified name, global shape and Spec."""

    name: str
    shape: tuple[int, ...]
    spec: Spec
    dtype: str = "f32"
    blocked: Blocked | None = None  # stored per head (planlang.model.program.head_blocks)

    def __str__(self) -> str:
        return f"{self.name}: {list(self.shape)} {self.spec}"


class PlacementError(ValueError):
    pass


def to_placements(spec: Spec, mesh: Mesh) -> tuple:
    """DTensor placements (one per mesh axis, in mesh order) for `spec`."""
    by_axis: dict[str, object] = {}
    for d in range(spec.rank):
        axes = spec.axes_of(d)
        order = [mesh.names.index(a) for a in axes]
        if order != sorted(order):
            raise PlacementError(f"dim {d} of {spec} lists its axes out of mesh order ({', '.join(mesh.names)})")
        for a in axes:
            by_axis[a] = Shard(d)
    for a in spec.partial:
        by_axis[a] = Partial()
    return tuple(by_axis.get(a, Replicate()) for a in mesh.names)


def from_placements(placements, mesh: Mesh, rank: int) -> Spec:
    """The Spec of a DTensor with `placements` on a mesh with axes `mesh.names` (inverse of to_placements)."""
    dims: list[list[str]] = [[] for _ in range(rank)]
    partial: list[str] = []
    for a, p in zip(mesh.names, placements):
        if isinstance(p, Shard):
            dims[p.dim % rank].append(a)
        elif isinstance(p, Partial):
            partial.append(a)
    return Spec(tuple(tuple(d) for d in dims), tuple(partial))


def shard_parameters(model: nn.Module, prog: Program, coords: dict[str, int], device,
                     dtype: torch.dtype | None = None) -> dict[str, ParamLayout]:
    """Replace every parameter by its local piece under the program's layout (shared ones once), cast to
    `dtype` when given (the plan's precision: planlang.runtime.precision.storage_dtype)."""
    layouts = {}
    done: dict[int, nn.Parameter] = {}
    for fqn, p in list(model.named_parameters(remove_duplicate=False)):
        owner_name, _, attr = fqn.rpartition(".")
        owner = model.get_submodule(owner_name) if owner_name else model
        if id(p) in done:
            setattr(owner, attr, done[id(p)])
            continue
        spec = prog.param_specs.get(fqn)
        if spec is None:  # unused in forward: keep it whole
            spec = Spec(tuple(() for _ in p.shape))
        whole, blocked = p.detach(), prog.blocked.get(fqn)
        if blocked is not None:  # stored per head: each device's columns are its heads of every block
            whole = blocked_order(whole, blocked, block_factor(blocked, prog.mesh))
        local = whole[local_slices(tuple(p.shape), spec, prog.mesh, coords)]
        local = local.to(device) if dtype is None or not p.is_floating_point() else local.to(device, dtype)
        new = nn.Parameter(local.clone().contiguous(), requires_grad=p.requires_grad)
        setattr(owner, attr, new)
        done[id(p)] = new
        layouts[fqn] = ParamLayout(fqn, tuple(p.shape), spec, dtype_name(p.dtype), blocked)
    return layouts
