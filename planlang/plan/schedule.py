"""Pipeline schedules, defined once: the order of forwards and backwards each pipeline rank runs, how many
microbatches' activations a stage holds at its peak, and the activation peak of each pipeline rank, for
the estimator, the report's schedule simulation and the stage partitioners of the solver.

The orders per rank (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM", §2.2), with p ranks, m microbatches and v chunks per rank:

    gpipe        all m forwards, then all m backwards
    1f1b         min(p - r - 1, m) warm-up forwards, then one forward / one backward, then the remaining
                 backwards (PipeDream-Flush)
    interleaved  1F1B over v chunks per rank (§2.2.2): forwards go through the chunks in groups of p
                 microbatches (chunk 0 for microbatches 0..p-1, chunk 1 for the same, ..., then the next
                 group), backwards through the chunks in reverse; (p - r - 1)·2 + (v - 1)·p warm-up
                 forwards. Model stage s is chunk s // p of rank s mod p (planlang.plan.placement). This is the order of
                 torch.distributed.pipelining's ScheduleInterleaved1F1B.
    looped_bfs   Breadth-first pipeline parallelism (Lamy-Poirier 2023, "Breadth-First Pipeline
                 Parallelism", arXiv:2211.05953) over v chunks per rank, placed as interleaved: each chunk
                 runs the forwards of all m microbatches before the next chunk starts, then the chunks'
                 backwards in reverse, microbatches last to first. Every stage holds all m microbatches
                 at its peak (GPipe's memory, the interleaved bubble). The order of torch's
                 ScheduleLoopedBFS (tests/runtime/test_schedule_orders.py compares planlang's orders
                 with torch's action by action, interleaved's too).
    zero_bubble  Zero bubble pipeline parallelism (Qi et al. 2024, "Zero Bubble Pipeline Parallelism",
                 ICLR; arXiv:2401.10241, §3, ZB-H1) over v chunks per rank, placed as interleaved: a
                 backward splits into the input gradient B, which the previous stage waits for, and the
                 weight gradient W, which nothing waits for and which fills the bubbles. Interleaved's
                 chunk groups of p microbatches, (v - 1)·p + p - r - 1 warm-up forwards, then one forward
                 and one B in turn; rank r holds its first r weight gradients back and runs one W after
                 each later B, the rest at the end. A stage keeps a microbatch's activations until its W.
                 The order of torch's ScheduleInterleavedZeroBubble.
    zbv          ZB-V (Qi et al. 2024, §6): exactly two model stages per rank in a V (planlang.plan.placement:
                 rank r holds stages a = r and b = 2p − 1 − r), the backward split as zero_bubble's. Rank r
                 runs 2(p − r) − 1 forwards of a, r pairs F(b) F(a), p − r of F(b) B(b) W(b), then F(a) B(a)
                 W(a) F(b) B(b) W(b) until a's forwards are done, r pairs B(a) B(b), p − r of B(a) W(a), and
                 the held-back weight gradients, b's first. Torch fills up to n = max(2p − 1, m)
                 microbatches and leaves out those numbered m or more. The order of torch's
                 ScheduleZBVZeroBubble.
    dualpipev    DualPipe (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", arXiv:2412.19437, §3.2.1) folded
                 into a V over two stages per rank, placed as zbv; needs m >= 2p. Its backwards are whole
                 ("BW": input and weight gradients in one) but for the rank's first p − r − 1 of b and the
                 second half of its last ones, which are split (B, and W from a first-in first-out queue,
                 run where the order has room). In its steady state a forward of one stage and a whole
                 backward of the other run as one operation (torch's OVERLAP_F_B, `overlapped`): planlang
                 lists the two in turn, the forward first, as torch's runtime runs them. The order of
                 torch's ScheduleDualPipeV (its sub-actions in order).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Sequence

from .types import CHUNKED, SCHEDULES, SPLIT_BACKWARD, V_SHAPED, stages_on, stages_per_rank


class ScheduleError(ValueError):
    """A schedule that cannot be run (bad sizes, or an order that would deadlock)."""


@dataclass(frozen=True)
class Step:
    """One operation a rank must run: a forward ("F") or backward ("B") of a model stage for a microbatch,
    or under a schedule that splits it (SPLIT_BACKWARD) the weight gradient ("W") after the B, which is
    then the input gradient only; there a whole backward, input and weight gradients in one, is "BW"
    (dualpipev's FULL_BACKWARD)."""

    kind: str
    stage: int
    microbatch: int

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch}@{self.stage}"


def rank_orders(kind: str, ranks: int, microbatches: int, chunks: int = 1) -> tuple[tuple[Step, ...], ...]:
    """The sequence of operations each rank runs under `kind` (module docstring). Made once per
    (kind, ranks, microbatches, chunks) and shared, read-only: the solver simulates the same schedule for
    every candidate with those degrees (8.7 % of a 76.1B solve rebuilt them)."""
    return _rank_orders(kind, ranks, microbatches, chunks)


def orders_made_by(kind: str, ranks: int, microbatches: int, chunks: int, make: Callable[[str, int, int], Any]) -> list[list]:
    """`rank_orders` with each operation made by `make(kind, stage, microbatch)` instead of a Step, made
    afresh (planlang.cost.schedule codes them as integers for its simulation)."""
    return _orders(kind, ranks, microbatches, chunks, make)


@lru_cache(maxsize=8)  # an entry is p * 2m * chunks steps: 1T's deepest candidate ~0.2 M, ~20 MB
def _rank_orders(kind: str, ranks: int, microbatches: int, chunks: int) -> tuple[tuple[Step, ...], ...]:
    return tuple(tuple(order) for order in _orders(kind, ranks, microbatches, chunks))


def _orders(kind: str, ranks: int, microbatches: int, chunks: int, make: Callable[[str, int, int], Any] = Step) -> list[list]:
    """Each rank's sequence, an operation made by `make(kind, stage, microbatch)` (a Step, or the compact
    code planlang.cost.schedule's compiled simulation reads)."""
    p, m = ranks, microbatches
    if kind not in SCHEDULES:
        raise ScheduleError(f"unknown schedule `{kind}`; expected one of {', '.join(SCHEDULES)}")
    if p < 1 or m < 1:
        raise ScheduleError(f"need at least one rank and one microbatch (got p={p}, m={m})")
    if kind == "gpipe":
        return [[make("F", r, j) for j in range(m)] + [make("B", r, j) for j in range(m)] for r in range(p)]
    if kind == "1f1b":
        return [_one_forward_one_backward(min(p - r - 1, m), m, lambda kind_, k, r=r: make(kind_, r, k))
                for r in range(p)]
    if kind in V_SHAPED:
        if kind == "dualpipev" and m < 2 * p:
            raise ScheduleError(f"dualpipev needs at least as many microbatches ({m}) as model stages ({2 * p})")
        return [(_zbv if kind == "zbv" else _dualpipev)(p, m, r, make) for r in range(p)]
    v = chunks
    if v < 1:
        raise ScheduleError(f"{kind} needs at least one chunk per rank (got {v})")
    own = [stages_on(kind, p, v, r) for r in range(p)]  # each rank's model stages, chunk by chunk
    if kind == "looped_bfs":
        return [[make("F", own[r][c], j) for c in range(v) for j in range(m)]
                + [make("B", own[r][c], j) for c in reversed(range(v)) for j in reversed(range(m))]
                for r in range(p)]
    if m % p:
        raise ScheduleError(f"{kind} needs microbatches ({m}) to be a multiple of the pipeline ranks ({p})")
    total = m * v
    if kind == "zero_bubble":
        return [_zero_bubble(p, m, v, own[r], make) for r in range(p)]

    def step(kind_: str, r: int, k: int):
        # the k-th forward (backward) of rank r: groups of p microbatches go through the chunks in turn
        chunk = (k % (p * v)) // p
        if kind_ == "B":
            chunk = v - 1 - chunk
        micro = (k // (p * v)) * p + k % p
        return make(kind_, own[r][chunk], micro)

    return [_one_forward_one_backward(min((p - r - 1) * 2 + (v - 1) * p, total), total,
                                      lambda kind_, k, r=r: step(kind_, r, k)) for r in range(p)]


def _zero_bubble(p: int, m: int, v: int, own: tuple[int, ...], make: Callable[[str, int, int], Any]) -> list:
    """The order under zero_bubble (module docstring) of the rank r that holds the model stages `own`:
    op k < warm is a forward, then each op is a forward (while any are left) and a B, with a W after it
    once r of them have run; the microbatch of each kind on a stage counts up from 0."""
    r = own[0]
    total = m * v
    warm = min((v - 1) * p + p - r - 1, total)
    done = {"F": [0] * v, "B": [0] * v, "W": [0] * v}
    backs: list[int] = []  # the chunk of each B run, in order: the Ws follow it
    seq: list = []

    def run(kind_: str, chunk: int) -> None:
        seq.append(make(kind_, own[chunk], done[kind_][chunk]))
        done[kind_][chunk] += 1

    for op in range(total + warm):
        if op < total:
            run("F", (op // p) % v)
        if op >= warm:
            backs.append(v - 1 - ((op - warm) // p) % v)
            run("B", backs[-1])
            if op - warm >= r:
                run("W", backs[sum(done["W"])])
    while sum(done["W"]) < len(backs):
        run("W", backs[sum(done["W"])])
    return seq


def _zbv(p: int, m: int, r: int, make: Callable[[str, int, int], Any]) -> list:
    """Rank r's order under zbv (module docstring), with its stages a = r and b = 2p − 1 − r: as if
    n = max(2p − 1, m) microbatches ran, those numbered m or more left out."""
    n = max(2 * p - 1, m)
    a, b = r, 2 * p - 1 - r
    seq: list[tuple[str, int, int]] = []
    f = {a: 0, b: 0}
    back = {a: 0, b: 0}

    def forward(stage: int) -> None:
        seq.append(("F", stage, f[stage]))
        f[stage] += 1

    def backward(stage: int, weight: bool = True) -> None:
        seq.append(("B", stage, back[stage]))
        if weight:
            seq.append(("W", stage, back[stage]))
        back[stage] += 1

    for _ in range(2 * (p - r) - 1):
        forward(a)
    for _ in range(r):
        forward(b)
        forward(a)
    for _ in range(p - r):
        forward(b)
        backward(b)
    while f[b] < f[a] or f[a] < n:
        if f[a] < n:
            forward(a)
        backward(a)
        forward(b)
        backward(b)
    weights = {a: back[a], b: back[b]}  # the weight gradients held back from here on
    for _ in range(r):
        backward(a, weight=False)
        backward(b, weight=False)
    for _ in range(p - r):
        backward(a, weight=False)
        seq.append(("W", a, weights[a]))
        weights[a] += 1
    seq += [("W", b, j) for j in range(weights[b], back[b])] + [("W", a, j) for j in range(weights[a], back[a])]
    return [make(kind, stage, j) for kind, stage, j in seq if j < m]


def _dualpipev(p: int, m: int, r: int, make: Callable[[str, int, int], Any], pairs: list[int] | None = None) -> list:
    """Rank r's order under dualpipev (module docstring), with its stages a = r and b = 2p − 1 − r: a
    backward is whole ("BW") or an input gradient ("B") whose weight gradient ("W") waits in a queue, run
    first in, first out. `pairs` gets the index in the order of each overlapped forward, whose whole
    backward follows it as one operation (torch's OVERLAP_F_B)."""
    a, b = r, 2 * p - 1 - r
    seq: list = []
    f = {a: 0, b: 0}
    back = {a: 0, b: 0}
    queue: list[tuple[int, int]] = []

    def forward(stage: int) -> None:
        seq.append(make("F", stage, f[stage]))
        f[stage] += 1

    def backward(stage: int, whole: bool) -> None:
        seq.append(make("BW" if whole else "B", stage, back[stage]))
        if not whole:
            queue.append((stage, back[stage]))
        back[stage] += 1

    def weight() -> None:
        if queue:
            stage, j = queue.pop(0)
            seq.append(make("W", stage, j))

    def overlap(fwd: int, bwd: int) -> None:
        if pairs is not None:
            pairs.append(len(seq))
        forward(fwd)
        backward(bwd, whole=True)

    for _ in range((p - r - 1) * 2):
        forward(a)
    for _ in range(r + 1):
        forward(a)
        forward(b)
    for _ in range(p - r - 1):
        backward(b, whole=False)
        weight()
        forward(b)
    for i in range(m - 2 * p + r + 1):
        if i == 0 and r == p - 1:  # not overlapped, as torch's (a smaller bubble)
            forward(a)
            backward(b, whole=True)
        else:
            overlap(a, b)
        overlap(b, a)
    for _ in range(p - r - 1):
        backward(b, whole=True)
        overlap(b, a)
    split = False  # the second half of the last backwards are split, their W run after
    for i in range(r + 1):
        split = split or (i == (r + 1) // 2 and r % 2 == 1)
        backward(b, whole=not split)
        split = split or (i == (r + 1) // 2 and r % 2 == 0)
        backward(a, whole=not split)
    for _ in range(p - r - 1):
        weight()
        backward(a, whole=not split)
    for _ in range(r + 1):
        weight()
    return seq


def overlapped(kind: str, ranks: int, microbatches: int, chunks: int = 2) -> tuple[tuple[int, ...], ...]:
    """Per rank, the indices k in its order (`rank_orders`) of the forwards that run as one operation with
    the whole backward at k + 1 (dualpipev's overlapped forward and backward, torch's OVERLAP_F_B: it
    starts once both inputs have arrived, runs the two in turn and sends both outputs after). Empty for
    every other schedule."""
    if kind != "dualpipev":
        return tuple(() for _ in range(ranks))
    rank_orders(kind, ranks, microbatches, chunks)  # its checks
    out = []
    for r in range(ranks):
        pairs: list[int] = []
        _dualpipev(ranks, microbatches, r, lambda *step: None, pairs)
        out.append(tuple(pairs))
    return tuple(out)


def _one_forward_one_backward(warm: int, total: int, step) -> list:
    """`warm` forwards, then one forward and one backward in turn, then the remaining backwards; `step(kind,
    k)` is the k-th forward or backward of the rank."""
    seq = [step("F", k) for k in range(warm)]
    for k in range(total - warm):
        seq += [step("F", warm + k), step("B", k)]
    return seq + [step("B", k) for k in range(total - warm, total)]


def activation_peaks(kind: str, ranks: int, microbatches: int, stage_bytes: Sequence[int],
                     chunks: int = 1, pending: Sequence[int] | None = None) -> list[int]:
    """Per pipeline rank, the most activation bytes it holds at once: its order replayed, each forward of
    model stage s keeping `stage_bytes[s]` (what one microbatch saves there) until that microbatch's
    backward of s (under a split backward, its W). `stage_bytes` has one entry per model stage (p·v for a
    chunked schedule). `pending[s]`: under a split backward, what a microbatch's B leaves on stage s for
    its W (the gradients at the outputs of the operations that use weights, torch's `param_groups`)."""
    v = stages_per_rank(kind, chunks)
    if len(stage_bytes) != ranks * v:
        raise ScheduleError(f"{len(stage_bytes)} stage sizes for {ranks} ranks of {v} chunks")
    frees = _frees(kind)
    wait = list(pending) if pending is not None and kind in SPLIT_BACKWARD else [0] * len(stage_bytes)
    peaks = []
    for order in rank_orders(kind, ranks, microbatches, v):
        held = peak = 0
        for st in order:
            if st.kind == "F":
                held += stage_bytes[st.stage]
            elif st.kind == frees:
                held -= stage_bytes[st.stage] + wait[st.stage]
            elif st.kind == "BW":  # a whole backward under a split one: nothing left for a W
                held -= stage_bytes[st.stage]
            else:  # the B of a split backward
                held += wait[st.stage]
            peak = max(peak, held)
        peaks.append(peak)
    return peaks


def _frees(kind: str) -> str:
    """The operation that frees a microbatch's activations on a stage: its backward, or under a split
    backward the weight gradient (torch keeps the forward's graph for it)."""
    return "W" if kind in SPLIT_BACKWARD else "B"


def backward_peaks(kind: str, ranks: int, microbatches: int, stage_bytes: Sequence[int],
                   backward_bytes: Sequence[int], gradient_bytes: Sequence[int], chunks: int = 1,
                   pending: Sequence[int] | None = None, weight_bytes: Sequence[int] | None = None) -> list[int]:
    """Per pipeline rank, the most bytes it holds at any of its backwards: activations held, what that
    backward of model stage s allocates beyond them (`backward_bytes[s]`, its own gradients included), and
    other stages' gradients (in `.grad` once a stage's first backward has run).

    Looped BFS: the order replayed, each backward beside the activations held then and the gradients of
    the rank's stages that have run a backward already: its first backwards (the last chunk's) run beside
    all m microbatches' activations and no other chunk's gradients (bench/results/pipeline_memory.txt:
    within 1.0 % on gloo, where the rule below is 12 % over). Other schedules: the rank's activation peak
    beside every other stage's gradients: interleaved 1F1B's steady state holds near-peak activations once
    every chunk has run a backward, and this is the closer one measured (-0.4 % against the replay's
    -6.9 % at GPT-2 pp2 x dp2 rank 0: the replay misses a term not yet identified there).

    Split backwards (zero_bubble, zbv, dualpipev): the replay too, with `pending` (as in `activation_peaks`)
    held from a microbatch's B to its W; each B and whole BW allocates its `backward_bytes`, each W
    `weight_bytes[s]` (torch's `autograd.grad` returns a group of weight gradients before they are added
    to `.grad`; `backward_bytes` when not given), but model stage 0's W, which runs its whole backward
    (its B runs nothing); a stage's gradients exist from its first W or BW. A rank's stages are
    planlang.plan.placement's."""
    v = stages_per_rank(kind, chunks)
    if not len(stage_bytes) == len(backward_bytes) == len(gradient_bytes) == ranks * v:
        raise ScheduleError(f"{len(stage_bytes)} stage sizes for {ranks} ranks of {v} chunks")
    if kind != "looped_bfs" and kind not in SPLIT_BACKWARD:
        acts = activation_peaks(kind, ranks, microbatches, stage_bytes, v)
        own = [stages_on(kind, ranks, v, r) for r in range(ranks)]
        return [acts[r] + max(backward_bytes[s] + sum(gradient_bytes[t] for t in own[r]) - gradient_bytes[s]
                              for s in own[r]) for r in range(ranks)]
    frees = _frees(kind)
    wait = list(pending) if pending is not None and kind in SPLIT_BACKWARD else [0] * len(stage_bytes)
    peaks = []
    for order in rank_orders(kind, ranks, microbatches, v):
        held = peak = grads = 0
        started: set[int] = set()
        for st in order:
            if st.kind == "F":
                held += stage_bytes[st.stage]
                continue
            others = grads - (gradient_bytes[st.stage] if st.stage in started else 0)  # its own: in backward_bytes
            if st.kind == "W" and st.stage > 0 and weight_bytes is not None:
                peak = max(peak, held + weight_bytes[st.stage] + others)
            elif not (st.kind == "B" and st.stage == 0 and kind in SPLIT_BACKWARD):
                peak = max(peak, held + backward_bytes[st.stage] + others)
            if st.kind not in (frees, "BW"):  # the B of a split backward: it leaves `pending` for the W
                held += wait[st.stage]
                continue
            if st.stage not in started:
                started.add(st.stage)
                grads += gradient_bytes[st.stage]
            held -= stage_bytes[st.stage] + (wait[st.stage] if st.kind == frees else 0)
        peaks.append(peak)
    return peaks


def interleaved_receives(stages: int, stage: int, microbatches: int, chunks: int) -> tuple[int, int]:
    """(activations, gradients): receive buffers model stage `stage` of `stages` holds at once under
    torch's interleaved schedule (ScheduleInterleaved1F1B through planlang.runtime.recv_buffers), which
    posts a stage's receives in lockstep with its neighbours' sends, ahead of its own order. Counted on
    gloo for 2-4 ranks, 2-3 chunks and 6-24 microbatches (tests/runtime/test_recv_buffers_gloo.py): the
    activations of at most one microbatch more than the stage has in flight, and gradients one at a time
    except on the last stage of a rank's chunk that is not the model's last (its successor, the next
    chunk's first stage, is on rank 0): one per pipeline rank there. Never more than one per microbatch.
    Interleaved's looped placement only (stage s on rank s mod p), never a V shape's."""
    ranks = stages // max(1, chunks)
    wraps = stage % ranks == ranks - 1 and stage != stages - 1
    held = in_flight("interleaved", stages, stage, microbatches, chunks=chunks)
    return min(microbatches, held + 1), min(microbatches, ranks if wraps else 1)


@lru_cache(maxsize=256)
def _chunked_held(kind: str, ranks: int, microbatches: int, chunks: int) -> tuple[int, ...]:
    """Per model stage of a chunked pipeline, the most microbatches it holds at once: each rank's order
    replayed once for all of its stages (what `activation_peaks` gives one stage at a time, with that stage's
    bytes 1 and the others' 0), so that pricing every stage of a deep pipeline replays the orders once."""
    held = [0] * (ranks * chunks)
    peak = [0] * (ranks * chunks)
    frees = _frees(kind)
    for order in rank_orders(kind, ranks, microbatches, chunks):
        for st in order:
            if st.kind == "F":
                held[st.stage] += 1
                peak[st.stage] = max(peak[st.stage], held[st.stage])
            elif st.kind in (frees, "BW"):
                held[st.stage] -= 1
    return tuple(peak)


def in_flight(schedule: str, stages: int, stage: int, microbatches: int, *, chunks: int = 1, extra: int = 0) -> int:
    """Microbatches whose activations model stage `stage` (0-based) of `stages` holds at once.

    GPipe runs every forward before any backward: all m. 1F1B (PipeDream-Flush, Narayanan et al. 2021,
    §2.2) warms stage i up with p − i forwards before its first backward and then alternates: min(p − i,
    m). Chunked schedules (`stages` = p·v model stages, v `chunks` per rank, 2 for the V shapes, placed by
    planlang.plan.placement): the most microbatches of this stage held at once in its rank's order (under a
    split backward until its W). A rank's peak is over all of its chunks together
    (`activation_peaks`), not the sum of each chunk's. `extra` adds microbatches at the peak
    (torch.distributed.pipelining's Schedule1F1B runs the next forward before the backward that frees one)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule {schedule!r}: choose one of {', '.join(SCHEDULES)}")
    if not 0 <= stage < stages or microbatches < 1:
        raise ValueError(f"stage {stage} of {stages} with {microbatches} microbatches is out of range")
    if schedule == "gpipe":
        return microbatches
    if schedule in CHUNKED:
        v = stages_per_rank(schedule, max(1, chunks))
        if stages % v:
            raise ValueError(f"{stages} stages cannot be split into {v} chunks per rank")
        return min(_chunked_held(schedule, stages // v, microbatches, v)[stage] + extra, microbatches)
    return min(stages - stage + extra, microbatches)
