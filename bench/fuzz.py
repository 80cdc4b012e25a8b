"""Fuzz the front end: every input through the in-process `planlang check` path and every renderer.

Run: .venv/bin/python bench/fuzz.py [--inputs 100000] [--generated 2000] [--seed 0] [--out FILE]

Each input is a file's bytes. It goes the way `planlang check FILE` takes it (planlang.cli): decoded
(not UTF-8 -> PL105), parsed, resolved and checked (`planlang.cli.checking.check_one`), filtered by a default configuration,
then rendered in every output format (human with and without colour, concise, json, sarif, github) and
as `--statistics`; the formatter runs on every FMT_EVERY-th input and must be idempotent on what it
accepts. Diagnostics are the expected outcome; an uncaught exception is a bug, and so is a human
rendering that shows a control or format character raw, or more than `MAX_LINE` characters of a line.

Input families (`--inputs` is shared out among them by `WEIGHTS`):

  mutated    the seeds (every plan of examples/, the standard library, the test corpus and bench/, and
             a sample of generated ones) with 1-4 random edits: delete/insert/duplicate/swap
             characters, tokens and lines
  bytes      random bytes, and seeds with bytes flipped, inserted or deleted (invalid UTF-8, NUL, BOM)
  truncated  a seed cut at a random character or byte (a multi-byte character may be split)
  unicode    invisible and look-alike characters inserted (NUL, BOM, zero-width, bidi controls, line
             and paragraph separators, other Cc/Cf, no-break spaces, Cyrillic/Greek/fullwidth letters)
  numbers    number literals replaced by huge, tiny, long and odd ones (5,000 digits, 1e999, 1e-999)
  nesting    deeply nested brackets, long dotted paths, many statements, 30,000-character lines
  generated  the hypothesis strategy of tests/lang/strategies.py (valid syntax, random content), run
             separately (`--generated`)

Failing inputs are written to bench/fuzz_failures/ and the script exits 1.
"""
from __future__ import annotations

import argparse
import io
import random
import re
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planlang.cli import checking as cli  # noqa: E402
from planlang.cli.common import STDIN  # noqa: E402
from planlang.lang.source import SourceFile  # noqa: E402
from planlang.lang.config import Config  # noqa: E402
from planlang.lang.fmt import FormatError, format_text  # noqa: E402
from planlang.lang.render import FORMATS, render  # noqa: E402
from planlang.lang.render._common import MAX_LINE  # noqa: E402

TOKENS = [
    "{", "}", "(", ")", "[", "]", ",", ";", ":", "=", "?", "_", ".", "*", "**", "\n", "#", '"', "\\\n",
    "use", "model", "input", "device", "link", "mesh", "budget", "optimizer", "data", "shard", "pipeline",
    "checkpoint", "template", "apply", "for", "in", "to", "of", "over", "per", "device", "schedule",
    "microbatches", "chunks", "stage", "with", "every", "partial", "output", "input", "x", "1f1b", "gpipe",
    "interleaved", "0", "1", "8", "1_024", "3e-4", "0.5", "GiB", "GB/s", "us", "TFLOPS", "tp", "dp", "pp",
    "h[0:6]", "h[*]", "[0]", "zero", "memory", "bandwidth", "latency", "flops.bf16", "i64", "bf16", "\t", "é",
    "\r\n", "\r", "use \"fuzz.plan\"", "use hardware", "use patterns.megatron", "hardware.a100_80g",
]

# Invisible, control and look-alike characters (the `unicode` family).
ODD_CHARS = [
    "\x00", "\x01", "\x07", "\x08", "\x0b", "\x0c", "\r", "\x1b", "\x1b[31m", "\x7f", "\x85", "\x9b",
    "\ufeff", "\u200b", "\u200c", "\u200d", "\u2060", "\u00ad", "\u180e", "\u034f",
    "\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069", "\u200e", "\u200f",
    "\u061c", "\u2028", "\u2029", "\u00a0", "\u2007", "\u202f", "\u3000", "\u1680",
    "\u0430", "\u0435", "\u043e", "\u0440", "\u03bf", "\u0391", "\uff1d", "\uff5b", "\uff08", "\u2212", "\u2010",
    "\u037e", "\u201c", "\u201d", "\u0301", "\u20dd", "\ufe0f", "\U0001f600", "\u6a21", "\ue000", "\U000e0041",
    "\ufffd", "\ufffe", "\uffff", "\U0010ffff", "\u0378",
]

NUMBERS = [
    "0", "00", "0_0", "1_", "_1", "1__0", "9" * 30, "9" * 400, "9" * 4400, "9" * 5000, "1" + "0" * 308,
    "18446744073709551617", "1e999", "1e-999", "1e308", "9e99999", "0.0", "0.", ".5", "1.5e", "1e+", "1E5",
    "1.0000000000000000000001", "4294967296", "2147483648", "inf", "nan", "0x10", "1e", "12345678901234567890.5",
    "1_000_000_000_000_000_000", "0e0", "5" * 100 + "." + "5" * 100,
]


class Stats:
    def __init__(self):
        self.inputs = 0
        self.diagnostics = 0
        self.clean = 0
        self.seconds = 0.0
        self.slowest = (0.0, b"")
        self.failures: list[tuple[bytes, str]] = []


_CONFIG = Config(root=ROOT)


def check_bytes(data: bytes, name: str) -> tuple[list, dict]:
    """What `planlang check NAME` computes for a file with these bytes, before printing (planlang.cli)."""
    real_stdin = sys.stdin
    sys.stdin = io.TextIOWrapper(io.BytesIO(data))  # `-` reads sys.stdin.buffer: the CLI's own reading
    try:
        plan = cli.read_plan(STDIN, name)
    finally:
        sys.stdin = real_stdin
    if plan.undecodable is not None:
        return [plan.undecodable], {plan.name: SourceFile(plan.name, plan.text)}
    res = cli.check_one(plan.name, plan.text, False)
    return _CONFIG.keep(res.diagnostics), dict(res.sources)


_RAW_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u00ad\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff]")
_SOURCE_ROW = re.compile(r" +\d+ \| ")


def check_human(out: str) -> None:
    """No line of the human rendering holds a raw control or format character, and no source line it
    shows is longer than the window (MAX_LINE characters and two ellipses)."""
    for line in out.split("\n"):
        if _RAW_CONTROL.search(line):
            raise AssertionError(f"human output shows a raw control character: {line[:200]!r}")
        m = _SOURCE_ROW.match(line)
        if m and len(line) - m.end() > MAX_LINE + 6:  # characters; columns are fewer (combining marks)
            raise AssertionError(f"human output shows {len(line) - m.end()} characters of one source line")


FMT_EVERY = 4  # the formatter (two more parses) runs on every 4th input of a family


def run_one(data: bytes, stats: Stats, name: str = "fuzz.plan") -> None:
    stats.inputs += 1
    t0 = time.perf_counter()
    try:
        diags, sources = check_bytes(data, name)
        for fmt in FORMATS:
            out = render(diags, sources, fmt)
            if fmt == "human":
                check_human(out)
        render(diags, sources, "human", color=True)
        cli.statistics_table(diags)
        stats.diagnostics += len(diags)
        if not diags:
            stats.clean += 1
        if stats.inputs % FMT_EVERY == 1:
            text = data.decode("utf-8", errors="replace")
            try:
                once = format_text(text, name)
                if format_text(once, name) != once:
                    raise AssertionError("formatter is not idempotent on this input")
            except FormatError:
                pass
    except Exception:  # noqa: BLE001 - the point is to catch everything
        stats.failures.append((data, traceback.format_exc()))
    dt = time.perf_counter() - t0
    stats.seconds += dt
    if dt > stats.slowest[0]:
        stats.slowest = (dt, data)


# ---- input families -----------------------------------------------------------------------------

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


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    if not data or rng.random() < 0.15:  # random bytes, mostly printable or mostly not
        n = rng.choice([0, 1, 2, 7, 64, 512, 4096])
        if rng.random() < 0.5:
            return bytes(rng.randrange(256) for _ in range(n))
        return bytes(rng.choice(b"{}()[]=,:;.#\"_ \n\tabcxyz0123456789\xc3\xa9\xff\x00") for _ in range(n))
    buf = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        op = rng.randrange(6)
        pos = rng.randint(0, len(buf))
        if op == 0 and buf:  # flip bits of one byte
            i = rng.randrange(len(buf))
            buf[i] ^= 1 << rng.randrange(8)
        elif op == 1:  # insert random bytes
            buf[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 4)))
        elif op == 2:  # insert a notable sequence
            buf[pos:pos] = rng.choice([b"\x00", b"\xef\xbb\xbf", b"\xff\xfe", b"\xc3", b"\xe2\x80", b"\xed\xa0\x80",
                                       b"\xf4\x90\x80\x80", b"\xc0\xaf", b"\r", b"\r\n", b"\x1b[2J", b"\x80"])
        elif op == 3 and buf:  # delete bytes
            del buf[pos:pos + rng.randint(1, 8)]
        elif op == 4:  # a BOM first
            buf[0:0] = b"\xef\xbb\xbf"
        else:  # line endings to CRLF or CR
            buf = bytearray(bytes(buf).replace(b"\n", rng.choice([b"\r\n", b"\r"])))
    return bytes(buf)


def truncate(data: bytes, rng: random.Random) -> bytes:
    if rng.random() < 0.5:  # at a byte: may split a UTF-8 sequence
        return data[:rng.randint(0, len(data))]
    text = data.decode("utf-8", errors="replace")
    return text[:rng.randint(0, len(text))].encode("utf-8")


def unicode_odd(text: str, rng: random.Random) -> str:
    for _ in range(rng.randint(1, 4)):
        ch = rng.choice(ODD_CHARS) if rng.random() < 0.85 else chr(rng.choice(
            [rng.randint(0x80, 0x2FFF), rng.randint(0xE000, 0xFFFF), rng.randint(0x10000, 0x10FFFF)]))
        if 0xD800 <= ord(ch[0]) <= 0xDFFF:
            continue
        where = rng.random()
        if where < 0.4 and text:  # inside a word: a name that looks right but is not
            idents = [m.start() for m in re.finditer(r"[A-Za-z_]\w*", text)]
            pos = rng.choice(idents) + 1 if idents else 0
        elif where < 0.5:
            pos = 0
        else:
            pos = rng.randint(0, len(text))
        if rng.random() < 0.3 and text:  # replace a character rather than insert
            text = text[:pos] + ch + text[pos + 1:]
        else:
            text = text[:pos] + ch + text[pos:]
    return text


def numbers(text: str, rng: random.Random) -> str:
    runs = list(re.finditer(r"\d[\d_]*(\.\d+)?([eE][-+]?\d+)?", text))
    for _ in range(rng.randint(1, 3)):
        new = rng.choice(NUMBERS)
        if runs:
            m = rng.choice(runs)
            text = text[:m.start()] + new + text[m.end():]
            runs = list(re.finditer(r"\d[\d_]*(\.\d+)?([eE][-+]?\d+)?", text))
        else:
            pos = rng.randint(0, len(text))
            text = text[:pos] + new + text[pos:]
    return text


DEPTHS = (10, 100, 500, 1000, 5000, 20000, 100000)


def nesting(text: str, rng: random.Random, depths: tuple[int, ...] = DEPTHS) -> str:
    depth = rng.choice(depths)
    kind = rng.randrange(8)
    lines = text.split("\n")
    i = rng.randrange(len(lines) + 1)
    if kind == 0:  # brackets around a value
        o, c = rng.choice([("[", "]"), ("(", ")"), ("{", "}"), ("[", ")"), ("(", "")])
        piece = f"data idx : {o * depth}dp{c * depth}" if rng.random() < 0.5 else o * depth + c * depth
    elif kind == 1:  # a long dotted path or segment chain
        piece = "checkpoint " + ".".join(["h"] * depth) if rng.random() < 0.5 else \
            "shard " + "h" + "[0]" * depth + " : [_]"
    elif kind == 2:  # nested loops and blocks
        d = min(depth, 2000)
        piece = "".join(f"for b{k} in h[*] {{\n" for k in range(d)) + "checkpoint b0\n" + "}\n" * d
    elif kind == 3:  # one very long line
        unit = rng.choice(["x", "h[0], ", "\u200b", "模", "a = 1, ", "\t", "# ", "\"", "é"])
        piece = "stage " + unit * (30000 // len(unit))
        if rng.random() < 0.5 and lines:  # or lengthen an existing line
            j = rng.randrange(len(lines))
            lines[j] = lines[j] + " " * 30000 + "?" if rng.random() < 0.5 else " " * 30000 + lines[j]
            return "\n".join(lines)
    elif kind == 4:  # many statements
        piece = "\n".join(rng.choice(["budget 1 GiB", "checkpoint h[0]", "use hardware", "x", "}"])
                          for _ in range(min(depth, 5000)))
    elif kind == 5 and rng.random() < 0.5:  # a cycle through many templates
        d = min(depth, 500)
        piece = "\n".join(f"template t{k}(a : axis) {{ apply t{k + 1}(a) to h }}" for k in range(d))
        piece += f"\ntemplate t{d}(a : axis) {{ apply t0(a) to h }}\napply t0(tp) to h"
    elif kind == 5:  # a chain applying the next template twice per level: 2^levels applications
        levels = min(depth.bit_length(), 20)  # 100,000 -> 17 levels, past the 100,000 applications of PL224
        piece = "\n".join(f"template t{k}(a : axis) {{ apply t{k + 1}(a) to h; apply t{k + 1}(a) to h }}"
                          for k in range(levels))
        piece += f"\ntemplate t{levels}(a : axis) {{ shard w : [a] }}\napply t0(tp) to h"
    elif kind == 6:  # long strings, names and comments
        piece = rng.choice(['model m = "' + "a" * depth + '"()', "n" * depth + " = 1", "#" * depth,
                            '"' + "\\" * depth + '"', "use \"" + "../" * min(depth, 2000) + "x.plan\""])
    else:  # many lines
        return text + "\n" * depth + "x"
    lines.insert(i, piece)
    return "\n".join(lines)


WEIGHTS = {"mutated": 40, "bytes": 15, "truncated": 10, "unicode": 15, "numbers": 12, "nesting": 8}


def family_input(family: str, seed: tuple[str, bytes, str], rng: random.Random,
                 depths: tuple[int, ...] = DEPTHS) -> bytes:
    text, data, _ = seed
    if family == "mutated":
        return mutate(text, rng).encode("utf-8")
    if family == "bytes":
        return mutate_bytes(data, rng)
    if family == "truncated":
        return truncate(data, rng)
    if family == "unicode":
        return unicode_odd(text, rng).encode("utf-8")
    if family == "numbers":
        return numbers(text, rng).encode("utf-8")
    if family == "nesting":
        return nesting(text, rng, depths).encode("utf-8")
    raise ValueError(family)


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
            run_one(text.encode("utf-8"), stats)

        body()


def seed_files() -> list[tuple[str, bytes, str]]:
    """(text, bytes, name) of every plan of the checkout: examples, the standard library, the corpus.
    The name puts the fuzzed file next to its seed, so its `use "file"` imports resolve as the seed's do."""
    out = []
    for d in ("examples", "planlang/stdlib", "tests/lang/corpus", "bench"):
        for p in sorted((ROOT / d).rglob("*.plan")):
            data = p.read_bytes()
            name = str((p.parent / "fuzz.plan").relative_to(ROOT))
            out.append((data.decode("utf-8", errors="replace"), data, name))
    return out


def run(n: int, seed: int, n_generated: int = 0, progress: bool = False,
        depths: tuple[int, ...] = DEPTHS) -> dict[str, Stats]:
    """Fuzz `n` inputs shared out among the families by WEIGHTS, plus `n_generated` generated ones;
    `depths` are the sizes the nesting family draws from. The same arguments give the same inputs."""
    stats: dict[str, Stats] = {}
    samples: list[str] = []
    if n_generated:
        stats["generated"] = Stats()
        generated(n_generated, seed, stats["generated"], samples)
    seeds = seed_files() + [(s, s.encode("utf-8"), "fuzz.plan") for s in samples]
    rng = random.Random(seed)
    families = list(WEIGHTS)
    for f in families:
        stats[f] = Stats()
    total = sum(WEIGHTS.values())
    counts = {f: n * WEIGHTS[f] // total for f in families}
    counts[families[0]] += n - sum(counts.values())
    order = [f for f in families for _ in range(counts[f])]
    rng.shuffle(order)
    t0 = time.perf_counter()
    for k, family in enumerate(order):
        src = rng.choice(seeds)
        run_one(family_input(family, src, rng, depths), stats[family], src[2])
        if progress and k and k % 5000 == 0:
            fails = sum(len(s.failures) for s in stats.values())
            print(f"  {k} inputs, {k / (time.perf_counter() - t0):.0f}/s, {fails} failures", file=sys.stderr)
    return stats


def table(stats: dict[str, Stats], wall: float) -> str:
    rows = [f"{'family':10} {'inputs':>8} {'clean':>7} {'diagnostics':>12} {'exceptions':>11} "
            f"{'time (s)':>9} {'inputs/s':>9} {'slowest (s)':>12}"]
    for name, s in stats.items():
        rate = s.inputs / s.seconds if s.seconds else 0.0
        rows.append(f"{name:10} {s.inputs:8d} {s.clean:7d} {s.diagnostics:12d} {len(s.failures):11d} "
                    f"{s.seconds:9.1f} {rate:9.0f} {s.slowest[0]:12.3f}")
    n = sum(s.inputs for s in stats.values())
    fails = sum(len(s.failures) for s in stats.values())
    rows.append(f"{'total':10} {n:8d} {'':7} {'':12} {fails:11d} {wall:9.1f} {n / wall:9.0f}")
    return "\n".join(rows) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--inputs", type=int, default=100_000, help="mutated, byte, truncated, unicode, number "
                    "and nesting inputs together")
    ap.add_argument("--generated", type=int, default=2000, help="inputs from the hypothesis strategy")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="also write the result table here")
    args = ap.parse_args()
    t0 = time.perf_counter()
    stats = run(args.inputs, args.seed, args.generated, progress=True)
    wall = time.perf_counter() - t0
    result = table(stats, wall)
    print(result, end="")
    if args.out:
        head = (f"# bench/fuzz.py --inputs {args.inputs} --generated {args.generated} --seed {args.seed}\n"
                f"# python {sys.version.split()[0]}, {time.strftime('%Y-%m-%d')}\n")
        args.out.write_text(head + result, encoding="utf-8")
    failures = [f for s in stats.values() for f in s.failures]
    if failures:
        out = ROOT / "bench" / "fuzz_failures"
        out.mkdir(exist_ok=True)
        for i, (data, tb) in enumerate(failures[:50]):
            (out / f"case{i}.plan").write_bytes(data)
            (out / f"case{i}.txt").write_text(tb, encoding="utf-8")
        print(f"first failure:\n{failures[0][1]}")
        print(f"inputs written to {out}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
