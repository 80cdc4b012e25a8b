"""Megatron-LM's weak-scaling table against planlang's model and solver (issue #29, part 4).

Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM"
(arXiv:2104.04473), Table 1: GPT models of 1.7B to 1T parameters on 32 to 3072 A100 80GB GPUs (DGX A100
nodes: 8 GPUs on NVLink, 8 HDR InfiniBand ports per node), sequence 2048, vocabulary 51200, with each row's
tensor- and pipeline-parallel sizes, global batch and the achieved TFLOP/s per GPU. Each row is written as two
plans under bench/plan_configs/megatron/ (`--write` regenerates them from ROWS):

- `<row>.plan`: the published layout. GPT from examples/gpt2's model at the row's shape, `hardware.a100_80g`,
  bf16 parameters and compute (an f32 master copy and f32 Adam states, no ZeRO: the paper's optimizer),
  Megatron attention and MLP over tp, every block checkpointed (the paper recomputes activations, §3.5),
  and each row's microbatch size and schedule as the authors ran it: Table 1 does not give them, their
  artifact script does (NVIDIA/Megatron-LM, examples/sc21/run_table_1.sh: MBS 16 for 1.7B-7.5B, 8, 4, 2, 2,
  then 1; `--num-layers-per-virtual-pipeline-stage` 5, 5, 3 and 1 for 76.1B-529.6B: the interleaved
  schedule with 3, 2, 2 and 3 chunks per rank; 1F1B elsewhere): microbatches = global batch / dp / MBS.
  Rows with pp = 1 accumulate their microbatches' gradients (a top-level `microbatches N`), summed once.
  The vocabulary is split over tp (`wte`, `lm_head`), as in Megatron.
- `<row>_holes.plan`: the same with the mesh degrees, microbatches, stages, schedule and checkpointing
  left `?` for `planlang solve`.

Per row the bench prints: the published TFLOP/s; planlang's prediction for the published layout (`planlang
estimate`'s step, which prices planlang's own runtime, its gradient sums overlapped with backward) and the
same step "as run" (the gradient sums as each row's --DDP-impl ran them: AS_RUN below); the plan `solve`
writes for the hole version and its predicted TFLOP/s; the solve's CPU
seconds (user + system of the child process, cold). TFLOP/s are by Megatron's own count (the paper's eq. 3,
§5.1: 96·B·s·l·h²·(1 + s/6h + V/16lh) flops per step, activation recomputation included) over the predicted
step and the GPU count. Targets (issue #29): each published layout within 10 % of its published TFLOP/s (as run),
each row solved within 120 CPU-s (1T within 300) to a plan no slower than the published layout by planlang's
own model.

    python bench/megatron_table.py                 # every row; writes bench/results/megatron_table.txt
    python bench/megatron_table.py --rows 1.7B,18.4B --no-solve
    python bench/megatron_table.py --write         # regenerate the plans from ROWS
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLANS = ROOT / "bench" / "plan_configs" / "megatron"
RESULTS = ROOT / "bench" / "results" / "megatron_table.txt"
SEQ = 2048
VOCAB = 51200
GPUS_PER_NODE = 8  # DGX A100


@dataclass(frozen=True)
class Row:
    """One row of Table 1."""
    name: str
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    gpus: int
    batch: int
    tflops: float  # achieved per GPU, published
    mbs: int = 1  # microbatch size (the authors' script)
    per_stage: int | None = None  # layers per (virtual) stage; None: one stage per pipeline rank (1F1B)
    ddp: str = "local"  # the script's --DDP-impl: "torch" overlaps the gradient sums with backward

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp)

    @property
    def microbatches(self) -> int:
        return self.batch // self.dp // self.mbs

    @property
    def chunks(self) -> int:
        """Stages per pipeline rank: > 1 under the interleaved schedule."""
        return self.layers // (self.per_stage or self.layers // self.pp) // self.pp

    @property
    def schedule(self) -> str:
        return f"interleaved chunks {self.chunks}" if self.chunks > 1 else "1f1b"

    @property
    def stem(self) -> str:
        return "megatron_" + self.name.replace(".", "_").lower()

    def flops(self) -> float:
        """Flops of one step by Megatron's count (Narayanan et al. 2021, eq. 3: forward, backward and the
        recomputed forward of a GPT with activation recomputation)."""
        b, s, l, h, v = self.batch, SEQ, self.layers, self.hidden, VOCAB
        return 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))

    def tflops_at(self, step_s: float) -> float:
        return self.flops() / step_s / self.gpus / 1e12


# Table 1 of Narayanan et al. 2021 (arXiv:2104.04473): heads, hidden, layers, tp, pp, GPUs, batch, TFLOP/s;
# microbatch size, layers per virtual stage and --DDP-impl from the authors' NVIDIA/Megatron-LM
# examples/sc21/run_table_1.sh
ROWS = (
    Row("1.7B", 24, 2304, 24, 1, 1, 32, 512, 137, mbs=16, ddp="torch"),
    Row("3.6B", 32, 3072, 30, 2, 1, 64, 512, 138, mbs=16, ddp="torch"),
    Row("7.5B", 32, 4096, 36, 4, 1, 128, 512, 142, mbs=16, ddp="torch"),
    Row("18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135, mbs=8, ddp="torch"),
    Row("39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138, mbs=4),
    Row("76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140, mbs=2, per_stage=5),
    Row("145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148, mbs=2, per_stage=5),
    Row("310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155, mbs=1, per_stage=3),
    Row("529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163, mbs=1, per_stage=1),
    Row("1T", 160, 25600, 128, 8, 64, 3072, 3072, 163),
)
# the rows issue #29 names (the others are written too, and run with --rows)
DEFAULT_ROWS = ("1.7B", "3.6B", "7.5B", "18.4B", "76.1B", "1T")
SOLVE_TARGET = {"1T": 300.0}  # CPU-s; every other row 120


def stage_lines(row: Row) -> list[str]:
    """`pp x chunks` stages of equal block counts; the embeddings join the first, the head the last."""
    per = row.per_stage or row.layers // row.pp
    n = row.layers // per
    out = []
    for i in range(n):
        mods = ["wte", "wpe", "drop"] if i == 0 else []
        mods.append(f"h[{i * per}:{(i + 1) * per}]")
        mods += ["ln_f", "lm_head"] if i == n - 1 else []
        out.append("    stage " + ", ".join(mods))
    return out


def plan_text(row: Row, holes: bool) -> str:
    """The row's plan: the published layout, or (holes) the same with the layout's choices left `?`."""
    q = "?"
    size = (lambda n: q) if holes else str
    what = "mesh degrees, microbatches, stages, schedule and checkpointing left to `planlang solve`" if holes \
        else f"the published layout: tp {row.tp}, pp {row.pp}, dp {row.dp}, microbatch size {row.mbs}"
    lines = [
        f"# bench/plan_configs/megatron/{row.stem}{'_holes' if holes else ''}.plan - Megatron-LM Table 1, "
        f"row {row.name}",
        f"# (Narayanan et al. 2021): {row.gpus} A100 80GB, global batch {row.batch}, published "
        f"{row.tflops:g} TFLOP/s per GPU;",
        f"# {what}. Generated by bench/megatron_table.py --write.",
        "use hardware",
        "use patterns.megatron",
        "",
        "# Megatron-LM 2021's attention (scores materialized) and dropout (0.1 on hidden states and attention",
        "# probabilities), whose memory traffic the roofline prices",
        'model gpt = "examples.gpt2.model:build"(',
        f"    layers = {row.layers},",
        f"    hidden = {row.hidden},",
        f"    heads = {row.heads},",
        f"    vocab = {VOCAB},",
        f"    seq = {SEQ},",
        '    attention = "unfused",',
        "    dropout = 0.1,",
        ")",
        f"input idx : i64[batch = {row.batch}, seq = {SEQ}]",
        "",
        "# DGX A100 nodes: tensor parallelism inside a node (NVLink), data and pipeline parallelism across",
        "# nodes (one HDR InfiniBand port per GPU)",
        f"mesh cluster of {row.gpus} x hardware.a100_80g {{",
        f"    dp = {size(row.dp)} over hardware.infiniband_200g",
        f"    pp = {size(row.pp)} over hardware.infiniband_200g",
        f"    tp = {size(row.tp)} over hardware.nvlink3",
        "}",
        "budget 80 GiB per device",
        "",
        "# mixed precision as the paper trains: bf16 parameters and compute, f32 master weights and Adam states",
        "optimizer adamw(lr = 0.00015, betas = [0.9, 0.95], weight_decay = 0.1) {",
        "    precision = bf16",
        "}",
        "",
        "data idx : [dp, _]",
        "",
    ]
    if holes:
        lines.append("pipeline over pp schedule ? microbatches ? { ? }")
    else:
        lines.append(f"# microbatch size {row.mbs} (the authors' run_table_1.sh): {row.batch} sequences / dp {row.dp} "
                     f"= {row.microbatches} microbatch{'es' if row.microbatches > 1 else ''}"
                     + ((", the gradients summed once (gradient accumulation)" if row.microbatches > 1 else "")
                        if row.pp == 1 else f", {row.schedule}"))
        if row.pp == 1:
            if row.microbatches > 1:
                lines.append(f"microbatches {row.microbatches}")
        else:
            lines.append(f"pipeline over pp schedule {row.schedule} microbatches {row.microbatches} {{")
            lines += stage_lines(row)
            lines.append("}")
    lines += [
        "",
        "for block in h[*] {",
        "    apply megatron.attention(tp) to block.attn",
        "    apply megatron.mlp(tp) to block.mlp",
        "}",
        "# the vocabulary split over tp, as Megatron's embedding and output layer are (Shoeybi et al. 2019, sec. 3)",
        "shard wte.weight : [tp, _]",
        "shard lm_head.weight : [tp, _]",
        "",
        "checkpoint ?" if holes else "# activation recomputation: every block's input kept, the rest recomputed",
    ]
    if not holes:
        lines.append("checkpoint h[*] every 1")
    return "\n".join(lines) + "\n"


def plan_path(row: Row, holes: bool) -> Path:
    return PLANS / f"{row.stem}{'_holes' if holes else ''}.plan"


def write_plans() -> None:
    PLANS.mkdir(parents=True, exist_ok=True)
    for row in ROWS:
        for holes in (False, True):
            plan_path(row, holes).write_text(plan_text(row, holes))
            print(f"wrote {plan_path(row, holes).relative_to(ROOT)}")


def run_child(args: list[str], timeout: float | None = None) -> tuple[subprocess.CompletedProcess, float, float]:
    """Run `planlang ARGS` in a fresh process: (the result, its CPU seconds (user + system), wall seconds)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "planlang.cli", *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        proc = subprocess.CompletedProcess(e.cmd, -9, "", f"killed after {timeout} s")
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return proc, cpu, wall


def estimate(path: Path) -> tuple[float | None, float | None, str, float | None]:
    """`planlang estimate --format json` of a plan: (the slowest device's step s, its peak GiB, an error,
    that step with its overlapped communication exposed: as Megatron-LM ran in 2021, see AS_RUN)."""
    proc, _, _ = run_child(["estimate", "--format", "json", str(path)])
    if proc.returncode != 0:
        return None, None, last_error(proc), None
    rows = json.loads(proc.stdout)  # one object per device (or pipeline stage)
    if not rows:
        return None, None, "the estimate lists no devices", None
    slowest = max(rows, key=lambda r: float(r["step_time"]))
    as_run = float(slowest["step_time"]) + float((slowest.get("step") or {}).get("overlapped", 0.0))
    return float(slowest["step_time"]), max(int(r["peak"]) for r in rows) / 2**30, "", as_run


# How Megatron-LM summed data-parallel gradients in the paper's runs depends on the row: the authors'
# run_table_1.sh passes `--DDP-impl torch` for 1.7B-18.4B and `--DDP-impl local` from 39.1B on (examples/sc21,
# CONFIG.sh). torch's DistributedDataParallel all-reduces bucket by bucket during backward (Li et al., VLDB
# 2020, §3.2.3), and Megatron-LM's no-pipeline schedule runs all but the last microbatch under `no_sync`: the
# sums overlap the last backward, as planlang's runtime and step-time model do (the `overlapped` part of a
# step). `local` summed after backward (`allreduce_gradients()` in train_step; overlapping it came in 2023 as
# --overlap-grad-reduce, NVIDIA/Megatron-LM issues #391 and #428): "as run" adds the overlapped part back for
# those rows. Every `local` row has a pipeline, whose stages sum after their last backward anyway, so "as run"
# equals planlang's step on every row of Table 1 (Run B of the results added it back on the `torch` rows too).
AS_RUN = ("as run = the same step with the gradient sums as Megatron-LM ran them: overlapped with backward under "
          "--DDP-impl torch (rows 1.7B-18.4B), after it under local")


def last_error(proc: subprocess.CompletedProcess) -> str:
    lines = [x for x in (proc.stderr or "").splitlines() if x.strip()]
    coded = [x for x in lines if re.match(r"\s*(error|planlang: error)", x)]
    if not coded and any(x.startswith("Traceback") for x in lines):
        coded = lines[-1:]  # the exception, not the traceback's first line
    return (coded or lines or [f"exit {proc.returncode}"])[0].strip()[:160]


MESH_RE = re.compile(r"^\s*(dp|pp|tp) = (\d+) over", re.M)


def layout_of(text: str) -> str:
    """The solved plan's choices in a few words: degrees, microbatches, schedule, checkpointing."""
    sizes = dict(MESH_RE.findall(text))
    m = re.search(r"pipeline over \w+ schedule (.+?) microbatches (\d+)", text)
    ck = re.findall(r"^checkpoint (.+)$", text, re.M)
    parts = [f"tp{sizes.get('tp', '?')} pp{sizes.get('pp', '?')} dp{sizes.get('dp', '?')}"]
    if m:
        parts.append(f"{m.group(1)} mb{m.group(2)}")
    parts.append("ckpt " + ("; ".join(ck) if ck else "none"))
    return ", ".join(parts)


def solve(row: Row, time_limit: float, out_dir: Path) -> tuple[str, float | None, float, float, str]:
    """`planlang solve` of the row's hole version: (layout, predicted step s, CPU s, wall s, error)."""
    out = out_dir / f"{row.stem}_solved.plan"
    proc, cpu, wall = run_child(["solve", str(plan_path(row, True)), "-o", str(out), "--time-limit",
                                 str(time_limit)], timeout=time_limit * 3 + 120)
    if proc.returncode != 0 or not out.exists():
        return "", None, cpu, wall, last_error(proc)
    text = out.read_text()
    step, _, err, _ = estimate(out)
    cut = " (cut by --time-limit)" if "INCOMPLETE SEARCH" in text else ""
    return layout_of(text) + cut, step, cpu, wall, err


def fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help="regenerate the plans from ROWS and stop")
    ap.add_argument("--rows", default=",".join(DEFAULT_ROWS), help="row names, comma-separated, or 'all'")
    ap.add_argument("--no-solve", action="store_true", help="the published layouts only")
    ap.add_argument("--time-limit", type=float, default=None,
                    help="solve's --time-limit, wall seconds (default: 3 x the row's CPU-s target)")
    ap.add_argument("--out", default=None, help="results file (default bench/results/megatron_table.txt)")
    args = ap.parse_args(argv)
    if args.write:
        write_plans()
        return
    names = [r.name for r in ROWS] if args.rows == "all" else args.rows.split(",")
    rows = [r for r in ROWS if r.name in names]
    stale = [str(plan_path(r, h).relative_to(ROOT)) for r in rows for h in (False, True)
             if not plan_path(r, h).exists() or plan_path(r, h).read_text() != plan_text(r, h)]
    if stale:
        sys.exit(f"plans differ from ROWS (run with --write): {', '.join(stale)}")
    head = git_head()
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    say(f"Megatron-LM Table 1 (Narayanan et al. 2021) against planlang at {head} (bench/megatron_table.py); "
        f"{os.cpu_count()} cores, load average at start {os.getloadavg()[0]:.1f}")
    say("TFLOP/s per GPU by Megatron's count 96*B*s*l*h^2*(1 + s/6h + V/16lh) over the predicted step; pub. = "
        "published; layout = published (tp, pp, dp, microbatch size, v = interleaved chunks per rank (else 1F1B), "
        "every block checkpointed: the authors' examples/sc21/run_table_1.sh), "
        "estimate error = (predicted - published) / published; solve = `planlang solve` of the hole version "
        "(mesh degrees, microbatches, stages, schedule, checkpointing `?`), whole command, CPU-s of the child")
    say(AS_RUN + " (run_table_1.sh's --DDP-impl; NVIDIA/Megatron-LM issues #391, #428: local's overlap came in 2023)")
    say(f"{'row':>6} {'GPUs':>5} {'pub.':>6} {'layout':>26} {'step s':>8} {'TFLOP/s':>8} {'err':>7} "
        f"{'as run':>8} {'TFLOP/s':>8} {'err':>7} {'peak GiB':>8} | {'solve cpu s':>11} {'target':>6} {'step s':>8} {'TFLOP/s':>8} {'vs pub.':>7}  solved plan")
    with tempfile.TemporaryDirectory() as tmp:
        for row in rows:
            step, peak, err, as_run = estimate(plan_path(row, False))
            pub_tf = row.tflops_at(step) if step else None
            err_pct = None if pub_tf is None else (pub_tf - row.tflops) / row.tflops * 100
            as_run = step if row.ddp == "torch" else as_run  # torch DDP overlaps the sums (AS_RUN)
            run_tf = row.tflops_at(as_run) if as_run else None
            run_pct = None if run_tf is None else (run_tf - row.tflops) / row.tflops * 100
            layout = f"tp{row.tp} pp{row.pp} dp{row.dp} mbs{row.mbs}" + (f" v{row.chunks}" if row.chunks > 1 else "")
            left = (f"{row.name:>6} {row.gpus:>5} {row.tflops:>6g} {layout:>26} {fmt(step, '8.3f')} "
                    f"{fmt(pub_tf, '8.1f')} {fmt(err_pct, '+6.1f'):>6}% {fmt(as_run, '8.3f')} {fmt(run_tf, '8.1f')} "
                    f"{fmt(run_pct, '+6.1f'):>6}% {fmt(peak, '8.1f')}")
            if args.no_solve:
                say(left + (f"   {err}" if err else ""))
                continue
            target = SOLVE_TARGET.get(row.name, 120.0)
            # the limit is wall time; the target CPU time (a loaded machine runs the same work slower)
            solved, s_step, cpu, wall, s_err = solve(row, args.time_limit or 3 * target, Path(tmp))
            s_tf = row.tflops_at(s_step) if s_step else None
            vs = None if (s_step is None or step is None) else (step / s_step - 1) * 100
            say(f"{left} | {cpu:>11.1f} {target:>6g} {fmt(s_step, '8.3f')} {fmt(s_tf, '8.1f')} "
                f"{fmt(vs, '+6.1f'):>6}%  {solved or s_err} (wall {wall:.0f} s)" + (f"; estimate: {err}" if err else ""))
    say(f"load average at end {os.getloadavg()[0]:.1f}; vs pub. = how much faster (+) the solved plan's step is "
        "than the published layout's, by planlang's model")
    if args.out or not args.no_solve and args.rows == ",".join(DEFAULT_ROWS):
        out = Path(args.out or RESULTS)
        out.write_text("\n".join(lines) + "\n")
        print(f"wrote {out}")


def git_head() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True).stdout.strip() or "?"
    except OSError:
        return "?"


if __name__ == "__main__":
    main()
