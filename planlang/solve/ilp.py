"""The intra-op sharding ILP: choose one strategy per node of a graph (plain data; no torch).

An `Instance` (ilp_instance.py) holds nodes (each with its candidate strategies, `Option`s), edges with
resharding cost matrices, the liveness of node outputs over time steps, groups of nodes that must choose
alike, and user-fixed choices. The formulation is Alpa's node+edge ILP with time-indexed memory constraints:

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

import time as _time
from typing import Iterable

import numpy as np

from planlang.plan.units import format_bytes

from . import ilp_backend as B
from .ilp_forms import (  # noqa: F401 - SolveOptions and the errors are part of this module's API
    BACKENDS, MERGES, Form, Reduced, SolveOptions, SolverFailed, SolveTimeout,
)
from .ilp_instance import (  # noqa: F401 - the instance's types are part of this module's API
    Edge, ILPError, InfeasibleBudget, Instance, Metrics, Node, Option, Result, Step, admissible, bytes_rounded_up,
    evaluate,
)

OBJECTIVES = ("time", "memory", "peak", "balanced")


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
    out: dict[str, tuple[str, np.ndarray]] = {}
    maps: dict[tuple[int, ...], np.ndarray | None] = {}  # per shared options and edge matrices
    for n in inst.nodes:
        es = ins.get(n.name, [])
        if not n.follower or len(es) != 1 or es[0].src == n.name or n.name in fixed:
            continue
        e = es[0]
        key = (id(n.options), id(e.seconds), id(e.volume), id(e.memory))
        if key not in maps:
            maps[key] = _follower_map(n, e)
        m = maps[key]
        if m is not None:
            out[n.name] = (e.src, m)
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
        kept = red.rows[k][2] if k is not None else None
        if k is None or (ci if ci is not None else -1) > (kept if kept is not None else -1):
            best[key] = r
    keep = sorted(best.values())
    rows = [red.rows[r] for r in keep]
    # merge chain segments no kept row refers to into the next referenced one
    used = sorted({ci for _, _, ci in rows if ci is not None})
    chain: list[Form] = []
    remap: dict[int, int] = {}
    at = 0
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
            clashing = [v for v in sizes0 if uf.find(v)[0] == r]
            raise ILPError(f"the fixed choices of {', '.join(clashing)} contradict each other or their group: "
                           "no option is left")
    cls = {r: i for i, r in enumerate(roots)}
    opts = [np.flatnonzero(uf.allowed[r]) for r in roots]
    sizes = [len(o) for o in opts]
    members: dict[str, tuple[int, np.ndarray]] = {}
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
            scaled[id(e.volume)] = alpha * np.asarray(e.volume)  # an array once the instance is validated
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
            edge_term(form, e, np.asarray(e.seconds) if kind == "time" else edge_volume(e))
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
                raise InfeasibleBudget(budget, None)  # type: ignore[arg-type]
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
        terms.append((float(np.asarray(e.memory)[choice[e.src], choice[e.dst]]), str(e)))
    terms = sorted((t for t in terms if t[0] > 0), reverse=True)
    top = ", ".join(f"{name} {format_bytes(int(b))}" for b, name in terms[:3])
    more = f" and {len(terms) - 3} more" if len(terms) > 3 else ""
    return f"it peaks at step {step.name!r}: {top}{more}" if top else f"it peaks at step {step.name!r}"
