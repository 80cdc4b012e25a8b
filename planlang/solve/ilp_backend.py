"""The intra-op ILP as sparse arrays, solved by HiGHS in-process (highspy) or PuLP's bundled CBC.

`run(reduced, goal, budget, options)` builds one model from a `Reduced` instance (ilp.py):

    x[c][j] binary, sum_j x[c][j] = 1                     one option per class of merged nodes
    e[c,d][j][k] in [0,1], sum_k e = x[c][j], sum_j e = x[d][k]     per pair of classes an edge couples
    m[i] = m[i-1] + (chain terms i)                       memory that stays live to the last step
    (direct terms of step t) + m[chain(t)] <= budget      (or <= P when the goal weighs peak memory P)

The model is plain numpy arrays (costs, bounds, integrality, the constraint matrix as coordinates),
built with whole-array operations per class and per pair rather than one expression object per term:
HiGHS takes them as one column-wise matrix (`highspy.HighsLp`); CBC, the fallback, gets a PuLP model
made from the same arrays. The LP relaxation is solved first; when every x is integral it is optimal
for the MIP too (its bound cannot exceed the MIP optimum and the point is feasible), otherwise the MIP
is solved. Coefficients are scaled so the largest is 1 (objective) and memory rows are in units of
the budget or the largest term, keeping the solvers' absolute tolerances (1e-6..1e-7) meaningful for
seconds and bytes alike. Values are recomputed from the chosen options in Python, not read back from
the solver.
"""
from __future__ import annotations

import ctypes
import os
import re
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from .ilp_forms import Form, Reduced, SolverFailed, SolveOptions, SolveTimeout

INTEGRAL_TOL = 1e-6
INF = float("inf")


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
    rows: int = 0
    timings: tuple[tuple[str, float], ...] = ()  # ("model", s), ("solver", s)

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


# ------------------------------------------------------------------------------ model as arrays
@dataclass
class _Model:
    """min cost . v  s.t.  row_lower <= A v <= row_upper, lower <= v <= upper, v[integer] integral."""

    cost: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    integer: np.ndarray  # bool per column
    row_lower: np.ndarray
    row_upper: np.ndarray
    a_rows: np.ndarray  # constraint matrix as coordinates (no duplicates)
    a_cols: np.ndarray
    a_vals: np.ndarray
    x: dict[int, np.ndarray]  # class -> its option columns
    factor: float  # model objective = factor * (true objective - constant)
    const: float
    solution: np.ndarray | None = None
    solver_state: dict = field(default_factory=dict)  # a backend's own model, kept between LP and MIP

    @property
    def variables(self) -> int:
        return len(self.cost)

    @property
    def rows(self) -> int:
        return len(self.row_lower)


class _Builder:
    """Columns and rows appended as blocks; the matrix collected as coordinate arrays."""

    def __init__(self) -> None:
        self.lower: list[np.ndarray] = []
        self.upper: list[np.ndarray] = []
        self.integer: list[np.ndarray] = []
        self.ncol = 0
        self.rlo: list[np.ndarray] = []
        self.rhi: list[np.ndarray] = []
        self.nrow = 0
        self.ri: list[np.ndarray] = []
        self.ci: list[np.ndarray] = []
        self.vi: list[np.ndarray] = []

    def cols(self, n: int, lo: float, hi: float, integer: bool) -> np.ndarray:
        self.lower.append(np.full(n, lo))
        self.upper.append(np.full(n, hi))
        self.integer.append(np.full(n, integer))
        idx = np.arange(self.ncol, self.ncol + n)
        self.ncol += n
        return idx

    def rows(self, lo, hi, n: int = 1) -> int:
        """Append n rows with bounds lo..hi (scalars or arrays); returns the first row's index."""
        self.rlo.append(np.broadcast_to(np.asarray(lo, dtype=float), (n,)).copy())
        self.rhi.append(np.broadcast_to(np.asarray(hi, dtype=float), (n,)).copy())
        first = self.nrow
        self.nrow += n
        return first

    def coef(self, rows, cols, vals) -> None:
        rows, cols = np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)
        vals = np.broadcast_to(np.asarray(vals, dtype=float), cols.shape)
        rows = np.broadcast_to(rows, cols.shape)
        self.ri.append(rows.ravel())
        self.ci.append(cols.ravel())
        self.vi.append(vals.ravel())

    def matrix(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if not self.ri:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
        r, c, v = np.concatenate(self.ri), np.concatenate(self.ci), np.concatenate(self.vi)
        keep = v != 0
        r, c, v = r[keep], c[keep], v[keep]
        key = r * max(self.ncol, 1) + c
        uniq, inv = np.unique(key, return_inverse=True)  # sum a column's repeated terms in one row
        if len(uniq) != len(key):
            v = np.bincount(inv, weights=v, minlength=len(uniq))
            r, c = uniq // max(self.ncol, 1), uniq % max(self.ncol, 1)
            keep = v != 0
            r, c, v = r[keep], c[keep], v[keep]
        return r, c, v


@dataclass
class _Pair:
    """The edge variables of a pair of classes (c, d): one per (row group, column group), where a group
    is a set of options whose rows (columns) are equal in every form's matrix for the pair."""

    cols: np.ndarray  # column indices, row-major over (row group, column group)
    row_rep: np.ndarray  # one option of c per row group
    col_rep: np.ndarray  # one option of d per column group
    row_group: np.ndarray  # group of each option of c
    col_group: np.ndarray


def _groups(stacked: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(a representative row per group of equal rows, each row's group), groups in order of first row."""
    _, first, inverse = np.unique(stacked, axis=0, return_index=True, return_inverse=True)
    order = np.argsort(first)  # renumber groups by first occurrence, for a stable column order
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return first[order], rank[inverse.ravel()]


def _pair(b: "_Builder", key: tuple[int, int], sizes: list[int], mats: list[np.ndarray], lump: bool) -> _Pair:
    """Columns and marginal rows of one pair. The cost of x_c = i, x_d = j only depends on the groups
    of i and j, so e over groups, with each group's marginal equal to the sum of its members' x, is the
    same model: an integral x gives the same e; any e over groups splits into one over options with
    the same marginals (in proportion to the members' x), so the LP relaxation is the same too."""
    nc, nd = sizes[key[0]], sizes[key[1]]
    if lump:
        row_rep, row_group = _groups(np.hstack(mats))
        col_rep, col_group = _groups(np.vstack(mats).T)
    else:
        row_rep = row_group = np.arange(nc)
        col_rep = col_group = np.arange(nd)
    gr, gc = len(row_rep), len(col_rep)
    cols = b.cols(gr * gc, 0.0, 1.0, False)
    return _Pair(cols, row_rep, col_rep, row_group, col_group)


def _terms(form: Form, x: dict[int, np.ndarray], e: dict[tuple[int, int], _Pair], scale: float):
    """Columns and coefficients of a form's variable part, divided by `scale`."""
    cols, vals = [], []
    for c, vec in form.lin.items():
        cols.append(x[c])
        vals.append(np.asarray(vec, dtype=float) / scale)
    for key, m in form.pair.items():
        p = e[key]
        cols.append(p.cols)
        vals.append(np.asarray(m, dtype=float)[p.row_rep[:, None], p.col_rep].ravel() / scale)
    if not cols:
        return np.zeros(0, np.int64), np.zeros(0)
    return np.concatenate(cols), np.concatenate(vals)


def build(red: Reduced, goal: Goal, budget: float | None) -> _Model:
    b = _Builder()
    x = {c: b.cols(n, 0.0, 1.0, True) for c, n in enumerate(red.sizes) if n > 1}
    for c, cols in x.items():  # one option per class
        b.coef(b.rows(1.0, 1.0), cols, 1.0)
    use_memory = budget is not None or goal.peak > 0
    forms = ([red.objectives[goal.objective]] if goal.objective else [])
    mem_forms = (red.chain + [f for _, f, _ in red.rows]) if use_memory else []
    mats: dict[tuple[int, int], list[np.ndarray]] = {}
    for f in forms + mem_forms:
        for key, m in f.pair.items():
            mats.setdefault(key, []).append(m)
    e = {}
    for key in sorted(mats):  # e[c,d] linearises x_c x_d^T: its rows sum to x_c, its columns to x_d
        c, d = key
        p = e[key] = _pair(b, key, red.sizes, mats[key], red.lump)
        gr, gc = len(p.row_rep), len(p.col_rep)
        r0 = b.rows(0.0, 0.0, gr)
        b.coef(r0 + np.repeat(np.arange(gr), gc), p.cols, 1.0)
        b.coef(r0 + p.row_group, x[c], -1.0)
        r1 = b.rows(0.0, 0.0, gc)
        b.coef(r1 + np.tile(np.arange(gc), gr), p.cols, 1.0)
        b.coef(r1 + p.col_group, x[d], -1.0)
    for a, c in red.equal:
        if a != c and a in x and c in x:
            r = b.rows(0.0, 0.0, red.sizes[a])
            b.coef(r + np.arange(red.sizes[a]), x[a], 1.0)
            b.coef(r + np.arange(red.sizes[a]), x[c], -1.0)
    for c, k in red.fixes:
        if c in x:
            b.coef(b.rows(1.0, 1.0), x[c][k], 1.0)
    for c, k in red.forbid:
        if c in x:
            b.coef(b.rows(0.0, 0.0), x[c][k], 1.0)

    mem_scale = max(_forms_scale(mem_forms), budget or 0.0, 1.0)
    peak_col = int(b.cols(1, 0.0, INF, False)[0]) if goal.peak > 0 else None
    if use_memory:
        chain_cols = b.cols(len(red.chain), -INF, INF, False) if red.chain else np.zeros(0, np.int64)
        for i, f in enumerate(red.chain):  # m_i - m_{i-1} - terms_i = const_i
            r = b.rows(f.const / mem_scale, f.const / mem_scale)
            b.coef(r, chain_cols[i], 1.0)
            if i:
                b.coef(r, chain_cols[i - 1], -1.0)
            cols, vals = _terms(f, x, e, mem_scale)
            b.coef(r, cols, -vals)
        if peak_col is not None and budget is not None:
            b.coef(b.rows(-INF, budget / mem_scale), peak_col, 1.0)
        for name, f, ci in red.rows:
            if peak_col is not None:
                r = b.rows(-INF, -f.const / mem_scale)
                b.coef(r, peak_col, -1.0)
            else:
                r = b.rows(-INF, (budget - f.const) / mem_scale)  # type: ignore[operator]
            cols, vals = _terms(f, x, e, mem_scale)
            b.coef(r, cols, vals)
            if ci is not None:
                b.coef(r, chain_cols[ci], 1.0)

    cost = np.zeros(b.ncol)
    const = 0.0
    scale = 0.0
    if goal.objective:
        form = red.objectives[goal.objective]
        scale = goal.weight * form.scale()
        const += goal.weight * form.const
    if peak_col is not None:
        scale = max(scale, goal.peak * mem_scale)
    scale = scale or 1.0
    if goal.objective:
        cols, vals = _terms(red.objectives[goal.objective], x, e, scale / goal.weight)
        np.add.at(cost, cols, vals)
    if peak_col is not None:
        cost[peak_col] += goal.peak * mem_scale / scale
    rows, columns, values = b.matrix()
    return _Model(cost, np.concatenate(b.lower), np.concatenate(b.upper), np.concatenate(b.integer),
                  np.concatenate(b.rlo) if b.rlo else np.zeros(0), np.concatenate(b.rhi) if b.rhi else np.zeros(0),
                  rows, columns, values, x, 1.0 / scale, const)


# ------------------------------------------------------------------------------ solvers
def _highs_model(model: _Model, highspy):
    """The model as one column-wise HighsLp (all columns continuous; integrality is set per call)."""
    order = np.lexsort((model.a_rows, model.a_cols))
    cols = model.a_cols[order]
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = model.variables, model.rows
    lp.col_cost_ = model.cost
    lp.col_lower_ = np.where(np.isinf(model.lower), -highspy.kHighsInf, model.lower)
    lp.col_upper_ = np.where(np.isinf(model.upper), highspy.kHighsInf, model.upper)
    lp.row_lower_ = np.where(np.isinf(model.row_lower), -highspy.kHighsInf, model.row_lower)
    lp.row_upper_ = np.where(np.isinf(model.row_upper), highspy.kHighsInf, model.row_upper)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    per_col = np.bincount(cols, minlength=model.variables)
    lp.a_matrix_.start_ = np.concatenate([[0], np.cumsum(per_col)]).astype(np.int32)
    lp.a_matrix_.index_ = model.a_rows[order].astype(np.int32)
    lp.a_matrix_.value_ = model.a_vals[order]
    return lp


def _new_highs(highspy):
    """A Highs instance, HiGHS's banner kept off stdout.

    highspy (1.16) prints "Running HiGHS ... Copyright" from C++ on the process's stdout the first
    time a Highs is constructed, before `output_flag` can be set; `planlang solve PLAN > out.plan`
    would write it into the plan. So file descriptor 1 points at /dev/null while one is built."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 1)
            try:
                return highspy.Highs()
            finally:
                _flush_c_stdout()
                os.dup2(saved, 1)
    finally:
        os.close(saved)


def _flush_c_stdout() -> None:
    """Flush C's stdout buffer, so what HiGHS printed goes where fd 1 pointed when it printed."""
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):  # no C runtime to reach (not expected on Linux/macOS)
        pass


# HiGHS runs on one scheduler per process, started by the first run with that run's `threads` option;
# a later run asking another count fails with kError (highspy 1.16) unless the scheduler is reset.
_scheduler_threads: int | None = None


def _use_scheduler(highspy, threads: int) -> None:
    """Restart HiGHS's global scheduler when this run asks another thread count (0: HiGHS's default)."""
    global _scheduler_threads
    if _scheduler_threads is not None and _scheduler_threads != threads:
        reset = getattr(highspy.Highs, "resetGlobalScheduler", None)
        if reset is not None:  # older highspy versions have neither the method nor the failure
            reset(True)
    _scheduler_threads = threads


def _solve_highs(model: _Model, mip: bool, options: SolveOptions) -> tuple[str, float | None]:
    try:
        # lazy: the solver backend loads only when an ILP is solved
        import highspy
    except ImportError as e:
        raise _Unavailable("highspy is not installed") from e
    h = model.solver_state.get("highs")
    if h is None:
        h = _new_highs(highspy)
        h.setOptionValue("output_flag", bool(options.msg))
        if options.time_limit is not None:
            h.setOptionValue("time_limit", float(options.time_limit))
        h.setOptionValue("mip_rel_gap", float(options.gap_rel))
        h.setOptionValue("mip_abs_gap", 1e-9)
        if options.threads:
            h.setOptionValue("threads", int(options.threads))
        if h.passModel(_highs_model(model, highspy)) == highspy.HighsStatus.kError:
            raise SolverFailed("HiGHS rejected the model")
        model.solver_state["highs"] = h
        model.solver_state["highs_mip"] = False
    if model.solver_state["highs_mip"] != mip:
        idx = np.flatnonzero(model.integer).astype(np.int32)
        kind = highspy.HighsVarType.kInteger if mip else highspy.HighsVarType.kContinuous
        h.changeColsIntegrality(len(idx), idx, np.full(len(idx), int(kind), dtype=np.uint8))
        model.solver_state["highs_mip"] = mip
    _use_scheduler(highspy, int(options.threads or 0))
    if h.run() == highspy.HighsStatus.kError:
        raise SolverFailed("HiGHS failed while solving")
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
    model.solution = np.asarray(h.getSolution().col_value, dtype=float)
    bound = info.mip_dual_bound if mip and model.integer.any() else info.objective_function_value
    return status, float(bound) if bound is not None and np.isfinite(bound) else None


def _pulp_model(model: _Model, pulp, mip: bool):
    """The same arrays as a PuLP problem (for CBC)."""
    prob = pulp.LpProblem("intra_op", pulp.LpMinimize)
    cat = pulp.LpBinary if mip else pulp.LpContinuous
    vs = []
    for i in range(model.variables):
        lo = None if np.isinf(model.lower[i]) else float(model.lower[i])
        hi = None if np.isinf(model.upper[i]) else float(model.upper[i])
        vs.append(prob.add_variable(f"v{i}", lo, hi, cat=cat if model.integer[i] else pulp.LpContinuous))
    order = np.argsort(model.a_rows, kind="stable")
    rows, cols, vals = model.a_rows[order], model.a_cols[order], model.a_vals[order]
    starts = np.searchsorted(rows, np.arange(model.rows + 1))
    for r in range(model.rows):
        sl = slice(starts[r], starts[r + 1])
        expr = pulp.LpAffineExpression([(vs[c], float(v)) for c, v in zip(cols[sl].tolist(), vals[sl].tolist())])
        lo, hi = model.row_lower[r], model.row_upper[r]
        if lo == hi:
            prob += expr == float(lo), f"r{r}"
        else:
            if not np.isinf(hi):
                prob += expr <= float(hi), f"r{r}u"
            if not np.isinf(lo):
                prob += expr >= float(lo), f"r{r}l"
    prob += pulp.LpAffineExpression([(vs[i], float(c)) for i, c in enumerate(model.cost) if c])
    return prob, vs


def _solve_cbc(model: _Model, mip: bool, options: SolveOptions) -> tuple[str, float | None]:
    # lazy: the solver backend loads only when an ILP is solved
    import pulp

    with warnings.catch_warnings():  # PuLP 3.3 flags its bundled CBC as going away in 4.0
        warnings.simplefilter("ignore", DeprecationWarning)
        solver = pulp.PULP_CBC_CMD(mip=mip, msg=False, timeLimit=options.time_limit, gapRel=options.gap_rel,
                                   threads=options.threads)
    if not solver.available():
        raise _Unavailable("PuLP's CBC binary is not available")
    prob, vs = _pulp_model(model, pulp, mip)
    fd, log = tempfile.mkstemp(suffix=".log", prefix="planlang_cbc_")
    os.close(fd)
    try:
        solver.optionsDict["logPath"] = log
        try:
            status = prob.solve(solver)
        except pulp.PulpSolverError as e:
            raise SolverFailed(str(e)) from e
        with open(log) as fh:
            text = fh.read()
    finally:
        os.unlink(log)
    if options.msg:
        print(text)
    if status == pulp.LpStatusInfeasible or prob.sol_status == pulp.LpSolutionInfeasible:
        return "infeasible", None
    if "Stopped on time" in text or "stopped on time" in text:
        if prob.sol_status not in (pulp.LpSolutionIntegerFeasible, pulp.LpSolutionOptimal):
            raise SolveTimeout(f"CBC found no feasible assignment within the time limit of "
                               f"{options.time_limit} s; raise the time limit or merge more nodes")
        model.solution = np.array([v.varValue or 0.0 for v in vs])
        bound = re.search(r"Lower bound:\s*([-+0-9.eE]+)", text)
        return "feasible", float(bound.group(1)) if bound else None
    if status != pulp.LpStatusOptimal:
        raise SolverFailed(f"CBC stopped with status {pulp.LpStatus[status]}")
    model.solution = np.array([v.varValue or 0.0 for v in vs])
    return "optimal", None


SOLVERS = {"highs": ("HiGHS", _solve_highs), "cbc": ("PULP_CBC_CMD", _solve_cbc)}


def _picks(model: _Model, sizes: list[int]) -> tuple[list[int], bool]:
    picks, integral = [], True
    sol = model.solution if model.solution is not None else np.zeros(model.variables)
    for c, n in enumerate(sizes):
        if c not in model.x:
            picks.append(0)
            continue
        vals = sol[model.x[c]]
        j = int(np.argmax(vals))
        integral &= bool(abs(vals[j] - 1.0) <= INTEGRAL_TOL and np.all(np.abs(np.delete(vals, j)) <= INTEGRAL_TOL))
        picks.append(j)
    return picks, integral


def _solve_with(name: str, model: _Model, red: Reduced, goal: Goal, options: SolveOptions) -> Raw:
    label, fn = SOLVERS[name]
    lp_integral = False
    model.solution = None
    if options.lp_first:
        status, bound = fn(model, False, options)
        if status == "infeasible":
            return Raw([], float("nan"), None, "infeasible", label, False, model.variables, model.rows)
        picks, lp_integral = _picks(model, red.sizes)
    if not lp_integral:
        status, bound = fn(model, True, options)
        if status == "infeasible":
            return Raw([], float("nan"), None, "infeasible", label, False, model.variables, model.rows)
        picks, integral = _picks(model, red.sizes)
        if not integral:
            raise SolverFailed(f"{label} returned a fractional assignment for the MIP")
    value = goal_value(red, goal, picks)
    true_bound: float | None
    if lp_integral or (status == "optimal" and bound is None):
        true_bound = value
    else:
        true_bound = bound / model.factor + model.const if bound is not None else None
    return Raw(picks, value, true_bound, "optimal" if lp_integral else status, label, lp_integral,
               model.variables, model.rows)


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
    t0 = time.perf_counter()
    model = build(red, goal, budget)
    t1 = time.perf_counter()
    names = ["highs", "cbc"] if options.backend == "auto" else [options.backend]
    errors = []
    for name in names:
        try:
            raw = _solve_with(name, model, red, goal, options)
            raw.timings = (("model", t1 - t0), ("solver", time.perf_counter() - t1))
            return raw
        except (_Unavailable, SolverFailed) as e:
            errors.append(f"{SOLVERS[name][0]}: {e}")
    raise SolverFailed("no ILP solver succeeded (" + "; ".join(errors) + "); install highspy or check PuLP's CBC")
