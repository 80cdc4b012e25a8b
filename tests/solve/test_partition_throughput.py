"""Alpa-style throughput stage DP (planlang.solve.throughput_stages) against enumeration of every plan:
every cut into consecutive stages x every sub-mesh per stage, using all devices, each stage within the
memory budget under the 1F1B rule indexed from the first stage (min(p − i, m), 0-based i)."""
from __future__ import annotations

import itertools
import random

import pytest

from planlang.solve.partition import PartitionError, in_flight
from planlang.solve.throughput_stages import (
    Submesh, ThroughputPlan, alpa_submeshes, pipeline_latency, throughput_stages,
)


def brute_force(times, sizes, devices, m, static, act, budget, schedule, extra, stages):
    n = len(times)
    best = None
    for p in range(1, n + 1):
        if stages is not None and p != stages:
            continue
        for cuts in itertools.combinations(range(1, n), p - 1):
            bounds = (0, *cuts, n)
            for groups in itertools.product(range(len(sizes)), repeat=p):
                if sum(sizes[g] for g in groups) != devices:
                    continue
                ok, ts = True, []
                for i, ((a, b), g) in enumerate(zip(zip(bounds, bounds[1:]), groups)):
                    ts.append(sum(times[l][g] for l in range(a, b)))
                    if budget is not None:
                        nf = in_flight(schedule, p, i, m, extra)
                        used = sum(static[l][g] for l in range(a, b)) + nf * sum(act[l][g] for l in range(a, b))
                        ok &= used <= budget
                if ok:
                    value = sum(ts) + (m - 1) * max(ts)
                    best = value if best is None else min(best, value)
    return best


def random_instance(rng: random.Random):
    n = rng.randint(1, 6)
    sizes = rng.choice([[1, 2, 4], [1, 2], [1], [1, 2, 4, 8], [2, 4]])
    devices = rng.choice([s for s in (1, 2, 3, 4, 6, 8) if s >= min(sizes)])
    base = [rng.randint(1, 20) for _ in range(n)]
    # a layer gets faster on bigger groups, with an integer overhead so the DP has real choices
    times = [[float(-(-b // s) + rng.randint(0, 3) * (s > 1)) for s in sizes] for b in base]
    static = [[float(rng.randint(0, 6) // (1 if rng.random() < 0.5 else s)) for s in sizes] for _ in range(n)]
    act = [[float(rng.randint(0, 4)) for s in sizes] for _ in range(n)]
    budget = rng.choice([None, float(rng.randint(4, 40))])
    stages = rng.choice([None, None, rng.randint(1, min(n, devices // min(sizes)))])
    return times, sizes, devices, rng.randint(1, 6), static, act, budget, rng.choice(["1f1b", "gpipe"]), \
        rng.choice([0, 0, 1]), stages


def test_matches_enumeration_of_all_plans():
    rng = random.Random(99)
    agree = feasible = 0
    for trial in range(250):
        times, sizes, devices, m, static, act, budget, schedule, extra, stages = args = random_instance(rng)
        want = brute_force(*args)
        kw = dict(static_bytes=static, act_bytes=act, budget=budget, schedule=schedule, extra_in_flight=extra,
                  stages=stages)
        if want is None:
            with pytest.raises(PartitionError):
                throughput_stages(times, sizes, devices, m, **kw)
        else:
            got = throughput_stages(times, sizes, devices, m, **kw)
            assert got.latency == want, (args, got)
            # the plan itself is valid and its latency is what it claims
            assert got.stages[0].start == 0 and got.stages[-1].stop == len(times)
            assert all(a.stop == b.start for a, b in zip(got.stages, got.stages[1:]))
            assert sum(s.mesh.size for s in got.stages) == devices
            assert stages is None or len(got.stages) == stages
            assert got.latency == pipeline_latency([s.time for s in got.stages], m)
            if budget is not None:
                assert all(s.memory <= budget for s in got.stages)
            feasible += 1
        agree += 1
    assert agree == 250 and feasible >= 150


def test_branch_and_bound_tries_few_bounds():
    rng = random.Random(5)
    times = [[float(rng.randint(50, 100)) / s for s in (1, 2, 4)] for _ in range(16)]
    plan = throughput_stages(times, [1, 2, 4], 8, 16)
    n_candidates = len({sum(times[l][g] for l in range(a, b)) for a in range(16) for b in range(a + 1, 17)
                        for g in range(3)})
    assert isinstance(plan, ThroughputPlan) and plan.bounds_tried < n_candidates


def test_more_microbatches_favour_balance():
    # with one microbatch the sum dominates (one stage on all devices); with many the bottleneck does
    times = [[8.0, 4.5, 2.5], [8.0, 4.5, 2.5], [8.0, 4.5, 2.5], [8.0, 4.5, 2.5]]
    one = throughput_stages(times, [1, 2, 4], 4, 1)
    many = throughput_stages(times, [1, 2, 4], 4, 64)
    assert len(one.stages) == 1 and one.stages[0].mesh.size == 4
    assert len(many.stages) == 4 and many.bottleneck == 8.0


def test_memory_budget_and_1f1b_rule():
    # two equal layers on two single devices: the first stage holds min(2, m) microbatches, the last 1
    times = [[1.0], [1.0]]
    plan = throughput_stages(times, [1], 2, 4, static_bytes=[[0.0], [0.0]], act_bytes=[[5.0], [5.0]],
                             budget=10.0)
    assert [s.memory for s in plan.stages] == [10.0, 5.0]
    with pytest.raises(PartitionError, match="budget"):
        throughput_stages(times, [1], 2, 4, static_bytes=[[0.0], [0.0]], act_bytes=[[5.0], [5.0]], budget=9.0)


def test_alpa_submeshes():
    assert [str(s) for s in alpa_submeshes(2, 4)] == ["1x1", "1x2", "1x4", "2x4"]
    assert [s.size for s in alpa_submeshes(1, 8)] == [1, 2, 4, 8]
    assert Submesh(2, 4).size == 8


def test_bad_shapes_are_clear_errors():
    with pytest.raises(PartitionError, match="one row per layer"):
        throughput_stages([[1.0, 2.0]], [1], 1, 1)
    with pytest.raises(PartitionError, match="gpipe or 1f1b"):
        throughput_stages([[1.0]], [1], 1, 1, schedule="interleaved")
    with pytest.raises(PartitionError, match="1..2 stages"):
        throughput_stages([[1.0], [1.0]], [1], 4, 1, stages=3)
