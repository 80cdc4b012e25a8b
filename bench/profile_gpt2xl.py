"""Profiling GPT-2 XL (1.5 B parameters) on the meta device: wall time of each step, no real allocation.

Run: .venv/bin/python bench/profile_gpt2xl.py [--batch 1] [--seq 1024]
Target (issue: model layer): the whole profile in at most 10 s on this machine. Prints the time of each
stage and the process's peak resident memory, which stays far below the 6 GB the fp32 weights would take.
"""
from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=1024)
    args = ap.parse_args()
    t0 = time.perf_counter()
    import torch  # noqa: F401

    from planlang.model.capture.load import build_model, meta_inputs
    from planlang.model.capture.profile import profile_model
    from planlang.model.capture.simulate import simulate_step
    from planlang.model.capture.trace import probe_modules, trace_graph
    from planlang.plan.types import Input, ModelRef
    from planlang.plan.units import format_bytes

    t_import = time.perf_counter()
    ref = ModelRef("gpt2_xl", "examples.gpt2.model:build",
                   (("layers", 48), ("hidden", 1600), ("heads", 25), ("vocab", 50257), ("seq", 1024)))
    rows = []
    t = time.perf_counter()
    model = build_model(ref)
    rows.append(("build on meta", time.perf_counter() - t))
    inputs = meta_inputs((Input("idx", "i64", (("batch", args.batch), ("seq", args.seq))),))
    t = time.perf_counter()
    facts = probe_modules(model, inputs)
    rows.append(("probe modules (hooks)", time.perf_counter() - t))
    t = time.perf_counter()
    graph = trace_graph(model, inputs)
    rows.append((f"fx graph ({graph.method}, {len(graph.nodes)} nodes)", time.perf_counter() - t))
    t = time.perf_counter()
    prof = profile_model(model, inputs)
    rows.append(("profile (flops, saved activations)", time.perf_counter() - t))
    t = time.perf_counter()
    sim = simulate_step(model, inputs)
    rows.append(("simulated step (live bytes)", time.perf_counter() - t))
    total = sum(s for _, s in rows)
    params = prof.modules[""].params
    print(f"GPT-2 XL: {params:,} parameters ({format_bytes(prof.param_bytes)} fp32), batch {args.batch} x seq {args.seq}")
    print(f"{'step':44} {'seconds':>8}")
    for name, s in rows:
        print(f"{name:44} {s:8.2f}")
    print(f"{'total (after imports)':44} {total:8.2f}   ({total / 10:.2f} x the 10 s target)")
    print(f"{'imports':44} {t_import - t0:8.2f}")
    print(f"forward {prof.total_fwd_flops / 1e12:.2f} TFLOP, backward {prof.total_bwd_flops / 1e12:.2f} TFLOP; "
          f"saved activations {format_bytes(sim.saved)}, backward peak {format_bytes(sim.backward_peak)}")
    print(f"modules {len(facts.order)}; process peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
