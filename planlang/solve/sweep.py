"""Spec sets for the spec holes of one mesh: the intra-op ILP (planlang.solve.intra_op, the plan's fixed
specs as constraints) over map §5.3's budget sweep.

The ILP is built once per mesh on the solve's op graph (traced once, planlang.solve.facts) and solved at
budgets (1 + α)^n · M, n = 0 .. 9 (M the plan's budget), from the tightest up to the budget where the
unconstrained optimum fits, then without a budget: each distinct set of specs is a candidate. A looser
budget buys a faster sharding whose activations no longer fit; the checkpoint stage then wins the memory
back. The memory and balanced objectives solve under their own objective and also price the time
objective's specs. When the ILP cannot run on the model, each option is priced as a whole plan.
"""
from __future__ import annotations

from planlang.plan import types as T

from .anytime import Cut
from .space import SolveError

ALPHA = 0.25  # map §5.3's expansion coefficient: budgets M, 1.25 M, ..., 1.25^9 M (about 7.5 M)
SWEEP = 10
MAX_SPEC_SETS = 3  # spec sets of the sweep refined per mesh (each costs a round of estimates)


def spec_sets(search, assign: dict) -> list[dict[int, T.Spec]]:
    """Spec sets for the spec holes: the intra-op ILP's solutions at budgets (1 + α)^n · M (map
    §5.3), distinct ones in order of increasing budget, ending with the unconstrained optimum; a
    spec with `?` entries is restricted to the layouts that keep its written entries. If the ILP
    cannot run on this model, each hole's option the estimator prices best. Activation holes
    (`output of`, `input of`) and holes with one option are not the ILP's: each option is priced
    with the first set's parameter specs, and the best joins every set."""
    h, space = search.holes, search.space
    if not h.specs:
        return [{}]
    opts = {k: space.spec_options(rule, assign) for k, (rule, _) in enumerate(h.specs)}
    if all(len(o) == 1 for o in opts.values()):
        return [{k: o[0] for k, o in opts.items()}]
    params = [k for k, (rule, _) in enumerate(h.specs) if rule.kind == "param" and len(opts[k]) > 1]
    sets: list[dict[int, T.Spec]] | None = None
    if params:
        try:
            sets = _ilp_spec_sets(search, assign, params)
        except Exception as e:  # noqa: BLE001 - fall back to pricing each option as a whole plan
            search.notes.append(f"intra-op ILP did not run ({type(e).__name__}: {e}); spec options priced by the "
                                "estimator")
    if sets is None:
        specs: dict[int, T.Spec] = {}
        for k in params:
            specs[k] = _priced_spec(search, k, assign, specs, opts[k])
        sets = [specs]
    for k in (k for k in range(len(h.specs)) if k not in params):
        sets[0][k] = opts[k][0] if len(opts[k]) == 1 else _priced_spec(search, k, assign, sets[0], opts[k])
        for other in sets[1:]:
            other[k] = sets[0][k]
    return sets


def _ilp_problem(search, assign: dict[str, int]):
    """The intra-op problem for this mesh, on the solve's op graph, from the candidate of this mesh at
    its defaults (the spec holes left out: the ILP chooses them)."""
    # lazy: torch loads only when this runs
    from planlang.solve.intra_op import build_problem, problem_args

    space = search.space
    fills = space.fills(assign, space.micro_options(assign)[0] if search.holes.micro is not None else None,
                        0, {}, None)
    fills = {key: f for key, f in fills.items() if not key.startswith("spec ")}
    plan = search.checked_value(fills)
    if plan is None:
        raise SolveError("the candidate plan does not check")
    graph = search.facts().op_graph(plan)
    args = problem_args(plan, graph)
    budget = args.pop("budget")
    return build_problem(graph, **args), budget


def _ilp_options(search):
    """Solver options: the time left before the solve's deadline bounds each ILP call."""
    # lazy: numpy loads only when this runs
    from planlang.solve.ilp import SolveOptions

    if search.clock.deadline is None:
        return SolveOptions()
    # half the time left: HiGHS's incumbent at its limit is then priced before the deadline
    return SolveOptions(time_limit=max(0.1, search.clock.left() / 2))


def _ilp_spec_sets(search, assign: dict, which: list[int]) -> list[dict[int, T.Spec]]:
    # lazy: numpy loads only when this runs
    from planlang.solve.ilp import InfeasibleBudget, SolveTimeout, solve as ilp_solve
    from planlang.solve.intra_op import decode

    def solve_ilp(instance, objective, least_when_infeasible=True):
        try:
            extra = {} if least_when_infeasible else {"least_when_infeasible": False}
            result = ilp_solve(instance, objective, _ilp_options(search), **extra)
        except SolveTimeout:  # bounded by the time left: the search's limit is reached
            raise Cut() from None
        if result.status != "optimal":  # HiGHS's incumbent at its time limit: kept, priced if time is left
            search.notes.append(f"intra-op ILP stopped at its time limit with a {result.status} solution "
                                f"(objective {result.value:.4g}, bound {result.bound})")
            search.progress(search.notes[-1])
        return result

    def targets(specs) -> str:
        return ", ".join(f"{search.holes.specs[k][0].target} : {v}" for k, v in specs.items())

    search.clock.check()  # tracing the op graph and building the problem take seconds on a large model
    problem, budget = _ilp_problem(search, assign)
    if search.objective != "time":
        # memory: min-memory-redundancy-ilp's objective (memory redundancy + α · volume, eq. 4–8);
        # balanced: the ILP's time × memory trade-off; neither needs the time objective's sweep. The
        # time objective's specs go on too: memory redundancy alone is indifferent between layouts
        # of equal size (a column split where Megatron's row split would do), and the estimator,
        # which prices whole plans, decides
        out: list[dict[int, T.Spec]] = []
        for objective in (search.objective, "time"):
            # Cut (the deadline inside the ILP) ends the search: --time-limit is hard
            sol = decode(problem, solve_ilp(problem.instance.with_budget(
                budget if objective != "time" else None), objective))
            specs = {k: _spec_choice(search, k, sol, assign) for k in which}
            search.progress(f"intra-op ILP ({objective}, {len(problem.kinds)} nodes): " + targets(specs))
            if specs not in out:
                out.append(specs)
        return out
    free = decode(problem, solve_ilp(problem.instance.with_budget(None), "time"))
    sols = []
    if budget is not None:
        for n in range(SWEEP):
            b = budget * (1 + search.alpha) ** n
            if free.result.metrics.peak <= b:
                break  # this budget and every larger one give the unconstrained optimum
            try:
                # an infeasible budget is skipped: the least budget that would fit is not asked for (its
                # MIP, minimising the peak, took most of the sweep's time, once per infeasible budget)
                sols.append((b, decode(problem, solve_ilp(problem.instance.with_budget(b), "time", False))))
            except InfeasibleBudget:
                continue
            search.clock.expired()  # between the sweep's solves
    sols.append((None, free))
    found: list[dict[int, T.Spec]] = []
    for b, sol in sols:
        specs = {k: _spec_choice(search, k, sol, assign) for k in which}
        where = "unconstrained" if b is None else f"budget {b / 2**30:.3g} GiB"
        search.progress(f"intra-op ILP ({where}, {len(problem.kinds)} nodes): " + targets(specs)
                        + f"; {sol.result.metrics.time * 1e3:.3g} ms, peak {sol.result.metrics.peak / 2**20:.4g} MiB")
        if specs not in found:
            found.append(specs)
    if len(found) > MAX_SPEC_SETS:  # the tightest, the unconstrained optimum, and one between
        found = [found[0], found[len(found) // 2], found[-1]]
    return found


def _spec_choice(search, k: int, sol, assign: dict) -> T.Spec:
    """The ILP's spec for hole `k`: its layout of the parameter, but whole over the data and pipeline
    axes; a spec with `?` entries keeps its written entries (and those a template argument fills)."""
    rule, hole = search.holes.specs[k]
    hits = rule.target.select(list(sol.params))
    if not hits:
        raise SolveError(f"the ILP chose no spec for {rule.target}")
    spec = sol.params[hits[0]]
    # parameters stay whole over data and pipeline axes (ZeRO is the plan's way to shard over data)
    drop = set(search.space.data_axes_of(assign)) | {search.space.pp_axis(assign)}
    chosen = [tuple(a for a in spec.axes_of(d) if a not in drop) for d in range(spec.rank)]
    if isinstance(hole, T.Hole):
        return T.Spec(tuple(chosen))
    used = set(hole.used_axes())
    entries: list[tuple[str, ...] | T.Hole] = []
    for d, x in enumerate(hole.dims):
        if not isinstance(x, T.Hole) or not search.space.literal(x):
            entries.append(x)  # written, or the entry a template argument fills
        else:
            entries.append(tuple(a for a in chosen[d] if a not in used))
    return T.Spec(tuple(entries), hole.partial)


def _priced_spec(search, k: int, assign: dict, fixed: dict[int, T.Spec], opts: list[T.Spec]) -> T.Spec:
    """Each option priced as a whole plan by the estimator; the best under the objective."""
    micro = search.space.micro_options(assign)[0] if search.holes.micro is not None else None
    priced = [(search.price_at(assign, micro, 0, {**fixed, k: opt}, None), i, opt) for i, opt in enumerate(opts)]
    priced = [(c.key(search.objective), i, opt) for c, i, opt in priced if c is not None]
    return min(priced)[2] if priced else opts[0]
