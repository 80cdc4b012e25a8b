"""The intra-op sharding ILP: choose one strategy per node of a graph (plain data; no torch).

An `Instance` holds nodes (each with its candidate strategies, `Option`s), edges with resharding cost
matrices, the liveness of node outputs over time steps, groups of nodes that must choose alike, and
user-fixed choices. The formulation is Alpa's node+edge ILP with time-indexed memory constraints:

    x_v in {0,1}^|S_v|, sum x_v = 1                   one strategy per node
    e_uv in [0,1]^(|S_u| x |S_v|), rows sum to x_u, columns to x_v
                                                      (linearises x_u x_v^T; integral whenever x is)
    time       = sum_v x_v . (C_v + B_v) + sum_uv <e_uv, R_uv>
    memory_t   = base + sum_{v live at t} x_v . M_v + sum_{uv live at t} <e_uv, M_uv>     per step t

Objectives (`solve(..., objective=)`):

* ``"time"`` - min time s.t. memory_t <= budget at every step: map-memory-aware-auto-parallel §5.1
  eq. 1 (compute C, the strategy's own collectives B, resharding R), with the memory constraint per
  step of the liveness instead of the sum over all nodes.
* ``"memory"`` - min sum_v x_v . D_v + alpha * (sum_v x_v . V_v + sum_uv <e_uv, V_uv>) s.t. the same
  budget: min-memory-redundancy-ilp §3.5 eq. 5 (D = memory redundancy per device, eq. 4; V =
  communication volume in bytes, of the strategies and of resharding). Its edge-selection constraints
  eq. 7-8 (an auxiliary edge is chosen iff both its ends are, in/out degree preserved) are the same
  marginal constraints on e_uv as above.
* ``"peak"`` - min max_t memory_t: the smallest budget any assignment fits.
* ``"balanced"`` - min time / T* + peak / P* s.t. the budget, where T* and P* are the optima of
  "time" and "peak" (each term 1 at its own optimum).

Before solving, nodes are merged (`SolveOptions.merge`): nodes in a group share one variable; a node
whose choice is forced (one option, or fixed) becomes constants folded into its neighbours; an edge
whose cost matrix is a sum of a row and a column term needs no edge variables; with "followers",
nodes marked `follower` (elementwise ops) that have one producer take the producer's layout (map
§5.1 merges such computationally trivial nodes; this one restricts the search, the others are exact).
Memory that stays live to the last step is accumulated in a chain of variables; of the memory rows
whose other terms are equal (repeated blocks sharing classes give many), only the one with the latest
chain index is kept, which implies the others, so the model stops growing with the number of blocks
(`_drop_dominated_rows`; exact). The LP relaxation is solved first and taken when integral, else the
MIP (ilp_backend.py). merge="none" keeps the plain formulation (every node, every row, edge variables
per option pair) as a reference for these reductions.
"""
from __future__ import annotations

import math
import time as _time
from dataclasses import dataclass, field, replace
from typing import Iterable, Sequence

import numpy as np

from planlang.plan.units import format_bytes

from . import ilp_backend as B
from .ilp_forms import (  # noqa: F401 - SolveOptions and the errors are part of this module's API
    BACKENDS, MERGES, Form, Reduced, SolveOptions, SolverFailed, SolveTimeout,
)

OBJECTIVES = ("time", "memory", "peak", "balanced")


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


class InfeasibleBudget(Exception):
    """No assignment fits the budget; `minimum` is the smallest budget that admits one (None when the
    caller did not ask for it: `solve(..., least_when_infeasible=False)`)."""

    def __init__(self, budget: float, minimum: float | None, cause: str) -> None:
        self.budget, self.minimum, self.cause = budget, minimum, cause
        if minimum is None:
            super().__init__(f"no sharding fits the budget of {format_bytes(int(budget))} per device")
            return
        need = bytes_rounded_up(minimum)
        super().__init__(
            f"no sharding fits the budget of {format_bytes(int(budget))} per device; the least memory any "
            f"choice needs is {need} ({cause}). Raise the budget to at least {need}, add devices, or allow "
            "more sharding (fewer fixed specs).")


def bytes_rounded_up(n: float) -> str:
    """Like format_bytes, but never below `n` (a budget written with it is enough)."""
    for unit, scale in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            v = math.ceil(n / scale * 100 - 1e-9) / 100
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.2f} {unit}"
    return f"{math.ceil(n - 1e-9):.0f} B"


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


# ------------------------------------------------------------------------------ reduction
class _Classes:
    """Union-find over nodes: a node's option is `map[root option]`; roots carry allowed options."""

    def __init__(self, sizes: dict[str, int]) -> None:
        self.parent = {v: v for v in sizes}
        self.map = {v: np.arange(n) for v, n in sizes.items()}
        self.allowed = {v: np.ones(n, dtype=bool) for v, n in sizes.items()}

    def find(self, v: str) -> tuple[str, np.ndarray]:
        p = self.parent[v]
        if p == v:
            return v, self.map[v]
        r, mp = self.find(p)
        self.parent[v], self.map[v] = r, self.map[v][mp]
        return r, self.map[v]

    def tie(self, a: str, b: str, f: np.ndarray) -> bool:
        """Make b's option f[a's option]. False (and nothing changed) when that needs a non-injective
        inverse; when a and b already share a class, options that disagree are disallowed."""
        ra, ma = self.find(a)
        rb, mb = self.find(b)
        target = f[ma]  # b's option for each option of a's root
        if ra == rb:
            self.allowed[ra] &= target == mb
            return True
        inv = np.full(max(int(mb.max()), int(target.max())) + 1, -1)
        inv[mb] = np.arange(len(mb))
        if np.count_nonzero(inv >= 0) != len(mb):  # b's root options map to fewer options of b
            return False
        g = inv[target]
        ok = g >= 0
        g[~ok] = 0
        self.allowed[ra] &= ok & self.allowed[rb][g]
        self.parent[rb], self.map[rb] = ra, g
        return True


def follower_maps(inst: Instance) -> dict[str, tuple[str, np.ndarray]]:
    """Nodes marked `follower` with exactly one incoming edge, from a different node, and for every
    producer option a free option (zero seconds, volume and memory on that edge): node -> (producer,
    the follower's option for each producer option, the cheapest free one)."""
    inst.validate()
    ins: dict[str, list[Edge]] = {}
    for e in inst.edges:
        ins.setdefault(e.dst, []).append(e)
    fixed = {v for v, _ in inst.fixed} | {v for v, _ in inst.allowed}
    out = {}
    maps: dict[tuple[int, ...], np.ndarray | None] = {}  # per shared options and edge matrices
    for n in inst.nodes:
        es = ins.get(n.name, [])
        if not n.follower or len(es) != 1 or es[0].src == n.name or n.name in fixed:
            continue
        e = es[0]
        key = (id(n.options), id(e.seconds), id(e.volume), id(e.memory))
        if key not in maps:
            maps[key] = _follower_map(n, e)
        if maps[key] is not None:
            out[n.name] = (e.src, maps[key])
    return out


def _follower_map(n: Node, e: Edge) -> np.ndarray | None:
    """For each producer option, the follower's cheapest option reached for free; None if one has none."""
    free = (np.asarray(e.seconds) == 0) & (np.asarray(e.volume) == 0) & (np.asarray(e.memory) == 0)
    if not free.any(axis=1).all():
        return None
    own = np.array([(o.seconds, o.memory, o.redundancy) for o in n.options])
    f = []
    for i in range(free.shape[0]):
        cands = np.flatnonzero(free[i])
        f.append(min(cands, key=lambda j: (own[j, 0], own[j, 1], own[j, 2], j)))
    return np.array(f, dtype=int)


def _liveness(inst: Instance) -> tuple[dict, dict]:
    """Split live items into those live from some step to the last (accumulated in a chain) and the
    rest (added to each row directly): ({start step: [items]}, {step: [items]}). An item is ("n", node)
    or ("e", edge index). One sweep compares each step's set with the previous one, so the work per
    step is set operations rather than a loop over everything live; a run of steps that ends before
    the last step is direct, the run that reaches it goes to the chain."""
    T = len(inst.steps)
    suffix: dict[int, list] = {}
    direct: dict[int, list] = {}
    begun: dict[tuple[str, object], int] = {}
    prev_n: set = set()
    prev_e: set = set()
    for t, s in enumerate(inst.steps):
        cur_n, cur_e = set(s.nodes), set(s.edges)
        ended = [("n", v) for v in sorted(prev_n - cur_n)] + [("e", i) for i in sorted(prev_e - cur_e)]
        for item in ended:
            for u in range(begun.pop(item), t):
                direct.setdefault(u, []).append(item)
        for item in [("n", v) for v in sorted(cur_n - prev_n)] + [("e", i) for i in sorted(cur_e - prev_e)]:
            begun[item] = t
        prev_n, prev_e = cur_n, cur_e
    for item, t0 in begun.items():
        suffix.setdefault(t0, []).append(item)
    return suffix, {t: direct[t] for t in sorted(direct)} if T else {}


def _form_key(form: Form) -> tuple:
    """Equal keys: equal forms (same constant and coefficients)."""
    return (form.const, tuple((c, v.tobytes()) for c, v in sorted(form.lin.items())),
            tuple((k, m.tobytes()) for k, m in sorted(form.pair.items())))


def _drop_dominated_rows(red: "Reduced", base_memory: float) -> None:
    """Keep one memory row per distinct set of direct terms: the one with the latest chain index.

    Every term of the chain is memory (>= 0 for any choice), so chain values never decrease along the
    chain; of two rows with equal direct terms the later chain index is never smaller, and the other
    row is implied (no optimum changes; max over rows, the peak, is the same). Repeated blocks give
    equal rows (their nodes share classes), so the rows left, and the chain segments they refer to,
    stop growing with the number of blocks. A row without a chain term is implied by one with it
    only when the base memory (the chain's constant) is not negative."""
    best: dict[tuple, int] = {}
    for r, (_, form, ci) in enumerate(red.rows):
        key = _form_key(form) if base_memory >= 0 else (_form_key(form), ci is None)
        k = best.get(key)
        if k is None or (ci if ci is not None else -1) > (red.rows[k][2] if red.rows[k][2] is not None else -1):
            best[key] = r
    keep = sorted(best.values())
    rows = [red.rows[r] for r in keep]
    # merge chain segments no kept row refers to into the next referenced one
    used = sorted({ci for _, _, ci in rows if ci is not None})
    chain, remap, at = [], {}, 0
    for ci in used:
        merged = Form()
        for f in red.chain[at:ci + 1]:
            merged.add(f)
        remap[ci] = len(chain)
        chain.append(merged)
        at = ci + 1
    red.chain = chain
    red.rows = [(name, form, remap[ci] if ci is not None else None) for name, form, ci in rows]


def reduce_instance(inst: Instance, objectives: Iterable[str], merge: str = "followers", alpha: float = 0.1) -> Reduced:
    """Merge nodes into classes and express objectives and memory rows over class variables."""
    sizes0 = {n.name: len(n.options) for n in inst.nodes}
    uf = _Classes(sizes0)
    equal_nodes: list[tuple[str, str]] = []
    if merge == "none":
        for g in inst.groups:
            equal_nodes += [(g[0], v) for v in g[1:]]
    else:
        for g in inst.groups:
            for v in g[1:]:
                uf.tie(g[0], v, np.arange(sizes0[v]))
        if merge == "followers":
            for v, (u, f) in follower_maps(inst).items():
                uf.tie(u, v, f)
        for v, ks in [(v, (k,)) for v, k in inst.fixed] + list(inst.allowed):
            r, m = uf.find(v)
            uf.allowed[r] &= np.isin(m, ks)
    roots = sorted({uf.find(v)[0] for v in sizes0}, key=list(sizes0).index)
    for r in roots:
        if not uf.allowed[r].any():
            members = [v for v in sizes0 if uf.find(v)[0] == r]
            raise ILPError(f"the fixed choices of {', '.join(members)} contradict each other or their group: "
                           "no option is left")
    cls = {r: i for i, r in enumerate(roots)}
    opts = [np.flatnonzero(uf.allowed[r]) for r in roots]
    sizes = [len(o) for o in opts]
    members = {}
    for v in sizes0:
        r, m = uf.find(v)
        members[v] = (cls[r], m[opts[cls[r]]])
    red = Reduced(sizes, members, {}, [], [], lump=merge != "none")
    if merge == "none":
        red.equal = [(members[a][0], members[b][0]) for a, b in equal_nodes]
        red.fixes = [(members[v][0], k) for v, k in inst.fixed]
        red.forbid = [(members[v][0], k) for v, ks in inst.allowed for k in range(sizes[members[v][0]]) if k not in ks]

    # a node whose class options are its own options in order (most of them) needs no re-indexing
    whole = {v: len(m) == sizes0[v] and bool(np.all(m[1:] > m[:-1])) for v, (_, m) in members.items()}

    def node_term(form: Form, v: str, values: np.ndarray) -> None:
        c, m = members[v]
        form.add_node(c, sizes[c], values if whole[v] else values[m])

    def edge_term(form: Form, e: Edge, mat: np.ndarray) -> None:
        cu, mu = members[e.src]
        cv, mv = members[e.dst]
        sub = mat if whole[e.src] and whole[e.dst] else mat[mu[:, None], mv]
        form.add_edge(cu, sizes[cu], cv, sizes[cv], sub)

    # per-option vectors, once per option tuple (nodes of repeated blocks share theirs)
    vectors: dict[tuple[int, str], np.ndarray] = {}

    def option_vector(n: Node, what: str) -> np.ndarray:
        key = (id(n.options), what)
        if key not in vectors:
            if what == "time":
                vectors[key] = np.array([o.seconds for o in n.options])
            elif what == "memory":
                vectors[key] = np.array([o.redundancy + alpha * o.volume for o in n.options])
            else:
                vectors[key] = np.array([o.memory for o in n.options], dtype=float)
        return vectors[key]

    scaled: dict[int, np.ndarray] = {}

    def edge_volume(e: Edge) -> np.ndarray:
        if id(e.volume) not in scaled:
            scaled[id(e.volume)] = alpha * e.volume
        return scaled[id(e.volume)]

    def finish(form: Form) -> Form:
        if merge != "none":
            form.fold_separable()
        form.drop_zeros()
        return form

    for kind in objectives:
        form = Form()
        for n in inst.nodes:
            node_term(form, n.name, option_vector(n, kind))
        for e in inst.edges:
            edge_term(form, e, e.seconds if kind == "time" else edge_volume(e))
        red.objectives[kind] = finish(form)

    mem = {n.name: option_vector(n, "bytes") for n in inst.nodes}

    def mem_form(items, const: float = 0.0) -> Form:
        form = Form(const)
        for kind, it in items:
            if kind == "n":
                node_term(form, it, mem[it])
            else:
                edge_term(form, inst.edges[it], inst.edges[it].memory)
        return finish(form)

    suffix, direct = _liveness(inst)
    chain_at = None
    for t, s in enumerate(inst.steps):
        if t in suffix or (t == 0 and inst.base_memory):
            red.chain.append(mem_form(suffix.get(t, []), inst.base_memory if t == 0 else 0.0))
            chain_at = len(red.chain) - 1
        red.rows.append((s.name, mem_form(direct.get(t, [])), chain_at))
    if merge != "none":  # "none" keeps the plain formulation, a reference for the reductions
        _drop_dominated_rows(red, inst.base_memory)
    return red


# ------------------------------------------------------------------------------ driver
def solve(inst: Instance, objective: str = "time", options: SolveOptions = SolveOptions(), *,
          least_when_infeasible: bool = True) -> Result:
    """The best assignment for `objective` (see module docstring) under `inst.budget`.

    Raises InfeasibleBudget (with the smallest feasible budget) when nothing fits, SolveTimeout when
    the time limit passes before any feasible assignment is found, ILPError for a malformed instance.
    `least_when_infeasible=False`: InfeasibleBudget without the smallest budget and its cause, which
    take a MIP of their own (minimising the peak: seconds on a large model, often most of a solve's
    time) — for callers that only need to know that the budget is infeasible (the solver's budget
    sweep)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective {objective!r}: choose one of {', '.join(OBJECTIVES)}")
    t0 = _time.perf_counter()
    inst.validate()
    needs = {"time": ["time"], "memory": ["memory"], "peak": [], "balanced": ["time"]}[objective]
    reduced = inst.__dict__.setdefault("_reduced", {})  # per objective terms and merge; not the budget
    key = (tuple(needs), options.merge, options.alpha)
    if key not in reduced:
        reduced[key] = reduce_instance(inst, needs, options.merge, options.alpha)
    red = reduced[key]
    t_reduced = _time.perf_counter()
    budget = inst.budget
    runs: list[B.Raw] = []

    def run(goal: "B.Goal", budget: float | None) -> "B.Raw":
        runs.append(B.run(red, goal, budget, options))
        return runs[-1]

    def least_peak() -> "B.Raw":
        raw = run(B.Goal(peak=1.0), None)
        if raw.infeasible:  # only equalities left (merge="none"): fixed choices against groups
            raise ILPError("the fixed choices contradict the groups: no assignment satisfies both")
        return raw

    if objective == "peak":
        raw = least_peak()
    else:
        goal = B.Goal(objective="time" if objective == "balanced" else objective)
        raw = run(goal, budget)
        if raw.infeasible:
            if not least_when_infeasible:
                raise InfeasibleBudget(budget, None, "")  # type: ignore[arg-type]
            peak = least_peak()
            cause = _peak_cause(inst, red.decode(peak.picks))
            raise InfeasibleBudget(budget, peak.value, cause)  # type: ignore[arg-type]
        if objective == "balanced":
            t_star = max(raw.value, 1e-30)
            p_star = max(least_peak().value, 1.0)
            raw = run(B.Goal(objective="time", weight=1.0 / t_star, peak=1.0 / p_star), budget)
    choice = red.decode(raw.picks)
    metrics = evaluate(inst, choice)
    stats = (("nodes", len(inst.nodes)), ("classes", sum(1 for s in red.sizes if s > 1)),
             ("edge_pairs", len(red.pairs())), ("steps", len(inst.steps)), ("rows", len(red.rows)),
             ("variables", raw.variables), ("lp_rows", raw.rows))
    timings = [("reduce", t_reduced - t0)]
    for what in ("model", "solver"):
        timings.append((what, sum(dict(r.timings).get(what, 0.0) for r in runs)))
    return Result(choice, objective, raw.value, raw.bound, raw.status, raw.solver, _time.perf_counter() - t0,
                  raw.lp_integral, metrics, stats, tuple(timings))


def min_peak(inst: Instance, options: SolveOptions = SolveOptions()) -> Result:
    """The assignment with the least peak memory per device (the smallest feasible budget)."""
    return solve(inst, "peak", options)


def _peak_cause(inst: Instance, choice: dict[str, int]) -> str:
    """Where the least-memory assignment peaks and what is live there, largest first."""
    m = evaluate(inst, choice)
    if not inst.steps:
        return "no steps"
    t = int(np.argmax(m.memory))
    step = inst.steps[t]
    terms = [(inst.node(v).options[choice[v]].memory, v) for v in dict.fromkeys(step.nodes)]
    for i in dict.fromkeys(step.edges):
        e = inst.edges[i]
        terms.append((float(e.memory[choice[e.src], choice[e.dst]]), str(e)))
    terms = sorted((t for t in terms if t[0] > 0), reverse=True)
    top = ", ".join(f"{name} {format_bytes(int(b))}" for b, name in terms[:3])
    more = f" and {len(terms) - 3} more" if len(terms) > 3 else ""
    return f"it peaks at step {step.name!r}: {top}{more}" if top else f"it peaks at step {step.name!r}"
