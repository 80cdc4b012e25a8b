"""Event simulation of a pipeline schedule: when each stage runs each microbatch's forward and backward.

Every pipeline rank runs a fixed sequence of operations that its schedule prescribes; an operation starts
when the rank is free and its input has arrived:

    forward  F(s, j)  after F(s - 1, j)                      (the activation from the previous stage)
    backward B(s, j)  after B(s + 1, j), or after F(s, j) on the last stage   (the gradient from the next)

with `s` a model stage and `j` a microbatch. Stage `s` runs on rank `s mod p` (with `v` chunks per rank,
model stage `s` is chunk `s // p` of its rank, as planlang's interleaved schedule places it). The
sequences per rank are planlang.plan.schedule.rank_orders.

Communication between stages is taken as free. planlang.model.price.step_time prices a pipeline step with it;
the report draws it. For equal stage times the idle share of the step (the
bubble) is (p - 1) / (m + p - 1) for gpipe and 1f1b, and (p - 1) / (v·m + p - 1) for interleaved when
each chunk takes 1/v of a stage's time (the paper's bubble fraction (p - 1)/(v·m) of the ideal time,
expressed as a share of the whole step); tests/report/test_schedule.py checks the simulation against it.
"""
from __future__ import annotations

import functools

from dataclasses import dataclass

from planlang.plan.schedule import ScheduleError, Step, rank_orders  # noqa: F401 - part of this module's API


@dataclass(frozen=True)
class Box:
    """A simulated operation: which rank ran it and when."""

    kind: str  # "F" or "B"
    stage: int  # model stage
    chunk: int  # chunk of the rank (0 without interleaving)
    rank: int  # pipeline rank
    microbatch: int
    start: float
    end: float

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch}@stage {self.stage} [{self.start:g}, {self.end:g})"


@dataclass(frozen=True)
class SimulatedSchedule:
    kind: str
    ranks: int  # p
    chunks: int  # v
    microbatches: int  # m
    boxes: tuple[Box, ...]

    def __str__(self) -> str:
        return (f"{self.kind}: p={self.ranks}, v={self.chunks}, m={self.microbatches}, "
                f"step {self.makespan:g}, bubble {self.bubble_ratio:.1%}")

    # computed once per schedule (its boxes never change): the step time prices a pipeline's ranks by
    # them, several times each, and a schedule of 64 ranks x 512 microbatches has 65k boxes
    @functools.cached_property
    def makespan(self) -> float:
        return max((b.end for b in self.boxes), default=0.0)

    @functools.cached_property
    def _busy(self) -> dict[int, float]:
        out: dict[int, float] = {}
        for b in self.boxes:
            out[b.rank] = out.get(b.rank, 0.0) + (b.end - b.start)
        return out

    def busy(self, rank: int) -> float:
        return self._busy.get(rank, 0.0)

    @property
    def bubble_ratio(self) -> float:
        """Idle share of the step over all ranks: 1 - busy time / (ranks × step time)."""
        total = self.ranks * self.makespan
        return 0.0 if total <= 0 else 1.0 - sum(self.busy(r) for r in range(self.ranks)) / total


def closed_form_bubble(kind: str, ranks: int, microbatches: int, chunks: int = 1) -> float:
    """The bubble share of a step for equal stage times (Narayanan et al. 2021, §2.2): (p − 1)/(v·m + p − 1)
    with v = 1 for gpipe and 1f1b."""
    v = chunks if kind == "interleaved" else 1
    return (ranks - 1) / (v * microbatches + ranks - 1)


def simulate(kind: str, forward: list[float], backward: list[float], microbatches: int,
             chunks: int = 1) -> SimulatedSchedule:
    """Simulate `kind` for model stages with the given per-microbatch forward and backward times
    (one entry per model stage: p·v of them for interleaved, p otherwise)."""
    stages = len(forward)
    if len(backward) != stages or stages == 0:
        raise ScheduleError("give one forward and one backward time per stage")
    v = chunks if kind == "interleaved" else 1
    if stages % v:
        raise ScheduleError(f"{stages} stages cannot be split into {v} chunks per rank")
    p = stages // v
    orders = rank_orders(kind, p, microbatches, v)
    done: dict[tuple[str, int, int], float] = {}
    free = [0.0] * p
    nxt = [0] * p
    boxes: list[Box] = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r in range(p):
            while nxt[r] < len(orders[r]):
                st = orders[r][nxt[r]]
                if st.kind == "F":
                    dep = ("F", st.stage - 1, st.microbatch) if st.stage > 0 else None
                else:
                    dep = ("B", st.stage + 1, st.microbatch) if st.stage < stages - 1 else ("F", st.stage, st.microbatch)
                if dep is not None and dep not in done:
                    break
                start = max(free[r], done[dep] if dep is not None else 0.0)
                end = start + (forward if st.kind == "F" else backward)[st.stage]
                done[(st.kind, st.stage, st.microbatch)] = end
                free[r] = end
                boxes.append(Box(st.kind, st.stage, st.stage // p, r, st.microbatch, start, end))
                nxt[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = ", ".join(str(orders[r][nxt[r]]) for r in range(p) if nxt[r] < len(orders[r]))
            raise ScheduleError(f"the {kind} schedule deadlocks: every rank waits ({stuck})")
    return SimulatedSchedule(kind, p, v, microbatches, tuple(boxes))
