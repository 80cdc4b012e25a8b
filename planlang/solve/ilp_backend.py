"""The intra-op ILP as a PuLP model, solved by HiGHS in-process (highspy) or PuLP's bundled CBC.

`run(reduced, goal, budget, options)` builds one model from a `Reduced` instance (ilp.py):

    x[c][j] binary, sum_j x[c][j] = 1                     one option per class of merged nodes
    e[c,d][j][k] in [0,1], sum_k e = x[c][j], sum_j e = x[d][k]     per pair of classes an edge couples
    m[i] = m[i-1] + (chain terms i)                       memory that stays live to the last step
    (direct terms of step t) + m[chain(t)] <= budget      (or <= P when the goal weighs peak memory P)

The LP relaxation is solved first; when every x is integral it is optimal for the MIP too (its bound
cannot exceed the MIP optimum and the point is feasible), otherwise the MIP is solved. Coefficients
are scaled so the largest is 1 (objective) and memory rows are in units of the budget or the largest
term, keeping the solvers' absolute tolerances (1e-6..1e-7) meaningful for seconds and bytes alike.
Values are recomputed from the chosen options in Python, not read back from the solver.
"""
from __future__ import annotations

import os
import re
import tempfile
import warnings
from dataclasses import dataclass

import numpy as np
import pulp

from .ilp import Form, Reduced, SolverFailed, SolveOptions, SolveTimeout

INTEGRAL_TOL = 1e-6


@dataclass(frozen=True)
class Goal:
    """Minimise weight * (objective form) + peak * (peak memory in bytes)."""

    objective: str | None = None  # "time" | "memory": a form of Reduced.objectives
    weight: float = 1.0
    peak: float = 0.0


@dataclass
class Raw:
    picks: list[int]
    value: float
    bound: float | None
    status: str  # "optimal" | "feasible" | "infeasible"
    solver: str
    lp_integral: bool
    variables: int

    @property
    def infeasible(self) -> bool:
        return self.status == "infeasible"


class _Unavailable(Exception):
    pass


# ------------------------------------------------------------------------------ values in Python
def form_value(form: Form, picks: list[int]) -> float:
    v = form.const
    for c, vec in form.lin.items():
        v += float(vec[picks[c]])
    for (c, d), m in form.pair.items():
        v += float(m[picks[c], picks[d]])
    return v


def step_memory(red: Reduced, picks: list[int]) -> list[float]:
    chain, acc = [], 0.0
    for f in red.chain:
        acc += form_value(f, picks)
        chain.append(acc)
    return [form_value(f, picks) + (chain[i] if i is not None else 0.0) for _, f, i in red.rows]


def goal_value(red: Reduced, goal: Goal, picks: list[int]) -> float:
    v = goal.weight * form_value(red.objectives[goal.objective], picks) if goal.objective else 0.0
    if goal.peak:
        v += goal.peak * max(step_memory(red, picks), default=0.0)
    return v


def _forms_scale(forms) -> float:
    return max([f.scale() for f in forms] + [abs(f.const) for f in forms], default=0.0)


# ------------------------------------------------------------------------------ model
@dataclass
class _Model:
    prob: pulp.LpProblem
    x: dict[int, list[pulp.LpVariable]]
    factor: float  # model objective = factor * (true objective - constant)
    const: float
    variables: int


def _expr(form: Form, x, e, scale: float) -> list[tuple[pulp.LpVariable, float]]:
    terms = []
    for c, vec in form.lin.items():
        terms += [(x[c][j], float(a) / scale) for j, a in enumerate(vec) if a]
    for key, m in form.pair.items():
        ev = e[key]
        rows, cols = np.nonzero(m)
        terms += [(ev[j][k], float(m[j, k]) / scale) for j, k in zip(rows.tolist(), cols.tolist())]
    return terms


def build(red: Reduced, goal: Goal, budget: float | None) -> _Model:
    prob = pulp.LpProblem("intra_op", pulp.LpMinimize)
    x = {c: [prob.add_variable(f"x{c}_{j}", cat=pulp.LpBinary) for j in range(n)]
         for c, n in enumerate(red.sizes) if n > 1}
    nvars = sum(len(v) for v in x.values())
    for c, xs in x.items():
        prob += pulp.LpAffineExpression([(v, 1.0) for v in xs]) == 1, f"one_{c}"
    use_memory = budget is not None or goal.peak > 0
    forms = ([red.objectives[goal.objective]] if goal.objective else [])
    mem_forms = (red.chain + [f for _, f, _ in red.rows]) if use_memory else []
    keys: set[tuple[int, int]] = set()
    for f in forms + mem_forms:
        keys |= set(f.pair)
    e = {}
    for key in sorted(keys):
        c, d = key
        ev = [[prob.add_variable(f"e{c}_{d}_{j}_{k}", 0, 1) for k in range(red.sizes[d])] for j in range(red.sizes[c])]
        e[key] = ev
        nvars += red.sizes[c] * red.sizes[d]
        for j in range(red.sizes[c]):
            prob += pulp.LpAffineExpression([(v, 1.0) for v in ev[j]] + [(x[c][j], -1.0)]) == 0, f"row_{c}_{d}_{j}"
        for k in range(red.sizes[d]):
            prob += pulp.LpAffineExpression([(ev[j][k], 1.0) for j in range(red.sizes[c])] + [(x[d][k], -1.0)]) == 0, \
                f"col_{c}_{d}_{k}"
    for a, b in red.equal:
        if a != b and a in x and b in x:
            for j in range(red.sizes[a]):
                prob += x[a][j] - x[b][j] == 0, f"eq_{a}_{b}_{j}"
    for c, k in red.fixes:
        if c in x:
            prob += x[c][k] == 1, f"fix_{c}_{k}"
    for c, k in red.forbid:
        if c in x:
            prob += x[c][k] == 0, f"forbid_{c}_{k}"

    mem_scale = max(_forms_scale(mem_forms), budget or 0.0, 1.0)
    peak_var = prob.add_variable("peak", 0) if goal.peak > 0 else None
    if use_memory:
        chain_vars = []
        for i, f in enumerate(red.chain):
            m = prob.add_variable(f"m{i}")
            prev = [(chain_vars[-1], -1.0)] if chain_vars else []
            prob += pulp.LpAffineExpression([(m, 1.0)] + prev + [(v, -a) for v, a in _expr(f, x, e, mem_scale)]) \
                == f.const / mem_scale, f"chain_{i}"
            chain_vars.append(m)
        nvars += len(chain_vars)
        if peak_var is not None and budget is not None:
            prob += peak_var <= budget / mem_scale, "budget"
        for t, (name, f, ci) in enumerate(red.rows):
            terms = _expr(f, x, e, mem_scale) + ([(chain_vars[ci], 1.0)] if ci is not None else [])
            if peak_var is not None:
                terms.append((peak_var, -1.0))
                rhs = -f.const / mem_scale
            else:
                rhs = (budget - f.const) / mem_scale  # type: ignore[operator]
            prob += pulp.LpAffineExpression(terms) <= rhs, f"mem_{t}"

    obj_terms: list[tuple[pulp.LpVariable, float]] = []
    const = 0.0
    scale = 0.0
    if goal.objective:
        form = red.objectives[goal.objective]
        scale = goal.weight * form.scale()
        const += goal.weight * form.const
    if peak_var is not None:
        scale = max(scale, goal.peak * mem_scale)
    scale = scale or 1.0
    if goal.objective:
        obj_terms += _expr(red.objectives[goal.objective], x, e, scale / goal.weight)
    if peak_var is not None:
        obj_terms.append((peak_var, goal.peak * mem_scale / scale))
        nvars += 1
    prob += pulp.LpAffineExpression(obj_terms)
    return _Model(prob, x, 1.0 / scale, const, nvars)


# ------------------------------------------------------------------------------ solvers
def _solve_highs(model: _Model, mip: bool, options: SolveOptions) -> tuple[str, float | None]:
    solver = pulp.HiGHS(mip=mip, msg=options.msg, timeLimit=options.time_limit, gapRel=options.gap_rel,
                        gapAbs=1e-9, threads=options.threads)
    if not solver.available():
        raise _Unavailable("highspy is not installed")
    import highspy

    model.prob.solve(solver)
    h = model.prob.solverModel
    ms = h.getModelStatus()
    info = h.getInfo()
    S = highspy.HighsModelStatus
    if ms in (S.kInfeasible, S.kUnboundedOrInfeasible):
        return "infeasible", None
    has_solution = info.primal_solution_status == 2  # kSolutionStatusFeasible
    if ms == S.kOptimal:
        status = "optimal"
    elif ms in {S.kTimeLimit, S.kInterrupt, S.kIterationLimit, getattr(S, "kSolutionLimit", S.kTimeLimit)}:
        if not has_solution:
            raise SolveTimeout(f"HiGHS found no feasible assignment within the time limit of "
                               f"{options.time_limit} s; raise the time limit or merge more nodes")
        status = "feasible"
    else:
        raise SolverFailed(f"HiGHS stopped with status {h.modelStatusToString(ms)}")
    bound = info.mip_dual_bound if mip and model.prob.isMIP() else info.objective_function_value
    return status, float(bound) if bound is not None and np.isfinite(bound) else None


def _solve_cbc(model: _Model, mip: bool, options: SolveOptions) -> tuple[str, float | None]:
    with warnings.catch_warnings():  # PuLP 3.3 flags its bundled CBC as going away in 4.0
        warnings.simplefilter("ignore", DeprecationWarning)
        solver = pulp.PULP_CBC_CMD(mip=mip, msg=False, timeLimit=options.time_limit, gapRel=options.gap_rel,
                                   threads=options.threads)
    if not solver.available():
        raise _Unavailable("PuLP's CBC binary is not available")
    fd, log = tempfile.mkstemp(suffix=".log", prefix="planlang_cbc_")
    os.close(fd)
    try:
        solver.optionsDict["logPath"] = log
        status = model.prob.solve(solver)
        with open(log) as fh:
            text = fh.read()
    finally:
        os.unlink(log)
    if options.msg:
        print(text)
    if status == pulp.LpStatusInfeasible or model.prob.sol_status == pulp.LpSolutionInfeasible:
        return "infeasible", None
    if "Stopped on time" in text or "stopped on time" in text:
        if model.prob.sol_status not in (pulp.LpSolutionIntegerFeasible, pulp.LpSolutionOptimal):
            raise SolveTimeout(f"CBC found no feasible assignment within the time limit of "
                               f"{options.time_limit} s; raise the time limit or merge more nodes")
        bound = re.search(r"Lower bound:\s*([-+0-9.eE]+)", text)
        return "feasible", float(bound.group(1)) if bound else None
    if status != pulp.LpStatusOptimal:
        raise SolverFailed(f"CBC stopped with status {pulp.LpStatus[status]}")
    return "optimal", None


SOLVERS = {"highs": ("HiGHS", _solve_highs), "cbc": ("PULP_CBC_CMD", _solve_cbc)}


def _picks(model: _Model, sizes: list[int]) -> tuple[list[int], bool]:
    picks, integral = [], True
    for c, n in enumerate(sizes):
        if c not in model.x:
            picks.append(0)
            continue
        vals = np.array([v.varValue or 0.0 for v in model.x[c]])
        j = int(np.argmax(vals))
        integral &= bool(abs(vals[j] - 1.0) <= INTEGRAL_TOL and np.all(np.abs(np.delete(vals, j)) <= INTEGRAL_TOL))
        picks.append(j)
    return picks, integral


def _solve_with(name: str, model: _Model, red: Reduced, goal: Goal, options: SolveOptions) -> Raw:
    label, fn = SOLVERS[name]
    lp_integral = False
    if options.lp_first:
        status, bound = fn(model, False, options)
        if status == "infeasible":
            return Raw([], float("nan"), None, "infeasible", label, False, model.variables)
        picks, lp_integral = _picks(model, red.sizes)
    if not lp_integral:
        status, bound = fn(model, True, options)
        if status == "infeasible":
            return Raw([], float("nan"), None, "infeasible", label, False, model.variables)
        picks, integral = _picks(model, red.sizes)
        if not integral:
            raise SolverFailed(f"{label} returned a fractional assignment for the MIP")
    value = goal_value(red, goal, picks)
    if lp_integral or (status == "optimal" and bound is None):
        true_bound = value
    else:
        true_bound = bound / model.factor + model.const if bound is not None else None
    return Raw(picks, value, true_bound, "optimal" if lp_integral else status, label, lp_integral, model.variables)


def run(red: Reduced, goal: Goal, budget: float | None, options: SolveOptions) -> Raw:
    """Solve; `options.backend` "auto" tries HiGHS and falls back to CBC when HiGHS is missing or
    fails (an infeasible model or a time-out is an answer, not a failure)."""
    if not any(n > 1 for n in red.sizes):
        picks = [0] * len(red.sizes)
        mem = step_memory(red, picks)
        if budget is not None and max(mem, default=0.0) > budget:
            return Raw(picks, float("nan"), None, "infeasible", "none", True, 0)
        v = goal_value(red, goal, picks)
        return Raw(picks, v, v, "optimal", "none", True, 0)
    model = build(red, goal, budget)
    names = ["highs", "cbc"] if options.backend == "auto" else [options.backend]
    errors = []
    for name in names:
        try:
            return _solve_with(name, model, red, goal, options)
        except (_Unavailable, SolverFailed, pulp.PulpSolverError) as e:
            errors.append(f"{SOLVERS[name][0]}: {e}")
    raise SolverFailed("no ILP solver succeeded (" + "; ".join(errors) + "); install highspy or check PuLP's CBC")
