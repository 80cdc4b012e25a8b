"""rotor's chain (planlang.solve.rotor): a linearized network's per-stage times and sizes, a schedule of
its operations, and an independent replay of a schedule (`simulate`: shares nothing with the DP; the
tests check every schedule the DP gives with it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

import numpy as np

from planlang.plan.units import format_bytes

from .infeasible import InfeasibleBudget  # noqa: F401 - the kernels' one budget error

OP_KINDS = ("F_all", "F_ck", "F_n", "loss", "B")



@dataclass(frozen=True)
class Op:
    """One operation of a schedule: a kind from OP_KINDS and the stage it runs (L for the loss)."""

    kind: str
    stage: int

    def __str__(self) -> str:
        return "loss" if self.kind == "loss" else f"{self.kind}({self.stage})"


def _tuple(values, name: str, n: int) -> tuple[float, ...]:
    out = tuple(values)
    if len(out) != n:
        raise ValueError(f"{name} has {len(out)} entries, expected {n} (fw and ftmp: one per stage; "
                         f"bw, x, xbar and btmp: one per stage plus one for the loss)")
    for v in out:
        if not isinstance(v, (int, float, Fraction, np.integer, np.floating)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{name} holds {v!r}: every time and size must be a finite number >= 0")
    return out


@dataclass(frozen=True)
class Chain:
    """A linearized network for checkpointing (see the module docstring for the indexing)."""

    fw: tuple[float, ...]
    bw: tuple[float, ...]
    x: tuple[float, ...]
    xbar: tuple[float, ...]
    ftmp: tuple[float, ...]
    btmp: tuple[float, ...]
    comm_fw: tuple[float, ...] = ()
    comm_bw: tuple[float, ...] = ()
    recompute_comm: bool = True

    def __post_init__(self) -> None:
        n = len(self.fw)
        if n < 1:
            raise ValueError("a chain needs at least one stage")
        put = object.__setattr__
        for name, size in (("fw", n), ("bw", n + 1), ("x", n + 1), ("xbar", n + 1), ("ftmp", n), ("btmp", n + 1)):
            put(self, name, _tuple(getattr(self, name), name, size))
        put(self, "comm_fw", _tuple(self.comm_fw or (0.0,) * n, "comm_fw", n))
        put(self, "comm_bw", _tuple(self.comm_bw or (0.0,) * (n + 1), "comm_bw", n + 1))
        for i in range(n):
            if self.xbar[i] < self.x[i + 1]:
                raise ValueError(f"xbar[{i}] = {self.xbar[i]} < x[{i + 1}] = {self.x[i + 1]}: what a stage keeps "
                                 f"for backward includes its output; add the output's bytes to xbar")

    @property
    def length(self) -> int:
        """L, the number of stages (the loss not counted)."""
        return len(self.fw)

    def forward_time(self, i: int, kind: str) -> float:
        """Seconds of stage i's forward run as `kind` (F_all, F_ck or F_n), communication included."""
        comm = self.comm_fw[i] if (kind == "F_all" or self.recompute_comm) else 0.0
        return self.fw[i] + comm

    def backward_time(self, i: int) -> float:
        """Seconds of B i (of the loss for i = L), communication included."""
        return self.bw[i] + self.comm_bw[i]

    def __str__(self) -> str:
        return f"chain of {self.length} stages, inputs {format_bytes(sum(self.x))}, kept {format_bytes(sum(self.xbar))}"


def discretise(chain: Chain, slot_size: float | Fraction) -> Chain:
    """The chain with every size in whole slots of `slot_size` bytes, rounded up (exact rational arithmetic
    on the given numbers, so 1.0 with slots of 0.25 is 4 slots, not 5)."""
    unit = Fraction(slot_size)

    def up(values):
        return tuple(int(math.ceil(Fraction(v) / unit)) for v in values)

    return Chain(chain.fw, chain.bw, up(chain.x), up(chain.xbar), up(chain.ftmp), up(chain.btmp),
                 chain.comm_fw, chain.comm_bw, chain.recompute_comm)


@dataclass(frozen=True)
class Schedule:
    """A solved chain: the operations in order, their total time, and the peak memory they reach."""

    makespan: float
    ops: tuple[Op, ...]
    peak: float  # bytes, with the chain's exact sizes
    peak_slots: int  # slots, with sizes rounded up to slots (<= slots)
    budget: float
    slots: int
    slot_size: float

    @property
    def recomputed(self) -> int:
        """Forward operations beyond one per stage."""
        return sum(op.kind.startswith("F") for op in self.ops) - sum(op.kind == "B" for op in self.ops)

    def __str__(self) -> str:
        return (f"makespan {self.makespan:.4g} s, peak {format_bytes(self.peak)} of {format_bytes(self.budget)}, "
                f"{len(self.ops)} ops ({self.recomputed} recomputed forwards)")


# ---------------------------------------------------------------------------------------------------------
# an independent replay of a schedule (shares nothing with the DP above; tests check every schedule with it)


@dataclass(frozen=True)
class Simulation:
    """What replaying a schedule gives: total time, peak memory (chain units, a_0 included), validity."""

    makespan: float
    peak: float
    valid: bool
    error: str = ""

    def __str__(self) -> str:
        return f"makespan {self.makespan:.6g}, peak {self.peak:g}" + ("" if self.valid else f", invalid: {self.error}")


def simulate(ops: Sequence[Op], chain: Chain) -> Simulation:
    """Replay `ops` on `chain` value by value: check each operation finds its inputs (and does not remake
    a value already held), track the bytes held and the time, and require the schedule to end holding
    exactly delta_0 with every backward done."""
    L = chain.length
    held: dict[tuple[str, int], float] = {("a", 0): chain.x[0]}
    clock = 0.0
    live = peak = chain.x[0]

    def has_input(i: int) -> bool:
        return ("a", i) in held or (i >= 1 and ("abar", i - 1) in held)

    def fail(k: int, op: Op, why: str) -> Simulation:
        return Simulation(clock, peak, False, f"op {k} ({op}): {why}")

    def make(key: tuple[str, int], nbytes: float) -> None:
        nonlocal live
        held[key] = nbytes
        live += nbytes

    def free(key: tuple[str, int]) -> None:
        nonlocal live
        if key in held:
            live -= held.pop(key)

    for k, op in enumerate(ops):
        i = op.stage
        if op.kind in ("F_all", "F_ck", "F_n"):
            if not 0 <= i < L:
                return fail(k, op, "no such stage")
            if not has_input(i):
                return fail(k, op, f"a_{i} is not held")
            if has_input(i + 1) or ("abar", i) in held or ("d", i) in held:
                return fail(k, op, "its output is already held (or its backward is done)")
            if op.kind == "F_n" and ("a", i) not in held:
                return fail(k, op, f"F_n frees a_{i}, which is not held on its own")
            made = chain.xbar[i] if op.kind == "F_all" else chain.x[i + 1]
            peak = max(peak, live + made + chain.ftmp[i])
            make(("abar", i) if op.kind == "F_all" else ("a", i + 1), made)
            if op.kind == "F_n":
                free(("a", i))
            pays_comm = op.kind == "F_all" or chain.recompute_comm
            clock += chain.fw[i] + (chain.comm_fw[i] if pays_comm else 0.0)
        elif op.kind == "loss":
            if i != L:
                return fail(k, op, f"the loss is index {L}")
            if not has_input(L) or ("d", L) in held:
                return fail(k, op, "a_L is not held, or the loss already ran")
            peak = max(peak, live + chain.xbar[L] + chain.btmp[L] + chain.x[L])
            free(("a", L))
            make(("d", L), chain.x[L])
            clock += chain.bw[L] + chain.comm_bw[L]
        elif op.kind == "B":
            if not 0 <= i < L:
                return fail(k, op, "no such stage")
            if ("d", i + 1) not in held or ("abar", i) not in held or not has_input(i):
                return fail(k, op, f"needs delta_{i + 1}, abar_{i} and a_{i}")
            peak = max(peak, live + chain.x[i] + chain.btmp[i])
            for key in (("d", i + 1), ("abar", i), ("a", i)):
                free(key)
            make(("d", i), chain.x[i])
            clock += chain.bw[i] + chain.comm_bw[i]
        else:
            return fail(k, op, f"unknown kind {op.kind!r}")
    if set(held) != {("d", 0)}:
        left = ", ".join(f"{n}_{j}" for n, j in sorted(held))
        return Simulation(clock, peak, False, f"the schedule ends holding {left}, not exactly delta_0")
    return Simulation(clock, peak, True)
