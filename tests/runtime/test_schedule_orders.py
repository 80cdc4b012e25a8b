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
from torch.distributed.pipelining.schedules import (ScheduleDualPipeV, ScheduleInterleaved1F1B,
                                                   ScheduleInterleavedZeroBubble, ScheduleLoopedBFS,
                                                   ScheduleZBVZeroBubble, _ComputationType)

from planlang.cost.schedule import WEIGHT_SHARE, closed_form_bubble, simulate
from planlang.plan.schedule import overlapped, rank_orders
from planlang.plan.types import SPLIT_BACKWARD, V_SHAPED

TORCH = {"interleaved": ScheduleInterleaved1F1B, "looped_bfs": ScheduleLoopedBFS,
         "zero_bubble": ScheduleInterleavedZeroBubble, "zbv": ScheduleZBVZeroBubble, "dualpipev": ScheduleDualPipeV}
#: torch's computation types as planlang's step kinds: B is the whole backward, or under a split backward
#: (SPLIT_BACKWARD) the input gradient (BACKWARD_INPUT), W the weight gradient and BW a whole backward
#: (dualpipev's FULL_BACKWARD)
KINDS = {_ComputationType.FORWARD: "F", _ComputationType.FULL_BACKWARD: "B", _ComputationType.BACKWARD_INPUT: "B",
         _ComputationType.BACKWARD_WEIGHT: "W"}
CASES = [(kind, p, m, v) for kind in ("interleaved", "looped_bfs", "zero_bubble")
         for p, m, v in [(2, 2, 2), (2, 4, 2), (2, 8, 3), (3, 6, 2), (4, 4, 2), (4, 8, 3), (4, 12, 2)]]
CASES += [("zero_bubble", p, m, 1) for p, m in [(2, 4), (4, 8), (3, 3)]]  # ZB-H1: one stage per rank
# the V shapes: two stages per rank; zbv takes any microbatches (torch fills up to 2p - 1 and leaves the
# rest out), dualpipev at least 2p
CASES += [("zbv", p, m, 2) for p, m in [(1, 1), (1, 3), (2, 2), (2, 3), (2, 4), (2, 8), (3, 3), (3, 5), (3, 9),
                                        (4, 4), (4, 8), (4, 13), (5, 16)]]
CASES += [("dualpipev", p, m, 2) for p, m in [(1, 2), (1, 5), (2, 4), (2, 5), (2, 8), (3, 6), (3, 9), (4, 8),
                                              (4, 11), (4, 16), (5, 12)]]


def torch_actions(kind: str, p: int, m: int, v: int) -> list[list]:
    """Each rank's (F|B|W|BW, model stage, microbatch) as torch's schedule `kind` orders them; an
    overlapped forward and backward (dualpipev's OVERLAP_F_B) is a tuple of its two."""
    rounds = max(1, m // p)
    fake = types.SimpleNamespace(_stages=[None] * v, n_local_stages=v, pp_group_size=p, _n_microbatches=m,
                                 number_of_rounds=rounds, microbatches_per_round=m // rounds, num_stages=p * v)

    def step(a) -> tuple:
        if a.sub_actions is not None:
            return tuple(step(sub) for sub in a.sub_actions)
        whole = a.computation_type == _ComputationType.FULL_BACKWARD and kind in SPLIT_BACKWARD
        return ("BW" if whole else KINDS[a.computation_type], a.stage_index, a.microbatch_index)

    out = []
    for r in range(p):
        fake.rank = r
        ops = TORCH[kind]._calculate_single_rank_operations(fake, r)
        out.append([step(a) for a in ops if a is not None])
    return out


def flat(orders) -> list[list[tuple[str, int, int]]]:
    return [[sub for a in order for sub in (a if isinstance(a[0], tuple) else (a,))] for order in orders]


def simulate_actions(orders, forward, backward, weight=None) -> tuple[float, float]:
    """(makespan, bubble) of running each rank's actions in order, an action starting when its rank is free
    and its input has arrived (the previous stage's forward; the next stage's backward, or the last stage's
    own forward; a weight gradient's own backward). `weight`: the weight gradients' times, when split (a
    whole backward BW then takes backward + weight). An overlapped pair starts once both of its inputs have
    arrived, runs its two in turn and hands both outputs on at its end (torch's runtime sends after it)."""
    stages, p = len(forward), len(orders)
    done: dict = {}
    free, nxt = [0.0] * p, [0] * p
    busy = [0.0] * p

    def dep(kind, s, j):
        if kind == "W":
            return ("B", s, j)
        if kind == "F":
            return ("F", s - 1, j) if s > 0 else None
        return ("B", s + 1, j) if s < stages - 1 else ("F", s, j)

    def took(kind, s):
        return {"F": forward, "B": backward, "W": weight}[kind][s] if kind != "BW" else backward[s] + weight[s]

    while any(nxt[r] < len(orders[r]) for r in range(p)):
        progressed = False
        for r in range(p):
            while nxt[r] < len(orders[r]):
                action = orders[r][nxt[r]]
                subs = action if isinstance(action[0], tuple) else (action,)
                deps = [dep(*sub) for sub in subs]
                deps = [d for d in deps if d is not None and d not in subs]
                if any(d not in done for d in deps):
                    break
                t = sum(took(kind, s) for kind, s, _ in subs)
                start = max([free[r]] + [done[d] for d in deps])
                free[r] = start + t
                for kind, s, j in subs:  # a whole backward's input gradient is there at its end
                    done[(kind, s, j)] = free[r]
                    if kind == "BW":
                        done[("B", s, j)] = free[r]
                busy[r] += t
                nxt[r] += 1
                progressed = True
        assert progressed, "torch's actions deadlock"
    makespan = max(free)
    return makespan, 1.0 - sum(busy) / (p * makespan)


@pytest.mark.parametrize("kind,p,m,v", CASES)
def test_planlangs_order_is_torchs_action_for_action(kind, p, m, v):
    mine = [[(s.kind, s.stage, s.microbatch) for s in order] for order in rank_orders(kind, p, m, v)]
    theirs = torch_actions(kind, p, m, v)
    assert mine == flat(theirs)
    # dualpipev: planlang's overlapped pairs are torch's OVERLAP_F_B, in the same places
    pairs = [tuple(k for k, a in enumerate(order) if isinstance(a[0], tuple)) for order in theirs]
    assert [tuple(k - i for i, k in enumerate(ks)) for ks in overlapped(kind, p, m, v)] == pairs


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
    # (zero_bubble: (p - 1) / (3·v·m + p - 1), forward, input and weight gradients taking a third each;
    # zbv the same with v = 2 once m >= 2p - 1, dualpipev (p - 1) / (3m + p - 1))
    if m >= (2 * p - 1 if kind in V_SHAPED else p):
        even_f, even_b = [1.0 / v] * (p * v), [2.0 / v] * (p * v)
        assert simulate_actions(torch_actions(kind, p, m, v), *_times(kind, even_f, even_b))[1] == \
            pytest.approx(closed_form_bubble(kind, p, m, v), abs=1e-12)


def _times(kind, forward, backward):
    """(forward, backward, weight) times as torch's actions take them: a split backward's B and W share it,
    but on stage 0, whose BACKWARD_INPUT torch skips and whose BACKWARD_WEIGHT runs the whole backward."""
    if kind not in SPLIT_BACKWARD:
        return forward, backward, None
    return (forward, [0.0] + [b * (1 - WEIGHT_SHARE) for b in backward[1:]],
            [backward[0]] + [b * WEIGHT_SHARE for b in backward[1:]])
