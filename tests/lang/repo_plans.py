"""Every plan file of the repository (examples, the standard library, the tests' plans) as (path, text),
for the tests that hold the parser's pieces to each other on all of them."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def repo_plans() -> list[tuple[str, str]]:
    files = sorted({*ROOT.glob("examples/**/*.plan"), *ROOT.glob("planlang/stdlib/**/*.plan"),
                    *ROOT.glob("tests/**/*.plan")})
    out = []
    for f in files:
        try:
            out.append((str(f.relative_to(ROOT)), f.read_text(encoding="utf-8")))
        except UnicodeDecodeError:  # the corpus's deliberately undecodable files
            continue
    return out
