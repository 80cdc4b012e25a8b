"""Contiguous min–max partition of a layer sequence into pipeline stages, and the 1F1B in-flight rule.

`min_max_partition(costs, k)` cuts `costs` (one number per layer, in execution order) into `k` non-empty
consecutive stages so that the largest stage cost is as small as possible — recursion (2)–(3) of
sagemaker-model-parallelism App. C.4, the classic linear-partition DP. Ties are broken in two steps,
both deterministic:

1. *leximax*: among partitions with the same largest stage, the one whose stage costs, sorted from the
   largest down, are lexicographically smallest (second-largest stage as small as possible, and so on);
2. *earliest cuts*: among partitions with the same multiset of stage costs, the one whose cut points,
   read from the first, are lexicographically smallest.

Step 1 is compatible with dynamic programming: comparing sorted cost vectors lexicographically is
preserved under adding the same stage to both, so the best split of a suffix extends to the best split
of the whole (see `_merge`). The DP runs over suffixes, so step 2 falls out of reconstructing forward
and taking the first cut that still reaches the optimum. O(k·n²) table entries, each an O(k) tuple;
only stages within the optimum's bottleneck (`bottleneck`: a binary search with a greedy test) are
tried, which leaves about n² merges (k·n entries, each over the ~n/k ends within it).

Stage costs are left-to-right float sums of the layers' costs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from planlang.plan.schedule import in_flight as plan_in_flight


class PartitionError(ValueError):
    """An input a partition kernel cannot work with; the message names the cause and the fix."""


@dataclass(frozen=True)
class Partition:
    """Stage `i` holds layers `bounds[i]:bounds[i + 1]`; `costs[i]` is its cost."""

    bounds: tuple[int, ...]
    costs: tuple[float, ...]

    def __str__(self) -> str:
        cuts = " | ".join(f"{a}:{b}" for a, b in self.ranges)
        return f"{len(self.costs)} stages [{cuts}], max {self.bottleneck:g}"

    @property
    def ranges(self) -> tuple[tuple[int, int], ...]:
        return tuple(zip(self.bounds, self.bounds[1:]))

    @property
    def bottleneck(self) -> float:
        return max(self.costs)


def check_costs(costs: Sequence[float], what: str = "layer cost") -> list[float]:
    """The costs as floats; finite and >= 0, else a PartitionError naming the bad entry."""
    out = []
    for i, c in enumerate(costs):
        c = float(c)
        if not math.isfinite(c) or c < 0:
            raise PartitionError(f"{what} {i} is {c}; costs must be finite and >= 0")
        out.append(c)
    return out


def segment_costs(costs: Sequence[float]) -> list[list[float]]:
    """`seg[s][e]` = cost of layers s..e-1 (left-to-right sum), for 0 <= s < e <= n."""
    n = len(costs)
    seg = [[0.0] * (n + 1) for _ in range(n + 1)]
    for s in range(n):
        acc = 0.0
        for e in range(s + 1, n + 1):
            acc += costs[e - 1]
            seg[s][e] = acc
    return seg


def _merge(sorted_desc: tuple[float, ...], c: float) -> tuple[float, ...]:
    """Insert `c` into a descending tuple. If A <= B lexicographically (both descending, same length),
    then merge(A, c) <= merge(B, c): the first differing value keeps its place relative to c."""
    i = 0
    while i < len(sorted_desc) and sorted_desc[i] >= c:
        i += 1
    return sorted_desc[:i] + (c,) + sorted_desc[i:]


def bottleneck(seg: list[list[float]], k: int) -> float:
    """The least largest stage cost over the cuts of the n layers of `seg` (segment_costs) into k <= n
    non-empty stages: the smallest segment cost B such that greedy stages (each as long as it stays <= B)
    need at most k — greedy is optimal as a segment's cost grows with its end and shrinks with its start
    (float sums of costs >= 0 round monotonically), and a cut into fewer stages splits further within B."""
    n = len(seg) - 1

    def fits(cap: float) -> bool:
        stages, s = 0, 0
        while s < n:
            row, e = seg[s], s + 1
            if row[e] > cap:
                return False
            while e < n and row[e + 1] <= cap:
                e += 1
            stages, s = stages + 1, e
            if stages > k:
                return False
        return True

    values = sorted({seg[s][e] for s in range(n) for e in range(s + 1, n + 1)})
    lo, hi = 0, len(values) - 1  # values[hi], the whole sequence's cost, fits in one stage
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(values[mid]):
            hi = mid
        else:
            lo = mid + 1
    return values[lo]


def min_max_partition(costs: Sequence[float], k: int) -> Partition:
    """Cut `costs` into `k` non-empty consecutive stages minimising the largest stage cost (ties: leximax,
    then earliest cuts — see the module docstring)."""
    c = check_costs(costs)
    n = len(c)
    if not isinstance(k, int) or k < 1:
        raise PartitionError(f"stage count {k!r} must be an integer >= 1")
    if k > n:
        raise PartitionError(f"cannot cut {n} layer(s) into {k} non-empty stages; use at most {n} stages "
                             "or split the model into finer layers")
    seg = segment_costs(c)
    cap = bottleneck(seg, k)
    # best[j][s]: descending stage costs of the best split of layers s..n-1 into j stages, None when it is
    # impossible or its largest stage is over `cap` (the optimum's bottleneck: such a split is in no optimal
    # partition, nor wins any comparison one is in, so the table is the full DP's wherever it is read)
    best: list[list[tuple[float, ...] | None]] = [[None] * (n + 1) for _ in range(k + 1)]
    best[0][n] = ()
    for j in range(1, k + 1):
        for s in range(n - j, -1, -1):  # at least j layers remain
            top = None
            row = seg[s]
            for e in range(s + 1, n - j + 2):
                if row[e] > cap:  # stage costs only grow with e (costs >= 0)
                    break
                rest = best[j - 1][e]
                if rest is None:
                    continue
                cand = _merge(rest, row[e])
                if top is None or cand < top:
                    top = cand
            best[j][s] = top
    bounds, s = [0], 0
    for j in range(k, 0, -1):
        target = best[j][s]
        e = next(e for e in range(s + 1, n - j + 2)
                 if (prev := best[j - 1][e]) is not None and _merge(prev, seg[s][e]) == target)
        bounds.append(e)
        s = e
    return Partition(tuple(bounds), tuple(seg[a][b] for a, b in zip(bounds, bounds[1:])))


# ------------------------------------------------------------------------------ microbatches in flight
def in_flight(schedule: str, stages: int, stage: int, microbatches: int, extra: int = 0) -> int:
    """Microbatches stage `stage` of `stages` holds at once (planlang.plan.schedule.in_flight), for the
    schedules the partitioners model: gpipe and 1f1b."""
    if schedule not in ("gpipe", "1f1b"):
        raise PartitionError(f"schedule {schedule!r} is not supported here; use gpipe or 1f1b")
    try:
        return plan_in_flight(schedule, stages, stage, microbatches, extra=extra)
    except ValueError as err:
        raise PartitionError(str(err)) from None
