"""The pipeline schedule simulation: bubble against the closed forms of Narayanan et al. 2021, data
dependencies, one operation at a time per rank, and start times against a longest-path reference."""
from __future__ import annotations

import itertools
import random

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planlang.cost.schedule import ScheduleError, closed_form_bubble, rank_orders, simulate

GRID = [(p, m) for p in (1, 2, 3, 4, 6) for m in (1, 2, 3, 4, 5, 8, 12)]


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize("backward", [1.0, 2.0, 3.5])
def test_equal_stage_times_give_the_closed_form_bubble(kind, backward):
    for p, m in GRID:
        sim = simulate(kind, [1.0] * p, [backward] * p, m)
        assert sim.bubble_ratio == pytest.approx((p - 1) / (m + p - 1), abs=1e-12), (kind, p, m)
        assert sim.makespan == pytest.approx((m + p - 1) * (1.0 + backward))


@pytest.mark.parametrize("backward", [1.0, 2.0])
def test_interleaved_bubble_shrinks_by_the_chunk_count(backward):
    # each of the v chunks of a rank takes 1/v of a stage's time (Narayanan et al. 2021 §2.2.2)
    for p, v, groups in itertools.product((2, 3, 4), (2, 3, 4), (1, 2, 3)):
        m = p * groups  # interleaving needs m to be a multiple of p
        stages = p * v
        sim = simulate("interleaved", [1.0 / v] * stages, [backward / v] * stages, m, chunks=v)
        assert sim.bubble_ratio == pytest.approx((p - 1) / (v * m + p - 1), abs=1e-12), (p, v, m)
        assert sim.bubble_ratio == pytest.approx(closed_form_bubble("interleaved", p, m, v))
        # and it beats 1F1B on the same p and m
        assert sim.bubble_ratio < closed_form_bubble("1f1b", p, m)


def _check_schedule(sim, forward, backward):
    S = len(forward)
    p = sim.ranks
    by_key = {(b.kind, b.stage, b.microbatch): b for b in sim.boxes}
    # every forward and backward of every stage and microbatch, exactly once, on rank stage mod p
    assert len(by_key) == len(sim.boxes) == 2 * S * sim.microbatches
    for b in sim.boxes:
        assert b.rank == b.stage % p and b.chunk == b.stage // p
        assert b.end - b.start == pytest.approx((forward if b.kind == "F" else backward)[b.stage])
    # data dependencies: forward after the previous stage's forward, backward after the next stage's
    for (kind, s, j), b in by_key.items():
        if kind == "F" and s > 0:
            assert b.start >= by_key[("F", s - 1, j)].end - 1e-12
        if kind == "B":
            prev = by_key[("B", s + 1, j)] if s < S - 1 else by_key[("F", s, j)]
            assert b.start >= prev.end - 1e-12
            assert b.start >= by_key[("F", s, j)].end - 1e-12
    # one operation at a time on each rank
    for r in range(p):
        row = sorted((b for b in sim.boxes if b.rank == r), key=lambda b: b.start)
        for a, b in zip(row, row[1:]):
            assert b.start >= a.end - 1e-12, (a, b)


def _reference_starts(kind, forward, backward, m, v):
    """Earliest start of every operation as a longest path over the graph of data dependencies and
    each rank's order (networkx topological order), independent of the simulator's event loop."""
    S = len(forward)
    p = S // v
    g = nx.DiGraph()
    for order in rank_orders(kind, p, m, v):
        keys = [(s.kind, s.stage, s.microbatch) for s in order]
        g.add_nodes_from(keys)
        g.add_edges_from(zip(keys, keys[1:]))
    for s, j in itertools.product(range(S), range(m)):
        if s > 0:
            g.add_edge(("F", s - 1, j), ("F", s, j))
        g.add_edge(("B", s + 1, j) if s < S - 1 else ("F", s, j), ("B", s, j))
    start = {}
    for n in nx.topological_sort(g):
        start[n] = max((start[q] + (forward if q[0] == "F" else backward)[q[1]] for q in g.predecessors(n)),
                       default=0.0)
    return start


times = st.floats(min_value=0.1, max_value=5.0, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(["gpipe", "1f1b", "interleaved", "looped_bfs"]), p=st.integers(1, 4), v=st.integers(2, 3),
       groups=st.integers(1, 3), data=st.data())
def test_unequal_stage_times_respect_dependencies_and_match_the_reference(kind, p, v, groups, data):
    v = v if kind in ("interleaved", "looped_bfs") else 1
    m = p * groups if kind == "interleaved" else data.draw(st.integers(1, 9))
    S = p * v
    forward = data.draw(st.lists(times, min_size=S, max_size=S))
    backward = data.draw(st.lists(times, min_size=S, max_size=S))
    sim = simulate(kind, forward, backward, m, chunks=v)
    _check_schedule(sim, forward, backward)
    ref = _reference_starts(kind, forward, backward, m, v)
    for b in sim.boxes:
        assert b.start == pytest.approx(ref[(b.kind, b.stage, b.microbatch)])
    # a share of the whole step
    assert 0.0 <= sim.bubble_ratio < 1.0


def _max_in_flight(sim, stage):
    """Most microbatches whose activations `stage` holds at once: from the start of its forward to the
    end of its backward (an end at the same instant as a start frees first)."""
    events = sorted([(b.start, 1) for b in sim.boxes if b.stage == stage and b.kind == "F"]
                    + [(b.end, -1) for b in sim.boxes if b.stage == stage and b.kind == "B"])
    live = most = 0
    for _, d in events:
        live += d
        most = max(most, live)
    return most


@pytest.mark.parametrize("p,m", [(2, 8), (4, 8), (4, 3), (3, 12)])
def test_1f1b_holds_at_most_p_minus_i_microbatches_and_gpipe_all(p, m):
    one = simulate("1f1b", [1.0] * p, [2.0] * p, m)
    gpipe = simulate("gpipe", [1.0] * p, [2.0] * p, m)
    for i in range(p):
        assert _max_in_flight(one, i) == min(p - i, m)
        assert _max_in_flight(gpipe, i) == m


def test_bad_schedules_are_refused():
    with pytest.raises(ScheduleError, match="multiple of the pipeline ranks"):
        simulate("interleaved", [1.0] * 4, [2.0] * 4, 3, chunks=2)
    with pytest.raises(ScheduleError, match="unknown schedule"):
        simulate("zigzag", [1.0] * 2, [2.0] * 2, 4)
    with pytest.raises(ScheduleError, match="one forward and one backward"):
        simulate("1f1b", [1.0] * 2, [2.0] * 3, 4)


def _reference(kind, forward, backward, m, v=1):
    """The simulation as it was written before its order was compiled once (planlang.cost.schedule.
    _program): each rank in turn runs its order until an input has not arrived; (box tuples, makespan)."""
    stages = len(forward)
    p = stages // v
    orders = rank_orders(kind, p, m, v)
    done, free, nxt, boxes = {}, [0.0] * p, [0] * p, []
    remaining = sum(len(o) for o in orders)
    while remaining:
        for r in range(p):
            while nxt[r] < len(orders[r]):
                s = orders[r][nxt[r]]
                if s.kind == "F":
                    dep = ("F", s.stage - 1, s.microbatch) if s.stage > 0 else None
                else:
                    dep = ("B", s.stage + 1, s.microbatch) if s.stage < stages - 1 else ("F", s.stage, s.microbatch)
                if dep is not None and dep not in done:
                    break
                start = max(free[r], done[dep] if dep is not None else 0.0)
                end = start + (forward if s.kind == "F" else backward)[s.stage]
                done[(s.kind, s.stage, s.microbatch)] = free[r] = end
                boxes.append((s.kind, s.stage, s.stage // p, r, s.microbatch, start, end))
                nxt[r] += 1
                remaining -= 1
    return boxes, max((b[6] for b in boxes), default=0.0)


@pytest.mark.parametrize("kind,p,v,m", [("gpipe", 3, 1, 5), ("1f1b", 4, 1, 7), ("1f1b", 1, 1, 3),
                                        ("interleaved", 2, 3, 4), ("interleaved", 3, 2, 6),
                                        ("looped_bfs", 2, 3, 4), ("looped_bfs", 3, 2, 5)])
def test_the_compiled_simulation_gives_the_reference_s_floats_exactly(kind, p, v, m):
    rng = random.Random(p * 100 + v * 10 + m)
    fwd = [rng.uniform(0.1, 3.0) for _ in range(p * v)]
    bwd = [rng.uniform(0.1, 6.0) for _ in range(p * v)]
    sim = simulate(kind, fwd, bwd, m, v)
    boxes, makespan = _reference(kind, fwd, bwd, m, v)
    assert [(b.kind, b.stage, b.chunk, b.rank, b.microbatch, b.start, b.end) for b in sim.boxes] == boxes
    assert sim.makespan == makespan  # the same floats: the step times the solver compares
    busy = {}
    for b in boxes:
        busy[b[3]] = busy.get(b[3], 0.0) + (b[6] - b[5])
    assert [sim.busy(r) for r in range(p)] == [busy[r] for r in range(p)]
