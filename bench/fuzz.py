"""Fuzz the front end: generated and mutated plans through parse -> resolve -> check -> render -> fmt.

Run: .venv/bin/python bench/fuzz.py [--generated 5000] [--mutated 5000] [--seed 0]

Generated inputs come from the hypothesis strategy in tests/lang/strategies.py (valid syntax, random
content: unknown names, odd sizes, holes everywhere). Mutated inputs take every bundled plan, corpus
plan and a sample of generated ones and apply random edits (delete/insert/duplicate/swap characters,
tokens and lines). Diagnostics are the expected outcome; an uncaught exception is a bug. Failing
inputs are written to bench/fuzz_failures/ and the script exits 1.
"""
from __future__ import annotations

import argparse
import random
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planlang.lang.fmt import FormatError, format_text  # noqa: E402
from planlang.lang.render import FORMATS, render  # noqa: E402
from planlang.plan.checker import check_text  # noqa: E402

TOKENS = [
    "{", "}", "(", ")", "[", "]", ",", ";", ":", "=", "?", "_", ".", "*", "**", "\n", "#", '"', "\\\n",
    "use", "model", "input", "device", "link", "mesh", "budget", "optimizer", "data", "shard", "pipeline",
    "checkpoint", "template", "apply", "for", "in", "to", "of", "over", "per", "device", "schedule",
    "microbatches", "chunks", "stage", "with", "every", "partial", "output", "input", "x", "1f1b", "gpipe",
    "interleaved", "0", "1", "8", "1_024", "3e-4", "0.5", "GiB", "GB/s", "us", "TFLOPS", "tp", "dp", "pp",
    "h[0:6]", "h[*]", "[0]", "zero", "memory", "bandwidth", "latency", "flops.bf16", "i64", "bf16", "\t", "é",
]


class Stats:
    def __init__(self):
        self.inputs = 0
        self.diagnostics = 0
        self.clean = 0
        self.failures: list[tuple[str, str]] = []


def run_one(text: str, stats: Stats, path: str = "fuzz.plan") -> None:
    stats.inputs += 1
    try:
        res = check_text(text, path)
        for fmt in FORMATS:
            render(res.diagnostics, res.sources, fmt)
        stats.diagnostics += len(res.diagnostics)
        if not res.diagnostics:
            stats.clean += 1
        try:
            once = format_text(text, path)
            if format_text(once, path) != once:
                raise AssertionError("formatter is not idempotent on this input")
        except FormatError:
            pass
    except Exception:  # noqa: BLE001 - the point is to catch everything
        stats.failures.append((text, traceback.format_exc()))


def mutate(text: str, rng: random.Random) -> str:
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        pos = rng.randint(0, len(text)) if text else 0
        if op == 0 and text:  # delete a run of characters
            end = min(len(text), pos + rng.randint(1, 12))
            text = text[:pos] + text[end:]
        elif op == 1:  # insert a token
            text = text[:pos] + rng.choice(TOKENS) + text[pos:]
        elif op == 2:  # insert a random character
            text = text[:pos] + chr(rng.choice([rng.randint(32, 126), rng.randint(0, 0x2FF)])) + text[pos:]
        elif op == 3:  # duplicate a line
            lines = text.split("\n")
            i = rng.randrange(len(lines))
            lines.insert(i, lines[i])
            text = "\n".join(lines)
        elif op == 4:  # delete a line
            lines = text.split("\n")
            if len(lines) > 1:
                del lines[rng.randrange(len(lines))]
            text = "\n".join(lines)
        elif op == 5 and len(text) > 2:  # swap two characters
            i = rng.randrange(len(text) - 1)
            text = text[:i] + text[i + 1] + text[i] + text[i + 2:]
        else:  # replace a digit run with another number
            digits = [i for i, c in enumerate(text) if c.isdigit()]
            if digits:
                i = rng.choice(digits)
                text = text[:i] + str(rng.choice([0, 1, 3, 7, 10**12])) + text[i + 1:]
    return text


def generated(n: int, seed: int, stats: Stats, keep: list[str], chunk: int = 250) -> None:
    """`n` plans from the hypothesis strategy, in runs of `chunk` (hypothesis keeps a tree of every
    choice it made during one run; separate runs keep memory flat)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hseed

    sys.path.insert(0, str(ROOT / "tests" / "lang"))
    from strategies import plan_texts  # noqa: E402

    for k, start in enumerate(range(0, n, chunk)):
        @hseed(seed * 100_003 + k)
        @settings(max_examples=min(chunk, n - start), deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(plan_texts())
        def body(text):
            if len(keep) < 500:
                keep.append(text)
            run_one(text, stats)

        body()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--generated", type=int, default=5000)
    ap.add_argument("--mutated", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.perf_counter()
    gen_stats, mut_stats = Stats(), Stats()
    samples: list[str] = []
    generated(args.generated, args.seed, gen_stats, samples)
    t1 = time.perf_counter()
    seeds = [p.read_text(encoding="utf-8") for d in ("examples", "stdlib", "tests/lang/corpus")
             for p in sorted((ROOT / d).rglob("*.plan"))] + samples
    rng = random.Random(args.seed)
    for _ in range(args.mutated):
        run_one(mutate(rng.choice(seeds), rng), mut_stats)
    t2 = time.perf_counter()
    print(f"{'source':12} {'inputs':>8} {'clean':>8} {'diagnostics':>12} {'exceptions':>11} {'time (s)':>9}")
    for name, s, dt in (("generated", gen_stats, t1 - t0), ("mutated", mut_stats, t2 - t1)):
        print(f"{name:12} {s.inputs:8d} {s.clean:8d} {s.diagnostics:12d} {len(s.failures):11d} {dt:9.1f}")
    total = gen_stats.inputs + mut_stats.inputs
    failures = gen_stats.failures + mut_stats.failures
    print(f"{'total':12} {total:8d} {'':8} {'':12} {len(failures):11d} {t2 - t0:9.1f}")
    if failures:
        out = ROOT / "bench" / "fuzz_failures"
        out.mkdir(exist_ok=True)
        for i, (text, tb) in enumerate(failures[:50]):
            (out / f"case{i}.plan").write_text(text, encoding="utf-8")
            (out / f"case{i}.txt").write_text(tb, encoding="utf-8")
        print(f"first failure:\n{failures[0][1]}")
        print(f"inputs written to {out}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
