"""`microbatches ?` at the top level (gradient accumulation without a pipeline): `planlang solve` writes
the smallest count whose step fits the budget (more microbatches only shrink the activations)."""
from __future__ import annotations

from pathlib import Path

from planlang.model.price.estimate import estimate_plan
from planlang.plan.checker import check_text
from planlang.plan.complete import complete
from planlang.solve.driver import solve

PLAN = """\
use hardware
model gpt2 = "examples.gpt2.model:build"(layers = 2, hidden = 64, heads = 4, vocab = 128, seq = 256)
input idx : i64[batch = 64, seq = 256]
mesh ranks of 4 x hardware.a100_80g { dp = 4 over hardware.nvlink3 }
budget 20 MiB per device
optimizer adamw(lr = 0.001)
data idx : [dp, _]
microbatches MICRO
"""


def _peak(tmp_path: Path, n: int) -> int:
    res = check_text(PLAN.replace("MICRO", str(n)), str(tmp_path / f"m{n}.plan"))
    (row,) = estimate_plan(complete(res.plan))
    return row.peak


def test_the_smallest_count_that_fits(tmp_path):
    path = tmp_path / "partial.plan"
    path.write_text(PLAN.replace("MICRO", "?"))
    solved = solve(str(path)).text
    (line,) = [x for x in solved.splitlines() if x.startswith("microbatches")]
    n = int(line.split()[1])
    budget = 20 * 2**20
    # the estimate the solver read: n fits, n / 2 (the next smaller divisor of the 16 a rank holds) does not
    assert n > 1 and _peak(tmp_path, n) <= budget < _peak(tmp_path, n // 2), n
