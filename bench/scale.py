"""`check --model` and `estimate` of models at the scale people train (issue #29, part 1): whole commands,
each in a fresh process, timed as a user meets them — cold (an empty cache directory) and warm (the
cache the cold run wrote) — in CPU seconds (user + system of the child) and peak RSS.

Rows: Llama-3-8B and Llama-3-70B (Hugging Face LlamaForCausalLM at the published shapes, sequence 8192,
64 H100s: tp 8 inside a node, ZeRO-3 dp 8 across nodes, bf16, every layer checkpointed:
bench/plan_configs/scale/) and Megatron-LM's 1T row (GPT from examples/gpt2: 128 layers, hidden 25600,
160 heads, sequence 2048 on 3072 A100s, tp 8 x pp 64 x dp 6: bench/plan_configs/megatron/megatron_1t.plan).
Targets: 5 / 10 / 20 CPU-s and 1 GB cold, 1 s warm.

    python bench/scale.py                  # every row, least of 3 cold runs each; writes bench/results/scale.txt
    python bench/scale.py --rows 8B --no-write
    python bench/scale.py --repeat 2 --base /tmp/base   # least of 2 cold runs; another checkout's beside
                                                        # them (PYTHONPATH, runs interleaved: same load)
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "scale.txt"
ROWS = {  # name -> (plan, cold CPU-s target)
    "8B": (ROOT / "bench/plan_configs/scale/llama3_8b.plan", 5.0),
    "70B": (ROOT / "bench/plan_configs/scale/llama3_70b.plan", 10.0),
    "1T": (ROOT / "bench/plan_configs/megatron/megatron_1t.plan", 20.0),
}
COMMANDS = {"check --model": ["check", "--model"], "estimate": ["estimate"]}
WARM_TARGET = 1.0
RSS_TARGET_MB = 1024


def run(args: list[str], cache: str, cwd: Path, source: str | None = None) -> tuple[float, float, int, str]:
    """One whole command in a fresh process: (CPU-s, peak RSS MB, exit code, its last output line).
    `source`: a checkout whose planlang runs instead of this one's."""
    env = dict(os.environ, PLANLANG_CACHE_DIR=cache, **({"PYTHONPATH": source} if source else {}))
    proc = subprocess.Popen([sys.executable, "-m", "planlang.cli", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    last = next((ln for ln in reversed(out.splitlines()) if ln.strip()), "")
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, proc.returncode, last


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=",".join(ROWS), help="comma-separated rows: " + ", ".join(ROWS))
    ap.add_argument("--no-write", action="store_true", help="print only; do not write bench/results/scale.txt")
    ap.add_argument("--repeat", type=int, default=3, help="cold and warm runs per command; the least CPU-s is "
                    "shown (other work on the machine only adds time; a 2-core VM drifts ~15%% in minutes)")
    ap.add_argument("--base", help="another checkout (e.g. a git worktree of an earlier commit): its cold runs "
                    "interleaved with this one's, shown beside them")
    opts = ap.parse_args()
    base = f"{opts.base} ({_commit(Path(opts.base))})" if opts.base else ""
    load = os.getloadavg()[0]  # other work on the machine inflates every figure: said with them
    lines = [f"# bench/scale.py at {_commit()} ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
             f"{os.cpu_count()} CPUs, python {sys.version.split()[0]})",
             "# whole commands in a fresh process; CPU-s = user + system of the child; RSS = its peak",
             f"# targets: cold <= 5 / 10 / 20 CPU-s (8B / 70B / 1T) and <= {RSS_TARGET_MB} MB; warm <= {WARM_TARGET} CPU-s",
             *([f"# base: {base}; least of {opts.repeat} run(s) each"] if base else
               [f"# least of {opts.repeat} run(s) each"] if opts.repeat > 1 else []),
             "",
             f"{'row':<5} {'command':<14} {'cold CPU-s':>10} {'cold MB':>8} {'warm CPU-s':>10} {'warm MB':>8}  "
             + (f"{'base cold':>9} {'base MB':>7}  " if base else "") + f"{'targets met':<12} exit  last line"]
    print("\n".join(lines), flush=True)
    for name in opts.rows.split(","):
        plan, target = ROWS[name]
        for label, args in COMMANDS.items():
            colds, warms, bases = [], [], []
            for _ in range(max(1, opts.repeat)):
                if opts.base:
                    with tempfile.TemporaryDirectory(prefix="planlang-scale-cache-") as cache:
                        bases.append(run([*args, plan.name], cache, plan.parent, opts.base))
                with tempfile.TemporaryDirectory(prefix="planlang-scale-cache-") as cache:
                    colds.append(run([*args, plan.name], cache, plan.parent))
                    warms.append(run([*args, plan.name], cache, plan.parent))
            cold, warm = min(colds), min(warms)
            met = cold[0] <= target and cold[1] <= RSS_TARGET_MB and warm[0] <= WARM_TARGET
            beside = f"{min(bases)[0]:>9.1f} {min(bases)[1]:>7.0f}  " if bases else ""
            line = (f"{name:<5} {label:<14} {cold[0]:>10.1f} {cold[1]:>8.0f} {warm[0]:>10.2f} {warm[1]:>8.0f}  "
                    f"{beside}{'yes' if met else 'no':<12} {cold[2]}/{warm[2]}  {cold[3][:70]}")
            lines.append(line)
            print(line, flush=True)
    lines.append(f"# load average (1 min) {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    print(lines[-1])
    if not opts.no_write:  # the newest run first; the earlier runs' lines kept below it
        earlier = RESULTS.read_text() if RESULTS.exists() else ""
        RESULTS.write_text("\n".join(lines) + "\n" + ("\n" + earlier if earlier else ""))


def _commit(where: Path = ROOT) -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=where, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


if __name__ == "__main__":
    main()
