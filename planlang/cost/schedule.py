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

from dataclasses import dataclass, field

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
    """A simulated schedule: each operation's start and end (seconds), in the order `_program` runs
    them; its `boxes` are made when first read (the step time reads only the makespan)."""

    kind: str
    ranks: int  # p
    chunks: int  # v
    microbatches: int  # m
    program: "_Program" = field(repr=False)
    starts: tuple[float, ...] = field(repr=False)
    ends: tuple[float, ...] = field(repr=False)

    @functools.cached_property
    def boxes(self) -> tuple[Box, ...]:
        """Every operation, in the order the simulation ran them."""
        prog, p = self.program, self.ranks
        return tuple(Box(st.kind, st.stage, st.stage // p, r, st.microbatch, start, end)
                     for st, r, start, end in zip(prog.steps, prog.rank, self.starts, self.ends))

    def __str__(self) -> str:
        return (f"{self.kind}: p={self.ranks}, v={self.chunks}, m={self.microbatches}, "
                f"step {self.makespan:g}, bubble {self.bubble_ratio:.1%}")

    # computed once per schedule (its boxes never change): the step time prices a pipeline's ranks by
    # them, several times each, and a schedule of 64 ranks x 512 microbatches has 65k boxes
    @functools.cached_property
    def makespan(self) -> float:
        return max(self.ends, default=0.0)

    @functools.cached_property
    def _busy(self) -> dict[int, float]:
        out: dict[int, float] = {}
        for r, start, end in zip(self.program.rank, self.starts, self.ends):
            out[r] = out.get(r, 0.0) + (end - start)
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
    prog = _program(kind, p, microbatches, v)
    times = list(forward) + list(backward)  # operation k takes times[prog.time[k]]
    free = [0.0] * p
    starts: list[float] = []
    ends: list[float] = []
    for r, t, d in zip(prog.rank, prog.time, prog.dep):
        # start = max(free[r], the dependency's end, or 0.0 without one), as max() compares
        f = free[r]
        e = ends[d] if d >= 0 else 0.0
        start = e if e > f else f
        end = start + times[t]
        starts.append(start)
        ends.append(end)
        free[r] = end
    return SimulatedSchedule(kind, p, v, microbatches, prog, tuple(starts), tuple(ends))


@dataclass(frozen=True)
class _Program:
    """The operations of a schedule in the order the simulation runs them — each rank in turn runs its
    order (planlang.plan.schedule.rank_orders) until an operation's input has not arrived — with each
    one's rank, its time's index (forward of model stage s: s; backward: stages + s) and the index of the
    operation it waits for (-1: none). That order depends only on which operations are done, never on
    their times: one program per (kind, p, m, v) serves every simulation of those degrees."""

    steps: tuple[Step, ...]
    rank: tuple[int, ...]
    time: tuple[int, ...]
    dep: tuple[int, ...]


def _program(kind: str, p: int, microbatches: int, v: int) -> _Program:
    return _cached_program(kind, p, microbatches, v)


@functools.lru_cache(maxsize=8)  # an entry is p * 2m * v operations, as rank_orders' cache holds
def _cached_program(kind: str, p: int, microbatches: int, v: int) -> _Program:
    stages = p * v
    orders = rank_orders(kind, p, microbatches, v)
    index: dict[tuple[str, int, int], int] = {}
    steps: list[Step] = []
    rank: list[int] = []
    time: list[int] = []
    dep: list[int] = []
    nxt = [0] * p
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r in range(p):
            order = orders[r]
            while nxt[r] < len(order):
                st = order[nxt[r]]
                if st.kind == "F":
                    d = ("F", st.stage - 1, st.microbatch) if st.stage > 0 else None
                else:
                    d = ("B", st.stage + 1, st.microbatch) if st.stage < stages - 1 else ("F", st.stage, st.microbatch)
                if d is not None and d not in index:
                    break
                index[(st.kind, st.stage, st.microbatch)] = len(steps)
                steps.append(st)
                rank.append(r)
                time.append(st.stage if st.kind == "F" else stages + st.stage)
                dep.append(index[d] if d is not None else -1)
                nxt[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = ", ".join(str(orders[r][nxt[r]]) for r in range(p) if nxt[r] < len(orders[r]))
            raise ScheduleError(f"the {kind} schedule deadlocks: every rank waits ({stuck})")
    return _Program(tuple(steps), tuple(rank), tuple(time), tuple(dep))
