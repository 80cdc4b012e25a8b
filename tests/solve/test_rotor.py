"""rotor's DP (planlang.solve.rotor) against exhaustive search, every schedule replayed by `simulate`.

The brute force enumerates rotor's schedule space explicitly — every sequence the persistent recursion of
Theorem 5.1 can generate, as op lists, independent of any budget — and prices each one with the
independent simulator (time and peak), never with the DP's formulas. On the same discretised chain the
DP's makespan must equal the least simulated makespan within the budget, its smallest feasible budget
the least simulated peak. A second search over *all* valid op sequences (Dijkstra over the held values,
no persistence) bounds it from below.
"""
from __future__ import annotations

import heapq
import itertools
import math
import random
from fractions import Fraction
from functools import lru_cache

import pytest

from planlang.solve.rotor import (Chain, InfeasibleBudget, Op, discretise, group_ops, min_peak, simulate, solve,
                                  solve_chain, solve_groups, top_level_groups)


# ---------------------------------------------------------------------------------------------------------
# the schedule space, enumerated


@lru_cache(maxsize=None)
def _segment(s: int, t: int, L: int) -> tuple[tuple[Op, ...], ...]:
    """Every persistent sequence for segment (s, t) of a chain with L stages:
    (L, L) = [loss];  (s, s) = [F_all s, B s];
    (s, t) = [F_all s] + (s+1, t) + [B s]   or, for s < s' <= t,
             [F_ck s, F_n s+1, ..., F_n s'-1] + (s', t) + (s, s'-1)."""
    if s == t:
        return ((Op("loss", L),),) if s == L else ((Op("F_all", s), Op("B", s)),)
    out = [(Op("F_all", s),) + inner + (Op("B", s),) for inner in _segment(s + 1, t, L)]
    for sp in range(s + 1, t + 1):
        sweep = (Op("F_ck", s),) + tuple(Op("F_n", j) for j in range(s + 1, sp))
        for first in _segment(sp, t, L):
            for second in _segment(s, sp - 1, L):
                out.append(sweep + first + second)
    return tuple(out)


def persistent_sequences(L: int) -> tuple[tuple[Op, ...], ...]:
    return _segment(0, L, L)


def group_sets(L: int):
    """Every set of disjoint non-empty contiguous groups of stages 0..L-1."""
    def rest(i):
        if i >= L:
            yield ()
            return
        yield from rest(i + 1)  # stage i outside any group
        for b in range(i + 1, L + 1):
            for more in rest(b):
                yield ((i, b),) + more
    return list(rest(0))


# ---------------------------------------------------------------------------------------------------------
# random chains


UNITS = (0.25, 0.5, 1.0, 2.0, 4.0)  # slot sizes: powers of two, so slots * unit is exact in floating point


def random_chain(rng: random.Random, L: int) -> Chain:
    def size(lo=1.0, hi=40.0):
        return round(rng.uniform(lo, hi), 3)
    x = [size() for _ in range(L + 1)]
    xbar = [x[i + 1] + (size(0, 60) if rng.random() < 0.8 else 0.0) for i in range(L)] + [size(0, 20)]
    ftmp = [size(0, 15) if rng.random() < 0.7 else 0.0 for _ in range(L)]
    btmp = [size(0, 15) if rng.random() < 0.7 else 0.0 for _ in range(L + 1)]
    fw = [rng.uniform(0.1, 10) for _ in range(L)]
    bw = [rng.uniform(0.1, 20) for _ in range(L + 1)]
    comm = rng.random() < 0.4
    cfw = [rng.uniform(0, 5) if comm else 0.0 for _ in range(L)]
    cbw = [rng.uniform(0, 5) if comm else 0.0 for _ in range(L + 1)]
    return Chain(fw, bw, x, xbar, ftmp, btmp, cfw, cbw, recompute_comm=rng.random() < 0.7)


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


# ---------------------------------------------------------------------------------------------------------
# the simulator itself


def test_simulator_by_hand():
    c = Chain(fw=[1.0], bw=[2.0, 0.5], x=[2, 3], xbar=[5, 1], ftmp=[1], btmp=[1, 2])
    sim = simulate([Op("F_all", 0), Op("loss", 1), Op("B", 0)], c)
    # F_all 0: 2 + 5 + 1 = 8; loss: 7 + 1 + 2 + 3 = 13; B 0: (7 + 3) + 2 + 1 = 13
    assert sim.valid and sim.peak == 13 and _close(sim.makespan, 3.5)
    # checkpointing: F_ck 0 keeps a_0, makes a_1 (peak 2 + 3 + 1); the loss frees the standalone a_1
    sim = simulate([Op("F_ck", 0), Op("loss", 1), Op("F_all", 0), Op("B", 0)], c)
    # loss: (2 + 3) + 1 + 2 + 3 = 11, leaves a_0, delta_1 = 5; F_all 0: 5 + 5 + 1 = 11; B 0: 10 + 2 + 1 = 13
    assert sim.valid and sim.peak == 13 and _close(sim.makespan, 4.5)


@pytest.mark.parametrize("ops, why", [
    ([Op("B", 0)], "needs delta_1"),
    ([Op("F_all", 1)], "a_1 is not held"),
    ([Op("F_all", 0), Op("F_n", 1)], "not held on its own"),
    ([Op("F_all", 0), Op("F_ck", 0)], "already held"),
    ([Op("F_all", 0), Op("F_all", 1), Op("loss", 2), Op("B", 1)], "ends holding"),
    ([Op("F_n", 0), Op("F_all", 1), Op("loss", 2), Op("B", 1), Op("B", 0)], "needs delta_1, abar_0"),
    ([Op("F_all", 0), Op("F_all", 1), Op("loss", 1)], "the loss is index 2"),
])
def test_simulator_rejects(ops, why):
    c = Chain(fw=[1, 1], bw=[1, 1, 1], x=[1, 1, 1], xbar=[1, 1, 1], ftmp=[0, 0], btmp=[0, 0, 0])
    sim = simulate(ops, c)
    assert not sim.valid and why in sim.error


def test_enumeration_sizes_and_validity():
    # the recursion's count: f(1) = 1, f(n) = f(n-1) + sum_k f(n-k) f(k) over segment lengths n = L + 1
    assert [len(persistent_sequences(L)) for L in range(0, 6)] == [1, 2, 6, 22, 90, 394]
    c = random_chain(random.Random(5), 4)
    seqs = persistent_sequences(4)
    assert len(set(seqs)) == len(seqs)
    assert all(simulate(s, c).valid for s in seqs)


# ---------------------------------------------------------------------------------------------------------
# the DP against the brute force


def _brute(chain: Chain, L: int) -> list[tuple[float, float, tuple[Op, ...]]]:
    return [(sim.makespan, sim.peak, seq) for seq in persistent_sequences(L)
            for sim in [simulate(seq, chain)] if sim.valid]


def test_dp_matches_brute_force_on_random_chains():
    rng = random.Random(20240611)
    instances = budgets = infeasible = 0
    for _ in range(120):
        L = rng.choice((1, 2, 3, 3, 4, 4, 5, 5, 5))
        chain = random_chain(rng, L)
        unit = rng.choice(UNITS)
        # one slot size for every budget below: the same discretised chain
        cs = discretise(chain, unit)
        runs = _brute(cs, L)
        assert len(runs) == len(persistent_sequences(L))
        least = min(p for _, p, _ in runs)
        most = max(p for _, p, _ in runs)
        assert min_peak(cs) == least
        if instances % 4 == 0:  # the unrounded minimum too (a second enumeration; a quarter of the instances)
            assert _close(min_peak(chain), min(simulate(s, chain).peak for s in persistent_sequences(L)))
        candidates = sorted({least - 1, least, least + 1, most}
                            | {rng.randint(int(least), int(most)) for _ in range(2)})
        for S in candidates:
            if S < 1:
                continue
            budget = S * unit
            budgets += 1
            fits = [(t, seq) for t, p, seq in runs if p <= S]
            if not fits:
                infeasible += 1
                with pytest.raises(InfeasibleBudget) as err:
                    solve(chain, budget, S)
                assert err.value.min_slots == least
                assert err.value.minimum == least * unit
                assert _close(err.value.exact, min_peak(chain))
                again = solve(chain, err.value.minimum, slot_size=err.value.slot_size)
                assert again.peak_slots == least
                continue
            best = min(t for t, _ in fits)
            got = solve(chain, budget, S)
            assert _close(got.makespan, best), (L, S, got.makespan, best)
            on_slots = simulate(got.ops, cs)
            assert on_slots.valid and on_slots.peak == got.peak_slots <= S
            assert _close(on_slots.makespan, got.makespan)
            in_bytes = simulate(got.ops, chain)
            assert in_bytes.valid and _close(in_bytes.peak, got.peak) and in_bytes.peak <= budget + 1e-9
        instances += 1
    assert instances >= 100 and budgets >= 500 and infeasible >= 100


def test_groups_dp_matches_brute_force():
    rng = random.Random(77)
    for _ in range(40):
        L = rng.choice((1, 2, 3, 4, 5))
        chain = random_chain(rng, L)
        unit = rng.choice(UNITS)
        cs = discretise(chain, unit)
        flags = [rng.random() < 0.8 for _ in range(L)]
        plans = []
        persistent = set(persistent_sequences(L))
        for groups in group_sets(L):
            ops = group_ops(L, groups)
            if not all(flags[i] for a, b in groups for i in range(a, b)):
                continue
            assert ops in persistent  # what torch.utils.checkpoint runs is one of rotor's sequences
            assert top_level_groups(ops, L) == groups
            sim = simulate(ops, cs)
            assert sim.valid
            plans.append((sim.makespan, sim.peak, groups))
        least = min(p for _, p, _ in plans)
        for S in sorted({least - 1, least, least + 2, max(p for _, p, _ in plans)}):
            if S < 1:
                continue
            fits = [t for t, p, _ in plans if p <= S]
            if not fits:
                with pytest.raises(InfeasibleBudget) as err:
                    solve_groups(chain, S * unit, S, checkpointable=flags)
                assert err.value.min_slots == least
                continue
            got = solve_groups(chain, S * unit, S, checkpointable=flags)
            assert all(flags[i] for a, b in got.groups for i in range(a, b))
            assert _close(got.schedule.makespan, min(fits))
            sim = simulate(got.schedule.ops, cs)
            assert sim.peak == got.schedule.peak_slots <= S
            assert _close(simulate(got.schedule.ops, chain).peak, got.schedule.peak)
            # the plan-expressible optimum is never faster than rotor's
            assert got.schedule.makespan >= solve(chain, S * unit, S).makespan - 1e-9


# ---------------------------------------------------------------------------------------------------------
# a lower bound from every valid sequence (persistent or not)


def _any_sequence_optimum(c: Chain, S: float) -> float:
    """Least time of any valid op sequence whose every op stays within S (Dijkstra over held values)."""
    L = c.length
    start = frozenset({("a", 0)})
    size = {("a", i): c.x[i] for i in range(L + 1)} | {("abar", i): c.xbar[i] for i in range(L + 1)} \
        | {("d", i): c.x[i] for i in range(L + 1)}
    if c.x[0] > S:
        return math.inf
    dist = {start: 0.0}
    heap = [(0.0, 0, start)]
    tie = itertools.count(1)
    while heap:
        d, _, held = heapq.heappop(heap)
        if d > dist.get(held, math.inf):
            continue
        if held == {("d", 0)}:
            return d
        live = sum(size[k] for k in held)
        has = lambda i: ("a", i) in held or (i >= 1 and ("abar", i - 1) in held)  # noqa: E731
        moves = []
        for i in range(L):
            if has(i) and not has(i + 1) and ("abar", i) not in held and ("d", i) not in held:
                moves.append((live + c.xbar[i] + c.ftmp[i], held | {("abar", i)}, c.fw[i] + c.comm_fw[i]))
                re = c.fw[i] + (c.comm_fw[i] if c.recompute_comm else 0.0)
                moves.append((live + c.x[i + 1] + c.ftmp[i], held | {("a", i + 1)}, re))
                if ("a", i) in held:
                    moves.append((live + c.x[i + 1] + c.ftmp[i], (held - {("a", i)}) | {("a", i + 1)}, re))
            if ("d", i + 1) in held and ("abar", i) in held and has(i):
                moves.append((live + c.x[i] + c.btmp[i], (held - {("d", i + 1), ("abar", i), ("a", i)}) | {("d", i)},
                              c.bw[i] + c.comm_bw[i]))
        if has(L) and ("d", L) not in held:
            moves.append((live + c.xbar[L] + c.btmp[L] + c.x[L], (held - {("a", L)}) | {("d", L)},
                          c.bw[L] + c.comm_bw[L]))
        for peak, nxt, dt in moves:
            if peak <= S and d + dt < dist.get(nxt, math.inf):
                dist[nxt] = d + dt
                heapq.heappush(heap, (d + dt, next(tie), nxt))
    return math.inf


def test_unrestricted_search_bounds_rotor():
    rng = random.Random(3)
    strictly_better = 0
    for _ in range(30):
        L = rng.choice((2, 3, 4))
        chain = random_chain(rng, L)
        cs = discretise(chain, 1.0)
        least = int(min_peak(cs))
        for S in (least, least + 5, least + 20):
            rotor = solve(chain, float(S), S).makespan
            anyseq = _any_sequence_optimum(cs, S)
            assert anyseq <= rotor + 1e-9
            strictly_better += anyseq < rotor - 1e-9
    # persistence costs something on some instances, but rarely
    assert strictly_better <= 10


# ---------------------------------------------------------------------------------------------------------
# API, communication and errors


def test_solve_chain_lists_and_validation():
    kw = dict(fw=[1, 2], bw=[2, 3, 1], x=[4, 4, 4], xbar=[10, 10, 2], ftmp=[1, 1], btmp=[1, 1, 1])
    s = solve_chain(**kw, budget=1000, slots=1000)
    assert [str(o) for o in s.ops] == ["F_all(0)", "F_all(1)", "loss", "B(1)", "B(0)"]
    assert s.recomputed == 0 and _close(s.makespan, 9)
    with pytest.raises(ValueError, match="xbar\\[0\\] = 1 < x\\[1\\] = 4"):
        solve_chain(**(kw | {"xbar": [1, 10, 2]}), budget=100)
    with pytest.raises(ValueError, match="bw has 2 entries, expected 3"):
        solve_chain(**(kw | {"bw": [1, 1]}), budget=100)
    with pytest.raises(ValueError, match="finite number >= 0"):
        solve_chain(**(kw | {"fw": [1, -1]}), budget=100)
    with pytest.raises(ValueError, match="positive number of bytes"):
        solve_chain(**kw, budget=0)


def test_infeasible_error_names_the_minimum():
    c = Chain(fw=[1, 1], bw=[1, 1, 1], x=[10, 10, 10], xbar=[30, 30, 5], ftmp=[0, 0], btmp=[0, 0, 0])
    with pytest.raises(InfeasibleBudget) as err:
        solve(c, 20, 20)
    # every schedule holds a_0 and, at the loss, a_2 + delta_2 + the loss's 5, plus a_1 or more
    assert err.value.minimum == min(simulate(s, c).peak for s in persistent_sequences(2))
    assert "Raise the budget to at least 70 B" in str(err.value)


def _forwards(schedule, stage: int) -> int:
    return sum(op.stage == stage and op.kind.startswith("F") for op in schedule.ops)


def test_forward_communication_discourages_recomputing_a_stage():
    # three identical stages after the first; at this budget one of them must be recomputed. Without
    # communication the DP recomputes stage 2; when stage 2 communicates for 5 s in forward, recomputing
    # it would repeat that, so the DP recomputes stage 1 instead. With eq. (5) taken literally only F_all
    # pays, and communication adds the same constant to every schedule.
    base = dict(fw=[1, 1, 1, 1], bw=[1, 1, 1, 1, 1], x=[1, 8, 8, 8, 1], xbar=[8, 20, 20, 20, 1], ftmp=[0] * 4,
                btmp=[0] * 5)
    cfw = [0, 0, 5, 0]
    quiet = solve_chain(**base, budget=74, slots=74)
    loud = solve_chain(**base, comm_fw=cfw, budget=74, slots=74)
    literal = solve_chain(**base, comm_fw=cfw, budget=74, slots=74, recompute_comm=False)
    assert _forwards(quiet, 2) == 2 and _forwards(quiet, 1) == 1 and _close(quiet.makespan, 10)
    assert _forwards(loud, 2) == 1 and _forwards(loud, 1) == 2 and _close(loud.makespan, 15)
    assert _close(literal.makespan, quiet.makespan + 5)
    # one recompute of stage 2 would cost 10 + 5 + 5 with recompute_comm
    forced = solve_chain(**base, comm_fw=cfw, budget=56, slots=56)
    assert _forwards(forced, 2) == 2 and _close(forced.makespan, 21)
    for sched, literal_eq5 in ((loud, False), (literal, True), (forced, False)):
        c = Chain(base["fw"], base["bw"], base["x"], base["xbar"], base["ftmp"], base["btmp"], cfw,
                  recompute_comm=not literal_eq5)
        assert _close(simulate(sched.ops, c).makespan, sched.makespan)


def test_decreasing_budgets_trade_time_for_memory():
    rng = random.Random(11)
    chain = random_chain(rng, 12)
    unit = 1.0
    least = int(min_peak(discretise(chain, unit)))
    last_time, last_peak = 0.0, math.inf
    for S in range(400, least - 1, -17):
        s = solve(chain, S * unit, S)
        assert s.makespan >= last_time - 1e-9 and s.peak_slots <= min(S, last_peak)
        last_time, last_peak = s.makespan, s.peak_slots
        assert simulate(s.ops, chain).valid


def test_discretise_rounds_up_exactly():
    c = Chain(fw=[1], bw=[1, 1], x=[0.25, 1.0], xbar=[1.0, 0.1], ftmp=[0.26], btmp=[0, 0])
    d = discretise(c, 0.125)
    assert d.x == (2, 8) and d.xbar == (8, 1) and d.ftmp == (3,)
    assert discretise(c, Fraction(3, 7)).x == (1, 3)
    # solve rounds the same way, whether the slot size is given or is budget / slots
    for s in (solve(c, 4.0, 32), solve(c, 4.1, slot_size=0.125)):
        assert s.slots == 32 and s.slot_size == 0.125 and s.peak_slots == simulate(s.ops, d).peak
