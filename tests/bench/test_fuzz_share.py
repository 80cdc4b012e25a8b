"""A fixed-seed share of bench/fuzz.py: a few thousand inputs (every family: mutated plans, random and
damaged bytes, truncations, invisible and look-alike characters, huge numbers, deep nesting and long
lines) through `planlang check` in process and every renderer, without one uncaught exception.

The full run is `python bench/fuzz.py` (100,000 inputs; results in bench/results/fuzz.txt).
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import fuzz  # noqa: E402

INPUTS = 4000
SEED = 20_240_601
DEPTHS = (10, 100, 500, 1000, 5000)  # the full run goes to 100,000; these keep the share to seconds


def test_fuzz_share_raises_nothing(monkeypatch):
    # PL224 stops template expansion at 100,000 applications (plus 100 per `apply` written): reached in
    # 1-3 s. A smaller budget takes the same paths in a fraction of the time.
    monkeypatch.setattr("planlang.plan.resolve.MAX_EXPANSIONS", 2_000)
    stats = fuzz.run(INPUTS, SEED, n_generated=0, depths=DEPTHS)
    assert set(stats) == set(fuzz.WEIGHTS)
    assert sum(s.inputs for s in stats.values()) == INPUTS
    failures = [(name, data, tb) for name, s in stats.items() for data, tb in s.failures]
    if failures:
        name, data, tb = failures[0]
        raise AssertionError(f"{len(failures)} of {INPUTS} inputs raised; the first ({name}, "
                             f"{len(data)} bytes: {data[:200]!r}...):\n{tb}")
    # the inputs are mostly wrong, and diagnosed
    assert sum(s.diagnostics for s in stats.values()) > INPUTS
