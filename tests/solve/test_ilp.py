"""The intra-op ILP kernel against brute-force enumeration of every strategy combination.

The reference (`reference`) recomputes costs from the instance's raw fields on its own, so the
kernel's `evaluate` is not trusted by the tests that check the solver."""
import dataclasses
import itertools
import math
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from planlang.solve import ilp_backend
from planlang.solve.ilp import (
    Edge, ILPError, InfeasibleBudget, Instance, Node, Option, SolveOptions, SolverFailed, SolveTimeout, Step,
    evaluate, follower_maps, solve,
)

ALPHA = 0.1
ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------ instances and reference
def random_instance(rng: random.Random, n_nodes: int, *, groups=True, fixed=True, followers=True) -> Instance:
    """3-6 nodes with 2-4 options, random DAG edges, random liveness, a random budget."""
    nodes = []
    for i in range(n_nodes):
        k = rng.randint(2, 4)
        nodes.append(Node(f"n{i}", tuple(
            Option(f"s{j}", compute=rng.uniform(0, 1), comm=rng.uniform(0, 0.5), memory=float(rng.randint(1, 10)),
                   volume=float(rng.randint(0, 5)), redundancy=float(rng.randint(0, 5))) for j in range(k)),
            follower=followers and rng.random() < 0.3))
    edges = []
    for j in range(1, n_nodes):
        for i in range(j):
            if rng.random() < 0.45:
                a, b = len(nodes[i].options), len(nodes[j].options)
                seconds = [[0.0 if rng.random() < 0.3 else rng.uniform(0, 1) for _ in range(b)] for _ in range(a)]
                edges.append(Edge(f"n{i}", f"n{j}", 0, seconds,
                                  [[float(rng.randint(0, 4)) for _ in range(b)] for _ in range(a)],
                                  [[float(rng.randint(0, 3)) for _ in range(b)] for _ in range(a)]))
    steps = tuple(Step(f"t{t}", tuple(f"n{i}" for i in range(n_nodes) if i == t or rng.random() < 0.5),
                       tuple(i for i in range(len(edges)) if rng.random() < 0.3)) for t in range(n_nodes))
    grp, fix, allowed = (), (), ()
    if groups:
        by_count: dict[int, list[str]] = {}
        for n in nodes:
            by_count.setdefault(len(n.options), []).append(n.name)
        grp = tuple(tuple(g[:rng.randint(2, len(g))]) for g in by_count.values() if len(g) > 1 and rng.random() < 0.5)
    if fixed:
        fix = tuple((n.name, rng.randrange(len(n.options))) for n in nodes if rng.random() < 0.1)
        allowed = tuple((n.name, tuple(sorted(rng.sample(range(len(n.options)), 2)))) for n in nodes
                        if rng.random() < 0.1)
    return Instance(tuple(nodes), tuple(edges), steps, grp, fix, allowed,
                    budget=float(rng.randint(8, 45)), base_memory=float(rng.choice([0, 0, 2])))


def reference(inst: Instance, choice: dict[str, int]) -> dict[str, float]:
    """Time, memory-objective value and peak of one assignment, from the raw instance fields."""
    inst.validate()  # turns missing volume / memory matrices into zeros
    opt = {n.name: n.options[choice[n.name]] for n in inst.nodes}
    t = sum(o.compute + o.comm for o in opt.values())
    red = sum(o.redundancy for o in opt.values())
    vol = sum(o.volume for o in opt.values())
    for e in inst.edges:
        i, j = choice[e.src], choice[e.dst]
        t += e.seconds[i][j]
        vol += e.volume[i][j]
    peak = max((inst.base_memory + sum(opt[v].memory for v in s.nodes)
                + sum(inst.edges[k].memory[choice[inst.edges[k].src]][choice[inst.edges[k].dst]] for k in s.edges)
                for s in inst.steps), default=0.0)
    return {"time": t, "memory": red + ALPHA * vol, "peak": peak}


def brute_force(inst: Instance) -> list[dict[str, float]]:
    """Costs of every assignment that respects groups, fixed and allowed options."""
    names = [n.name for n in inst.nodes]
    fixed = dict(inst.fixed)
    allowed = dict(inst.allowed)
    out = []
    for combo in itertools.product(*[range(len(n.options)) for n in inst.nodes]):
        ch = dict(zip(names, combo))
        if any(ch[v] != k for v, k in fixed.items()) or any(ch[v] not in ks for v, ks in allowed.items()):
            continue
        if any(len({ch[v] for v in g}) > 1 for g in inst.groups):
            continue
        out.append(reference(inst, ch))
    return out


def best(costs, objective: str, budget) -> float | None:
    ok = [c[objective] for c in costs if budget is None or c["peak"] <= budget]
    return min(ok) if ok else None


def close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(b))


def check_against_brute_force(inst: Instance, objective: str, options: SolveOptions, tally: dict):
    """Solve and compare with the brute-force optimum; returns the result when there is one."""
    costs = brute_force(inst)
    if not costs:  # fixed choices contradict the groups
        with pytest.raises(ILPError, match="contradict"):
            solve(inst, objective, options)
        tally["contradiction"] = tally.get("contradiction", 0) + 1
        return
    want = best(costs, objective, inst.budget)
    if want is None:
        with pytest.raises(InfeasibleBudget) as ei:
            solve(inst, objective, options)
        assert close(ei.value.minimum, best(costs, "peak", None))
        assert ei.value.budget == inst.budget and "peaks at step" in ei.value.cause
        with pytest.raises(InfeasibleBudget) as ei:  # the solver's budget sweep: no least budget asked for
            solve(inst, objective, options, least_when_infeasible=False)
        assert ei.value.minimum is None and ei.value.budget == inst.budget
        tally["infeasible"] = tally.get("infeasible", 0) + 1
        return
    r = solve(inst, objective, options)
    assert solve(inst, objective, options, least_when_infeasible=False).choice == r.choice
    assert close(r.value, want), (objective, r.value, want)
    got = reference(inst, r.choice)  # the returned assignment itself is feasible and has that value
    assert got["peak"] <= inst.budget * (1 + 1e-9) and close(got[objective], want)
    assert r.status == "optimal" and r.bound is not None and r.bound <= r.value + 1e-6 * max(1, abs(r.value))
    tally["optimal"] = tally.get("optimal", 0) + 1
    tally["mip"] = tally.get("mip", 0) + (not r.lp_integral)
    tally["forced"] = tally.get("forced", 0) + (r.solver == "none")  # every node forced: no solver call
    return r


# ------------------------------------------------------------------------------ brute force agreement
@pytest.mark.parametrize("objective", ["time", "memory"])
def test_matches_brute_force_on_random_instances(objective):
    rng = random.Random(2024 if objective == "time" else 7)
    tally: dict[str, int] = {}
    for _ in range(110):
        inst = random_instance(rng, rng.randint(3, 6))
        check_against_brute_force(inst, objective, SolveOptions(merge="exact", alpha=ALPHA), tally)
    assert tally["optimal"] + tally["infeasible"] + tally.get("contradiction", 0) == 110
    # both outcomes and both solve paths were exercised
    assert tally["optimal"] >= 50 and tally["infeasible"] >= 10, tally
    assert tally["mip"] >= 3, tally


def test_min_peak_matches_brute_force():
    rng = random.Random(5)
    for _ in range(25):
        inst = random_instance(rng, rng.randint(3, 6), fixed=False)
        r = solve(inst, "peak", SolveOptions(merge="exact"))
        assert close(r.value, best(brute_force(inst), "peak", None))


def test_balanced_matches_brute_force():
    rng = random.Random(11)
    for _ in range(12):
        inst = random_instance(rng, rng.randint(3, 5), fixed=False).with_budget(None)
        costs = brute_force(inst)
        t_star, p_star = best(costs, "time", None), best(costs, "peak", None)
        want = min(c["time"] / t_star + c["peak"] / p_star for c in costs)
        r = solve(inst, "balanced", SolveOptions(merge="exact"))
        got = reference(inst, r.choice)
        assert close(got["time"] / t_star + got["peak"] / p_star, want)


@pytest.mark.parametrize("objective", ["time", "memory"])
def test_cbc_agrees_with_highs(objective):
    rng = random.Random(99)
    tally: dict[str, int] = {}
    for _ in range(20):
        inst = random_instance(rng, rng.randint(3, 6))
        c = check_against_brute_force(inst, objective, SolveOptions(backend="cbc", merge="exact", alpha=ALPHA), tally)
        if c is not None and c.solver != "none":
            h = solve(inst, objective, SolveOptions(backend="highs", merge="exact", alpha=ALPHA))
            assert (h.solver, c.solver) == ("HiGHS", "PULP_CBC_CMD")
            assert close(h.value, c.value)
    assert tally.get("optimal", 0) >= 8


def test_mip_without_lp_first_agrees():
    rng = random.Random(3)
    tally: dict[str, int] = {}
    for _ in range(15):
        inst = random_instance(rng, rng.randint(3, 6))
        check_against_brute_force(inst, "time", SolveOptions(merge="exact", lp_first=False), tally)
    assert tally["mip"] == tally["optimal"] - tally["forced"] > 5  # every solver call was a MIP


# ------------------------------------------------------------------------------ merging and groups
def test_unmerged_formulation_agrees_with_merged():
    """merge="none" keeps every node a variable, groups and fixed choices as explicit constraints."""
    rng = random.Random(17)
    n = 0
    for _ in range(30):
        inst = random_instance(rng, rng.randint(3, 6))
        for objective in ("time", "memory"):
            try:
                a = solve(inst, objective, SolveOptions(merge="exact", alpha=ALPHA))
            except (InfeasibleBudget, ILPError) as e:
                with pytest.raises(type(e)):
                    solve(inst, objective, SolveOptions(merge="none", alpha=ALPHA))
                continue
            b = solve(inst, objective, SolveOptions(merge="none", alpha=ALPHA))
            assert close(a.value, b.value)
            n += 1
            assert dict(a.stats)["variables"] <= dict(b.stats)["variables"]
    assert n >= 20


def _block(rng: random.Random, prefix: str, spec: list) -> tuple[list[Node], list[Edge]]:
    nodes = [Node(f"{prefix}{i}", opts) for i, opts in enumerate(spec[0])]
    edges = [Edge(f"{prefix}{i}", f"{prefix}{j}", 0, m) for i, j, m in spec[1]]
    return nodes, edges


def test_shared_blocks_keep_the_optimum_of_independent_identical_blocks():
    """Two identical blocks that do not interact choose alike anyway: sharing one variable per pair
    of corresponding nodes (repeated blocks) gives the same optimum as solving them ungrouped."""
    rng = random.Random(23)
    for _ in range(10):
        base = random_instance(rng, rng.randint(3, 5), groups=False, fixed=False, followers=False)
        spec = [[n.options for n in base.nodes],
                [(int(e.src[1:]), int(e.dst[1:]), e.seconds) for e in base.edges]]
        n0, e0 = _block(rng, "a", spec)
        n1, e1 = _block(rng, "b", spec)
        steps = tuple(Step(f"{p}{s.name}", tuple(p + v[1:] for v in s.nodes)) for p in "ab" for s in base.steps)
        groups = tuple((f"a{i}", f"b{i}") for i in range(len(n0)))
        inst = Instance(tuple(n0 + n1), tuple(e0 + e1), steps, budget=None)
        grouped = dataclasses.replace(inst, groups=groups)
        free = solve(inst, "time")
        shared = solve(grouped, "time")
        assert close(shared.value, free.value)
        assert all(shared.choice[f"a{i}"] == shared.choice[f"b{i}"] for i in range(len(n0)))
        assert dict(shared.stats)["variables"] < dict(free.stats)["variables"]


def _metric(rng: random.Random, k: int) -> np.ndarray:
    """A shortest-path distance matrix (zero diagonal, triangle inequality), like conversion costs."""
    d = np.array([[0.0 if i == j else rng.uniform(0.1, 1) for j in range(k)] for i in range(k)])
    for m in range(k):
        d = np.minimum(d, d[:, [m]] + d[[m], :])
    return d


def test_follower_merge_is_exact_for_free_pass_through_nodes():
    """A follower with no cost of its own between a producer and one consumer, under conversion costs
    obeying the triangle inequality, loses nothing by taking its producer's layout."""
    rng = random.Random(31)
    for _ in range(15):
        k = rng.randint(2, 4)
        d = _metric(rng, k)
        opts = lambda: tuple(Option(f"s{j}", compute=rng.uniform(0, 1), memory=float(rng.randint(1, 5)))  # noqa: E731
                             for j in range(k))
        free = tuple(Option(f"s{j}") for j in range(k))
        nodes = (Node("u", opts()), Node("v", free, follower=True), Node("w", opts()))
        edges = (Edge("u", "v", 0, d), Edge("v", "w", 0, d))  # same shape before and after: same costs
        steps = (Step("u", ("u",)), Step("w", ("u", "w")))
        inst = Instance(nodes, edges, steps, budget=float(rng.randint(2, 10)))
        assert "v" in follower_maps(inst)
        try:
            exact = solve(inst, "time", SolveOptions(merge="exact"))
        except InfeasibleBudget:
            with pytest.raises(InfeasibleBudget):
                solve(inst, "time", SolveOptions(merge="followers"))
            continue
        merged = solve(inst, "time", SolveOptions(merge="followers"))
        assert close(merged.value, exact.value)
        assert merged.choice["v"] == merged.choice["u"]
        assert dict(merged.stats)["classes"] < dict(exact.stats)["classes"]


def _with_free_followers(rng: random.Random, inst: Instance) -> Instance:
    """Give every follower with one incoming edge a free option per producer option."""
    ins: dict[str, list[int]] = {}
    for i, e in enumerate(inst.edges):
        ins.setdefault(e.dst, []).append(i)
    edges = list(inst.edges)
    for n in inst.nodes:
        if n.follower and len(ins.get(n.name, [])) == 1:
            e = edges[ins[n.name][0]]
            sec, vol, mem = (np.array(m, dtype=float) for m in (e.seconds, e.volume, e.memory))
            for i in range(sec.shape[0]):
                j = rng.randrange(sec.shape[1])
                sec[i, j] = vol[i, j] = mem[i, j] = 0.0
            edges[ins[n.name][0]] = Edge(e.src, e.dst, e.slot, sec, vol, mem)
    return dataclasses.replace(inst, edges=tuple(edges), budget=None)


def test_follower_merge_is_a_restriction():
    """In general the follower merge restricts the search: never better than the exact optimum, and its
    answer is a real assignment whose costs are what it reports."""
    rng = random.Random(37)
    merged_any = 0
    for _ in range(30):
        inst = _with_free_followers(rng, random_instance(rng, rng.randint(3, 6), groups=False, fixed=False))
        merged_any += bool(follower_maps(inst))
        a = solve(inst, "time", SolveOptions(merge="exact"))
        b = solve(inst, "time", SolveOptions(merge="followers"))
        assert b.value >= a.value - 1e-9
        assert close(reference(inst, b.choice)["time"], b.value)
    assert merged_any >= 3


def test_forced_nodes_fold_into_constants():
    """A node with one option, or fixed, has no variable; the optimum is unchanged."""
    d = [[0, 1, 2], [1, 0, 1]]
    nodes = (Node("p", (Option("only", compute=1.0, memory=3.0),)),
             Node("a", tuple(Option(f"a{j}", compute=c) for j, c in enumerate([1.0, 0.5]))),
             Node("b", tuple(Option(f"b{j}", compute=c) for j, c in enumerate([0.2, 0.1, 0.9]))))
    edges = (Edge("p", "a", 0, [[0.3, 0.0]]), Edge("a", "b", 0, d))
    inst = Instance(nodes, edges, (Step("all", ("p", "a", "b")),), fixed=(("a", 0),))
    r = solve(inst, "time")
    # a fixed to a0: p->a costs 0.3; b: 0.2 + 0 or 0.1 + 1 -> b0
    assert r.choice == {"p": 0, "a": 0, "b": 0}
    assert close(r.value, 1.0 + 1.0 + 0.2 + 0.3)
    assert dict(r.stats)["classes"] == 1  # only b is a variable


# ------------------------------------------------------------------------------ results and errors
def _chain(budget=None) -> Instance:
    """Replicated is fast and big, split is slow and small; b converting a split a costs 1 s and a copy."""
    opts = (Option("rep", compute=1.0, memory=8.0), Option("split", compute=1.0, comm=0.5, memory=2.0))
    edges = (Edge("a", "b", 0, [[0, 0], [1, 0]], memory=[[0, 0], [8, 0]]),)
    steps = (Step("a", ("a",)), Step("b", ("a", "b"), (0,)))
    return Instance((Node("a", opts), Node("b", opts)), edges, steps, budget=budget, base_memory=1.0)


def test_evaluate_by_hand():
    m = evaluate(_chain(), {"a": 1, "b": 0})
    assert (m.compute, m.comm, m.reshard) == (2.0, 0.5, 1.0)
    assert m.memory == (1 + 2, 1 + 2 + 8 + 8) and m.peak == 19 and m.peak_step == "b"


def test_budget_decides_between_fast_and_small():
    # (time, peak): rep/rep (2, 17), rep/split (2.5, 11), split/split (3, 5), split/rep (3.5, 19)
    assert solve(_chain(100), "time").choice == {"a": 0, "b": 0}
    r = solve(_chain(12), "time")
    assert r.choice == {"a": 0, "b": 1} and r.value == 2.5 and r.metrics.peak == 11
    assert solve(_chain(6), "time").choice == {"a": 1, "b": 1}
    assert solve(_chain(6), "peak").value == 5
    with pytest.raises(InfeasibleBudget) as ei:
        solve(_chain(4.0), "time")
    assert ei.value.minimum == 5.0 and "'b'" in ei.value.cause
    assert "at least 5 B" in str(ei.value)


def test_result_records_the_solve():
    r = solve(_chain(100), "time", SolveOptions(backend="highs", threads=1, time_limit=10, gap_rel=1e-4))
    assert r.solver == "HiGHS" and r.status == "optimal" and r.wall > 0 and r.objective == "time"
    assert r.bound == pytest.approx(r.value) and r.metrics.time == pytest.approx(r.value)
    assert "optimal time" in str(r)


@pytest.mark.parametrize("order", [(None, 1, 2, None, 1), (1, None, 3, 1)])
def test_highs_solves_again_with_another_thread_count(order):
    # HiGHS's scheduler is per process and started by the first run's thread count (highspy 1.16 fails a
    # later run with another count unless it is reset); every solve here must still be optimal.
    for threads in order:
        r = solve(_chain(11), "time", SolveOptions(backend="highs", threads=threads, lp_first=False))
        assert r.solver == "HiGHS" and r.status == "optimal" and r.choice == {"a": 0, "b": 1}


def test_highs_writes_nothing_to_stdout(tmp_path):
    # A fresh process: highspy prints its banner on the first Highs() it constructs, from C++.
    script = ("from planlang.solve.ilp import solve, SolveOptions\n"
              "from tests.solve.test_ilp import _chain\n"
              "r = solve(_chain(11), 'time', SolveOptions(backend='highs', threads=1))\n"
              "import sys; print(r.solver, r.status, file=sys.stderr)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "HiGHS optimal" in out.stderr
    assert out.stdout == ""


def test_falls_back_to_cbc_when_highs_fails(monkeypatch):
    def broken(model, mip, options):
        raise SolverFailed("simulated HiGHS crash")

    monkeypatch.setitem(ilp_backend.SOLVERS, "highs", ("HiGHS", broken))
    r = solve(_chain(100), "time")
    assert r.solver == "PULP_CBC_CMD" and r.choice == {"a": 0, "b": 0}
    with pytest.raises(SolverFailed, match="simulated HiGHS crash"):
        solve(_chain(100), "time", SolveOptions(backend="highs"))


@pytest.mark.parametrize("backend", ["highs", "cbc"])
def test_time_limit_without_solution_is_a_clear_error(backend):
    inst = random_instance(random.Random(1), 6, fixed=False).with_budget(None)
    with pytest.raises(SolveTimeout, match="no feasible assignment within the time limit"):
        solve(inst, "time", SolveOptions(backend=backend, time_limit=0.0, lp_first=False))


def test_malformed_instances_are_rejected():
    a = Node("a", (Option("x"), Option("y")))
    b = Node("b", (Option("x"), Option("y"), Option("z")))
    with pytest.raises(ILPError, match=r"matrix shape \(2, 2\) is not \(2, 3\)"):
        solve(Instance((a, b), (Edge("a", "b", 0, [[0, 0], [0, 0]]),)))
    with pytest.raises(ILPError, match="unknown node 'c'"):
        solve(Instance((a, b), (), (Step("t", ("c",)),)))
    with pytest.raises(ILPError, match="different option counts"):
        solve(Instance((a, b), groups=(("a", "b"),)))
    with pytest.raises(ILPError, match="out of range"):
        solve(Instance((a, b), fixed=(("a", 2),)))
    with pytest.raises(ValueError, match="objective 'fastest'"):
        solve(Instance((a, b)), "fastest")
    with pytest.raises(ValueError, match="merge 'all'"):
        SolveOptions(merge="all")


def test_contradicting_fixed_choices_in_a_group():
    a = Node("a", (Option("x"), Option("y")))
    b = Node("b", (Option("x"), Option("y")))
    inst = Instance((a, b), groups=(("a", "b"),), fixed=(("a", 0), ("b", 1)))
    for merge in ("exact", "none"):
        with pytest.raises(ILPError, match="contradict"):
            solve(inst, "time", SolveOptions(merge=merge))


def test_scaling_keeps_microsecond_differences():
    """Seconds around 1e-6 and bytes around 1e10 in one instance: the optimum is still exact."""
    nodes = tuple(Node(f"n{i}", tuple(Option(f"s{j}", compute=1e-3 + j * 1e-7 * (i + 1), memory=1e10 * (3 - j))
                                      for j in range(3))) for i in range(4))
    edges = tuple(Edge(f"n{i}", f"n{i + 1}", 0, [[0 if a == b else 2e-7 for b in range(3)] for a in range(3)])
                  for i in range(3))
    steps = (Step("all", tuple(n.name for n in nodes)),)
    inst = Instance(nodes, edges, steps, budget=7e10)
    costs = brute_force(inst)
    r = solve(inst, "time")
    assert close(r.value, best(costs, "time", 7e10))
    assert not math.isclose(best(costs, "time", None), r.value)  # the budget binds


# ------------------------------------------------------------------------------ reductions of the model
def _with_repeated_options(rng: random.Random, inst: Instance) -> Instance:
    """Copy some options of each node (same costs and the same rows / columns in every edge matrix), as
    op strategies that produce or take the same layout do: pairs then have groups of equal rows."""
    copies = {n.name: [j for j in range(len(n.options))] + [rng.randrange(len(n.options))
                                                             for _ in range(rng.randint(0, 2))] for n in inst.nodes}
    nodes = tuple(Node(n.name, tuple(n.options[j] for j in copies[n.name]), n.follower) for n in inst.nodes)
    edges = tuple(Edge(e.src, e.dst, e.slot, *(np.asarray(m)[np.ix_(copies[e.src], copies[e.dst])]
                                              for m in (e.seconds, e.volume, e.memory))) for e in inst.edges)
    return dataclasses.replace(inst, nodes=nodes, edges=edges, groups=(), fixed=(), allowed=())


@pytest.mark.parametrize("objective", ["time", "memory"])
def test_lumped_edge_variables_match_brute_force(objective):
    """Edge variables per group of equal rows / columns (ilp_backend._pair) keep the optimum."""
    rng = random.Random(41 if objective == "time" else 43)
    tally: dict[str, int] = {}
    lumped = 0
    for _ in range(25):
        inst = _with_repeated_options(rng, random_instance(rng, rng.randint(3, 5)))
        r = check_against_brute_force(inst, objective, SolveOptions(merge="exact", alpha=ALPHA), tally)
        if r is not None and r.solver != "none":
            plain = solve(inst, objective, SolveOptions(merge="none", alpha=ALPHA))
            assert close(plain.value, r.value)
            lumped += dict(r.stats)["variables"] < dict(plain.stats)["variables"]
    assert tally["optimal"] >= 10 and lumped >= 5, (tally, lumped)


def _repeated_blocks(rng: random.Random, k: int) -> Instance:
    """k copies of one random 3-node block in a chain (block i feeds block i + 1), corresponding nodes
    grouped, activations of each block saved to the end (live from their step on), like a layer stack."""
    proto = [tuple(Option(f"s{j}", compute=rng.uniform(0, 1), memory=float(rng.randint(1, 6))) for j in range(3))
             for _ in range(3)]
    mats = [np.array([[0.0 if a == b else rng.uniform(0.1, 1) for b in range(3)] for a in range(3)]) for _ in range(3)]
    copy = [np.array([[0.0 if a == b else float(rng.randint(1, 4)) for b in range(3)] for a in range(3)])
            for _ in range(3)]
    nodes, edges, steps = [], [], []
    for b in range(k):
        nodes += [Node(f"b{b}n{i}", proto[i]) for i in range(3)]
        edges += [Edge(f"b{b}n0", f"b{b}n1", 0, mats[0], memory=copy[0]),
                  Edge(f"b{b}n1", f"b{b}n2", 0, mats[1], memory=copy[1])]
        if b:
            edges.append(Edge(f"b{b - 1}n2", f"b{b}n0", 0, mats[2], memory=copy[2]))
    for t in range(3 * k):
        b, i = divmod(t, 3)
        saved = tuple(f"b{c}n{j}" for c in range(b + 1) for j in range(3) if 3 * c + j <= t)
        conv = tuple(x for x, e in enumerate(edges) if e.dst == f"b{b}n{i}")  # converted input, live now
        steps.append(Step(f"t{t}", saved, conv))
    groups = tuple(tuple(f"b{b}n{i}" for b in range(k)) for i in range(3))
    return Instance(tuple(nodes), tuple(edges), tuple(steps), groups)


def test_memory_rows_do_not_grow_with_repeated_blocks():
    """Rows with equal direct terms are implied by the one with the latest chain index: with the
    blocks' nodes sharing classes, the model has as many rows for 6 blocks as for 3, and the same
    optimum as the plain formulation (every row kept) under a budget that binds."""
    rng = random.Random(47)
    binds = 0
    for _ in range(5):
        sizes = {}
        for k in (3, 6):
            inst = _repeated_blocks(rng, k)
            least = solve(inst, "peak", SolveOptions(merge="exact")).value
            fast = solve(inst, "time", SolveOptions(merge="exact"))
            inst = inst.with_budget((least + fast.metrics.peak) / 2)
            r = solve(inst, "time", SolveOptions(merge="exact"))
            plain = solve(inst, "time", SolveOptions(merge="none"))
            assert close(r.value, plain.value)
            assert reference(inst, r.choice)["peak"] <= inst.budget * (1 + 1e-9)
            sizes[k] = (dict(r.stats)["rows"], dict(r.stats)["variables"])
            assert dict(plain.stats)["rows"] == 3 * k
            binds += r.value > fast.value + 1e-9
        assert sizes[3] == sizes[6], sizes
    assert binds >= 4  # the budget changed the answer, so the memory rows mattered
