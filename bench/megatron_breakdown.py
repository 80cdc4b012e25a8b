"""Where each Megatron-LM Table 1 row's predicted step goes, against Megatron's own analysis (issue #29).

For the published layout of every row of Narayanan et al. 2021, Table 1 (the plans bench/megatron_table.py
writes), `planlang estimate --format json`'s slowest device (pipeline rank), by the step-time model's parts
(planlang.model.price.step_time), beside what the paper's analysis gives for the same work:

- compute: planlang's (the rank's ops, recomputation included, by the roofline of
  planlang.cost.comm.work_time: the flop-counted ops at MATMUL_EFFICIENCY of bf16 peak, the memory-bound
  ops' bytes at the A100's memory bandwidth) and Megatron's count for the same rank at MATMUL_EFFICIENCY
  (§5.1 eq. 3 per layer, 96·b·s·h²·(1 + s/6h) / t per microbatch, 6·b·s·h·V / t more for the output layer
  on the last stage): their difference is what the memory-bound ops add;
- tp: the in-line tensor-parallel collectives; bubble: the simulated schedule's idle time of the rank and
  Megatron's (p - 1)/(v·m) of the rank's busy time (§2.2, balanced stages);
- sums: the data-parallel gradient sums, exposed + overlapped (as run: overlapped under --DDP-impl torch);
- not priced by planlang, estimated here: p2p, the sends between stages with §4.1's scatter/gather
  (b·s·h/t bytes per tp rank over the pipeline link, then an all-gather over NVLink), two per microbatch and
  chunk on the critical path; optim, Adam's step over the rank's parameters, ~30 bytes of HBM traffic per
  parameter (fp32 master, m, v read and written, fp32 gradient read, fp16 copy written) at the A100 80GB's
  2039 GB/s (datasheet);
- k*: the factor compute and bubble would be scaled by for the predicted step to equal the published one
  (the rest fixed; 1 = exact, above 1: planlang predicts the row slow); util: Megatron's flops of the rank
  over its compute time scaled by 1/k*, as a fraction of peak: the share of peak the published figure
  implies;
  roof: the same share as a roofline of one layer under Megatron-LM 2021's kernels would give it (ROOF_GEMM
  of peak for the GEMMs, an assumption; the attention's batched matmuls at the larger of their flop and
  byte times; the element-wise and softmax traffic of §4.2's fused kernels at HBM bandwidth, layer norms,
  dropouts and residual adds replicated over tp: see `roofline_util`). It is an explanation to compare
  util with, not part of planlang's model.

    python bench/megatron_breakdown.py                 # every row; writes bench/results/megatron_breakdown.txt
    python bench/megatron_breakdown.py --rows 1T,529.6B
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from megatron_table import ROWS, SEQ, VOCAB, Row, git_head, plan_path, run_child  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "megatron_breakdown.txt"
from planlang.cost.comm import MATMUL_EFFICIENCY as EFF  # noqa: E402

PEAK = 312e12  # A100 bf16/fp16 dense (hardware.a100_80g)
IB, NVLINK = 25e9, 300e9  # hardware.infiniband_200g, hardware.nvlink3 (bytes/s per GPU, one direction)
HBM = 2039e9  # A100 80GB SXM datasheet, bytes/s


def megatron_rank_flops(row: Row, last: bool) -> float:
    """Megatron's count (eq. 3's terms) for one pipeline rank's step, per GPU."""
    b = row.batch // row.dp  # sequences through this rank per step
    s, h, t = SEQ, row.hidden, row.tp
    layers = row.layers // row.pp
    out = 96 * b * s * layers * h * h * (1 + s / (6 * h)) / t
    return out + (6 * b * s * h * VOCAB / t if last or row.pp == 1 else 0.0)


ROOF_GEMM = EFF  # the share of peak for large fp16 GEMMs, as planlang's roofline takes it


def roofline_util(row: Row) -> float:
    """Megatron's flops of one layer over its roofline time, as a fraction of peak. Forward, per GPU, fp16
    bytes: layer norms 2 x 4bsh, bias-dropout-add 2 x 7bsh (replicated over tp, §3 of Shoeybi et al.);
    bias-GeLU 16bsh/t; scale-mask-softmax 4bas^2/t and attention dropout 5bas^2/t (§4.2's fused kernels);
    QK^T and AV: 4bsh·s/t flops against 4bas^2/t bytes. Recomputation and backward: 4 x the forward."""
    b, s, h, a, t = row.mbs, SEQ, row.hidden, row.heads, row.tp
    gemm = 24 * b * s * h * h / t / (ROOF_GEMM * PEAK)
    bmm = max(4 * b * s * s * h / t / (ROOF_GEMM * PEAK), 4 * b * a * s * s / t / HBM)
    mem = (22 * b * s * h + 16 * b * s * h / t + 9 * b * a * s * s / t) / HBM
    return 96 * b * s * h * h * (1 + s / (6 * h)) / t / (4 * (gemm + bmm + mem)) / PEAK


def p2p_seconds(row: Row) -> float:
    """§4.1's scatter/gather sends on one rank's critical path: 2 per microbatch and chunk."""
    if row.pp == 1:
        return 0.0
    size = row.mbs * SEQ * row.hidden * 2  # fp16 activation (or its gradient) of one microbatch
    hop = size / row.tp / IB + (row.tp - 1) / row.tp * size / NVLINK
    return 2 * row.chunks * row.microbatches * hop


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="all", help="row names, comma-separated, or 'all'")
    ap.add_argument("--out", default=None, help="results file (default: bench/results/megatron_breakdown.txt "
                                                "when every row runs)")
    args = ap.parse_args(argv)
    rows = [r for r in ROWS if args.rows == "all" or r.name in args.rows.split(",")]
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    say(f"Megatron-LM Table 1's published layouts, the slowest rank's step by part, planlang at {git_head()} "
        f"(bench/megatron_breakdown.py; {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}); seconds per step")
    say(f"comp = planlang's compute (roofline: matmuls at {EFF:.0%} of peak, memory-bound ops' bytes at {HBM / 1e9:g} "
        f"GB/s), meg = Megatron's flop count for the same rank at {EFF:.0%}; "
        "bub = simulated idle, (p-1)/vm = Megatron's closed form; p2p, optim: not priced by planlang (estimates); "
        "k* = factor on compute and bubble that matches the published step; util = Megatron's flops / (compute / k*); "
        f"roof = util by a one-layer roofline of Megatron-LM 2021's kernels, GEMMs at {ROOF_GEMM:.0%} of peak")
    say(f"{'row':>6} {'h':>6} {'t/p/v/m':>15} {'rank':>5} {'comp':>7} {'meg':>7} {'tp':>6} {'bub':>6} "
        f"{'(p-1)/vm':>8} {'sums':>6} {'p2p':>5} {'optim':>5} {'as run':>7} {'pub.':>7} {'err':>6} {'k*':>5} {'util':>5} {'roof':>5}")
    for row in rows:
        proc, _, _ = run_child(["estimate", "--format", "json", str(plan_path(row, False))])
        if proc.returncode != 0:
            say(f"{row.name:>6} estimate failed: {(proc.stderr or '').strip().splitlines()[-1:]}")
            continue
        ranks = json.loads(proc.stdout)
        i, top = max(enumerate(ranks), key=lambda x: float(x[1]["step_time"]))
        part = top["step"]
        last = i == len(ranks) - 1
        comp, tp, bub = part["compute"], part["tensor"], part["bubble"]
        sums = part["exposed"] + (part["overlapped"] if row.ddp == "local" else 0.0)
        run = float(top["step_time"]) + (part["overlapped"] if row.ddp == "local" else 0.0)
        meg = megatron_rank_flops(row, last) / (EFF * PEAK)
        closed = (row.pp - 1) / (row.chunks * row.microbatches) * (comp + tp)
        params = int(top["parameters"]) / 2  # bf16 bytes -> elements
        optim = 30 * params / HBM
        pub = row.flops() / row.gpus / (row.tflops * 1e12)
        fixed = run - comp - bub
        k_star = (pub - fixed) / (comp + bub) if pub > fixed else float("nan")
        util = megatron_rank_flops(row, last) / (comp * k_star) / PEAK
        shape = f"{row.tp}/{row.pp}/{row.chunks}/{row.microbatches}"
        say(f"{row.name:>6} {row.hidden:>6} {shape:>15} {i:>5} {comp:7.2f} {meg:7.2f} {tp:6.2f} {bub:6.2f} "
            f"{closed:8.2f} {sums:6.2f} {p2p_seconds(row):5.2f} {optim:5.2f} {run:7.2f} {pub:7.2f} "
            f"{(pub / run - 1) * 100:+5.1f}% {k_star:5.3f} {util:5.3f} {roofline_util(row):5.3f}")
    if args.out or args.rows == "all":
        out = Path(args.out or RESULTS)
        out.write_text("\n".join(lines) + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
