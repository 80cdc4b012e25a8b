"""What the lowering runs less split than the plan says, for the rules to report (never silently):

* `Fallback` (PL364): an opaque op (no sharding rule) not known to act per sample runs on the whole batch:
  its activation inputs are gathered over the data axes and it is repeated on every rank there;
* `Replicated` (PL367): an opaque op whose activation inputs the plan splits over other axes (tensor
  parallelism) runs on them whole: they are gathered over those axes and its compute is repeated on each of
  their devices (attention whose mask is a tensor of the step, T5's learned position bias, is opaque: a
  tensor-parallel plan's attention then runs every head on every tp rank).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from planlang.cost.layout import local_shape
from planlang.cost.ops.base import DTYPE_BYTES
from planlang.plan.complete import CompleteMesh
from planlang.plan.types import Spec
from planlang.plan.units import format_bytes


@dataclass(frozen=True)
class Fallback:
    """An op the lowering runs on whole values where the plan splits them (PL364): an opaque op with no
    rule and not known to act per sample gathers its inputs over the data axes and is repeated there."""

    node: str
    module: str
    target: str
    axes: tuple[str, ...]  # the data axes its inputs are gathered over
    gathered_bytes: int  # bytes one rank receives per step for the gather (forward)

    def message(self, name: Callable[[str], str] = str) -> str:
        """What happens, the module named by `name` (the checker's: as the plan writes paths)."""
        return (f"`{self.target}` {_where(self.module, name)} runs on the whole batch: its inputs are gathered "
                f"over {', '.join(self.axes)} ({format_bytes(self.gathered_bytes)} per rank per step) and it is "
                f"repeated on every rank there")

    def __str__(self) -> str:
        return self.message()


@dataclass(frozen=True)
class Replicated:
    """An opaque op whose activation inputs the plan splits over axes other than the data axes, run on them
    whole (PL367): gathered over `axes`, its compute repeated on each of their devices."""

    node: str
    module: str
    target: str
    axes: tuple[str, ...]  # the non-data axes its inputs are gathered over
    gathered_bytes: int  # bytes one rank receives per step for the gathers (forward)

    def message(self, name: Callable[[str], str] = str) -> str:
        """What happens, the module named by `name` (the checker's: as the plan writes paths)."""
        return (f"`{self.target}` {_where(self.module, name)} has no rule for inputs split over "
                f"{', '.join(self.axes)}: they are gathered ({format_bytes(self.gathered_bytes)} per rank per step) "
                f"and it runs whole on each of the {' x '.join(self.axes)} devices")

    def __str__(self) -> str:
        return self.message()


def _where(module: str, name: Callable[[str], str]) -> str:
    return f"in `{name(module)}`" if module else "at the model's top level"


def gathered_over_data(in_vals, layouts: list[Spec], daxes: set[str], mesh: CompleteMesh) -> tuple[set[str], int] | None:
    """The data axes an opaque op's activation inputs are split over, and the bytes one rank receives to
    make them whole; None when no input is split over a data axis."""
    axes: set[str] = set()
    received = 0
    for v, spec in zip(in_vals, layouts):
        if v.kind in ("param", "const"):
            continue
        mine = {a for i in range(spec.rank) for a in spec.axes_of(i)} & daxes
        if mine:
            axes |= mine
            whole = math.prod(v.shape) * DTYPE_BYTES.get(v.dtype, 4)
            received += whole - whole // math.prod(mesh.size_of(a) for a in mine)
    return (axes, received) if axes else None


def gathered_over_model_axes(in_vals, now: list[Spec], wanted: list[Spec], daxes: set[str],
                             mesh: CompleteMesh) -> tuple[tuple[str, ...], int] | None:
    """The axes other than the data axes (of size > 1) that an opaque op's activation inputs are split
    over now and whole in `wanted` (the layouts it runs on), in the mesh's order, and the bytes one rank
    receives to gather them; None when there are none (parameters: PL366's; constants are whole)."""
    axes: set[str] = set()
    received = 0
    for v, have, want in zip(in_vals, now, wanted):
        if v.kind in ("param", "const") or not v.shape:
            continue
        split = {a for i in range(have.rank) for a in have.axes_of(i)}
        kept = {a for i in range(want.rank) for a in want.axes_of(i)}
        lost = {a for a in split - kept - daxes if mesh.size_of(a) > 1}
        if lost:
            axes |= lost
            item = DTYPE_BYTES.get(v.dtype, 4)
            before = math.prod(local_shape(tuple(v.shape), have, mesh))
            after = math.prod(local_shape(tuple(v.shape), want, mesh))
            received += max(0, after - before) * item
    return (tuple(a for a in mesh.names if a in axes), received) if axes else None
