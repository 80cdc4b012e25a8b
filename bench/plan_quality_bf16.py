"""bench/plan_quality.py's plans of the papers' configurations, priced again in bf16, with the model flops
utilisation and the physical floor of each step.

Every plan of bench/plan_quality.py (the Megatron grid, pure DP, ZeRO-2 DP, the uniform pipeline) is
priced twice by planlang.model.price.estimate: as written (f32) and with `precision = bf16` in its optimizer
block (bf16 parameters and compute, f32 reduction and master weights; compute at the device's
`flops.bf16`). For each bf16 plan:

    floor = 6 · parameters · tokens / (devices · peak flops)      the step no plan can beat: every device
                                                                  busy at peak on the training flops alone
    MFU   = 6 · parameters · tokens / (devices · peak flops · step)

with tokens = batch · sequence per step, parameters the model's (bench/plan_configs/plans.parameter_count)
and peak the device's flops.bf16. Every predicted step must be at or above its floor (checked; a row
below it is marked and the run exits 1). The estimator's step is compute at 0.5 of peak plus the
data-parallel all-reduce, so MFU cannot exceed 0.5 there by construction; where it is far below,
communication or redundant compute (replicated embeddings, attention) dominates.

Run: .venv/bin/python bench/plan_quality_bf16.py [--quick] [--config TEXT ...] [--out FILE]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.plan_configs.configs import CONFIGS, Config  # noqa: E402
from bench.plan_configs.plans import NotApplicable, baseline, grid, parameter_count, plan_text  # noqa: E402

PLAN_DIR = ROOT / "bench" / "plan_configs"
RESULT = ROOT / "bench" / "results" / "plan_quality_bf16.txt"


def with_precision(text: str) -> str:
    """`text` with `precision = bf16` in its optimizer block."""
    lines = text.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith("optimizer "))
    line = lines[i]
    if line.endswith("}"):
        lines[i] = line[:-1].rstrip() + "; precision = bf16 }"
    else:
        lines[i] = line + " { precision = bf16 }"
    return "\n".join(lines) + "\n"


def price(text: str, path: Path) -> tuple[int, float, bool]:
    from planlang.lang.diagnostics import Severity
    from planlang.model.price.estimate import estimate_plan
    from planlang.plan.checker import check_text
    from planlang.plan.complete import complete

    res = check_text(text, str(path))
    errors = {d.code for d in res.diagnostics if d.severity is Severity.ERROR}
    if errors or res.plan is None:
        raise ValueError(f"the plan does not check: {', '.join(sorted(errors))}")
    rows = estimate_plan(complete(res.plan))
    peak, step = max(r.peak for r in rows), max(r.step_time for r in rows)
    return peak, step, res.plan.budget is None or peak <= res.plan.budget.bytes


def peak_flops(cfg: Config, dtype: str) -> float:
    from planlang.plan.checker import check_text

    plan = check_text(f"use hardware\nmesh m of 1 x hardware.{cfg.device} {{ a = 1 }}\n").plan
    return plan.mesh.device.flops_for(dtype)


def evaluate(cfg: Config, log) -> list[str]:
    layouts = [("Megatron grid", lay) for lay in grid(cfg)]
    for name, label in (("dp", "pure DP"), ("zero2", "ZeRO-2 DP"), ("pipeline", "uniform pipeline")):
        try:
            layouts.append((label, baseline(cfg, name)))
        except NotApplicable:
            pass
    flops_bf16 = peak_flops(cfg, "bf16")
    useful = 6 * parameter_count(cfg) * cfg.batch * cfg.seq  # training flops per step
    floor = useful / (cfg.devices * flops_bf16)
    out = [f"== {cfg.paper}: {cfg.label} ({cfg.devices} x {cfg.device}, {parameter_count(cfg) / 1e9:.2f}B "
           f"parameters, {cfg.batch} x {cfg.seq} tokens; bf16 peak {flops_bf16 / 1e12:g} TFLOPS; floor "
           f"{floor * 1e3:.2f} ms)",
           f"{'strategy':17} {'layout':22} {'f32 peak':>10} {'f32 step':>10} {'bf16 peak':>10} {'bf16 step':>10} "
           f"{'fits':>4} {'MFU':>6} {'>= floor':>8}"]
    rows: list[tuple] = []
    path = PLAN_DIR / f"{cfg.slug}.plan"
    for label, lay in layouts:
        t = time.process_time()
        try:
            text = plan_text(cfg, lay, label)
            p32, s32, _ = price(text, path)
            p16, s16, fits = price(with_precision(text), path)
        except Exception as e:  # noqa: BLE001 - a plan the estimator cannot price: said in the table
            out.append(f"{label:17} {str(lay):22} not priced: {type(e).__name__}: {str(e).splitlines()[0][:80]}")
            continue
        rows.append((label, lay, p32, s32, p16, s16, fits))
        log(f"  {label} {lay}: {time.process_time() - t:.1f} s")
    fitting = [r for r in rows if r[0] == "Megatron grid" and r[6]]
    best = min(fitting, key=lambda r: r[5]) if fitting else None
    bad = 0
    for label, lay, p32, s32, p16, s16, fits in rows:
        if label == "Megatron grid" and (best is None or (lay, s16) != (best[1], best[5])):
            continue  # the grid's best in bf16 only, as plan_quality.py shows
        mfu = useful / (cfg.devices * flops_bf16 * s16)
        ok = s16 >= floor
        bad += not ok
        name = "Megatron grid (best)" if label == "Megatron grid" else label
        out.append(f"{name[:17]:17} {str(lay):22} {p32 / 2**30:>8.2f}Gi {s32 * 1e3:>8.1f}ms {p16 / 2**30:>8.2f}Gi "
                   f"{s16 * 1e3:>8.2f}ms {'yes' if fits else 'no':>4} {mfu:>6.3f} {'yes' if ok else 'NO !':>8}")
    out.append(f"  {len(rows)} plans priced; the grid's best in bf16: {best[1] if best else 'none fits'}")
    if not rows:
        bad += 1
        out.append("  no plan priced: BELOW nothing, but nothing checked either (counted as a failure)")
    return out if not bad else out + [f"  {bad} rows BELOW the physical floor or unpriced"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the configurations plan_quality.py --quick runs")
    ap.add_argument("--config", action="append", default=[], help="only configurations whose title has TEXT")
    ap.add_argument("--out", type=Path, default=None, help=f"write the output here (e.g. {RESULT})")
    args = ap.parse_args(argv)
    configs = [c for c in CONFIGS if (not args.quick or c.quick)
               and (not args.config or any(t in f"{c.paper} {c.label}" for t in args.config))]
    lines = ["plan quality in bf16 (bench/plan_quality_bf16.py): bench/plan_quality.py's plans with "
             "`precision = bf16`, priced by planlang.model.price.estimate",
             "floor = 6 · parameters · tokens / (devices · bf16 peak); MFU = the same over the predicted step", ""]
    print("\n".join(lines), flush=True)
    below = 0
    for cfg in configs:
        block = evaluate(cfg, lambda m: print(m, file=sys.stderr, flush=True))
        below += sum("BELOW" in line for line in block)
        print("\n".join(block) + "\n", flush=True)
        lines += block + [""]
    lines.append(f"{len(configs)} configurations; " + ("every bf16 step at or above its physical floor" if not below
                                                        else f"{below} configurations with a step below its floor"))
    print(lines[-1])
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 1 if below else 0


if __name__ == "__main__":
    sys.exit(main())
