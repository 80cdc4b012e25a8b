"""Throughput-optimal pipeline stages over layer ranges and device groups, in the style of Alpa's
inter-operator pass (Zheng et al., OSDI 2022, §5.2).

A plan cuts the layers (in execution order) into S consecutive stages and gives stage i a sub-mesh of
`size_i` devices; the sub-meshes must use every device (Σ size_i = D — with Alpa's shapes (1, 2^j) and
(n, M) any such multiset tiles the N x M cluster, Alpa Theorem 1). With `t_i` the latency of stage i for
one microbatch on its sub-mesh and B microbatches, the pipeline's latency is (Alpa eq. 2)

    T = Σ_i t_i + (B − 1) · max_j t_j.

Alpa's dynamic program fixes a bound t_max on the stage latencies and computes

    F(s, k, d) = min over i >= k and sub-mesh g with size_g <= d, t(k..i, g) <= t_max and the stage fitting
                 in memory as the s-th stage from the end, of  t(k..i, g) + F(s − 1, i + 1, d − size_g),
    F(0, K, 0) = 0,

the least Σ t of cutting layers k..K−1 into s stages on d devices; then T*(t_max) = min_s F(s, 0, D) +
(B − 1) · t_max. Minimising over t_max among the distinct stage latencies gives the optimum: the best
plan's own bottleneck is one of the candidates. Alpa scans the candidates upwards with an early stop;
here a branch and bound over the sorted candidates needs far fewer DP runs, with the same answer: the
DP value min_s F never grows with t_max, so for every bound strictly between two evaluated ones lo < hi
the total is at least min_s F at hi + (B − 1) x (the first bound after lo), and intervals whose bound
cannot beat the best total found are dropped.

The position from the end (s) is what the 1F1B memory rule needs: stage i of p holds min(p − i, m)
microbatches (`partition.in_flight`), i.e. min(s, m) with s = p − i stages from it to the end. A stage
fits when Σ static bytes + in-flight · Σ activation bytes <= the budget, per device of its sub-mesh.

Inputs are plain data: `layer_times[l][g]` (layer l's latency for one microbatch, forward + backward, on
sub-mesh g — for instance from the intra-op solver, as Alpa's t_intra), and optionally `static_bytes[l][g]`
and `act_bytes[l][g]` per device. A stage's latency and memory are sums over its layers.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Sequence, Union

import numpy as np

from .partition import PartitionError, in_flight


@dataclass(frozen=True)
class Submesh:
    """`hosts` x `devices` (per host) devices; Alpa's sub-mesh shape."""

    hosts: int
    devices: int

    def __str__(self) -> str:
        return f"{self.hosts}x{self.devices}"

    @property
    def size(self) -> int:
        return self.hosts * self.devices


def alpa_submeshes(hosts: int, devices_per_host: int) -> tuple[Submesh, ...]:
    """Alpa's sub-mesh shapes for an N x M cluster: (1, 1), (1, 2), (1, 4), ... up to (1, M), then
    (2, M), ..., (N, M)."""
    out, d = [], 1
    while d < devices_per_host:
        out.append(Submesh(1, d))
        d *= 2
    out += [Submesh(h, devices_per_host) for h in range(1, hosts + 1)]
    return tuple(out)


@dataclass(frozen=True)
class TimedStage:
    """Layers `start:stop` on sub-mesh `mesh` (index `group` of the inputs), with latency and memory."""

    start: int
    stop: int
    group: int
    mesh: Submesh
    time: float
    memory: float = 0.0

    def __str__(self) -> str:
        return f"[{self.start}:{self.stop}] on {self.mesh} ({self.time:.4g})"


@dataclass(frozen=True)
class ThroughputPlan:
    """Stages in pipeline order; `latency` = Σ t_i + (B − 1) · max t_i."""

    stages: tuple[TimedStage, ...]
    latency: float
    microbatches: int
    bounds_tried: int = 0  # t_max values whose DP ran

    def __str__(self) -> str:
        return f"{len(self.stages)} stages, latency {self.latency:.4g}: " + ", ".join(str(s) for s in self.stages)

    @property
    def bottleneck(self) -> float:
        return max(s.time for s in self.stages)


def pipeline_latency(times: Sequence[float], microbatches: int) -> float:
    """Alpa eq. 2: Σ t_i + (B − 1) · max t_i."""
    return sum(times) + (microbatches - 1) * max(times)


def _table(rows, n: int, g: int, what: str) -> np.ndarray:
    a = np.asarray(rows, dtype=float)
    if a.shape != (n, g):
        raise PartitionError(f"{what} has shape {a.shape}; give one row per layer and one column per sub-mesh "
                             f"({n} x {g})")
    if not np.all(np.isfinite(a)) or np.any(a < 0):
        raise PartitionError(f"{what} must be finite and >= 0")
    return a


def _range_sums(a: np.ndarray) -> np.ndarray:
    """R[k, i, g] = Σ_{l=k}^{i-1} a[l, g] for k < i (inf elsewhere)."""
    n, g = a.shape
    out = np.full((n, n + 1, g), np.inf)
    for k in range(n):
        out[k, k + 1:, :] = np.cumsum(a[k:, :], axis=0)
    return out


def throughput_stages(
    layer_times: Sequence[Sequence[float]],
    submeshes: Sequence[Union[Submesh, int]],
    devices: int,
    microbatches: int,
    static_bytes: Sequence[Sequence[float]] | None = None,
    act_bytes: Sequence[Sequence[float]] | None = None,
    budget: float | None = None,
    schedule: str = "1f1b",
    extra_in_flight: int = 0,
    epsilon: float = 0.0,
    stages: int | None = None,
) -> ThroughputPlan:
    """The stages and sub-meshes minimising Σ t_i + (B − 1) · max t_i (module docstring).

    `submeshes`: the device groups a stage may take (Submesh or a plain device count); `devices`: how many
    the stages must use in all; memory is checked when `budget` is given (bytes per device). `epsilon` > 0
    skips t_max candidates within a factor (1 + epsilon) of the last one tried (Alpa's speed-up; not
    exact). `stages` fixes the number of stages (a plan's pipeline axis size); Alpa leaves it free.
    Raises PartitionError when no plan fits."""
    meshes = tuple(s if isinstance(s, Submesh) else Submesh(1, int(s)) for s in submeshes)
    sizes = [s.size for s in meshes]
    n, G = len(layer_times), len(meshes)
    if n == 0 or G == 0:
        raise PartitionError("no layers or no sub-meshes to plan with")
    if any(s < 1 for s in sizes) or devices < 1:
        raise PartitionError("sub-mesh sizes and the device count must be >= 1")
    if microbatches < 1:
        raise PartitionError(f"microbatches = {microbatches}; use at least 1")
    if schedule not in ("gpipe", "1f1b"):
        raise PartitionError(f"schedule {schedule!r} is not supported here; use gpipe or 1f1b")
    T = _range_sums(_table(layer_times, n, G, "layer_times"))
    max_stages = min(n, devices // min(sizes))
    if stages is not None and not 1 <= stages <= max_stages:
        raise PartitionError(f"{stages} stages of at least one layer and {min(sizes)} device(s) each do not fit "
                             f"{n} layers on {devices} devices; use 1..{max_stages} stages")
    counts = [stages] if stages is not None else list(range(1, max_stages + 1))
    # fits[s - 1][k, i, g]: layers k..i-1 on sub-mesh g fit in memory as the s-th stage from the end
    top = max(counts)
    fits = np.isfinite(T)[None].repeat(top, axis=0)
    if budget is not None:
        S = _range_sums(_table(static_bytes, n, G, "static_bytes")) if static_bytes is not None else np.zeros_like(T)
        A = _range_sums(_table(act_bytes, n, G, "act_bytes")) if act_bytes is not None else np.zeros_like(T)
        for s in range(1, top + 1):
            fits[s - 1] &= S + in_flight(schedule, s, 0, microbatches, extra_in_flight) * A <= budget
    candidates = np.unique(T[fits.any(axis=0)])
    if candidates.size == 0:
        raise PartitionError(_nothing_fits(budget))

    def solve(t_max: float) -> list[np.ndarray]:
        """F[s][k, d] for s = 0..top (module docstring), stage latencies <= t_max; numpy over the stage
        start, the stage end and the devices."""
        F = [np.full((n + 1, devices + 1), np.inf)]
        F[0][n, 0] = 0.0
        for s in range(1, top + 1):
            Fs = np.full((n + 1, devices + 1), np.inf)
            prev = F[s - 1]
            for g, size in enumerate(sizes):
                if size > devices:
                    continue
                t = np.where(fits[s - 1, :, :, g] & (T[:, :, g] <= t_max), T[:, :, g], np.inf)  # (n, n+1)
                shifted = np.full((n + 1, devices + 1), np.inf)
                shifted[:, size:] = prev[:, :devices + 1 - size]
                Fs[:n] = np.minimum(Fs[:n], (t[:, :, None] + shifted[None, :, :]).min(axis=1))
            F.append(Fs)
        return F

    if epsilon > 0:  # Alpa's speed-up: skip bounds within (1 + epsilon) of the last one kept
        kept = [candidates[0]]
        for t in candidates[1:]:
            if t >= kept[-1] * (1 + epsilon):
                kept.append(t)
        if kept[-1] != candidates[-1]:
            kept.append(candidates[-1])  # the loosest bound: every plan
        candidates = np.array(kept)
    least: dict[int, float] = {}  # candidate index -> min Σ t_i with every stage <= that candidate

    def least_sum(i: int) -> float:
        if i not in least:
            F = solve(float(candidates[i]))
            least[i] = float(min(F[s][0, devices] for s in counts))
        return least[i]

    def total(i: int) -> float:
        return least_sum(i) + (microbatches - 1) * float(candidates[i])

    # Branch and bound over the sorted bounds. least_sum never grows with the bound, so for the bounds
    # strictly inside (lo, hi) the total is at least least_sum(hi) + (B − 1) · candidates[lo + 1]; an
    # interval whose bound cannot beat the best total so far is dropped (exact: no plan is lost).
    last = len(candidates) - 1
    best_i = min((0, last), key=lambda i: (total(i), i))
    best = total(best_i)
    if not np.isfinite(best):
        raise PartitionError(_nothing_fits(budget))
    heap = [(least_sum(last) + (microbatches - 1) * float(candidates[1]), 0, last)] if last > 1 else []
    while heap:
        bound, lo, hi = heapq.heappop(heap)
        if bound >= best:
            continue
        mid = (lo + hi) // 2
        if total(mid) < best:
            best, best_i = total(mid), mid
        for a, b in ((lo, mid), (mid, hi)):
            if b - a > 1:
                lb = least_sum(b) + (microbatches - 1) * float(candidates[a + 1])
                if lb < best:
                    heapq.heappush(heap, (lb, a, b))
    best_t, tried = float(candidates[best_i]), len(least)
    chosen = _reconstruct(solve(best_t), best_t, T, fits, sizes, meshes, n, devices, counts,
                          static_bytes, act_bytes, schedule, microbatches, extra_in_flight)
    times = [s.time for s in chosen]
    return ThroughputPlan(chosen, pipeline_latency(times, microbatches), microbatches, tried)


def _reconstruct(F, t_max, T, fits, sizes, meshes, n, devices, counts, static_bytes, act_bytes,
                 schedule, m, extra) -> tuple[TimedStage, ...]:
    """Walk the DP table forward: the fewest stages achieving the minimum, then the first (stop, group)
    whose entry reproduces the table value."""
    s = min(counts, key=lambda s: (F[s][0, devices], s))
    k, d, out = 0, devices, []
    while s > 0:
        found = None
        for i in range(k + 1, n + 1):
            for g, size in enumerate(sizes):
                if size > d or not fits[s - 1, k, i, g] or T[k, i, g] > t_max:
                    continue
                if T[k, i, g] + F[s - 1][i, d - size] == F[s][k, d]:
                    found = (i, g)
                    break
            if found:
                break
        assert found is not None, "DP table is inconsistent"
        i, g = found
        mem = 0.0
        if static_bytes is not None:
            mem += sum(static_bytes[l][g] for l in range(k, i))
        if act_bytes is not None:
            mem += in_flight(schedule, s, 0, m, extra) * sum(act_bytes[l][g] for l in range(k, i))
        out.append(TimedStage(k, i, g, meshes[g], float(T[k, i, g]), float(mem)))
        k, d, s = i, d - sizes[g], s - 1
    return tuple(out)


def _nothing_fits(budget) -> str:
    if budget is None:
        return "no stage plan uses all devices with these sub-meshes; offer sub-meshes whose sizes add up to it"
    return (f"no stage plan fits the budget of {budget:.4g} bytes per device; raise the budget, use more "
            "devices or microbatches of fewer samples")
