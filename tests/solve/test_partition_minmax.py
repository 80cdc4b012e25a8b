"""Min–max contiguous partition (planlang.solve.partition) against enumeration of every partition."""
from __future__ import annotations

import itertools
import random

import pytest

from planlang.solve.partition import Partition, PartitionError, bottleneck, in_flight, min_max_partition, segment_costs


def all_partitions(n: int, k: int):
    """Every cut of n layers into k non-empty consecutive stages, as bounds tuples."""
    for cuts in itertools.combinations(range(1, n), k - 1):
        yield (0, *cuts, n)


def brute_force(costs: list[float], k: int) -> tuple[int, ...]:
    """The documented rule by enumeration: min of the largest stage, then leximax, then earliest cuts."""
    def key(bounds):
        stage = [sum(costs[a:b]) for a, b in zip(bounds, bounds[1:])]
        return (sorted(stage, reverse=True), bounds)
    return min(all_partitions(len(costs), k), key=key)


def test_matches_enumeration_on_random_integer_costs():
    rng = random.Random(7)
    agree = 0
    for trial in range(300):
        n = rng.randint(1, 9)
        k = rng.randint(1, n)
        hi = rng.choice([3, 10, 1000])  # small ranges make many ties, which exercise the tie rule
        costs = [float(rng.randint(0, hi)) for _ in range(n)]
        got = min_max_partition(costs, k)
        want = brute_force(costs, k)
        assert got.bounds == want, (costs, k, got, want)
        assert got.costs == tuple(sum(costs[a:b]) for a, b in zip(want, want[1:]))
        agree += 1
    assert agree == 300


def test_optimum_on_random_float_costs():
    rng = random.Random(11)
    for trial in range(100):
        n = rng.randint(2, 9)
        k = rng.randint(1, n)
        costs = [rng.lognormvariate(0, 1.5) for _ in range(n)]
        got = min_max_partition(costs, k)
        best = min(max(sum(costs[a:b]) for a, b in zip(bd, bd[1:])) for bd in all_partitions(n, k))
        assert got.bottleneck == pytest.approx(best, rel=1e-12)
        assert got.bounds[0] == 0 and got.bounds[-1] == n and len(got.costs) == k
        assert all(a < b for a, b in got.ranges)


def test_bottleneck_is_the_least_largest_stage_exactly():
    """The bound the DP prunes by (the greedy test's binary search) equals, as a float, the least largest
    stage over every cut, with the stage costs summed as the DP sums them (zeros and ties included)."""
    rng = random.Random(5)
    for trial in range(300):
        n = rng.randint(1, 9)
        k = rng.randint(1, n)
        costs = [rng.choice([0.0, 0.1, 0.2, 0.3, 1.0, rng.random()]) for _ in range(n)]
        seg = segment_costs(costs)
        want = min(max(seg[a][b] for a, b in zip(bd, bd[1:])) for bd in all_partitions(n, k))
        assert bottleneck(seg, k) == want, (costs, k)
        assert min_max_partition(costs, k).bottleneck == want


def test_known_case_and_str():
    p = min_max_partition([1, 2, 3, 4, 5, 6, 7, 8, 9], 3)
    assert p.bounds == (0, 5, 7, 9) and p.costs == (15, 13, 17)
    assert str(p) == "3 stages [0:5 | 5:7 | 7:9], max 17"
    assert isinstance(p, Partition)


def test_tie_rules():
    # leximax: max 4 either way, then {4, 3, 1} beats {4, 4, 0}
    assert sorted(min_max_partition([4, 0, 3, 1], 3).costs) == [1, 3, 4]
    # three partitions with the same multiset {2, 1, 1}: the earliest cuts win
    assert min_max_partition([1, 1, 1, 1], 3).bounds == (0, 1, 2, 4)
    # zero-cost layers go to the earliest stage that keeps the optimum
    assert min_max_partition([0, 5, 0, 5, 0], 2).bounds == (0, 2, 5)


@pytest.mark.parametrize("costs,k,word", [([1, 2], 3, "non-empty"), ([1, -1], 1, "finite"),
                                          ([1, float("nan")], 1, "finite"), ([1], 0, ">= 1")])
def test_bad_input_is_a_clear_error(costs, k, word):
    with pytest.raises(PartitionError, match=word):
        min_max_partition(costs, k)


def test_in_flight_rule():
    # 1F1B, 0-based stage i of p holds min(p - i, m): the first stage p, the last 1
    assert [in_flight("1f1b", 4, i, 8) for i in range(4)] == [4, 3, 2, 1]
    assert [in_flight("1f1b", 4, i, 2) for i in range(4)] == [2, 2, 2, 1]
    assert [in_flight("1f1b", 4, i, 8, extra=1) for i in range(4)] == [5, 4, 3, 2]
    assert [in_flight("gpipe", 4, i, 8) for i in range(4)] == [8] * 4
    with pytest.raises(PartitionError, match="gpipe or 1f1b"):
        in_flight("interleaved", 4, 0, 8)


def test_kernels_are_plain_data_without_torch():
    import subprocess
    import sys

    code = ("import sys, planlang.solve.partition, planlang.solve.capture, planlang.solve.tree_partition, "
            "planlang.solve.throughput_stages; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
