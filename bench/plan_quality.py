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
* the pipeline partitioners side by side, on configurations with a pipeline: the best grid plan with
  one (pp >= 2) with its stage lines replaced by each method `planlang solve` fills a `stages ?` hole
  with (planlang.solve.pipeline_stages.stage_partition: flops, activations, tree, capture, alpa),
  everything else as the grid plan writes it;

as absolute figures and as ratios to the best grid plan. Configurations: bench/plan_configs/configs.py.
Every step is planlang.model.price.step_time's, the one model `planlang estimate` reports and `planlang solve`
prices candidates with (docs/step_time.md), so the solver's figures and the baselines' are comparable.

Run: .venv/bin/python bench/plan_quality.py [--quick] [--solve-limit S] [--config TEXT ...]
[--out FILE [--append]] [--write-plans DIR]. The full run (no --quick/--config) writes
bench/results/plan_quality.txt. --write-plans writes every priced plan and the solver's chosen ones
(`<config>__ours_<objective>.plan`) into DIR.

Side by side: .venv/bin/python bench/plan_quality.py --compare BEFORE AFTER [--out FILE] prices the
solver's chosen plans in two such folders (say, one written by an older checkout) with this checkout's
estimator, configuration by configuration and objective by objective; nothing is solved.
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
* Everything is PREDICTED by planlang.model.price.estimate (nothing is run). Its step time is
  planlang.model.price.step_time's, the one `planlang solve` prices with: compute (flops / (the device's peak
  at the plan's compute dtype x 0.5)), the lowered program's tensor-parallel collectives and the loss
  all-reduce on the critical path, the data-parallel gradient sums and ZeRO's gathers and
  reduce-scatters with what overlaps backward (and forward) hidden, and the pipeline bubble from the
  schedule's simulation. NOT priced: sends of activations between pipeline stages (plans with more
  stages look somewhat faster than they are), activation dtypes under autocast alone (priced in f32),
  contention between overlapped communication and compute. Peak memory: parameters, gradients, AdamW
  states, the runtime's buffers, activations of the microbatches in flight, transients (backward, the
  flat data-parallel gradient sum, the optimizer step).
* Where a configuration has a microbatch count (map, capture), every plan splits the batch into it: a
  pipeline of one stage is gradient accumulation. Microbatches in flight follow the estimator's 1F1B
  rule for every strategy alike.
* Embeddings and the LM head are replicated over tp in every plan (examples/gpt2/gpt2_3d.plan's layout).
* "ours" is `planlang solve` on the partial plan: mesh sizes, ZeRO stage, stages, the MLP's three
  parameter specs and checkpointing are holes; attention is fixed to Megatron's split. A solve that
  fails or passes --solve-limit is reported as such, not dropped.
* "stages: METHOD" rows: the best grid plan with a pipeline (pp >= 2; "stages: equal blocks" is that
  plan as the grid writes it) with its stages cut by METHOD, each priced in full as above: flops and
  activations balance that per-layer cost (min-max), tree is SageMaker's tree partition, capture
  minimises the predicted peak (capture §III-C), alpa is Alpa's stage DP (alpa §5.2, eq. 2) on the one
  sub-mesh shape every stage has (dp x tp devices: stages of different device counts are not run, PL418),
  i.e. the fastest cut under the step-time model's per-layer compute whose every stage fits the budget
  by the 1F1B in-flight rule. capture's and alpa's memory rule is their papers' predictor (states +
  in-flight activations), not the estimate: a cut alpa keeps within the budget can be over it priced
  (buffers, transients, the loss's logits). "deepest: METHOD" rows do the same on the uniform pipeline
  baseline's layout (the deepest pipeline) where it differs. `planlang solve` tries all five and keeps
  the best priced ("ours" notes which).
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
def price_text(text: str, path: Path) -> tuple[int, float, bool]:
    """(peak bytes, step seconds, fits the budget) of a complete plan, as driver.price() does: the largest
    peak and the slowest step over planlang.model.price.estimate's rows."""
    from planlang.lang.render import render
    from planlang.model.price.estimate import estimate_plan
    from planlang.plan.checker import check_text
    from planlang.plan.complete import complete

    res = check_text(text, str(path))
    if res.errors or res.plan is None:
        raise ValueError("the plan does not check:\n" + render(list(res.diagnostics), res.sources, "concise"))
    rows = estimate_plan(complete(res.plan))
    peak, step = max(r.peak for r in rows), max(r.step_time for r in rows)
    return peak, step, res.plan.budget is None or peak <= res.plan.budget.bytes


def price_layout(cfg: Config, lay: Layout, strategy: str, write: Path | None) -> Outcome:
    t = time.process_time()
    text = plan_text(cfg, lay, strategy)
    if write is not None:
        name = f"{cfg.slug}__{strategy.split()[0].lower()}_dp{lay.dp}_tp{lay.tp}_pp{lay.pp}_z{lay.zero}.plan"
        (write / name).write_text(text)
    try:
        peak, step, fits = price_text(text, PLAN_DIR / f"{cfg.slug}.plan")
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


def run_solve(cfg: Config, objective: str, limit: float, write: Path | None = None) -> Outcome:
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
        res = solve(str(path), objective, progress)
    except SolveTimeout:
        return Outcome(name, "-", note=f"stopped at the {limit:.0f} CPU-s limit ({priced[0]} progress steps)",
                       seconds=time.process_time() - cpu)
    except Exception as e:  # noqa: BLE001 - the solver's failure is a result of this bench
        msg = str(e).splitlines()[0] if str(e) else ""
        return Outcome(name, "-", note=f"solve failed: {type(e).__name__}: {msg}"[:160],
                       seconds=time.process_time() - cpu)
    best = res.best
    if write is not None:
        (write / ours_plan_name(cfg, objective)).write_text(res.text)
    budget = cfg.budget_gib * 2**30
    layout, specs = solved_layout(res.text, path)
    method = dict(best.choices).get("stages", "-")  # the partition a `stages ?` hole was filled by
    note = " ".join(([f"specs {specs}"] if specs else []) +
                    ([f"stages by {method}"] if "pp=" in layout and "pp=1 " not in layout + " " else []))
    return Outcome(name, layout, best.peak, best.step_time, best.peak <= budget, note=note,
                   seconds=time.process_time() - cpu)


# ------------------------------------------------------------------------------ one configuration
def evaluate(cfg: Config, limit: float, write: Path | None, log=print) -> tuple[list[Outcome], list[Outcome]]:
    """(the grid's outcomes, the table's rows) of one configuration."""
    points = [price_layout(cfg, lay, "Megatron grid", write) for lay in grid(cfg)]
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
        rows.append(price_layout(cfg, lay, label, write))
    path = PLAN_DIR / "partial" / f"{cfg.slug}.plan"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != partial_text(cfg):
        path.write_text(partial_text(cfg))
    for objective in OBJECTIVES:
        rows.append(run_solve(cfg, objective, limit, write))
        log(f"  {rows[-1].strategy}: {rows[-1].seconds:.1f} s")
    rows += stage_rows(cfg, points, write)
    return points, rows


def pipeline_layout(cfg: Config, points: list[Outcome]) -> tuple[Layout, Outcome] | None:
    """The best grid plan with a pipeline (pp >= 2), as best_grid ranks them, and its layout."""
    piped = [(lay, o) for lay, o in zip(grid(cfg), points) if lay.pp > 1]
    best = best_grid([o for _, o in piped])
    return next(((lay, o) for lay, o in piped if o is best), None)


def stage_rows(cfg: Config, points: list[Outcome], write: Path | None) -> list[Outcome]:
    """The pipeline partitioners on the best grid plan with a pipeline ("stages: METHOD") and on the
    uniform pipeline baseline's plan, the deepest, when it is another ("deepest: METHOD"): each method's
    stages in place of the equal blocks (the function `planlang solve` fills a `stages ?` hole with, on
    the model profiled as the solver profiles it: the batch whole), priced in full (price_text)."""
    found = pipeline_layout(cfg, points) if cfg.microbatches else None
    if found is None:
        return []
    rows = partition_rows(cfg, found[0], found[1], "stages", write)
    try:
        deep = baseline(cfg, "pipeline")
    except NotApplicable:
        return rows
    if deep != found[0]:
        equal = next((o for lay, o in zip(grid(cfg), points) if lay == deep), None) or \
            price_layout(cfg, deep, "uniform pipeline", write)
        rows += partition_rows(cfg, deep, equal, "deepest", write)
    return rows


def partition_rows(cfg: Config, lay: Layout, equal: Outcome, prefix: str, write: Path | None) -> list[Outcome]:
    """`equal` (the plan of `lay` with equal blocks) as "PREFIX: equal blocks", then a row per method."""
    from planlang.plan.checker import check_text
    from planlang.solve.pipeline_stages import plan_layers, stage_partition
    from planlang.solve.space import STAGE_METHODS

    t = time.process_time()
    path = PLAN_DIR / f"{cfg.slug}.plan"
    plan = check_text(plan_text(cfg, lay, "stages ?", stages=()), str(path)).plan
    assert plan is not None
    parts = plan_layers(plan, divide=1)
    rows = [Outcome(f"{prefix}: equal blocks", equal.layout, equal.peak, equal.step, equal.fits,
                    f"the plan with equal blocks; the model's profile for the partitions took "
                    f"{time.process_time() - t:.1f} CPU-s", equal.seconds)]
    for method in STAGE_METHODS:
        t, name = time.process_time(), f"{prefix}: {method}"
        try:
            chosen = stage_partition(plan, method, lay.pp, parts, degrees=(lay.dp, lay.tp), zero=lay.zero)
            text = plan_text(cfg, lay, f"stages by {method}", stages=[str(c) for c in chosen])
            if write is not None:
                (write / f"{cfg.slug}__{prefix}_{method}.plan").write_text(text)
            peak, step, fits = price_text(text, path)
        except Exception as e:  # noqa: BLE001 - a partition or plan that fails: say so in the table
            rows.append(Outcome(name, str(lay), note=f"failed: {type(e).__name__}: {str(e).splitlines()[0]}"[:160],
                                seconds=time.process_time() - t))
            continue
        cut = " | ".join(",".join(c.modules) for c in chosen)
        over = " (by its memory rule no cut fits the budget: the fastest cut)" if "no cut fits" in chosen[0].note else ""
        rows.append(Outcome(name, str(lay), peak, step, fits, f"cut {cut}{over}", time.process_time() - t))
    return rows


def _gib(b: int | None) -> str:
    from planlang.plan.units import format_bytes

    return "-" if b is None else format_bytes(b)


def _ms(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s:.2f} s" if s >= 1 else f"{s * 1e3:.3g} ms"


def _ratio(a, b) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}"


def render(cfg: Config, points: list[Outcome], rows: list[Outcome]) -> str:
    ref = rows[0]
    head = f"{'strategy':22} {'layout':40} {'peak':>11} {'step':>12} {'peak/grid':>9} {'step/grid':>9} {'fits':>4} {'cpu':>7}"
    out = [f"== {cfg.title}",
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
    names = list(dict.fromkeys(o.strategy for _, rows in results for o in rows))  # stage rows: pipelines only
    head = f"{'strategy':22} {'configs':>7} {'fits':>5} {'peak/grid (min..max)':>22} {'step/grid (min..max)':>22}"
    out = ["== summary over configurations (ratios to the best grid plan, where both were priced)", head,
           "-" * len(head)]
    for name in names:
        pk, st, n, fit = [], [], 0, 0
        for _, rows in results:
            ref, o = rows[0], next((r for r in rows if r.strategy == name), Outcome(name, "-"))
            if o.peak is None or ref.peak is None:
                continue
            n += 1
            fit += o.fits
            pk.append(o.peak / ref.peak)
            st.append(o.step / ref.step)
        rng = (lambda v: f"{min(v):.2f}..{max(v):.2f}" if v else "-")
        out.append(f"{name:22} {n:>7} {fit:>5} {rng(pk):>22} {rng(st):>22}")
    return "\n".join(out) + "\n"


def run_pass(configs: list[Config], limit: float, write: Path | None) -> tuple[str, str]:
    """(the tables, the summary) of one pass over `configs`, printed as they come."""
    blocks, results = [], []
    for cfg in configs:
        print(f"... {cfg.title}", file=sys.stderr, flush=True)
        points, rows = evaluate(cfg, limit, write, log=lambda s: print(s, file=sys.stderr, flush=True))
        blocks.append(render(cfg, points, rows))
        print(blocks[-1], flush=True)
        results.append((cfg, rows))
    tail = summary(results)
    print(tail, flush=True)
    return "\n".join(blocks), tail


# ------------------------------------------------------------------------------ two runs side by side
def ours_plan_name(cfg: Config, objective: str) -> str:
    """The file --write-plans writes the solver's chosen plan of `objective` into."""
    return f"{cfg.slug}__ours_{objective}.plan"


def _score(peak: int, step: float, objective: str) -> float:
    """What the objective minimizes among plans that fit (planlang.solve.pricing.Candidate.key)."""
    return {"time": step, "memory": float(peak), "balanced": peak * step}[objective]


def compare(before: Path, after: Path, configs: list[Config], tol: float = 1e-6) -> str:
    """The solver's chosen plans of two --write-plans folders, each priced with this checkout's estimator
    (price_text), per configuration and objective: the peaks, the steps, after / before of the objective's
    own measure (time: step; memory: peak; balanced: peak x step, as the solver ranks them; a plan over
    the budget loses to one within it) and the verdict (same within `tol`, better, worse)."""
    head = (f"{'configuration':40} {'objective':9} {'before: peak':>12} {'step':>10} {'after: peak':>12} "
            f"{'step':>10} {'peak a/b':>8} {'step a/b':>8} {'obj a/b':>8}  verdict")
    out = [head, "-" * len(head)]
    counts: dict[str, int] = {}
    for cfg in configs:
        path = PLAN_DIR / "partial" / f"{cfg.slug}.plan"
        for objective in OBJECTIVES:
            got = []
            for folder in (before, after):
                f = folder / ours_plan_name(cfg, objective)
                try:
                    got.append(price_text(f.read_text(), path) if f.exists() else None)
                except Exception as e:  # noqa: BLE001 - say so in the table
                    got.append(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:60])
            b, a = got
            label = f"{cfg.slug[:40]:40} {objective:9}"
            if not isinstance(a, tuple) or not isinstance(b, tuple):
                verdict = "not compared: " + ("; ".join(f"{w}: {x or 'no plan'}" for w, x in
                                                        (("before", b), ("after", a)) if not isinstance(x, tuple)))
                out.append(f"{label} {verdict}")
                counts["not compared"] = counts.get("not compared", 0) + 1
                continue
            (bp, bs, bf), (ap, as_, af) = b, a
            sb, sa = _score(bp, bs, objective), _score(ap, as_, objective)
            if af != bf:
                verdict = "better (fits)" if af else "WORSE (over the budget)"
            elif abs(sa - sb) <= tol * max(abs(sb), 1e-30):
                verdict = "same"
            else:
                verdict = "better" if sa < sb else "WORSE"
            key = verdict.split()[0].lower()
            counts[key] = counts.get(key, 0) + 1
            out.append(f"{label} {_gib(bp):>12} {_ms(bs):>10} {_gib(ap):>12} {_ms(as_):>10} {ap / bp:>8.4f} "
                       f"{as_ / bs:>8.4f} {sa / sb:>8.4f}  {verdict}")
    out.append(f"{sum(counts.values())} configuration x objective pairs: "
               + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="two small configurations (min-memory-redundancy BERT-Large on 2 devices, map beta)")
    ap.add_argument("--solve-limit", type=float, default=None, help="CPU seconds per solve (default 90, quick 30)")
    ap.add_argument("--config", action="append", default=[], help="only configurations whose title has TEXT")
    ap.add_argument("--out", type=Path, default=None, help=f"write the output here (full run: {RESULT})")
    ap.add_argument("--append", action="store_true", help="append to --out instead of replacing it")
    ap.add_argument("--write-plans", type=Path, default=None,
                    help="also write every priced plan and the solver's chosen ones "
                         "(<config>__ours_<objective>.plan) into DIR")
    ap.add_argument("--compare", type=Path, nargs=2, metavar=("BEFORE", "AFTER"), default=None,
                    help="only price the chosen plans of two --write-plans folders side by side (no solving)")
    args = ap.parse_args(argv)
    configs = [c for c in CONFIGS if all(t.lower() in c.title.lower() for t in args.config)]
    if args.quick:
        configs = [c for c in configs if c.quick]
    if args.compare:
        before, after = args.compare
        text = (f"ours before ({before}) and after ({after}): each folder's chosen plans priced with this "
                "checkout's estimator (bench/plan_quality.py --compare)\n" + compare(before, after, configs))
        print(text, end="")
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            with args.out.open("a" if args.append else "w") as f:
                f.write(text)
        return 0
    full = not args.quick and not args.config
    limit = args.solve_limit or (30.0 if args.quick else 90.0)
    out_path = args.out or (RESULT if full else None)
    if args.write_plans:
        args.write_plans.mkdir(parents=True, exist_ok=True)
    start, cpu = time.perf_counter(), time.process_time()
    text = ["Plan quality: predicted per-device peak memory and step time (bench/plan_quality.py)",
            f"{len(configs)} configuration(s); solve limit {limit:.0f} CPU seconds per objective", "", CAVEATS]
    print("\n".join(text), flush=True)
    text += run_pass(configs, limit, args.write_plans)
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
