"""The intra-op ILP's instance (planlang.solve.ilp): nodes with their options, edges with resharding
cost matrices, the memory live at each step, groups and fixed choices; what an assignment costs
(`evaluate`, straight from the instance, no solver involved), and a solve's `Result`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np

from planlang.plan.units import format_bytes

from .infeasible import InfeasibleBudget, bytes_rounded_up  # noqa: F401 - the kernels' one budget error


# ------------------------------------------------------------------------------ instance
@dataclass(frozen=True)
class Option:
    """One candidate strategy of a node. Seconds are forward + backward; bytes are per device.

    `memory` counts while the node is live (see `Step`); `volume` is the bytes a device sends for the
    strategy's own collectives; `redundancy` is the bytes per device beyond a perfectly even split
    (min-memory-redundancy-ilp eq. 4 divided by the device count). `name`: what the option is, printed
    with str() (a layout's `Spec`, a strategy's name)."""

    name: object
    compute: float = 0.0
    comm: float = 0.0
    memory: float = 0.0
    volume: float = 0.0
    redundancy: float = 0.0

    def __str__(self) -> str:
        return f"{self.name} ({self.seconds * 1e6:.1f} us, {format_bytes(int(self.memory))})"

    @property
    def seconds(self) -> float:
        return self.compute + self.comm


@dataclass(frozen=True)
class Node:
    """A choice to make. `follower`: may take its single producer's layout under merge="followers"."""

    name: str
    options: tuple[Option, ...]
    follower: bool = False

    def __str__(self) -> str:
        return f"{self.name} ({len(self.options)} options)"


def _matrix(m, rows: int, cols: int, what: str) -> np.ndarray:
    a = np.asarray(m, dtype=float)
    if a.shape != (rows, cols):
        raise ILPError(f"{what}: matrix shape {a.shape} is not ({rows}, {cols}) (source x target options)")
    if not np.all(np.isfinite(a)):
        raise ILPError(f"{what}: matrix has non-finite entries")
    return a


@dataclass(frozen=True, eq=False)
class Edge:
    """Data flowing from `src` into input `slot` of `dst`: resharding costs [src option][dst option].

    `seconds` (forward + backward) enters the time objective, `volume` (bytes sent per device) the
    memory objective, `memory` (bytes per device of the converted copy) the steps that list the edge."""

    src: str
    dst: str
    slot: int = 0
    seconds: np.ndarray | Sequence | None = None
    volume: np.ndarray | Sequence | None = None
    memory: np.ndarray | Sequence | None = None

    def __str__(self) -> str:
        return f"{self.src} -> {self.dst}[{self.slot}]"


@dataclass(frozen=True)
class Step:
    """One time step: the nodes whose `memory` and the edges (indices) whose `memory` are live."""

    name: str
    nodes: tuple[str, ...] = ()
    edges: tuple[int, ...] = ()

    def __str__(self) -> str:
        return f"{self.name}: {len(self.nodes)} nodes, {len(self.edges)} edges live"


@dataclass(frozen=True)
class Instance:
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...] = ()
    steps: tuple[Step, ...] = ()
    groups: tuple[tuple[str, ...], ...] = ()  # nodes choosing the same option index
    fixed: tuple[tuple[str, int], ...] = ()  # (node, option index) the user fixed
    allowed: tuple[tuple[str, tuple[int, ...]], ...] = ()  # (node, the options it may take)
    budget: float | None = None  # bytes per device
    base_memory: float = 0.0  # bytes per device at every step, independent of the choices

    def __str__(self) -> str:
        b = f", budget {format_bytes(int(self.budget))}" if self.budget is not None else ""
        return f"ILP instance: {len(self.nodes)} nodes, {len(self.edges)} edges, {len(self.steps)} steps{b}"

    def node(self, name: str) -> Node:
        return self._index()[name]

    def _index(self) -> dict[str, Node]:
        idx = self.__dict__.get("_idx")
        if idx is None:
            idx = {n.name: n for n in self.nodes}
            object.__setattr__(self, "_idx", idx)
        return idx

    def with_budget(self, budget: float | None) -> "Instance":
        """The same instance under another budget; its checks and reductions (which do not depend on
        the budget) are shared, so a sweep over budgets reduces the instance once."""
        new = replace(self, budget=budget)
        for k in ("_valid", "_idx", "_reduced"):
            if k in self.__dict__:
                object.__setattr__(new, k, self.__dict__[k])
        return new

    def validate(self) -> None:
        """Raise ILPError naming the first inconsistency; normalises edge matrices to arrays. An
        instance that passed once is not checked again (it is frozen; its edges are normalised)."""
        if self.__dict__.get("_valid"):
            return
        self._check()
        object.__setattr__(self, "_valid", True)

    def _check(self) -> None:
        idx: dict[str, Node] = {}
        checked: set = set()  # option tuples and matrices shared by many nodes and edges are checked once
        for n in self.nodes:
            if n.name in idx:
                raise ILPError(f"node {n.name!r} is listed twice")
            if not n.options:
                raise ILPError(f"node {n.name!r} has no options")
            if id(n.options) in checked:
                idx[n.name] = n
                continue
            checked.add(id(n.options))
            for o in n.options:
                vals = (o.compute, o.comm, o.memory, o.volume, o.redundancy)
                if not all(math.isfinite(v) for v in vals):
                    raise ILPError(f"node {n.name!r} option `{o.name}` has a non-finite cost")
                if o.memory < 0:
                    raise ILPError(f"node {n.name!r} option `{o.name}` has negative memory")
            idx[n.name] = n
        object.__setattr__(self, "_idx", idx)
        for e in self.edges:
            for end in (e.src, e.dst):
                if end not in idx:
                    raise ILPError(f"edge {e} names unknown node {end!r}")
            r, c = len(idx[e.src].options), len(idx[e.dst].options)
            for attr in ("seconds", "volume", "memory"):
                m = getattr(e, attr)
                if m is None:
                    object.__setattr__(e, attr, np.zeros((r, c)))
                elif not (isinstance(m, np.ndarray) and (id(m), attr) in checked and m.shape == (r, c)):
                    a = _matrix(m, r, c, f"edge {e} {attr}")
                    if attr == "memory" and np.any(a < 0):
                        raise ILPError(f"edge {e} has negative memory")
                    object.__setattr__(e, attr, a)
                    checked.add((id(a), attr))
        named = set().union(*(s.nodes for s in self.steps))
        live_edges = set().union(*(s.edges for s in self.steps))
        if not idx.keys() >= named or (live_edges and not 0 <= min(live_edges) <= max(live_edges) < len(self.edges)):
            for s in self.steps:
                for v in s.nodes:
                    if v not in idx:
                        raise ILPError(f"step {s.name!r} names unknown node {v!r}")
                for i in s.edges:
                    if not 0 <= i < len(self.edges):
                        raise ILPError(f"step {s.name!r} names edge {i}, but there are {len(self.edges)}")
        for g in self.groups:
            for v in g:
                if v not in idx:
                    raise ILPError(f"group {list(g)} names unknown node {v!r}")
            counts = {len(idx[v].options) for v in g}
            if len(counts) > 1:
                raise ILPError(f"group {list(g)}: nodes have different option counts {sorted(counts)}; "
                               "only nodes with the same candidate list can share a choice")
        for v, k in self.fixed:
            if v not in idx:
                raise ILPError(f"fixed choice names unknown node {v!r}")
            if not 0 <= k < len(idx[v].options):
                raise ILPError(f"fixed choice {k} of node {v!r} is out of range (0..{len(idx[v].options) - 1})")
        for v, ks in self.allowed:
            if v not in idx:
                raise ILPError(f"allowed options name unknown node {v!r}")
            if not ks or not all(0 <= k < len(idx[v].options) for k in ks):
                raise ILPError(f"allowed options {list(ks)} of node {v!r} are empty or out of range")


# ------------------------------------------------------------------------------ errors
class ILPError(ValueError):
    """The instance is malformed or its fixed choices contradict each other."""


@dataclass(frozen=True)
class Metrics:
    """What an assignment costs, straight from the instance (no solver involved)."""

    compute: float
    comm: float
    reshard: float
    memory: tuple[float, ...]  # bytes per device at each step
    redundancy: float
    volume: float
    step_names: tuple[str, ...] = field(default=(), repr=False)

    @property
    def time(self) -> float:
        return self.compute + self.comm + self.reshard

    @property
    def peak(self) -> float:
        return max(self.memory, default=0.0)

    @property
    def peak_step(self) -> str:
        if not self.memory:
            return ""
        return self.step_names[int(np.argmax(self.memory))]

    def objective(self, kind: str, alpha: float) -> float:
        if kind == "time":
            return self.time
        if kind == "memory":
            return self.redundancy + alpha * self.volume
        if kind == "peak":
            return self.peak
        raise ValueError(f"no single-metric value for objective {kind!r}")

    def __str__(self) -> str:
        return (f"{self.time * 1e3:.3f} ms (compute {self.compute * 1e3:.3f}, comm {self.comm * 1e3:.3f}, "
                f"reshard {self.reshard * 1e3:.3f}), peak {format_bytes(int(self.peak))}")


def evaluate(inst: Instance, choice: dict[str, int]) -> Metrics:
    """Costs of a full assignment node -> option index (groups and fixed choices are not checked)."""
    idx = inst._index()
    opts = {v: idx[v].options[k] for v, k in choice.items()}
    compute = sum(o.compute for o in opts.values())
    comm = sum(o.comm for o in opts.values())
    red = sum(o.redundancy for o in opts.values())
    vol = sum(o.volume for o in opts.values())
    reshard = 0.0
    edge_mem = []
    for e in inst.edges:
        i, j = choice[e.src], choice[e.dst]
        reshard += float(np.asarray(e.seconds)[i, j])
        vol += float(np.asarray(e.volume)[i, j]) if e.volume is not None else 0.0
        edge_mem.append(float(np.asarray(e.memory)[i, j]) if e.memory is not None else 0.0)
    node_mem = {v: o.memory for v, o in opts.items()}
    mem = tuple(inst.base_memory + sum(map(node_mem.__getitem__, s.nodes)) + sum(map(edge_mem.__getitem__, s.edges))
                for s in inst.steps)
    return Metrics(compute, comm, reshard, mem, red, vol, tuple(s.name for s in inst.steps))


def admissible(inst: Instance, choice: dict[str, int]) -> bool:
    """Does `choice` respect the groups, fixed choices and allowed options (the budget aside)?"""
    return all(choice[v] == k for v, k in inst.fixed) and all(choice[v] in ks for v, ks in inst.allowed) and \
        all(len({choice[v] for v in g}) <= 1 for g in inst.groups)


# ------------------------------------------------------------------------------ options and result
@dataclass(frozen=True)
class Result:
    choice: dict[str, int]  # node -> option index
    objective: str
    value: float  # objective value of `choice`, from the solver
    bound: float | None  # best bound the solver proved (== value when optimal; None if unknown)
    status: str  # "optimal" | "feasible" (time limit or gap reached)
    solver: str  # "HiGHS" | "PULP_CBC_CMD"
    wall: float  # seconds, reduction + every solver call
    lp_integral: bool  # the LP relaxation was integral (no branching needed)
    metrics: Metrics
    stats: tuple[tuple[str, int], ...] = ()  # sizes: classes, variables, rows, ...
    timings: tuple[tuple[str, float], ...] = ()  # seconds: reduce, model, solver (summed over solver calls)

    def option(self, inst: Instance, node: str) -> Option:
        return inst.node(node).options[self.choice[node]]

    def __str__(self) -> str:
        return (f"{self.status} {self.objective} = {self.value:.6g} by {self.solver} in {self.wall:.2f} s"
                f"{' (LP integral)' if self.lp_integral else ''}: {self.metrics}")
