"""CAPTURE's memory-centric search (planlang.solve.capture) against enumeration of every plan.

The reference enumerates, independently of the kernel: every cut of the layers into consecutive
groups, every stage config per group, the placement rule checked by filling nodes from device 0 in
pipeline order (or only the device count, for placement "any"), the 1F1B rule indexed from the first
stage, and the §III-C comparison (distinct per-device memories from the highest down, then the
stage tuples)."""
from __future__ import annotations

import itertools
import random

import pytest

from planlang.solve.capture import (
    CapturePlan, MemoryModel, capture_search, default_configs, plan_key, stage_memory,
)
from planlang.solve.partition import PartitionError, in_flight

PAR_ORDER = {"none": 0, "dp": 1, "tp": 2}


def compositions(n: int):
    for p in range(1, n + 1):
        for cuts in itertools.combinations(range(1, n), p - 1):
            yield (0, *cuts, n)


def placeable(degrees, devices, node, placement) -> bool:
    if sum(degrees) != devices:
        return False
    if placement == "any":
        return all(d <= node for d in degrees)
    offset = 0
    for d in degrees:  # fill nodes from the first device, in pipeline order; no stage spans two nodes
        if offset // node != (offset + d - 1) // node:
            return False
        offset += d
    return True


def brute_force(W, A, devices, node, m, schedule, model, configs, stages, placement, extra):
    best = None
    for bounds in compositions(len(W)):
        p = len(bounds) - 1
        if stages is not None and p != stages:
            continue
        for combo in itertools.product(configs, repeat=p):
            if not placeable([d for _, d in combo], devices, node, placement):
                continue
            mems = []
            for i, ((a, b), (par, d)) in enumerate(zip(zip(bounds, bounds[1:]), combo)):
                nf = in_flight(schedule, p, i, m, extra)
                mems.append(stage_memory(sum(W[a:b]), sum(A[a:b]), par, d, nf, model))
            key = plan_key([x for x, (_, d) in zip(mems, combo) for _ in range(d)])
            order = tuple((a, b, PAR_ORDER[par], d) for (a, b), (par, d) in zip(zip(bounds, bounds[1:]), combo))
            if best is None or (key, order) < best[:2]:
                best = (key, order)
    return best


def random_instance(rng: random.Random):
    n = rng.randint(1, 6)
    node = rng.choice([1, 2, 4])
    nodes = rng.choice([1, 1, 2]) if node < 4 else 1
    devices = node * nodes
    # small integer ranges: many exact ties, which exercise the tie-break
    W = [float(rng.choice([0, 1, 2, 4, 8])) for _ in range(n)]
    A = [float(rng.choice([1, 2, 4, 8, 16])) for _ in range(n)]
    m = rng.randint(1, 6)
    schedule = rng.choice(["1f1b", "gpipe"])
    model = MemoryModel(grad=1.0, optimizer=rng.choice([0.0, 2.0]), ddp_buffer=rng.choice([0.0, 1.0]))
    stages = rng.choice([None, None, rng.randint(1, n)])
    placement = rng.choice(["in_order", "any"])
    extra = rng.choice([0, 0, 1])
    return W, A, devices, node, m, schedule, model, default_configs(node), stages, placement, extra


def test_matches_enumeration_of_all_plans():
    rng = random.Random(2024)
    agree = feasible = 0
    for trial in range(220):
        args = random_instance(rng)
        W, A, devices, node, m, schedule, model, configs, stages, placement, extra = args
        want = brute_force(*args)
        for seed in (True, False):
            kw = dict(schedule=schedule, memory=model, configs=configs, stages=stages, placement=placement,
                      extra_in_flight=extra, seed=seed)
            if want is None:
                with pytest.raises(PartitionError, match="no plan"):
                    capture_search(W, A, devices, node, m, **kw)
                continue
            got = capture_search(W, A, devices, node, m, **kw)
            assert got.key == want[0], (args, got)
            assert tuple(s.order_key for s in got.stages) == want[1], (args, got)
            assert got.peak == max(got.device_memory) == want[0][0]
        feasible += want is not None
        agree += 1
    assert agree == 220 and feasible >= 150


def test_pruning_skips_plans():
    W = [4.0, 1.0, 1.0, 4.0, 2.0, 2.0, 1.0]
    A = [1.0, 8.0, 8.0, 2.0, 4.0, 1.0, 16.0]
    seeded = capture_search(W, A, 4, 4, 4, seed=True)
    plain = capture_search(W, A, 4, 4, 4, seed=False)
    assert seeded.stages == plain.stages and seeded.plans_evaluated <= plain.plans_evaluated
    total = sum(1 for b in compositions(7) for c in itertools.product(default_configs(4), repeat=len(b) - 1)
                if placeable([d for _, d in c], 4, 4, "in_order"))
    assert plain.plans_evaluated < total  # the §III-C pruning removed plans


def test_tensor_parallel_wins_for_weight_heavy_layers():
    # one huge layer: splitting its weights (tp) beats replicating them (dp) or a pipeline of 1 device
    plan = capture_search([100.0], [1.0], 4, 4, 2)
    assert [(s.parallelism, s.degree) for s in plan.stages] == [("tp", 4)]
    assert isinstance(plan, CapturePlan) and "tp4" in str(plan)


def test_activation_heavy_first_stage_gets_more_devices_under_1f1b():
    # equal layers; stage 0 holds the most microbatches in flight, so it should not be the smallest
    plan = capture_search([1.0] * 4, [10.0] * 4, 4, 4, 8, stages=3)
    first, last = plan.stages[0], plan.stages[-1]
    assert first.memory <= plan.peak and first.degree >= last.degree


@pytest.mark.parametrize("kwargs,word", [
    (dict(devices=6, node_size=4), "whole nodes"),
    (dict(devices=4, node_size=4, configs=[("dp", 8)]), "invalid"),
    (dict(devices=4, node_size=4, schedule="interleaved"), "gpipe or 1f1b"),
    (dict(devices=4, node_size=1, stages=4), "no plan"),
])
def test_bad_input_is_a_clear_error(kwargs, word):
    with pytest.raises(PartitionError, match=word):
        capture_search([1.0, 1.0], [1.0, 1.0], microbatches=2, **kwargs)
