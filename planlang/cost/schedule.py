"""Event simulation of a pipeline schedule: when each stage runs each microbatch's forward and backward.

Every pipeline rank runs a fixed sequence of operations that its schedule prescribes; an operation starts
when the rank is free and its input has arrived:

    forward  F(s, j)  after F(s - 1, j)                      (the activation from the previous stage)
    backward B(s, j)  after B(s + 1, j), or after F(s, j) on the last stage   (the gradient from the next)
    weight   W(s, j)  after B(s, j), which its rank ran before it   (zero_bubble: B is then the input
                      gradient alone, 1 - WEIGHT_SHARE of the backward, and W the weight gradient, the
                      rest; on model stage 0, which has no input gradient, torch runs the whole backward
                      in W)
    whole    BW(s, j) as a backward, taking the whole of it (dualpipev's FULL_BACKWARD under a split
                      backward); the input gradient it carries is there at its end

with `s` a model stage and `j` a microbatch. Stage `s` runs on the rank planlang.plan.placement.stage_ranks
places it on (s mod p, or the V shapes' r and 2p − 1 − r), as chunk s // p of it. The sequences per rank
are planlang.plan.schedule.rank_orders. Dualpipev's overlapped forward and whole backward
(planlang.plan.schedule.overlapped, torch's OVERLAP_F_B) run as one operation: it starts once both of
their inputs have arrived, runs them in turn, and both outputs leave at its end (torch's runtime sends
after the pair). Two stages of a V on one rank (p − 1 and p on the last) hand over like any others:
the dependency rules stay, communication being free here.

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

from planlang.plan.schedule import (ScheduleError, Step, orders_made_by, overlapped,  # noqa: F401 - this API's
                                    rank_orders)
from planlang.plan.types import SPLIT_BACKWARD, stages_on, stages_per_rank

#: The weight gradient's share of a backward under a split backward (zero_bubble). A linear layer's
#: backward is two matmuls of its forward's flops, one for the input gradient and one for the weight
#: gradient; the rest of the backward (attention scores, norms, activations) is input gradient only
#: (Qi et al. 2024, §2: T_W is taken equal to T_B there; here a layer of matmuls and the rest halves).
WEIGHT_SHARE = 0.5


@dataclass(frozen=True)
class Box:
    """A simulated operation: which rank ran it and when."""

    kind: str  # "F", "B", "W" or "BW" (planlang.plan.schedule.Step)
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
        chunk = {s: c for r in range(p) for c, s in enumerate(stages_on(self.kind, p, self.chunks, r))}
        steps = (prog.step(k) for k in range(len(prog.codes)))
        return tuple(Box(st.kind, st.stage, chunk[st.stage], r, st.microbatch, start, end)
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

    @functools.cached_property
    def _last_steps(self) -> dict[int, Step]:
        # each rank's order is kept in the run order: its last operation is the last of its in the run,
        # found from the end (the run's tail holds every rank's last ones)
        out: dict[int, Step] = {}
        prog = self.program
        for k in range(len(prog.codes) - 1, -1, -1):
            if prog.rank[k] not in out:
                out[prog.rank[k]] = prog.step(k)
                if len(out) == self.ranks:
                    break
        return out

    def last_step(self, rank: int) -> Step:
        """The rank's last operation (planlang.plan.schedule's order; the runtime syncs gradients on it)."""
        return self._last_steps[rank]

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
    loop back to rank 0 waits for nothing once a chunk has as many microbatches as ranks). Zero bubble
    with the backward twice the forward and WEIGHT_SHARE 0.5 (T_F = T_B = T_W, Qi et al. 2024 §3.1:
    ZB-H1 idles (p − 1)(T_F + T_B − T_W) per rank, here over v chunks of 1/v of the stage):
    (p − 1)/(3·v·m + p − 1). zbv (v = 2) has the same, (p − 1)/(6m + p − 1), once m >= 2p − 1: torch's
    actions (ScheduleZBVZeroBubble) leave each rank idle (p − 1)·T_F of a chunk (its warm-up), where the
    authors' summary (sail-sg/zero-bubble-pipeline-parallelism, "Comparison assuming T_F=T_B=T_W") gives
    ZBV a bubble rate of 0 (tests/runtime/test_schedule_orders.py holds torch's to this one). dualpipev,
    its whole backwards taking B + W: each rank idles 2(p − 1)·T_F, (p − 1)/(3m + p − 1) for every m it
    takes (m >= 2p): DeepSeek's (PP/2 − 1)(F&B + B − 3W) for PP = 2p stages (deepseek-ai/DualPipe's
    table), its overlapped F&B run in turn (F + B), at these equal times only (with W a quarter of the
    backward torch's actions idle less than that, with W three fifths of it more). NaN for zbv with m <
    2p − 1, where its actions have no closed form here (more idle than the formula: p = 4, m = 4: 20 %
    against 11 %)."""
    v = stages_per_rank(kind, chunks)
    if kind == "zbv" and microbatches < 2 * ranks - 1:
        return float("nan")
    if kind == "dualpipev":
        return (ranks - 1) / (3 * microbatches + ranks - 1)
    if kind in SPLIT_BACKWARD:
        return (ranks - 1) / (3 * v * microbatches + ranks - 1)
    return (ranks - 1) / (v * microbatches + ranks - 1)


def simulate(kind: str, forward: list[float], backward: list[float], microbatches: int,
             chunks: int = 1) -> SimulatedSchedule:
    """Simulate `kind` for model stages with the given per-microbatch forward and backward times
    (one entry per model stage: p·v of them for a chunked schedule, p otherwise). Under a split
    backward the backward's B takes 1 - WEIGHT_SHARE of it and its W the rest."""
    stages = len(forward)
    if len(backward) != stages or stages == 0:
        raise ScheduleError("give one forward and one backward time per stage")
    v = stages_per_rank(kind, chunks)
    if stages % v:
        raise ScheduleError(f"{stages} stages cannot be split into {v} chunks per rank")
    p = stages // v
    prog = _program(kind, p, microbatches, v)
    # operation k takes times[prog.time[k]]: forwards, then backwards (B), weight gradients (W), whole (BW)
    if kind in SPLIT_BACKWARD:  # the model's first stage has no input gradient: torch runs it all in W
        times = (list(forward) + [0.0] + [b * (1 - WEIGHT_SHARE) for b in backward[1:]]
                 + [backward[0]] + [b * WEIGHT_SHARE for b in backward[1:]] + list(backward))
    else:
        times = list(forward) + list(backward)
    free = [0.0] * p
    starts: list[float] = []
    ends: list[float] = []
    if prog.gate is not None:  # dualpipev: a pair's forward waits for its backward's input too
        for r, t, d, g in zip(prog.rank, prog.time, prog.dep, prog.gate):
            start = max(free[r], ends[d] if d >= 0 else 0.0, ends[g] if g >= 0 else 0.0)
            starts.append(start)
            ends.append(start + times[t])
            free[r] = ends[-1]
        return SimulatedSchedule(kind, p, v, microbatches, prog, tuple(starts), tuple(ends))
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
    its time's index (forward of model stage s: s; backward: stages + s; weight gradient: 2·stages + s;
    whole backward: 3·stages + s) and the index of the operation it waits for (-1: none); `gate`, only
    for a schedule that overlaps (dualpipev), the index of the operation the first of a pair waits for
    besides (its backward's input). That order depends only on which operations are done, never on their
    times: one program per (kind, p, m, v) serves every simulation of those degrees. An operation is coded
    (stage · m + microbatch) · 4 + (0 forward, 1 backward, 2 weight gradient, 3 whole backward): `step(k)`
    is the k-th as a Step. Equal (and hashed) by the degrees it is made from."""

    kind: str
    ranks: int
    microbatches: int
    chunks: int
    codes: array = field(compare=False, repr=False)
    rank: array = field(compare=False, repr=False)
    time: array = field(compare=False, repr=False)
    dep: array = field(compare=False, repr=False)
    gate: array | None = field(default=None, compare=False, repr=False)

    def step(self, k: int) -> Step:
        return _step(self.codes[k], self.microbatches)


_KINDS = ("F", "B", "W", "BW")  # an operation's code & 3


def _step(code: int, m: int) -> Step:
    stage, micro = divmod(code >> 2, m)
    return Step(_KINDS[code & 3], stage, micro)


def _program(kind: str, p: int, microbatches: int, v: int) -> _Program:
    return _cached_program(kind, p, microbatches, v)


@functools.lru_cache(maxsize=8)  # an entry is p * 2m * v operations, 16 bytes each
def _cached_program(kind: str, p: int, microbatches: int, v: int) -> _Program:
    m = microbatches
    stages = p * v
    # each rank's order (planlang.plan.schedule, the one definition), coded: F(s, j) = 4(s·m + j), B(s, j) one
    # more, W(s, j) two more, BW(s, j) three more; F(s - 1, j) is then code - 4m, the next stage's input gradient
    # B(s + 1, j) base + 4m + 1 (a BW there is indexed under its B's code too), F(s, j) of a backward its base
    # and B(s, j) of a weight gradient code - 1
    orders = orders_made_by(kind, p, m, v, lambda kind_, s, j: ((s * m + j) << 2) | _KINDS.index(kind_))
    pairs = [set(ks) for ks in overlapped(kind, p, m, v)]
    last = 4 * (stages - 1) * m  # codes of the last stage's operations are >= this
    index = [-1] * (4 * stages * m)  # code -> its operation's index in the run order (-1: not run yet)
    codes, rank, time, dep = array("l"), array("l"), array("l"), array("l")
    gate = array("l") if any(pairs) else None

    def needs(c: int) -> int:
        """The code of the operation `c` waits for (-1: none)."""
        op = c & 3
        if op == 2:  # a weight gradient waits for its own stage's backward (run before it on the rank)
            return c - 1
        if op:  # a backward waits for the next stage's input gradient, or its own forward on the last
            return c - op if c >= last else c - op + 4 * m + 1
        return c - 4 * m if c >= 4 * m else -1  # a forward waits for the previous stage's forward

    def emit(c: int, r: int, d: int, g: int) -> None:
        index[c] = len(codes)
        if c & 3 == 3:
            index[c - 2] = len(codes)  # a whole backward's input gradient
        codes.append(c)
        rank.append(r)
        time.append((c >> 2) // m + stages * (c & 3))
        dep.append(index[d] if d >= 0 else -1)
        if gate is not None:
            gate.append(index[g] if g >= 0 else -1)

    nxt = [0] * p
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r in range(p):
            order, k = orders[r], nxt[r]
            paired = pairs[r]
            while k < len(order):
                c = order[k]
                op = c & 3
                if op == 2:  # (needs(c), inline: the common path)
                    d = c - 1
                elif op:
                    d = c - op if c >= last else c - op + 4 * m + 1
                else:
                    d = c - 4 * m if c >= 4 * m else -1
                if d >= 0 and index[d] < 0:
                    break
                if paired and k in paired:  # an overlapped forward and whole backward: one operation
                    c2 = order[k + 1]
                    d2 = needs(c2)
                    if d2 >= 0 and index[d2] < 0:
                        break
                    emit(c, r, d, d2)
                    emit(c2, r, d2, -1)
                    index[c] = index[c2]  # its output leaves with the backward's
                    k += 2
                    remaining -= 2
                elif gate is None and op != 3:  # (emit(c, r, d, -1), inline)
                    index[c] = len(codes)
                    codes.append(c)
                    rank.append(r)
                    time.append((c >> 2) // m + stages * op)
                    dep.append(index[d] if d >= 0 else -1)
                    k += 1
                    remaining -= 1
                else:
                    emit(c, r, d, -1)
                    k += 1
                    remaining -= 1
                progressed = True
            nxt[r] = k
        if not progressed:
            stuck = ", ".join(str(_step(orders[r][nxt[r]], m)) for r in range(p) if nxt[r] < len(orders[r]))
            raise ScheduleError(f"the {kind} schedule deadlocks: every rank waits ({stuck})")
    return _Program(kind, p, m, v, codes, rank, time, dep, gate)
