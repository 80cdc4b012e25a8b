"""How a planlang `Spec` maps to DTensor placements, and the layout record of one parameter.

The runtime keeps every parameter as a plain local tensor (this device's piece under its Spec); these
helpers give the DTensor view of it for torch's own tools (DCP, FSDP2 interop, tests with DTensor as the
oracle). Our chunk convention (layout.py: a dim split by axes (a, b) is indexed coord[a]*size(b)+coord[b])
equals DTensor's when the axes of a dim are listed in mesh order, which `to_placements` requires.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from planlang.plan.types import Mesh, Spec

if TYPE_CHECKING:
    from planlang.model.program.head_blocks import Blocked


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
    # lazy: torch loads only when this runs
    from torch.distributed.tensor import Partial, Replicate, Shard

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
    # lazy: torch loads only when this runs
    from torch.distributed.tensor import Partial, Shard

    dims: list[list[str]] = [[] for _ in range(rank)]
    partial: list[str] = []
    for a, p in zip(mesh.names, placements):
        if isinstance(p, Shard):
            dims[p.dim % rank].append(a)
        elif isinstance(p, Partial):
            partial.append(a)
    return Spec(tuple(tuple(d) for d in dims), tuple(partial))
