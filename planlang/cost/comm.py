"""Collective and compute costs per mesh axis: the alpha-beta model read from a plan's hardware.

For a collective over a group of n devices connected by a link with latency alpha (seconds, one per
collective, as `planlang probe` measures it with small messages) and bandwidth beta (bytes/s per device,
one direction), with S the size in bytes of the *full* (gathered / reduced) tensor of one group:

    all-reduce      alpha + 2 (n-1)/n * S / beta        (ring: reduce-scatter then all-gather)
    all-gather      alpha +   (n-1)/n * S / beta        (S = gathered output size)
    reduce-scatter  alpha +   (n-1)/n * S / beta        (S = input size before scattering)
    all-to-all      alpha +   (n-1)/n * S / beta        (S = the tensor each rank holds)
    broadcast       alpha +            S / beta         (pipelined)
    send/recv       alpha +            S / beta

These are the standard ring formulas (map-memory-aware-auto-parallel §4.2 derives bus bandwidth from
all-reduce the same way: busbw = algbw * 2(n-1)/n). A group spanning several axes uses the slowest
link among them (its bandwidth is the bottleneck of a ring that crosses it) and the largest latency.
`bytes_sent(...)` gives the per-device payload of the same algorithms, the quantity tests compare with
what a run actually moves.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Iterable

from planlang.plan.types import Link, Mesh

# When an axis has no link (a plan that names none), price it as a slow network so plans that rely on
# it are not accidentally preferred; `planlang check` warns about such axes (PL309).
DEFAULT_LINK = Link("unspecified", bandwidth=10e9, latency=10e-6)


class Collective(str, Enum):
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    BROADCAST = "broadcast"
    SEND_RECV = "send_recv"


# per-device bytes sent, as a multiple of S, for a group of n
_RING_STEPS = {Collective.ALL_REDUCE: 2.0, Collective.ALL_GATHER: 1.0, Collective.REDUCE_SCATTER: 1.0,
               Collective.ALL_TO_ALL: 1.0, Collective.BROADCAST: None, Collective.SEND_RECV: None}


def _volume_factor(kind: Collective, n: int) -> float:
    # a ring collective sends (n-1)/n of S per pass (all-reduce: two passes); broadcast and send/recv S
    # once. A module-level table: this runs for every transfer the solver prices (7.6 % of a 76.1B solve
    # when it built its dict per call)
    if n <= 1:
        return 0.0
    passes = _RING_STEPS[kind]
    return 1.0 if passes is None else passes * (n - 1) / n


@dataclass(frozen=True)
class Group:
    """The devices a collective runs over: one or more mesh axes, with their combined link."""

    axes: tuple[str, ...]
    size: int
    bandwidth: float
    latency: float

    def __str__(self) -> str:
        return f"{'x'.join(self.axes)}({self.size})"


def group(mesh: Mesh, axes: Iterable[str]) -> Group:
    axes = tuple(axes)
    size, bws, lats = 1, [], []
    for name in axes:
        ax = mesh.axis(name)
        if ax is None:
            raise KeyError(f"mesh {mesh.name} has no axis {name!r}")
        if not isinstance(ax.size, int):
            raise ValueError(f"axis {name!r} has no size yet (a hole); solve the plan first")
        link = ax.link or DEFAULT_LINK
        size *= ax.size
        bws.append(link.bandwidth)
        lats.append(link.latency)
    return Group(axes, size, min(bws) if bws else math.inf, max(lats) if lats else 0.0)


def bytes_sent(kind: Collective, n: int, size_bytes: float) -> float:
    """Bytes each device sends for collective `kind` of a full tensor of `size_bytes` over n devices."""
    return _volume_factor(kind, n) * size_bytes


def collective_time(kind: Collective, g: Group, size_bytes: float) -> float:
    """Seconds for one collective of a full tensor of `size_bytes` over group `g` (0 for a group of 1)."""
    if g.size <= 1:
        return 0.0
    return g.latency + bytes_sent(kind, g.size, size_bytes) / g.bandwidth


def compute_time(flops: float, mesh: Mesh, dtype: str = "f32", efficiency: float = 0.5) -> float:
    """Seconds for `flops` on one device of the mesh at `efficiency` of its peak for `dtype`.

    Efficiency is the fraction of datasheet peak a real kernel reaches (0.4-0.6 for large matmuls);
    falls back to f32 and then to any declared figure when the dtype has none. This flat figure prices
    a step's memory-bound ops as if they ran at it too; `work_time` prices them by their bytes where the
    device declares its memory bandwidth."""
    dev = mesh.device
    if dev is None or not dev.flops:
        raise ValueError(f"mesh {mesh.name} has no device throughput; declare `flops.{dtype}` on its device")
    peak = dev.flops_for(dtype) or dev.flops_for("f32") or max(v for _, v in dev.flops)
    return flops / (peak * efficiency)


#: the fraction of peak the flop-counted ops (matmuls, convolutions, fused attention) reach under the
#: roofline, where memory-bound ops are priced by their bytes instead of hiding in a flat efficiency:
#: a round figure for large tensor-core GEMMs, set before Megatron-LM's Table 1 was priced with it (not
#: fitted to it; bench/megatron_table.py, docs/step_time.md "Compute efficiency").
MATMUL_EFFICIENCY = 0.7


def work_time(flops: float, moved: float, mesh: Mesh, dtype: str = "f32", efficiency: float = 0.5) -> float:
    """Seconds for a stage's ops on one device: `flops` of the ops with a flop formula and `moved` bytes
    read and written by the rest (planlang.model.capture.profile).

    A device that declares `memory_bandwidth` is priced by a roofline split by op kind: the flop-counted
    ops at MATMUL_EFFICIENCY of peak, the memory-bound ops (norms, activations, softmax, dropout, casts)
    at the memory bandwidth — the two never overlap within one stream (Williams et al. 2009, "Roofline",
    per kernel). A device without it: `compute_time` at the flat `efficiency`, bytes unpriced."""
    dev = mesh.device
    bandwidth = dev.memory_bandwidth if dev is not None else None
    if not bandwidth:
        return compute_time(flops, mesh, dtype, efficiency)
    return compute_time(flops, mesh, dtype, MATMUL_EFFICIENCY) + moved / bandwidth


@dataclass(frozen=True)
class CommCost:
    """A priced collective: what, over which axes, how many bytes, how long."""

    kind: Collective
    axes: tuple[str, ...]
    size_bytes: float  # full tensor size S as in the module docstring
    seconds: float

    def __str__(self) -> str:
        return f"{self.kind.value}[{','.join(self.axes)}] {self.size_bytes:.0f} B {self.seconds * 1e6:.1f} us"


def price(kind: Collective, mesh: Mesh, axes: Iterable[str], size_bytes: float) -> CommCost:
    g = group(mesh, axes)
    return CommCost(kind, g.axes, size_bytes, collective_time(kind, g, size_bytes))
