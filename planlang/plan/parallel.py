"""The parallel dimensions of a complete plan, computed once: which mesh axes split the batch, the
tensors, the pipeline, and what ZeRO and FSDP2 shard over. `CompletePlan.dims` holds them
(planlang.plan.complete); the lowering, the cost model and the runtime read them there.

    sizes      every mesh axis and its size, in mesh order
    data       the axes the batch is split over (planlang.plan.data), in mesh order, size-1 ones included
               (the runtime's process groups count them); `batch` leaves those out (a split over one
               device is none)
    tensor     the axes of more than one device a `shard` splits over, neither data nor pipeline axes
    pipeline   the pipeline axis (None without a pipeline)
    zero       the optimizer's ZeRO stage and axis (0, None without ZeRO)
    fsdp       the mesh axes FSDP2 shards over under ZeRO-2/3 (`fsdp_mesh_axes`), () when it does not run:
               no ZeRO-2/3, or a ZeRO axis of one device

The values are those of a plan the checker accepted: `complete` narrows holes only, the checker's rules
(PL313 batch splits, PL415 and PL507 the axes FSDP2 can arrange, PL502–PL504 the ZeRO stage and axis)
make the combinations consistent, and nothing here says them again. The one rule both need, FSDP2's
arrangement of the data axes, is `fsdp_mesh_axes`, read by the checker's PL507 on plans that may
still have holes.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from planlang.lang.frozen import value_type
from . import types as T
from .data import data_axes, tensor_axes


def fsdp_mesh_axes(names: Sequence[str], data: Sequence[str], zero_axis: str) -> tuple[str, ...] | None:
    """The mesh axes FSDP2 shards over for ZeRO-2/3 over `zero_axis` without a pipeline, with the batch
    split over `data` (mesh order; size-1 axes included) on a mesh whose axes are `names`: the ZeRO
    axis alone, or (r, zero axis) for HSDP (replicated over r, sharded over the ZeRO axis) when one more
    data axis r comes before it in the mesh; None when FSDP2 cannot arrange them (PL507). In a pipeline
    each stage is sharded over the ZeRO axis alone (PL415 keeps the batch to it)."""
    rest = [a for a in data if a != zero_axis]
    if not rest:
        return (zero_axis,)
    if len(rest) == 1 and names.index(rest[0]) < names.index(zero_axis):
        return (rest[0], zero_axis)
    return None


@value_type
class ParallelDims:
    """A complete plan's parallel dimensions (see the module docstring); `CompletePlan.dims` builds it
    once with `of`."""

    sizes: tuple[tuple[str, int], ...] = ()
    data: tuple[str, ...] = ()
    tensor: tuple[str, ...] = ()
    pipeline: str | None = None
    zero_stage: int = 0
    zero_axis: str | None = None
    fsdp: tuple[str, ...] = ()

    @classmethod
    def of(cls, plan: T.Plan, sizes: tuple[tuple[str, int], ...], pipeline: str | None, zero_stage: int,
           zero_axis: str | None) -> ParallelDims:
        """The dims of `plan`, whose mesh axes have `sizes` and whose pipeline axis and ZeRO stage and
        axis are those given (the complete plan's values; `plan` itself may type them with holes).
        A ValueError when FSDP2 cannot arrange the data axes: a plan the checker refuses (PL507)."""
        size = dict(sizes)
        data = data_axes(plan)
        fsdp: tuple[str, ...] = ()
        if zero_stage in (2, 3) and zero_axis is not None and size[zero_axis] > 1:
            arranged = (zero_axis,) if pipeline is not None else fsdp_mesh_axes(tuple(size), data, zero_axis)
            if arranged is None:
                raise ValueError(f"{plan.path}: ZeRO-{zero_stage} over `{zero_axis}` with the batch over "
                                 f"{', '.join(data)}: FSDP2 cannot arrange these axes (PL507); validate the plan "
                                 "(`planlang check`) before running or pricing it")
            fsdp = arranged
        return cls(sizes, data, tensor_axes(plan), pipeline, zero_stage, zero_axis, fsdp)

    def size(self, axis: str) -> int:
        """The size of mesh axis `axis`; KeyError when the mesh has none (the checker refuses it, PL201)."""
        for name, n in self.sizes:
            if name == axis:
                return n
        raise KeyError(f"the mesh has no axis `{axis}`")

    @property
    def batch(self) -> tuple[str, ...]:
        """The data axes of more than one device: the axes the batch is really split over."""
        return tuple(a for a in self.data if self.size(a) > 1)

    @property
    def data_degree(self) -> int:
        """How many ways the batch is split: the product of the data axes' sizes."""
        return math.prod(self.size(a) for a in self.data)

    @property
    def pipeline_size(self) -> int:
        """The number of pipeline ranks (1 without a pipeline)."""
        return self.size(self.pipeline) if self.pipeline is not None else 1

    @property
    def zero_shards(self) -> int:
        """How many ranks ZeRO shards over: the ZeRO axis' size (1 without ZeRO)."""
        return self.size(self.zero_axis) if self.zero_stage and self.zero_axis is not None else 1

    @property
    def replicate(self) -> tuple[str, ...]:
        """Under ZeRO-2/3 with FSDP2, the data axes of more than one device besides the ZeRO axis, over
        which each gradient shard is all-reduced after FSDP2's reduce-scatter (HSDP's replicate axis)."""
        return tuple(a for a in self.batch if a != self.zero_axis) if self.fsdp else ()
