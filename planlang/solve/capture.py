"""CAPTURE's memory-centric search for a partitioning and parallelization plan (capture-memory-centric-
partitioning §III-C, Algorithm 4).

A *stage config* is (layer group, parallelism, degree): a run of consecutive layers processed by `degree`
devices with data parallelism ("dp") or tensor parallelism ("tp"); degree 1 is a plain pipeline stage
("none" — 1-way dp and 1-way tp are the same thing, §III-C). Degrees are powers of two up to the devices
of one node `k` (§III-C), and a plan places its stages on `N = devices / k` nodes so that every layer is
placed once, in order, and no device is left unused; with `placement="in_order"` the stages fill the
nodes in pipeline order and a stage never spans two nodes (the degrees on each node sum to k), with
`placement="any"` the degrees only have to sum to the device count (Alpa's Theorem 1: power-of-two
sub-meshes of one node always tile the cluster).

The predictor is the analytical model of §III-B3 (the paper fits it to profiles; here the caller's
per-layer bytes stand in for the profile): for a group with parameter bytes W and activation bytes A
per microbatch, n microbatches in flight and states S = W · (1 + grad + optimizer):

    none      S + n · A
    dp d      S + n · A / d + ddp_buffer · W        (weights replicated; each device sees 1/d of the batch)
    tp d      (S + n · A) / d                       (weights and activations split)

Unlike the paper (which does not adjust for 1F1B, §II-B), n follows the schedule: m for GPipe,
min(p − i, m) for stage i of p under 1F1B (`partition.in_flight`).

The search is Algorithm 4: depth-first placement of stage configs, keeping the plan with the lowest
peak memory over all devices, with the paper's pruning (a stage config whose predicted memory exceeds
the best plan's peak so far is not placed) and its tie-break: among plans with the same peak, drop the
device(s) at the peak from each and compare the highest remaining, until a winner is found — i.e.
compare the plans' *distinct* per-device memory values from the highest down, lexicographically (a plan
that runs out of devices first wins). Where the paper picks at random among plans still equal, this
picks the plan whose stages, as (start, stop, parallelism, degree) tuples, come first.

Two exact accelerations keep the result identical: the search places stages from the last one back,
so a stage's position from the end (what the 1F1B rule needs) is known when it is placed; and by default
it is seeded with the optimal peak from a min–max dynamic program over (layers placed, stages placed,
devices used), so the pruning bites from the first plan, and the same table stops it from entering a
partial plan that cannot be completed within that peak. A partial plan whose distinct values already
compare worse than the best plan's is abandoned too (adding devices never improves that comparison).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from .partition import PartitionError, check_costs, in_flight

PARALLELISMS = ("none", "dp", "tp")


@dataclass(frozen=True)
class MemoryModel:
    """Multipliers of the parameter bytes: gradients, optimizer states, DDP gradient buckets (dp only)."""

    grad: float = 1.0
    optimizer: float = 2.0
    ddp_buffer: float = 1.0

    def __str__(self) -> str:
        return f"states = W x (1 + {self.grad:g} + {self.optimizer:g}), ddp buffer {self.ddp_buffer:g} W"


@dataclass(frozen=True)
class StageConfig:
    """Layers `start:stop` on `degree` devices with `parallelism`; `memory` is the predicted per-device peak."""

    start: int
    stop: int
    parallelism: str
    degree: int
    memory: float

    def __str__(self) -> str:
        how = "pp" if self.parallelism == "none" else f"{self.parallelism}{self.degree}"
        return f"[{self.start}:{self.stop}] {how} {self.memory:.4g}"

    @property
    def order_key(self) -> tuple:
        return (self.start, self.stop, PARALLELISMS.index(self.parallelism), self.degree)


@dataclass(frozen=True)
class CapturePlan:
    """The recommended plan; `key` is the tie-break vector (distinct per-device memories, highest first)."""

    stages: tuple[StageConfig, ...]
    peak: float
    key: tuple[float, ...]
    plans_evaluated: int = 0  # complete plans compared (after pruning)

    def __str__(self) -> str:
        return f"{len(self.stages)} stages, peak {self.peak:.4g}: " + ", ".join(str(s) for s in self.stages)

    @property
    def device_memory(self) -> tuple[float, ...]:
        """Predicted memory of every device, stage by stage."""
        return tuple(m for s in self.stages for m in [s.memory] * s.degree)


def stage_memory(params: float, acts: float, parallelism: str, degree: int, inflight: int,
                 model: MemoryModel) -> float:
    """Predicted per-device memory of one stage config (module docstring, §III-B3)."""
    states = params * (1.0 + model.grad + model.optimizer)
    if parallelism == "none":
        return states + inflight * acts
    if parallelism == "dp":
        return states + inflight * acts / degree + model.ddp_buffer * params
    if parallelism == "tp":
        return (states + inflight * acts) / degree
    raise PartitionError(f"parallelism {parallelism!r} is not one of none, dp, tp")


def default_configs(node_size: int, parallelisms: Sequence[str] = ("dp", "tp")) -> tuple[tuple[str, int], ...]:
    """("none", 1) and every (parallelism, 2^j) with 2 <= 2^j <= node_size."""
    out = [("none", 1)]
    d = 2
    while d <= node_size:
        out += [(p, d) for p in parallelisms]
        d *= 2
    return tuple(out)


def plan_key(memories: Sequence[float]) -> tuple[float, ...]:
    """§III-C tie-break vector: the distinct per-device memories from the highest down. Dropping the
    devices at the peak and comparing what remains is comparing these tuples lexicographically."""
    return tuple(sorted(set(memories), reverse=True))


def capture_search(
    param_bytes: Sequence[float],
    act_bytes: Sequence[float],
    devices: int,
    node_size: int,
    microbatches: int,
    schedule: str = "1f1b",
    memory: MemoryModel = MemoryModel(),
    configs: Sequence[tuple[str, int]] | None = None,
    stages: int | None = None,
    placement: str = "in_order",
    extra_in_flight: int = 0,
    seed: bool = True,
) -> CapturePlan:
    """The plan with the lowest predicted peak memory per device (module docstring).

    `param_bytes[l]`, `act_bytes[l]`: layer l's parameter bytes and the activation bytes one microbatch
    saves on one device; `devices` = nodes x `node_size`; `configs`: the allowed (parallelism, degree)
    pairs (default `default_configs(node_size)`); `stages`: fix the number of stages (e.g. to the
    pipeline axis size), else any. Raises PartitionError when no plan exists."""
    W = check_costs(param_bytes, "parameter bytes of layer")
    A = check_costs(act_bytes, "activation bytes of layer")
    n = len(W)
    if len(A) != n:
        raise PartitionError(f"{n} parameter sizes but {len(A)} activation sizes; give one of each per layer")
    if n == 0:
        raise PartitionError("no layers to partition")
    if node_size < 1 or devices < 1 or devices % node_size:
        raise PartitionError(f"{devices} devices do not make whole nodes of {node_size}; "
                             "give a device count that is a multiple of the node size")
    if microbatches < 1:
        raise PartitionError(f"microbatches = {microbatches}; use at least 1")
    if placement not in ("in_order", "any"):
        raise PartitionError(f"placement {placement!r}: use in_order or any")
    cfgs = tuple(configs) if configs is not None else default_configs(node_size)
    for par, d in cfgs:
        if par not in PARALLELISMS or d < 1 or d > node_size or (par == "none") != (d == 1):
            raise PartitionError(f"stage config ({par}, {d}) is invalid: degree 1 is ('none', 1), "
                                 f"dp/tp degrees are 2..{node_size}")
    prefix_w, prefix_a = [0.0], [0.0]
    for w, a in zip(W, A):
        prefix_w.append(prefix_w[-1] + w)
        prefix_a.append(prefix_a[-1] + a)
    G, k, m = devices, node_size, microbatches

    if schedule not in ("gpipe", "1f1b"):
        raise PartitionError(f"schedule {schedule!r} is not supported here; use gpipe or 1f1b")

    @lru_cache(maxsize=None)
    def mem(i: int, j: int, ci: int, s: int) -> float:
        """Memory of layers i:j with config ci as the s-th stage from the end (1-based): under 1F1B it
        is stage p - s of p, holding min(p - (p - s), m) = min(s, m) microbatches, whatever p is."""
        par, d = cfgs[ci]
        nf = in_flight(schedule, s, 0, m, extra_in_flight)
        return stage_memory(prefix_w[j] - prefix_w[i], prefix_a[j] - prefix_a[i], par, d, nf, memory)

    def fits(used: int, d: int) -> bool:
        if used + d > G:
            return False
        return placement == "any" or (used % k) + d <= k

    def enough_left(i: int, used: int, s: int) -> bool:
        """Can layers 0:i fill the G - used devices left (stages of >= 1 layer and <= k devices)?"""
        left = G - used
        if i == 0:
            return left == 0 and (stages is None or s == stages)
        if left == 0 or left > i * k:
            return False
        if stages is not None:
            more = stages - s  # stages still to place
            return 1 <= more <= i and more <= left <= more * k
        return True

    # ---------------------------------------------------------------- seed: the optimal peak by DP
    INF = float("inf")
    best_peak = INF
    if seed:
        @lru_cache(maxsize=None)
        def lowest_peak(j: int, s: int, used: int) -> float:
            """Lowest peak of placing layers 0:j as stages s+1, s+2, ... from the end, on G - used devices."""
            if not enough_left(j, used, s):
                return INF
            if j == 0:
                return 0.0
            out = INF
            for i in range(j - 1, -1, -1):
                for ci, (_, d) in enumerate(cfgs):
                    if not fits(used, d) or not enough_left(i, used + d, s + 1):
                        continue
                    here = mem(i, j, ci, s + 1)
                    if here >= out:
                        continue
                    out = min(out, max(here, lowest_peak(i, s + 1, used + d)))
            return out

        best_peak = lowest_peak(n, 0, 0)
        if best_peak == INF:
            raise PartitionError(_no_plan(n, G, k, stages))

    # ---------------------------------------------------------------- Algorithm 4, from the last stage back
    best: list = [None, None, None]  # key, order key, stages (in pipeline order)
    evaluated = 0
    chosen: list[StageConfig] = []  # last stage first

    def place(j: int, used: int) -> None:
        nonlocal best_peak, evaluated
        s = len(chosen)
        if j == 0:
            if used != G:
                return
            evaluated += 1
            plan = tuple(reversed(chosen))
            key = plan_key([c.memory for c in plan])
            order = tuple(c.order_key for c in plan)
            if best[0] is None or (key, order) < (best[0], best[1]):
                best[:] = [key, order, plan]
                best_peak = min(best_peak, key[0])
            return
        for i in range(j - 1, -1, -1):
            for ci, (par, d) in enumerate(cfgs):
                if not fits(used, d) or not enough_left(i, used + d, s + 1):
                    continue
                value = mem(i, j, ci, s + 1)
                if value > best_peak:  # §III-C pruning
                    continue
                if seed and lowest_peak(i, s + 1, used + d) > best_peak:
                    continue  # no way to place the rest within the best peak (exact; from the seeding DP)
                chosen.append(StageConfig(i, j, par, d, value))
                if best[0] is None or plan_key([c.memory for c in chosen]) <= best[0]:
                    place(i, used + d)
                chosen.pop()

    place(n, 0)
    if best[2] is None:
        raise PartitionError(_no_plan(n, G, k, stages))
    plan = best[2]
    return CapturePlan(plan, best[0][0], best[0], evaluated)


def _no_plan(n: int, devices: int, node_size: int, stages: int | None) -> str:
    want = f"{stages} stages" if stages is not None else "stages"
    return (f"no plan places {n} layer(s) as {want} on {devices} devices (nodes of {node_size}, degrees "
            f"up to {node_size}); allow more stage configs, change the stage count, or split the model "
            "into more layers")
