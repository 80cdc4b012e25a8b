"""Optimal activation checkpointing of a chain: rotor's persistent dynamic program (Herrmann et al. 2019,
"Optimal checkpointing for heterogeneous chains") with the communication terms of
map-memory-aware-auto-parallel §5.2.1 (Table 1, Table 2, Theorem 5.1).

The chain (rotor's indexing, 0-based). Stages 0..L-1 run forward one after the other; the loss is the
last step, index L. For each index:

    a_i       the input of stage i (a_0 the chain input, a_L the chain output = the loss input), x[i] bytes
    abar_i    what stage i keeps for its backward when run with grad: xbar[i] bytes, its output a_{i+1}
              included (so xbar[i] >= x[i+1]); xbar[L] is what the loss holds while it runs
    delta_i   the gradient w.r.t. a_i, x[i] bytes
    fw[i], ftmp[i] (i < L)     forward time and transient bytes
    bw[i], btmp[i] (i <= L)    backward time and transient bytes; bw[L] is the loss (forward and backward)

Operations (map Table 1) and what they do to memory ("live" is everything held before the op):

    F_all i   a_i -> abar_i, a_i kept            peak live + xbar[i] + ftmp[i]
    F_ck i    a_i -> a_{i+1}, a_i kept           peak live + x[i+1] + ftmp[i]
    F_n i     a_i -> a_{i+1}, a_i freed          peak live + x[i+1] + ftmp[i]  (a_i must be held on its own)
    loss      a_L -> delta_L                     peak live + xbar[L] + btmp[L] + x[L]; a standalone a_L freed
    B i       delta_{i+1}, abar_i, a_i -> delta_i  peak live + x[i] + btmp[i]; frees delta_{i+1}, abar_i and a_i
                                                  when a_i is held on its own (inside abar_{i-1} it stays)

a_i is available when held on its own or inside abar_{i-1}. The budget counts everything held, the chain
input a_0 from the start. The makespan is the sum of the operations' times.

Communication (map Table 2, Theorem 5.1): stage i's forward communicates for comm_fw[i] seconds and its
backward for comm_bw[i]; the loss's comm_bw[L]. Eq. (5) as printed charges u_fcomm only where the stage
is run with F_all and sums bare u_f over the checkpointing forward sweep of C_ck, although eq. (6)
charges that sweep's communication memory o_fcomm. A stage's forward code runs its collectives every
time it runs, so by default every forward (F_all, F_ck, F_n) pays comm_fw[i]; `recompute_comm=False`
reproduces eq. (5) literally (only F_all pays), under which the communication terms add the same
constant to every schedule. Communication memory (o_fcomm, o_bcomm) enters eq. (6) exactly where o_f
and o_b do, so callers add it to ftmp and btmp.

The recurrence (Theorem 5.1, in these terms). A segment (s, t) starts with a_s held (counted by whoever
holds it, not in the segment's memory m) and, when t < L, delta_{t+1} held (counted in m, g = x[t+1];
g = 0 for t = L); it ends with delta_s. Either

    all:    F_all s, then (s+1, t) with m - xbar[s], then B s            (a_{s+1} lives inside abar_s)
    ck s':  F_ck s, F_n s+1 .. s'-1, then (s', t) with m - x[s'], then (s, s'-1) with m

and (s, s) is F_all s, B s (the loss alone for s = L). The memory conditions are the operations' peaks
above. The sequences this recursion generates are rotor's persistent sequences: each abar_i is computed
once and kept until B i. `solve` returns the fastest of them within the budget; `min_peak` the least
memory any of them needs.

Memory is discretised like rotor's: the budget is cut into `slots` equal slots of budget/slots bytes and
every size is rounded up to whole slots, so a schedule feasible in slots is feasible in bytes. The DP is
exact on that discretised chain (`discretise`): its makespan is the optimum over all persistent
sequences of the rounded chain, tested against exhaustive enumeration (tests/solve/test_rotor.py).

`solve_groups` is the same problem restricted to what a plan can say: contiguous groups of stages, each
recomputed as one unit (torch.utils.checkpoint), no nesting.

Cost: `solve` takes O(L^3 * slots) time, vectorised over memory with numpy, and about 26 * L^2 * slots
bytes of tables (48 stages x 500 slots: 31 MB); `solve_groups` O(L^2 * slots).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

import numpy as np

from .rotor_chain import (  # noqa: F401 - the chain's types and the replay are part of this module's API
    OP_KINDS, Chain, InfeasibleBudget, Op, Schedule, Simulation, discretise, simulate,
)

_NONE, _ALL = -2, -1  # decision codes in the DP's choice table; >= 1 is the checkpoint position s'


# ---------------------------------------------------------------------------------------------------------
# the least memory of any persistent sequence


def _forward_sweep_peaks(x, ftmp, n_stages: int) -> list[list[float]]:
    """sweep[s][s'] = peak of F_ck s, F_n s+1 .. s'-1 beyond a_s and the incoming gradient."""
    sweep: list[list[float]] = [[0] * (n_stages + 1) for _ in range(n_stages + 1)]
    for s in range(n_stages):
        peak = x[s + 1] + ftmp[s]
        sweep[s][s + 1] = peak
        for sp in range(s + 2, n_stages + 1):
            j = sp - 1
            peak = max(peak, x[j] + x[j + 1] + ftmp[j])
            sweep[s][sp] = peak
    return sweep


def _min_peak_table(c: Chain) -> list[list[float]]:
    """P[s][t]: least memory (a_s excluded) of any persistent sequence for segment (s, t)."""
    L = c.length
    x, xb, ft, bt = c.x, c.xbar, c.ftmp, c.btmp
    sweep = _forward_sweep_peaks(x, ft, L)
    P = [[math.inf] * (L + 1) for _ in range(L + 1)]
    P[L][L] = xb[L] + bt[L] + x[L]
    for s in range(L):
        P[s][s] = max(x[s + 1] + xb[s] + ft[s], xb[s] + x[s + 1] + x[s] + bt[s])
    for d in range(1, L + 1):
        for s in range(L + 1 - d):
            t = s + d
            g = x[t + 1] if t < L else 0
            best = max(g + xb[s] + ft[s], xb[s] + P[s + 1][t], xb[s] + x[s + 1] + x[s] + bt[s])
            for sp in range(s + 1, t + 1):
                best = min(best, max(g + sweep[s][sp], x[sp] + P[sp][t], P[s][sp - 1]))
            P[s][t] = best
    return P


def min_peak(chain: Chain) -> float:
    """The least peak memory (a_0 included) of any persistent sequence, in the chain's own units."""
    return chain.x[0] + _min_peak_table(chain)[0][chain.length]


# ---------------------------------------------------------------------------------------------------------
# the dynamic program


TIE = 1e-12  # relative: makespans this close count as equal, and the smaller peak wins
_BIG = 2**30  # "no schedule" in peak tables (slots are far fewer)


def _pick(times: np.ndarray, peaks: np.ndarray) -> np.ndarray:
    """Per column (memory m), the row with the least time; among rows within TIE of it, the least peak."""
    best = times.min(axis=0)
    near = times <= best + TIE * np.abs(best)
    return np.argmin(np.where(near, peaks, _BIG), axis=0)


def _tables(c: Chain, S: int) -> tuple[np.ndarray, np.ndarray]:
    """(C, W): C[s, t, m] the least time of segment (s, t) with m slots, a_s excluded; W[s, t, m] the first
    decision of that schedule (_ALL, or the checkpoint position s' of the forward sweep; _NONE where
    infeasible). Among equally fast decisions the one whose schedule peaks lowest is kept (P[s, t, m]), so
    a smaller budget never gets a schedule with a higher peak. Sizes in slots.
 The checkpoint rows read C[s', t, m - x[s']] for
    every s' of a segment ending at t; those shifted rows are stored once per finished (s', t) in
    Ct[t, s', m] (t-major, so a segment's rows are one contiguous block), likewise Pt."""
    L = c.length
    n = L + 1
    X = [int(v) for v in c.x]
    XB = [int(v) for v in c.xbar]
    FT = [int(v) for v in c.ftmp]
    BT = [int(v) for v in c.btmp]
    f_all = [c.forward_time(i, "F_all") for i in range(L)]
    f_re = np.array([c.forward_time(i, "F_ck") for i in range(L)])
    f_re_sum = np.concatenate([[0.0], np.cumsum(f_re)])  # sum of f_re[s:s'] = f_re_sum[s'] - f_re_sum[s]
    b = [c.backward_time(i) for i in range(n)]
    sweep = np.array(_forward_sweep_peaks(X, FT, L), dtype=np.int64)

    C = np.full((n, n, S + 1), np.inf)
    P = np.full((n, n, S + 1), _BIG, dtype=np.int32)
    Ct = np.full((n, n, S + 1), np.inf)
    Pt = np.full((n, n, S + 1), _BIG, dtype=np.int32)
    W = np.full((n, n, S + 1), _NONE, dtype=np.int16)
    m = np.arange(S + 1)

    def finish(s: int, t: int) -> None:
        shift = X[s]
        if shift <= S:
            Ct[t, s, shift:] = C[s, t, :S + 1 - shift]
            Pt[t, s, shift:] = np.minimum(P[s, t, :S + 1 - shift] + shift, _BIG)

    for s in range(n):
        need = XB[L] + BT[L] + X[L] if s == L else max(X[s + 1] + XB[s] + FT[s], XB[s] + X[s + 1] + X[s] + BT[s])
        if need <= S:
            C[s, s, need:] = (b[L] if s == L else f_all[s] + b[s])
            P[s, s, need:] = need
            W[s, s, need:] = _ALL
        finish(s, s)
    least = _min_peak_table(c)  # below least[s][t] slots a segment has no schedule: skip those columns
    for d in range(1, n):
        for s in range(n - d):
            t = s + d
            lo = int(least[s][t])
            if lo > S:
                continue
            cols = m[lo:]
            w = S + 1 - lo
            g = X[t + 1] if t < L else 0
            times = np.empty((d + 1, w))
            peaks = np.empty((d + 1, w), dtype=np.int32)
            # row 0: F_all s, then (s+1, t) with m - xbar[s], then B s
            own = max(g + XB[s] + FT[s], XB[s] + X[s + 1] + X[s] + BT[s])
            need = max(own, XB[s], lo)
            times[0] = np.inf
            peaks[0] = _BIG
            if need <= S:
                times[0, need - lo:] = C[s + 1, t, need - XB[s]:S + 1 - XB[s]] + (f_all[s] + b[s])
                peaks[0, need - lo:] = np.maximum(own, XB[s] + P[s + 1, t, need - XB[s]:S + 1 - XB[s]])
            # rows 1..d: F_ck s, F_n .., then (s', t) with m - x[s'], then (s, s'-1), for s' = s+1 .. t
            thr = g + sweep[s, s + 1:t + 1]
            np.add(Ct[t, s + 1:t + 1, lo:], C[s, s:t, lo:], out=times[1:])
            times[1:] += (f_re_sum[s + 1:t + 1] - f_re_sum[s])[:, None]
            for r, th in enumerate(thr.tolist(), start=1):
                if th > lo:
                    times[r, :th - lo] = np.inf
            np.maximum(Pt[t, s + 1:t + 1, lo:], P[s, s:t, lo:], out=peaks[1:])
            np.maximum(peaks[1:], thr[:, None].astype(np.int32), out=peaks[1:])
            best = _pick(times, peaks)
            chosen = times[best, cols - lo]
            C[s, t, lo:] = chosen
            feasible = np.isfinite(chosen)
            P[s, t, lo:] = np.where(feasible, peaks[best, cols - lo], _BIG)
            W[s, t, lo:] = np.where(feasible, np.where(best == 0, _ALL, s + best), _NONE)
            finish(s, t)
    return C, W


def _walk(c: Chain, cs: Chain, W: np.ndarray, s: int, t: int, m: int, out: list[Op]) -> tuple[float, ...]:
    """Append the ops of segment (s, t) with m slots to `out`; return its peak (a_s excluded) in bytes
    (chain c) and in slots (chain cs)."""
    L = c.length
    if s == t:
        if s == L:
            out.append(Op("loss", L))
            return tuple(ch.xbar[L] + ch.btmp[L] + ch.x[L] for ch in (c, cs))
        out += [Op("F_all", s), Op("B", s)]
        return tuple(max(ch.x[s + 1] + ch.xbar[s] + ch.ftmp[s], ch.xbar[s] + ch.x[s + 1] + ch.x[s] + ch.btmp[s])
                     for ch in (c, cs))
    w = int(W[s, t, m])
    if w == _ALL:
        out.append(Op("F_all", s))
        inner = _walk(c, cs, W, s + 1, t, m - int(cs.xbar[s]), out)
        out.append(Op("B", s))
        peaks = []
        for ch, p in zip((c, cs), inner):
            g = ch.x[t + 1] if t < L else 0
            peaks.append(max(g + ch.xbar[s] + ch.ftmp[s], ch.xbar[s] + p,
                             ch.xbar[s] + ch.x[s + 1] + ch.x[s] + ch.btmp[s]))
        return tuple(peaks)
    assert s < w <= t, f"no decision for segment ({s}, {t}) with {m} slots"
    out.append(Op("F_ck", s))
    out += [Op("F_n", j) for j in range(s + 1, w)]
    first = _walk(c, cs, W, w, t, m - int(cs.x[w]), out)
    second = _walk(c, cs, W, s, w - 1, m, out)
    peaks = []
    for ch, p1, p2 in zip((c, cs), first, second):
        g = ch.x[t + 1] if t < L else 0
        sweep = max([ch.x[s + 1] + ch.ftmp[s]] + [ch.x[j] + ch.x[j + 1] + ch.ftmp[j] for j in range(s + 1, w)])
        peaks.append(max(g + sweep, ch.x[w] + p1, p2))
    return tuple(peaks)


def _slots(budget: float, slots: int, slot_size: float | None) -> tuple[int, Fraction]:
    """(number of slots, slot size): budget/slots by default; with `slot_size`, the budget is cut into
    whole slots of that size (use a fixed slot size to compare budgets on one discretisation)."""
    number = (int, float, Fraction, np.integer, np.floating)
    if not (isinstance(budget, number) and math.isfinite(budget) and budget > 0):
        raise ValueError(f"budget {budget!r} must be a positive number of bytes")
    if slot_size is not None:
        if not (isinstance(slot_size, (int, float, Fraction)) and math.isfinite(slot_size) and slot_size > 0):
            raise ValueError(f"slot_size {slot_size!r} must be a positive number of bytes")
        unit = Fraction(slot_size)
        n = int(Fraction(budget) // unit)
        if n < 1:
            raise ValueError(f"slot_size {slot_size!r} is larger than the budget {budget!r}")
        return n, unit
    if not isinstance(slots, (int, np.integer)) or slots < 1:
        raise ValueError(f"slots {slots!r} must be a positive integer (rotor uses a few hundred)")
    return int(slots), Fraction(budget) / int(slots)


def solve(chain: Chain, budget: float, slots: int = 500, *, slot_size: float | None = None) -> Schedule:
    """The fastest persistent schedule of `chain` whose peak memory fits `budget` bytes, memory rounded up to
    slots of budget/slots bytes (or of `slot_size`); among equally fast ones, the one with the least peak.
    Raises InfeasibleBudget (with the least budget that fits) when none fits."""
    slots, unit = _slots(budget, slots, slot_size)
    cs = discretise(chain, unit)
    least = min_peak(cs)
    if least > slots:
        raise InfeasibleBudget.in_slots(budget, slots, unit, int(least), min_peak(chain))
    C, W = _tables(cs, slots)
    L = chain.length
    m = slots - int(cs.x[0])
    assert math.isfinite(C[0, L, m]), "the DP disagrees with the least-memory recursion"
    ops: list[Op] = []
    peak, peak_slots = _walk(chain, cs, W, 0, L, m, ops)
    return Schedule(float(C[0, L, m]), tuple(ops), chain.x[0] + peak, int(cs.x[0] + peak_slots), budget, slots,
                    float(unit))


def solve_chain(fw: Sequence[float], bw: Sequence[float], x: Sequence[float], xbar: Sequence[float],
                ftmp: Sequence[float], btmp: Sequence[float], budget: float, *,
                comm_fw: Sequence[float] | None = None, comm_bw: Sequence[float] | None = None,
                slots: int = 500, slot_size: float | None = None, recompute_comm: bool = True) -> Schedule:
    """`solve` on a chain given as lists (fw, ftmp: L entries; bw, x, xbar, btmp: L + 1, the last for the
    loss; comm_fw: L, comm_bw: L + 1 seconds of communication, zero when omitted)."""
    chain = Chain(tuple(fw), tuple(bw), tuple(x), tuple(xbar), tuple(ftmp), tuple(btmp),
                  tuple(comm_fw or ()), tuple(comm_bw or ()), recompute_comm)
    return solve(chain, budget, slots, slot_size=slot_size)


# ---------------------------------------------------------------------------------------------------------
# what a plan can express: contiguous checkpoint groups, one level


@dataclass(frozen=True)
class GroupSchedule:
    """Checkpoint groups (half-open stage ranges [a, b), each recomputed as one unit in backward) and the
    schedule torch.utils.checkpoint runs for them."""

    groups: tuple[tuple[int, int], ...]
    schedule: Schedule

    def __str__(self) -> str:
        gs = ", ".join(f"[{a}:{b}]" for a, b in self.groups) or "none"
        return f"groups {gs}: {self.schedule}"


def group_ops(length: int, groups: Sequence[tuple[int, int]]) -> tuple[Op, ...]:
    """The operations torch.utils.checkpoint performs for these groups of a chain of `length` stages: a
    group's forward keeps only its input (F_ck, then F_n), its backward recomputes every stage of it with
    grad (F_all ...) and runs their backward; stages outside groups run F_all once."""
    start: dict[int, int] = {}
    for a, b in sorted(groups):
        if not 0 <= a < b <= length or any(a < e and s < b for s, e in start.items()):
            raise ValueError(f"checkpoint group [{a}:{b}] is empty, out of range or overlaps another")
        start[a] = b
    ops: list[Op] = []
    pending: list[tuple[str, int, int]] = []  # what backward must do, innermost last
    i = 0
    while i < length:
        if i in start:
            b = start[i]
            ops.append(Op("F_ck", i))
            ops += [Op("F_n", j) for j in range(i + 1, b)]
            pending.append(("group", i, b))
            i = b
        else:
            ops.append(Op("F_all", i))
            pending.append(("stage", i, i + 1))
            i += 1
    ops.append(Op("loss", length))
    for kind, a, b in reversed(pending):
        if kind == "group":
            ops += [Op("F_all", j) for j in range(a, b)]
        ops += [Op("B", j) for j in reversed(range(a, b))]
    return tuple(ops)


def _all_chain_peak(c: Chain, s: int, e: int) -> float:
    """Peak (a_s excluded) of F_all s .. e then B e .. s with delta_{e+1} held: a group's recomputation."""
    g = c.x[e + 1]
    peak: float = 0
    below: float = 0  # abar of the stages before j
    for j in range(s, e + 1):
        peak = max(peak, below + g + c.xbar[j] + c.ftmp[j])
        below += c.xbar[j]
    for j in range(e, s - 1, -1):
        below -= c.xbar[j]
        held_grad = c.x[j + 1]  # delta_{j+1} (= g for j = e)
        peak = max(peak, below + c.xbar[j] + held_grad + c.x[j] + c.btmp[j])
    return peak


def solve_groups(chain: Chain, budget: float, slots: int = 500, *, slot_size: float | None = None,
                 checkpointable: Sequence[bool] | None = None) -> GroupSchedule:
    """The fastest schedule expressible as contiguous checkpoint groups (one level, torch.utils.checkpoint)
    within `budget`, on the same discretisation as `solve`; with `checkpointable` (one flag per stage),
    groups hold only flagged stages. Among equally fast groupings, the one with the least peak. Raises
    InfeasibleBudget when none fits."""
    slots, unit = _slots(budget, slots, slot_size)
    cs = discretise(chain, unit)
    L = chain.length
    ok = _flags(checkpointable, L)
    X = [int(v) for v in cs.x]
    XB = [int(v) for v in cs.xbar]
    S = slots
    m = np.arange(S + 1)
    # G[s, m]: least time from stage s to the end (segment (s, L)) with m slots, a_s excluded; GP its peak
    big = np.iinfo(np.int64).max // 4
    G = np.full((L + 1, S + 1), np.inf)
    GP = np.full((L + 1, S + 1), big, dtype=np.int64)
    D = np.full((L + 1, S + 1), _NONE, dtype=np.int64)
    need = X[L] + XB[L] + int(cs.btmp[L])
    if need <= S:
        G[L, need:] = chain.backward_time(L)
        GP[L, need:] = need
        D[L, need:] = _ALL
    sweep = _forward_sweep_peaks(cs.x, cs.ftmp, L)
    for s in range(L - 1, -1, -1):
        times = np.full((L - s + 1, S + 1), np.inf)
        peaks = np.full((L - s + 1, S + 1), big, dtype=np.int64)
        own = max(XB[s] + int(cs.ftmp[s]), XB[s] + X[s + 1] + X[s] + int(cs.btmp[s]))
        need = max(own, XB[s])
        if need <= S:
            own_time = chain.forward_time(s, "F_all") + chain.backward_time(s)
            times[0, need:] = G[s + 1, need - XB[s]:S + 1 - XB[s]] + own_time
            peaks[0, need:] = np.maximum(own, XB[s] + GP[s + 1, need - XB[s]:S + 1 - XB[s]])
        cost = 0.0
        for b in range(s + 1, L + 1):  # the group [s, b)
            j = b - 1
            if not ok[j]:
                break
            cost += chain.forward_time(j, "F_ck") + chain.forward_time(j, "F_all") + chain.backward_time(j)
            own_b = int(max(sweep[s][b], _all_chain_peak(cs, s, b - 1)))
            lo = max(own_b, X[b])
            if lo <= S:
                times[b - s, lo:] = G[b, lo - X[b]:S + 1 - X[b]] + cost
                peaks[b - s, lo:] = np.maximum(own_b, X[b] + GP[b, lo - X[b]:S + 1 - X[b]])
        pick = _pick(times, peaks)
        G[s] = times[pick, m]
        GP[s] = np.where(np.isinf(G[s]), big, peaks[pick, m])
        D[s] = np.where(np.isinf(G[s]), _NONE, np.where(pick == 0, _ALL, s + pick))
    top = S - X[0]
    if top < 0 or not math.isfinite(G[0, top]):
        raise InfeasibleBudget.in_slots(budget, slots, unit, int(_least_groups_peak(cs, ok)), _least_groups_peak(chain, ok),
                               "grouping of checkpoints")
    groups = []
    s, rem = 0, top
    while s < L:
        d = int(D[s, rem])
        if d == _ALL:
            rem -= XB[s]
            s += 1
        else:
            groups.append((s, d))
            rem -= X[d]
            s = d
    ops = group_ops(L, groups)
    peak = _group_peak(chain, groups)
    peak_slots = _group_peak(cs, groups)
    assert peak_slots <= S
    return GroupSchedule(tuple(groups), Schedule(float(G[0, top]), ops, peak, int(peak_slots), budget, slots,
                                                 float(unit)))


def _group_peak(c: Chain, groups: Sequence[tuple[int, int]]) -> float:
    """Peak memory (a_0 included) of the group schedule, by the recursion's accounting."""
    L = c.length
    start = dict(groups)

    def seg(s: int) -> float:  # segment (s, L), a_s excluded
        if s == L:
            return c.xbar[L] + c.btmp[L] + c.x[L]
        if s in start:
            b = start[s]
            sweep = max([c.x[s + 1] + c.ftmp[s]] + [c.x[j] + c.x[j + 1] + c.ftmp[j] for j in range(s + 1, b)])
            return max(sweep, c.x[b] + seg(b), _all_chain_peak(c, s, b - 1))
        return max(c.xbar[s] + c.ftmp[s], c.xbar[s] + seg(s + 1), c.xbar[s] + c.x[s + 1] + c.x[s] + c.btmp[s])

    return c.x[0] + seg(0)


def _flags(checkpointable: Sequence[bool] | None, L: int) -> tuple[bool, ...]:
    if checkpointable is None:
        return (True,) * L
    flags = tuple(bool(v) for v in checkpointable)
    if len(flags) != L:
        raise ValueError(f"checkpointable has {len(flags)} flags for {L} stages")
    return flags


def _least_groups_peak(c: Chain, ok: Sequence[bool]) -> float:
    """The least peak memory of any group schedule (groups of `ok` stages only)."""
    L = c.length
    least = [0.0] * (L + 1)
    least[L] = c.xbar[L] + c.btmp[L] + c.x[L]
    sweep = _forward_sweep_peaks(c.x, c.ftmp, L)
    for s in range(L - 1, -1, -1):
        best = max(c.xbar[s] + c.ftmp[s], c.xbar[s] + least[s + 1], c.xbar[s] + c.x[s + 1] + c.x[s] + c.btmp[s])
        for b in range(s + 1, L + 1):
            if not ok[b - 1]:
                break
            best = min(best, max(sweep[s][b], c.x[b] + least[b], _all_chain_peak(c, s, b - 1)))
        least[s] = best
    return c.x[0] + least[0]


def top_level_groups(ops: Sequence[Op], length: int) -> tuple[tuple[int, int], ...]:
    """The checkpoint groups of a schedule's first forward sweep (each stage's first run): a run F_ck a,
    F_n a+1 .. b-1 is the group [a, b); a stage first run with F_all is not checkpointed. This is what a plan
    can keep of a rotor schedule: nested recomputation inside a group is flattened (the group recomputes
    all its stages with grad at once), so the plan's schedule is `group_ops(length, groups)`, which may be
    slower or need more memory than the rotor schedule it came from."""
    groups: list[tuple[int, int]] = []
    seen = 0  # stages 0 .. seen-1 have run once
    open_at = None
    for op in ops:
        if op.kind == "loss" or seen >= length:
            break
        if op.kind not in ("F_all", "F_ck", "F_n") or op.stage != seen:
            continue
        if open_at is not None and op.kind != "F_n":
            groups.append((open_at, seen))
            open_at = None
        if op.kind == "F_ck":
            open_at = seen
        seen += 1
    if open_at is not None:
        groups.append((open_at, seen))
    return tuple(groups)
