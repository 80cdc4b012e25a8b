"""Side by side: the solver's plans ("ours") in two runs of bench/plan_quality.py, configuration by
configuration, with a verdict per objective.

Run: .venv/bin/python bench/plan_quality_compare.py BEFORE AFTER [--out FILE]

Each configuration (a `== ...` title; the "With communication" pass repeats them, marked `+comm`) has three
rows of ours: time (judged by the predicted step), memory (by the peak) and balanced (by peak x step). A row
is "worse" when its measure grew by more than 0.5 % (the printed figures are rounded to 3-4 digits), and
"better" when it fell by more than that. Both runs' figures are the estimator's predictions at the time of
the run: a change to the estimator changes them for every plan alike, and the verdict is on what the
command would tell its user.
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "us": 1e-6, "ms": 1e-3, "s": 1.0}
ROW = re.compile(r"^ours \((time|memory|balanced)\)\s+(.*?)\s{2,}([\d.]+) (B|KiB|MiB|GiB|TiB)\s+([\d.]+) (us|ms|s)\b")
TOLERANCE = 0.005


def rows(path: Path) -> dict[tuple[str, str], tuple[str, float, float]]:
    """(configuration, objective) -> (plan, peak bytes, step seconds)."""
    out: dict[tuple[str, str], tuple[str, float, float]] = {}
    title, comm = "", False
    for line in path.read_text().splitlines():
        if line.startswith("==== With communication"):
            comm = True
        elif line.startswith("== "):
            title = line[3:].split(" on ")[0].strip() + (" +comm" if comm else "")
        m = ROW.match(line)
        if m and title:
            obj, plan, peak, pu, step, su = m.groups()
            out[(title, obj)] = (plan.strip(), float(peak) * UNITS[pu], float(step) * UNITS[su])
    return out


def measure(obj: str, peak: float, step: float) -> float:
    return step if obj == "time" else peak if obj == "memory" else peak * step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    old, new = rows(args.before), rows(args.after)
    lines = [f"ours before ({args.before}) and after ({args.after}), bench/plan_quality_compare.py",
             f"{'configuration':58} {'objective':9} {'before: peak GiB, step s':>25} {'after':>20}  verdict"]
    counts = {"better": 0, "same": 0, "worse": 0, "missing": 0}
    for key in old:
        title, obj = key
        before = old[key]
        after = new.get(key)
        if after is None:
            counts["missing"] += 1
            lines.append(f"{title[:58]:58} {obj:9} {'':>25} {'(not in the new run)':>20}  missing")
            continue
        a, b = measure(obj, *before[1:]), measure(obj, *after[1:])
        verdict = "worse" if b > a * (1 + TOLERANCE) else "better" if b < a * (1 - TOLERANCE) else "same"
        counts[verdict] += 1
        lines.append(f"{title[:58]:58} {obj:9} {before[1] / 2**30:>12.3f} {before[2]:>12.4g} "
                     f"{after[1] / 2**30:>9.3f} {after[2]:>10.4g}  {verdict}")
    lines.append(", ".join(f"{k} {v}" for k, v in counts.items()))
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
