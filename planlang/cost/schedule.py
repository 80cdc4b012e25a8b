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
from array import array

from dataclasses import dataclass, field

from planlang.plan.schedule import ScheduleError, Step, orders_made_by, rank_orders  # noqa: F401 - part of this module's API
from planlang.plan.types import stages_per_rank


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
        steps = (prog.step(k) for k in range(len(prog.codes)))
        return tuple(Box(st.kind, st.stage, st.stage // p, r, st.microbatch, start, end)
                     for st, r, start, end in zip(steps, prog.rank, self.starts, self.ends))

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

    @functools.cached_property
    def _ends(self) -> dict[int, float]:
        out: dict[int, float] = {}
        for r, end in zip(self.program.rank, self.ends):
            if end > out.get(r, 0.0):
                out[r] = end
        return out

    def rank_end(self, rank: int) -> float:
        """When the rank's last operation (its last backward) ends."""
        return self._ends.get(rank, 0.0)

    def busy(self, rank: int) -> float:
        return self._busy.get(rank, 0.0)

    @property
    def bubble_ratio(self) -> float:
        """Idle share of the step over all ranks: 1 - busy time / (ranks × step time)."""
        total = self.ranks * self.makespan
        return 0.0 if total <= 0 else 1.0 - sum(self.busy(r) for r in range(self.ranks)) / total


def closed_form_bubble(kind: str, ranks: int, microbatches: int, chunks: int = 1) -> float:
    """The bubble share of a step for equal stage times (Narayanan et al. 2021, §2.2): (p − 1)/(v·m + p − 1)
    with v = 1 for gpipe and 1f1b. Looped BFS has interleaved's when m >= p (Lamy-Poirier 2023, §3: the
    loop back to rank 0 waits for nothing once a chunk has as many microbatches as ranks)."""
    v = stages_per_rank(kind, chunks)
    return (ranks - 1) / (v * microbatches + ranks - 1)


def simulate(kind: str, forward: list[float], backward: list[float], microbatches: int,
             chunks: int = 1) -> SimulatedSchedule:
    """Simulate `kind` for model stages with the given per-microbatch forward and backward times
    (one entry per model stage: p·v of them for a chunked schedule, p otherwise)."""
    stages = len(forward)
    if len(backward) != stages or stages == 0:
        raise ScheduleError("give one forward and one backward time per stage")
    v = stages_per_rank(kind, chunks)
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
    order (planlang.plan.schedule's) until an operation's input has not arrived — with each one's rank,
    its time's index (forward of model stage s: s; backward: stages + s) and the index of the operation
    it waits for (-1: none). That order depends only on which operations are done, never on their times:
    one program per (kind, p, m, v) serves every simulation of those degrees. An operation is coded
    ((stage · m + microbatch) · 2 + 1 for a backward): `step(k)` is the k-th as a Step. Equal (and
    hashed) by the degrees it is made from."""

    kind: str
    ranks: int
    microbatches: int
    chunks: int
    codes: array = field(compare=False, repr=False)
    rank: array = field(compare=False, repr=False)
    time: array = field(compare=False, repr=False)
    dep: array = field(compare=False, repr=False)

    def step(self, k: int) -> Step:
        return _step(self.codes[k], self.microbatches)


def _step(code: int, m: int) -> Step:
    stage, micro = divmod(code >> 1, m)
    return Step("B" if code & 1 else "F", stage, micro)


def _program(kind: str, p: int, microbatches: int, v: int) -> _Program:
    return _cached_program(kind, p, microbatches, v)


@functools.lru_cache(maxsize=8)  # an entry is p * 2m * v operations, 16 bytes each
def _cached_program(kind: str, p: int, microbatches: int, v: int) -> _Program:
    m = microbatches
    stages = p * v
    # each rank's order (planlang.plan.schedule, the one definition), coded: F(s, j) = 2(s·m + j), B(s, j) one more;
    # F(s - 1, j) is then code - 2m, B(s + 1, j) code + 2m, F(s, j) of a backward code - 1
    orders = orders_made_by(kind, p, m, v, lambda kind_, s, j: ((s * m + j) << 1) | (kind_ == "B"))
    last = 2 * (stages - 1) * m  # codes of the last stage's operations are >= this
    index = [-1] * (2 * stages * m)  # code -> its operation's index in the run order (-1: not run yet)
    codes, rank, time, dep = array("l"), array("l"), array("l"), array("l")
    nxt = [0] * p
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r in range(p):
            order, k = orders[r], nxt[r]
            while k < len(order):
                c = order[k]
                if c & 1:  # a backward waits for the next stage's backward, or its own forward on the last
                    d = c - 1 if c >= last else c + 2 * m
                else:  # a forward waits for the previous stage's forward
                    d = c - 2 * m if c >= 2 * m else -1
                if d >= 0 and index[d] < 0:
                    break
                index[c] = len(codes)
                codes.append(c)
                rank.append(r)
                time.append((c >> 1) // m + (stages if c & 1 else 0))
                dep.append(index[d] if d >= 0 else -1)
                k += 1
                remaining -= 1
                progressed = True
            nxt[r] = k
        if not progressed:
            stuck = ", ".join(str(_step(orders[r][nxt[r]], m)) for r in range(p) if nxt[r] < len(orders[r]))
            raise ScheduleError(f"the {kind} schedule deadlocks: every rank waits ({stuck})")
    return _Program(kind, p, m, v, codes, rank, time, dep)
