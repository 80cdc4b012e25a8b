"""Plan quality on the papers' configurations: predicted per-device peak memory and step time of

* the best Megatron-style (dp, tp, pp) grid plan (Narayanan et al. 2021; the baseline of
  min-memory-redundancy-ilp §4.1, map §7 and, through Alpa, capture §IV): every factorization of the
  device count, Megatron tensor parallelism over tp, equal-block stages over pp, no ZeRO, no recomputation;
  "best" = the fastest plan within the budget (the smallest peak when none fits);
* pure data parallelism (dp = all devices);
* ZeRO-2 data parallelism (gradients and AdamW states sharded over dp);
* a uniform pipeline split (equal blocks per stage, 1F1B; all devices in the pipeline when the layers
  allow, else the deepest equal split with data-parallel replicas);
* ours: `planlang solve` on a partial plan (bench/plan_configs/partial/) under each objective
  (time, memory, balanced), each solve stopped after --solve-limit CPU seconds;

as absolute figures and as ratios to the best grid plan. Configurations: bench/plan_configs/configs.py.
Steps are the estimator's (compute + data-parallel all-reduce); a second pass ("with communication",
--traffic alone) prices them as `planlang solve` does with planlang.runtime.traffic's per-step collectives,
on the configurations that model covers (no pipeline block).

Run: .venv/bin/python bench/plan_quality.py [--quick] [--traffic] [--solve-limit S] [--config TEXT ...]
[--out FILE [--append]] [--write-plans DIR]. The full run (no --quick/--config/--traffic: both passes,
about 13 CPU-minutes) writes bench/results/plan_quality.txt.
"""
from __future__ import annotations

import argparse
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.plan_configs.configs import CONFIGS, Config  # noqa: E402
from bench.plan_configs.plans import (Layout, NotApplicable, baseline, grid, parameter_count,  # noqa: E402
                                      partial_text, plan_text)

PLAN_DIR = ROOT / "bench" / "plan_configs"
RESULT = ROOT / "bench" / "results" / "plan_quality.txt"
OBJECTIVES = ("time", "memory", "balanced")

CAVEATS = """\
Caveats (read before the numbers):
* Everything is PREDICTED by planlang.model.estimate (nothing is run). Its step time is compute
  (flops / (f32 peak x 0.5)) plus the data-parallel gradient all-reduce only: tensor-parallel
  collectives, pipeline bubbles and activation transfers between stages are NOT priced, so plans with
  more tensor or pipeline parallelism look faster than they are, and step ratios of such plans are
  optimistic (the pass "With communication" at the end prices them where the traffic model can). Peak
  memory: parameters, gradients, AdamW states, the runtime's buffers, activations of the microbatches in
  flight, transients (backward, the flat data-parallel gradient sum, the optimizer step).
* Where a configuration has a microbatch count (map, capture), every plan splits the batch into it: a
  pipeline of one stage is gradient accumulation. Microbatches in flight follow the estimator's 1F1B
  rule for every strategy alike.
* Embeddings and the LM head are replicated over tp in every plan (examples/gpt2/gpt2_3d.plan's layout).
* "ours" is `planlang solve` on the partial plan: mesh sizes, ZeRO stage, stages, the MLP's three
  parameter specs and checkpointing are holes; attention is fixed to Megatron's split. A solve that
  fails or passes --solve-limit is reported as such, not dropped.
* Ratios are strategy / best grid plan (peak and step); < 1 is better. "paper" lines quote the paper's
  own measured ratio of its plan to Megatron-LM's, for orientation only (different hardware, measured).
"""


@dataclass(frozen=True)
class Outcome:
    """One strategy on one configuration."""
    strategy: str
    layout: str
    peak: int | None = None  # bytes on the largest device
    step: float | None = None  # seconds of the slowest device
    fits: bool = False
    note: str = ""
    seconds: float = 0.0  # CPU seconds spent on it

    def __str__(self) -> str:
        return f"{self.strategy}: {self.layout}"


class SolveTimeout(BaseException):
    """Raised from solve's progress callback to stop a solve at the time limit. A BaseException, so the
    driver's `except Exception` fallbacks (which catch failures of a single candidate) let it through."""


# ------------------------------------------------------------------------------ pricing
def price_text(text: str, path: Path, traffic: bool = False) -> tuple[int, float, bool]:
    """(peak bytes, step seconds, fits the budget) of a complete plan, as driver.price() does. With
    `traffic`, the step is the estimator's compute plus planlang.runtime.traffic's per-step collectives
    (tensor-parallel ones included) in place of the estimator's data-parallel all-reduce, as `planlang
    solve` prices candidates; ValueError for plans that model does not cover."""
    from planlang.lang.render import render
    from planlang.model.estimate import estimate_plan
    from planlang.plan.checker import check_text

    res = check_text(text, str(path))
    if res.errors or res.plan is None:
        raise ValueError("the plan does not check:\n" + render(list(res.diagnostics), res.sources, "concise"))
    rows = estimate_plan(res.plan)
    peak, step = max(r.peak for r in rows), max(r.step_time for r in rows)
    if traffic:
        from planlang.runtime.traffic import step_comm_seconds

        step = max(r.step_time - data_sync_seconds(res.plan, r) for r in rows) + step_comm_seconds(res.plan)
    return peak, step, res.plan.budget is None or peak <= res.plan.budget.bytes


def data_sync_seconds(plan, row) -> float:
    """The data-parallel gradient all-reduce planlang.model.estimate adds to a row's step time: the row's
    local parameter bytes (whole again under ZeRO-3) all-reduced over the data axes of size > 1."""
    from planlang.cost.comm import Collective, price
    from planlang.plan import types as T

    mesh = plan.mesh
    if mesh is None or mesh.device is None or not mesh.device.flops:
        return 0.0
    axes = sorted({a for d in plan.data if isinstance(d.spec, T.Spec) and d.spec.dims
                   for a in d.spec.axes_of(0) if (mesh.axis_size(a) or 1) > 1})
    if not axes:
        return 0.0
    opt = plan.optimizer
    zero = opt.zero_stage if opt is not None and isinstance(opt.zero_stage, int) else 0
    zero_n = (mesh.axis_size(opt.zero_axis) or 1) if opt is not None and isinstance(opt.zero_axis, str) else 1
    return price(Collective.ALL_REDUCE, mesh, axes, row.parameters * (zero_n if zero >= 3 else 1)).seconds


def price_layout(cfg: Config, lay: Layout, strategy: str, write: Path | None, traffic: bool = False) -> Outcome:
    t = time.process_time()
    text = plan_text(cfg, lay, strategy)
    if write is not None:
        name = f"{cfg.slug}__{strategy.split()[0].lower()}_dp{lay.dp}_tp{lay.tp}_pp{lay.pp}_z{lay.zero}.plan"
        (write / name).write_text(text)
    try:
        peak, step, fits = price_text(text, PLAN_DIR / f"{cfg.slug}.plan", traffic)
    except Exception as e:  # noqa: BLE001 - a plan the estimator cannot price: say so in the table
        return Outcome(strategy, str(lay), note=f"not priced: {type(e).__name__}: {str(e).splitlines()[0]}",
                       seconds=time.process_time() - t)
    return Outcome(strategy, str(lay), peak, step, fits, seconds=time.process_time() - t)


def best_grid(points: list[Outcome]) -> Outcome | None:
    """The fastest grid plan within the budget; the smallest peak when none fits."""
    priced = [o for o in points if o.peak is not None]
    fitting = [o for o in priced if o.fits]
    if fitting:
        return min(fitting, key=lambda o: (o.step, o.peak))
    return min(priced, key=lambda o: (o.peak, o.step)) if priced else None


def solved_layout(text: str, path: Path) -> tuple[str, str]:
    """(mesh, ZeRO and checkpointing; the MLP's specs) of a solved plan, read back from its text rather
    than from solver internals."""
    from planlang.plan import types as T
    from planlang.plan.checker import check_text

    plan = check_text(text, str(path)).plan
    if plan is None or plan.mesh is None:
        return "?", ""
    parts = [f"{a.name}={a.size}" for a in plan.mesh.axes]
    if plan.optimizer is not None and isinstance(plan.optimizer.zero_stage, int) and plan.optimizer.zero_stage:
        parts.append(f"zero={plan.optimizer.zero_stage}")
    ckpt = [ln.strip()[len("checkpoint "):] for ln in text.splitlines() if ln.strip().startswith("checkpoint ")]
    parts += [f"ckpt {c}" for c in ckpt]
    mlp = [r for r in plan.shards if r.kind == "param" and isinstance(r.spec, T.Spec)
           and ("mlp." in str(r.target) or ".intermediate." in str(r.target) or ".output.dense" in str(r.target))
           and ".attention." not in str(r.target)]
    return " ".join(parts), " ".join(f"{_short(str(r.target))}={r.spec}" for r in mlp)


def _short(target: str) -> str:
    """`h[*].mlp.c_fc.weight` -> `c_fc.weight`; `layer[*].output.dense.weight` -> `output.dense.weight`."""
    parts = target.split(".")
    return ".".join(parts[-3:] if len(parts) >= 3 and parts[-2] == "dense" else parts[-2:])


def run_solve(cfg: Config, objective: str, limit: float, traffic: bool = False) -> Outcome:
    from planlang.solve.driver import solve

    path = PLAN_DIR / "partial" / f"{cfg.slug}.plan"
    cpu = time.process_time()
    priced = [0]

    def progress(line: str) -> None:
        # CPU seconds, not wall: the limit then means the same on a loaded machine; it is checked between
        # the solver's steps, so one slow estimate can overrun it
        priced[0] += 1
        if time.process_time() - cpu > limit:
            raise SolveTimeout

    name = f"ours ({objective})"
    try:
        if traffic:  # as `planlang solve` does: candidates' communication from the runtime's traffic model
            from planlang.runtime.traffic import step_comm_seconds

            res = solve(str(path), objective, progress, comm_time=step_comm_seconds)
        else:
            res = solve(str(path), objective, progress)
    except SolveTimeout:
        return Outcome(name, "-", note=f"stopped at the {limit:.0f} CPU-s limit ({priced[0]} progress steps)",
                       seconds=time.process_time() - cpu)
    except Exception as e:  # noqa: BLE001 - the solver's failure is a result of this bench
        msg = str(e).splitlines()[0] if str(e) else ""
        return Outcome(name, "-", note=f"solve failed: {type(e).__name__}: {msg}"[:160],
                       seconds=time.process_time() - cpu)
    best = res.best
    budget = cfg.budget_gib * 2**30
    layout, specs = solved_layout(res.text, path)
    return Outcome(name, layout, best.peak, best.step_time, best.peak <= budget,
                   note=f"specs {specs}" if specs else "", seconds=time.process_time() - cpu)


# ------------------------------------------------------------------------------ one configuration
def evaluate(cfg: Config, limit: float, write: Path | None, log=print,
             traffic: bool = False) -> tuple[list[Outcome], list[Outcome]]:
    """(the grid's outcomes, the table's rows) of one configuration."""
    points = [price_layout(cfg, lay, "Megatron grid", write, traffic) for lay in grid(cfg)]
    best = best_grid(points)
    rows = [best if best is not None else Outcome("Megatron grid", "-", note="no grid plan could be priced")]
    note = rows[0].note or ("" if rows[0].fits else "no grid plan fits the budget: the one with the smallest peak")
    rows[0] = Outcome("Megatron grid (best)", rows[0].layout, rows[0].peak, rows[0].step, rows[0].fits, note,
                      sum(o.seconds for o in points))
    for name, label in (("dp", "pure DP"), ("zero2", "ZeRO-2 DP"), ("pipeline", "uniform pipeline")):
        try:
            lay = baseline(cfg, name)
        except NotApplicable as e:
            rows.append(Outcome(label, "-", note=f"n/a: {e}"))
            continue
        rows.append(price_layout(cfg, lay, label, write, traffic))
    path = PLAN_DIR / "partial" / f"{cfg.slug}.plan"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != partial_text(cfg):
        path.write_text(partial_text(cfg))
    for objective in OBJECTIVES:
        rows.append(run_solve(cfg, objective, limit, traffic))
        log(f"  {rows[-1].strategy}: {rows[-1].seconds:.1f} s")
    return points, rows


def _gib(b: int | None) -> str:
    from planlang.plan.units import format_bytes

    return "-" if b is None else format_bytes(b)


def _ms(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s:.2f} s" if s >= 1 else f"{s * 1e3:.3g} ms"


def _ratio(a, b) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}"


def render(cfg: Config, points: list[Outcome], rows: list[Outcome], traffic: bool = False) -> str:
    ref = rows[0]
    head = f"{'strategy':22} {'layout':40} {'peak':>11} {'step':>12} {'peak/grid':>9} {'step/grid':>9} {'fits':>4} {'cpu':>7}"
    out = [f"== {cfg.title}" + (" [step: compute + traffic model]" if traffic else ""),
           f"   {parameter_count(cfg) / 1e9:.3f}B parameters; plans priced with the links "
           + ", ".join(f"{a} over {link}" for a, link in cfg.links), head, "-" * len(head)]
    for o in rows:
        fits = "-" if o.peak is None else ("yes" if o.fits else "NO")
        out.append(f"{o.strategy:22} {o.layout:40} {_gib(o.peak):>11} {_ms(o.step):>12} "
                   f"{_ratio(o.peak, ref.peak):>9} {_ratio(o.step, ref.step):>9} {fits:>4} {o.seconds:>6.1f}s")
        if o.note:
            out.append(f"{'':22}   {o.note}")
    out += textwrap.wrap("grid: " + "; ".join(f"{o.layout}: {_gib(o.peak)}, {_ms(o.step)}"
                                              f"{'' if o.fits else ' (over)'}{o.note}" for o in points),
                         width=len(head), subsequent_indent="      ")
    if cfg.paper_ratio is not None:
        what, r = cfg.paper_ratio  # what: "peak" or "step", an Outcome field
        objective = "memory" if what == "peak" else "time"
        ours = next(o for o in rows if o.strategy == f"ours ({objective})")
        out.append(f"paper: its plan's {what} / Megatron-LM's = {r:.2f} (measured); here ours ({objective}) / best "
                   f"grid = {_ratio(getattr(ours, what), getattr(ref, what))} (predicted)")
    return "\n".join(out) + "\n"


def summary(results: list[tuple[Config, list[Outcome]]]) -> str:
    names = [o.strategy for o in results[0][1]] if results else []
    head = f"{'strategy':22} {'configs':>7} {'fits':>5} {'peak/grid (min..max)':>22} {'step/grid (min..max)':>22}"
    out = ["== summary over configurations (ratios to the best grid plan, where both were priced)", head,
           "-" * len(head)]
    for name in names:
        pk, st, n, fit = [], [], 0, 0
        for _, rows in results:
            ref, o = rows[0], next(r for r in rows if r.strategy == name)
            if o.peak is None or ref.peak is None:
                continue
            n += 1
            fit += o.fits
            pk.append(o.peak / ref.peak)
            st.append(o.step / ref.step)
        rng = (lambda v: f"{min(v):.2f}..{max(v):.2f}" if v else "-")
        out.append(f"{name:22} {n:>7} {fit:>5} {rng(pk):>22} {rng(st):>22}")
    return "\n".join(out) + "\n"


TRAFFIC_HEADER = """\
==== With communication: the same comparison, each plan's step = the estimator's compute + the per-step
collectives planlang.runtime.traffic predicts from the lowered plan (tensor-parallel ones included), which
is how `planlang solve` prices candidates (its comm_time hook); the solver runs with that hook here. The
traffic model covers plans without pipelines and ZeRO-2/3, so this pass covers the configurations without
a pipeline block (min-memory-redundancy-ilp); a baseline it does not cover shows "not priced", while the
solver prices such candidates (ZeRO-2/3) with the estimator's step instead (so "ours" with zero=3 below
has an estimator step time).
"""


def run_pass(configs: list[Config], limit: float, write: Path | None, traffic: bool) -> tuple[str, str]:
    """(the tables, the summary) of one pass over `configs`, printed as they come."""
    blocks, results = [], []
    for cfg in configs:
        print(f"... {cfg.title}{' [traffic]' if traffic else ''}", file=sys.stderr, flush=True)
        points, rows = evaluate(cfg, limit, write, log=lambda s: print(s, file=sys.stderr, flush=True),
                                traffic=traffic)
        blocks.append(render(cfg, points, rows, traffic))
        print(blocks[-1], flush=True)
        results.append((cfg, rows))
    tail = summary(results)
    print(tail, flush=True)
    return "\n".join(blocks), tail


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="two small configurations (min-memory-redundancy BERT-Large on 2 devices, map beta)")
    ap.add_argument("--solve-limit", type=float, default=None, help="CPU seconds per solve (default 90, quick 30)")
    ap.add_argument("--config", action="append", default=[], help="only configurations whose title has TEXT")
    ap.add_argument("--traffic", action="store_true",
                    help="only the pass with communication (steps priced with planlang.runtime.traffic)")
    ap.add_argument("--out", type=Path, default=None, help=f"write the output here (full run: {RESULT})")
    ap.add_argument("--append", action="store_true", help="append to --out instead of replacing it")
    ap.add_argument("--write-plans", type=Path, default=None, help="also write every priced plan into DIR")
    args = ap.parse_args(argv)
    configs = [c for c in CONFIGS if all(t.lower() in c.title.lower() for t in args.config)]
    if args.quick:
        configs = [c for c in configs if c.quick]
    full = not args.quick and not args.config and not args.traffic
    limit = args.solve_limit or (30.0 if args.quick else 90.0)
    out_path = args.out or (RESULT if full else None)
    if args.write_plans:
        args.write_plans.mkdir(parents=True, exist_ok=True)
    start, cpu = time.perf_counter(), time.process_time()
    text = ["Plan quality: predicted per-device peak memory and step time (bench/plan_quality.py)",
            f"{len(configs)} configuration(s); solve limit {limit:.0f} CPU seconds per objective", "", CAVEATS]
    print("\n".join(text), flush=True)
    if not args.traffic:
        text += run_pass(configs, limit, args.write_plans, traffic=False)
    if args.traffic or full:  # the traffic model covers plans without a pipeline block
        print(TRAFFIC_HEADER, flush=True)
        text += [TRAFFIC_HEADER, *run_pass([c for c in configs if not c.microbatches], limit, args.write_plans,
                                           traffic=True)]
    text.append(f"total {time.perf_counter() - start:.0f} s wall, {time.process_time() - cpu:.0f} s CPU "
                "(wall time depends on the machine's load)\n")
    print(text[-1])
    if out_path is not None:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        with out_path.open("a" if args.append else "w") as f:  # appended: without the header again
            f.write("\n".join(text[4:] if args.append else text))
        print(f"wrote {out_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
