"""CPU time of `planlang check` per invocation on the bundled examples (target: <= 0.15 CPU-s each, issue
32), and `planlang check` / `planlang fmt --check` on generated big plans (target for 5 MB: < 10 CPU-s, < 200 MB).

Run: .venv/bin/python bench/check_time.py [--repeat 5] [--big-repeat 3] [--sizes 0.5,5] [--out FILE]

Examples: one row per example plan, a fresh process each time as a user runs it: the CPU time (user +
system, from wait4: what the process costs, whatever else the machine runs) as the least and the median
of the repeats, with the parser cache (planlang.lang.parser_cache, as a user's second and later checks
run) and without it (PLANLANG_PARSER_CACHE=0: the driver built from Lark in every process, as before the
cache), the median wall time, and the in-process time of parse+resolve+check for comparison; then
`planlang --version`, the imports a check needs without running one, and a bare `python -c pass` the
same way: the floors under every command. The processes run with their bytecode cached (as an installed
planlang has it: pip compiles it): in a temporary PYTHONPYCACHEPREFIX, written by one run before the
measured ones, whatever PYTHONDONTWRITEBYTECODE says here; the parser cache goes to a temporary
PLANLANG_CACHE_DIR, written by that run too.

Big plans: `big_plan(n)` writes a valid plan of about n bytes the way a user writes a big hand-tuned plan
(a deep GPT-2 style model, its blocks sharded in groups of ten: `for` loops over the stdlib's Megatron
templates, hand-written `shard` lines, templates of the plan applied to ranges, loops with their own
bodies, disjoint `checkpoint` groups, full-line, trailing and suppression comments). Each command runs
in a fresh process; the row gives the median CPU and wall times and the largest peak memory (the
process's maximum resident set size, from wait4) over the repeats, and per line of the plan.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLANLANG = [sys.executable, "-m", "planlang.cli"]
BIG_TARGET = {"seconds": 10.0, "mb": 200.0, "size": 5_000_000}  # the 5 MB plan's budget


def big_plan(target_bytes: int = 5_000_000) -> str:
    """A valid plan of about `target_bytes` (at least the header), the same text for the same size."""
    groups = []
    size = 0
    g = 0
    while size < target_bytes:
        a, b = 10 * g, 10 * g + 10
        kind = g % 5
        out = [f"# ---- blocks {a}-{b - 1} " + "-" * 60]
        if kind == 0:
            out += [
                f"# Megatron tensor parallelism from the standard library for blocks {a}..{b - 1}",
                f"for block in h[{a}:{b}] {{",
                "    apply megatron.attention(tp) to block.attn",
                "    apply megatron.mlp(tp) to block.mlp  # column- then row-parallel",
                "    shard output of block.ln_1 : [dp, _, _]",
                "}",
                f"checkpoint h[{a}:{b}] every 2  # five groups of two blocks",
            ]
        elif kind == 1:
            out.append("# hand-written shards, one checkpoint group per block")
            for i in range(a, b):
                out += [
                    f"shard h[{i}].attn.c_attn.weight : [_, tp]",
                    f"shard h[{i}].attn.c_attn.bias : [tp]",
                    f"shard output of h[{i}].attn.c_attn : [_, _, tp]",
                    f"shard h[{i}].attn.c_proj.weight : [tp, _]  # row-parallel",
                    f"shard h[{i}].attn.c_proj.bias : [_]",
                    f"shard output of h[{i}].attn.c_proj : [_, _, _] partial(tp)",
                    f"shard h[{i}].mlp.c_fc.weight : [_, tp]",
                    f"shard h[{i}].mlp.c_fc.bias : [tp]",
                    f"shard h[{i}].mlp.c_proj.weight : [tp, _]",
                    f"shard h[{i}].mlp.c_proj.bias : [_]",
                    f"checkpoint h[{i}]",
                    "",
                ]
        elif kind == 2:
            out += [
                f"# a template of this plan for blocks {a}..{b - 1}: recompute attention and MLP per block",
                f"template stack_{g}(t: axis, n: int) {{",
                "    apply megatron.attention(t) to attn",
                "    apply megatron.mlp(t) to mlp",
                "    shard ln_1.weight : [_]",
                "    shard ln_2.weight : [_]",
                "    checkpoint attn, mlp every n",
                "}",
                f"apply stack_{g}(tp, 1) to h[{a}:{b}]",
            ]
        elif kind == 3:
            out += [
                "# plan: ignore[PL303]",
                f"for block in h[{a}:{b}] {{",
                "    for proj in block.attn.c_* {",
                "        shard proj.bias : [_]",
                "    }",
                "    shard block.mlp.c_fc.weight   : [(dp, tp), _]",
                "    shard block.mlp.c_proj.weight : [_, (dp, tp)]",
                "    checkpoint block.attn, block.mlp  # one group per block",
                "}",
            ]
        else:
            out.append("# explicit ranges, every block its own group")
            for i in range(a, b, 2):
                out += [
                    f"shard h[{i}:{i + 2}].ln_1.weight : [_]; shard h[{i}:{i + 2}].ln_2.weight : [_]",
                    f"apply megatron.attention(tp) to h[{i}:{i + 2}].attn",
                    f"apply megatron.mlp(tp) to h[{i}:{i + 2}].mlp",
                    f"checkpoint h[{i}], h[{i + 1}].attn, h[{i + 1}].mlp",
                ]
        out.append("")
        text = "\n".join(out) + "\n"
        groups.append(text)
        size += len(text)
        g += 1
    head = f'''# A {10 * g}-block GPT-2 style model on 8 A100s: 2 data x 4 tensor parallel, written out by hand.
use hardware
use patterns.megatron

model gpt = "examples.gpt2.model:build"(
    layers = {10 * g},
    hidden = 1024,
    heads = 16,
    vocab = 50304,
    seq = 1024,
)
input idx : i64[batch = 32, seq = 1024]

mesh cluster of 8 x hardware.a100_80g {{
    dp = 2 over hardware.nvlink3
    tp = 4 over hardware.nvlink3  # inside one node
}}
budget 60 GiB per device

optimizer adamw(lr = 0.0003, weight_decay = 0.1) {{
    zero = 1 over dp
}}

data idx : [dp, _]
shard wte.weight : [_, _]
shard lm_head.weight : [_, _]

'''
    return head + "".join(groups)


def run_measured(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float, int, float]:
    """(wall seconds, peak resident memory in MB, exit code, CPU seconds: user + system) of one fresh
    process."""
    t = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_maxrss / 1024, proc.returncode, usage.ru_utime + usage.ru_stime  # maxrss: KiB


def cached_bytecode_env(prefix: str) -> dict[str, str]:
    """This environment, with bytecode written to and read from `prefix` and planlang's caches under it
    (see the module docstring)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PLANLANG_PARSER_CACHE")}
    env["PYTHONPYCACHEPREFIX"] = prefix
    env["PLANLANG_CACHE_DIR"] = str(Path(prefix) / "planlang-cache")
    return env


def examples(repeat: int, out) -> None:
    plans = sorted((ROOT / "examples").rglob("*.plan"))
    from planlang.plan.checker import check_file

    out(f"{'':44} {'parser cache (CPU-s)':>23} {'no parser cache (CPU-s)':>23}")
    out(f"{'plan':44} {'least':>11} {'median':>11} {'least':>11} {'median':>11} {'wall (s)':>9} "
        f"{'in-process (ms)':>16} {'result':>8}")
    worst = (0.0, 0.0)  # the largest least and median CPU-s of a check
    with tempfile.TemporaryDirectory() as prefix:
        env = cached_bytecode_env(prefix)
        before = {**env, "PLANLANG_PARSER_CACHE": "0"}
        run_measured(PLANLANG + ["check", str(plans[0].relative_to(ROOT))], env)  # writes bytecode, parser cache

        def row(name: str, argv: list[str], inproc: str, result: str | None = None,
                compare: bool = True, extra: dict[str, str] | None = None) -> tuple[float, float]:
            runs, cpu_before = [], []
            for _ in range(repeat):  # interleaved: the same load for both
                runs.append(run_measured(argv, {**env, **(extra or {})}))
                if compare:
                    cpu_before.append(run_measured(argv, before)[3])
            cpu = [r[3] for r in runs]
            rc = runs[-1][2]
            shown = result if result is not None else ("ok" if rc == 0 else f"rc={rc}")
            then = (f"{min(cpu_before):11.3f} {statistics.median(cpu_before):11.3f}" if compare
                    else f"{'':11} {'':11}")
            out(f"{name:44} {min(cpu):11.3f} {statistics.median(cpu):11.3f} {then} "
                f"{statistics.median(r[0] for r in runs):9.3f} {inproc:>16} {shown:>8}")
            return min(cpu), statistics.median(cpu)

        for plan in plans:
            rel = plan.relative_to(ROOT)
            check_file(str(plan))  # warm the grammar cache
            t = time.perf_counter()
            for _ in range(repeat):
                check_file(str(plan))
            inproc = (time.perf_counter() - t) / repeat * 1000
            least, med = row(str(rel), PLANLANG + ["check", str(rel)], f"{inproc:.1f}")
            worst = (max(worst[0], least), max(worst[1], med))
        entry = Path(sys.executable).parent / "planlang"  # the installed console script
        if entry.is_file():
            rel = plans[0].relative_to(ROOT)
            least, med = row(f"planlang check {rel.name} (entry point)", [str(entry), "check", str(rel)], "")
            worst = (max(worst[0], least), max(worst[1], med))
        typer_plan = "examples/gpt2/gpt2_3d.plan"  # through the Typer app, as every check ran before planlang.cli.fast
        row(f"check {Path(typer_plan).name} via Typer (NO_FAST_CLI)", PLANLANG + ["check", typer_plan], "",
            compare=False, extra={"PLANLANG_NO_FAST_CLI": "1"})
        out()
        version = row("planlang --version", PLANLANG + ["--version"], "", "", compare=False)
        for name, code in FLOORS:
            row(name, [sys.executable, "-c", code], "", "", compare=False)
        bare = row("python -c pass", [sys.executable, "-c", "pass"], "", "", compare=False)
    # the least of the repeats is what a check costs; the median adds what other processes take of the
    # caches and cores of a shared machine
    out(f"\nworst check: {worst[0]:.3f} CPU-s (least of {repeat}; median {worst[1]:.3f}), {worst[0] / 0.15:.2f} x "
        f"the 0.15 CPU-s target; planlang --version {version[0]:.3f}, bare python {bare[0]:.3f}")


# what a check loads before it parses anything, without running one: where the 0.15 CPU-s target goes
FLOORS = (("import typer", "import typer"),
          ("import planlang.lang.ast (dataclasses)", "import planlang.lang.ast"),
          ("import lark", "import lark"),
          ("import planlang.plan.checker", "import planlang.plan.checker"),
          ("import planlang.cli.fast (a check's imports)", "import planlang.cli.fast"),
          ("import planlang.cli.commands (Typer's app)", "import planlang.cli.commands"))


def big_plans(sizes_mb: list[float], repeat: int, out) -> bool:
    """The big-plan table; True when the 5 MB plan (if measured) is within its budget. Per line: the CPU
    time and peak memory above those of a one-line plan (the interpreter, imports, start-up). The time
    budget is judged on CPU-s (user + system): for this one-threaded process the same as the wall time on
    an idle machine, and not stretched, as the wall time is, by whatever else a shared machine runs."""
    ok = True
    commands = (("check", ["check"]), ("fmt --check", ["fmt", "--check"]))
    out(f"{'plan':10} {'lines':>8} {'command':12} {'CPU (s)':>8} {'wall (s)':>9} {'peak (MB)':>10} "
        f"{'us/line':>8} {'KB/line':>8} {'result':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        env = cached_bytecode_env(str(Path(tmp) / "pycache"))
        tiny = Path(tmp) / "one_line.plan"
        tiny.write_text("shard wte.weight : [_, _]\n", encoding="utf-8")
        run_measured(PLANLANG + ["check", str(tiny)], env)  # writes the bytecode
        base = {}
        for name, args in commands:
            runs = [run_measured(PLANLANG + args + [str(tiny)], env) for _ in range(repeat)]
            base[name] = (statistics.median(r[3] for r in runs), max(r[1] for r in runs))
            out(f"{'one line':10} {1:8} {name:12} {base[name][0]:8.2f} {statistics.median(r[0] for r in runs):9.2f} "
                f"{base[name][1]:10.1f} {'':>8} {'':>8} {'':>8}")
        for mb in sizes_mb:
            text = big_plan(int(mb * 1_000_000))
            path = Path(tmp) / f"big_{mb:g}mb.plan"
            path.write_text(text, encoding="utf-8")
            lines = text.count("\n")
            for name, args in commands:
                runs = [run_measured(PLANLANG + args + [str(path)], env) for _ in range(repeat)]
                cpu = statistics.median(r[3] for r in runs)
                wall = statistics.median(r[0] for r in runs)
                peak = max(r[1] for r in runs)
                # check: a clean plan exits 0; fmt --check: 1 means "would reformat" (the generator does not
                # align shard runs as fmt does), 2 would be a usage or internal error
                rcs = {r[2] for r in runs}
                good = rcs == {0} if name == "check" else rcs <= {0, 1}
                within = ""
                if abs(len(text) - BIG_TARGET["size"]) < 0.05 * BIG_TARGET["size"]:
                    fits = cpu < BIG_TARGET["seconds"] and peak < BIG_TARGET["mb"]
                    ok &= fits and good
                    within = "  within budget" if fits else "  OVER BUDGET"
                base_cpu, base_peak = base[name]
                out(f"{len(text) / 1e6:6.2f} MB {lines:8} {name:12} {cpu:8.2f} {wall:9.2f} {peak:10.1f} "
                    f"{(cpu - base_cpu) / lines * 1e6:8.1f} {(peak - base_peak) * 1024 / lines:8.2f} "
                    f"{'ok' if good else 'rc=' + ','.join(map(str, sorted(rcs))):>8}{within}")
        # the largest plan again with a syntax error on its last line (one error reported: exit 1)
        broken = Path(tmp) / "broken.plan"
        broken.write_text(big_plan(int(max(sizes_mb) * 1_000_000)) + "shard h[0 : [dp]\n", encoding="utf-8")
        runs = [run_measured(PLANLANG + ["check", str(broken)], env) for _ in range(repeat)]
        out(f"{max(sizes_mb):6.2f} MB {'+1 line':>8} {'check':12} {statistics.median(r[3] for r in runs):8.2f} "
            f"{statistics.median(r[0] for r in runs):9.2f} {max(r[1] for r in runs):10.1f} {'':>8} {'':>8} "
            f"{'rc=' + ','.join(sorted({str(r[2]) for r in runs})):>8}  with a syntax error on the last line")
    out(f"\nbudget for a {BIG_TARGET['size'] / 1e6:g} MB plan: < {BIG_TARGET['seconds']:g} CPU-s and "
        f"< {BIG_TARGET['mb']:g} MB peak, for check and for fmt; CPU and wall: median of {repeat} runs, peak: "
        "the largest (max RSS); per line: above the one-line plan")
    return ok


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5, help="runs per example plan")
    ap.add_argument("--big-repeat", type=int, default=3, help="runs per big plan and command")
    ap.add_argument("--sizes", default="0.5,5", help="big plan sizes in MB, comma-separated ('' for none)")
    ap.add_argument("--no-examples", action="store_true")
    ap.add_argument("--out", type=Path, help="also write the tables to this file")
    args = ap.parse_args()
    lines: list[str] = []

    def out(line: str = "") -> None:
        print(line, flush=True)
        lines.append(line)

    if not args.no_examples:
        examples(args.repeat, out)
    ok = True
    sizes = [float(s) for s in args.sizes.split(",") if s.strip()]
    if sizes:
        if not args.no_examples:
            out()
        ok = big_plans(sizes, args.big_repeat, out)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
