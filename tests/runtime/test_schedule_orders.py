"""planlang's pipeline orders (planlang.plan.schedule) against the actions torch.distributed.pipelining's
own schedules compute, and the bubble planlang predicts against a simulation of torch's actions.

torch computes every rank's actions in `_calculate_single_rank_operations` from the stage count per rank,
the pipeline size and the microbatches alone, so it is called here on a stand-in for the schedule object
(no process group); the `None` entries are its idle slots. The simulation of torch's actions below is
written on its own (a rank runs its next action once the action's input has arrived), so a difference in
either the orders or planlang's compiled simulation shows."""
from __future__ import annotations

import random
import types

import pytest
from torch.distributed.pipelining.schedules import (ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble,
                                                   ScheduleLoopedBFS, _ComputationType)

from planlang.cost.schedule import WEIGHT_SHARE, closed_form_bubble, simulate
from planlang.plan.schedule import rank_orders

TORCH = {"interleaved": ScheduleInterleaved1F1B, "looped_bfs": ScheduleLoopedBFS,
         "zero_bubble": ScheduleInterleavedZeroBubble}
#: torch's computation types as planlang's step kinds: B is the whole backward, or under zero_bubble the
#: input gradient (BACKWARD_INPUT), and W the weight gradient
KINDS = {_ComputationType.FORWARD: "F", _ComputationType.FULL_BACKWARD: "B", _ComputationType.BACKWARD_INPUT: "B",
         _ComputationType.BACKWARD_WEIGHT: "W"}
CASES = [(kind, p, m, v) for kind in sorted(TORCH)
         for p, m, v in [(2, 2, 2), (2, 4, 2), (2, 8, 3), (3, 6, 2), (4, 4, 2), (4, 8, 3), (4, 12, 2)]]
CASES += [("zero_bubble", p, m, 1) for p, m in [(2, 4), (4, 8), (3, 3)]]  # ZB-H1: one stage per rank


def torch_actions(kind: str, p: int, m: int, v: int) -> list[list[tuple[str, int, int]]]:
    """Each rank's (F|B|W, model stage, microbatch) as torch's schedule `kind` orders them."""
    rounds = max(1, m // p)
    fake = types.SimpleNamespace(_stages=[None] * v, n_local_stages=v, pp_group_size=p, _n_microbatches=m,
                                 number_of_rounds=rounds, microbatches_per_round=m // rounds)
    out = []
    for r in range(p):
        fake.rank = r
        ops = TORCH[kind]._calculate_single_rank_operations(fake, r)
        out.append([(KINDS[a.computation_type], a.stage_index, a.microbatch_index) for a in ops if a is not None])
    return out


def simulate_actions(orders, forward, backward, weight=None) -> tuple[float, float]:
    """(makespan, bubble) of running each rank's actions in order, an action starting when its rank is free
    and its input has arrived (the previous stage's forward; the next stage's backward, or the last stage's
    own forward; a weight gradient's own backward). `weight`: the weight gradients' times, when split."""
    stages, p = len(forward), len(orders)
    done: dict = {}
    free, nxt = [0.0] * p, [0] * p
    busy = [0.0] * p
    while any(nxt[r] < len(orders[r]) for r in range(p)):
        moved = False
        for r in range(p):
            while nxt[r] < len(orders[r]):
                kind, s, j = orders[r][nxt[r]]
                if kind == "W":
                    dep = ("B", s, j)
                elif kind == "F":
                    dep = ("F", s - 1, j) if s > 0 else None
                else:
                    dep = ("B", s + 1, j) if s < stages - 1 else ("F", s, j)
                if dep is not None and dep not in done:
                    break
                t = {"F": forward, "B": backward, "W": weight}[kind][s]
                start = max(free[r], done[dep] if dep is not None else 0.0)
                done[(kind, s, j)] = free[r] = start + t
                busy[r] += t
                nxt[r] += 1
                moved = True
        assert moved, "torch's actions deadlock"
    makespan = max(free)
    return makespan, 1.0 - sum(busy) / (p * makespan)


@pytest.mark.parametrize("kind,p,m,v", CASES)
def test_planlangs_order_is_torchs_action_for_action(kind, p, m, v):
    mine = [[(s.kind, s.stage, s.microbatch) for s in order] for order in rank_orders(kind, p, m, v)]
    assert mine == torch_actions(kind, p, m, v)


@pytest.mark.parametrize("kind,p,m,v", CASES)
def test_the_predicted_bubble_is_that_of_torchs_actions(kind, p, m, v):
    rng = random.Random(p * 1000 + m * 10 + v)
    forward = [rng.uniform(0.2, 2.0) for _ in range(p * v)]
    backward = [rng.uniform(0.4, 4.0) for _ in range(p * v)]
    sim = simulate(kind, forward, backward, m, chunks=v)
    makespan, bubble = simulate_actions(torch_actions(kind, p, m, v), *_times(kind, forward, backward))
    assert sim.makespan == pytest.approx(makespan, rel=1e-12)
    assert sim.bubble_ratio == pytest.approx(bubble, abs=1e-12)
    # equal chunk times: the closed form (p - 1) / (v·m + p - 1) once a chunk has a microbatch per rank
    # (zero_bubble: (p - 1) / (3·v·m + p - 1), forward, input and weight gradients taking a third each)
    if m >= p:
        even_f, even_b = [1.0 / v] * (p * v), [2.0 / v] * (p * v)
        assert simulate_actions(torch_actions(kind, p, m, v), *_times(kind, even_f, even_b))[1] == \
            pytest.approx(closed_form_bubble(kind, p, m, v), abs=1e-12)


def _times(kind, forward, backward):
    """(forward, backward, weight) times as torch's actions take them: a split backward's B and W share it,
    but on stage 0, whose BACKWARD_INPUT torch skips and whose BACKWARD_WEIGHT runs the whole backward."""
    if kind != "zero_bubble":
        return forward, backward, None
    return (forward, [0.0] + [b * (1 - WEIGHT_SHARE) for b in backward[1:]],
            [backward[0]] + [b * WEIGHT_SHARE for b in backward[1:]])
