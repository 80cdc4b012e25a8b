"""Bounds by step time (docs/solve.md, Bounds): a candidate whose step time alone (the local model's
profile, no simulated step) exceeds that of a plan that fits, where the search compares it with that
plan, is not priced in full. The search then meets the same candidates, takes the same path and writes
the same plan and header, byte for byte, as the search that prices every candidate in full
(`solve(..., prune=False)`); the step time each candidate is bounded out by is never above the one the
full pricing gives it."""
from __future__ import annotations

from pathlib import Path

import pytest

from planlang.solve.driver import solve
from tests.solve.test_driver import GPT, MLP
from tests.solve.test_every_hole import CASES, HEAD

REPO = Path(__file__).resolve().parents[2]

# gpt2_partial's holes (pp x dp x tp, microbatches, stages, ZeRO, an MLP spec, checkpoints) on a small GPT
SMALL_3D = '''use hardware
use patterns.megatron
model gpt2 = "examples.gpt2.model:build"(layers = 4, hidden = 64, heads = 4, vocab = 128, seq = 32)
input idx : i64[batch = 32, seq = 32]
mesh cluster of 8 x hardware.a100_80g {
    pp = ? over hardware.infiniband_200g
    dp = ? over hardware.nvlink3
    tp = ? over hardware.nvlink3
}
budget BUDGET per device
optimizer adamw(lr = 0.0006) {
    zero = ? over dp
}
data idx : [dp, _]
pipeline over pp schedule 1f1b microbatches ? { ? }
for block in h[*] {
    apply megatron.attention(tp) to block.attn
}
shard h[*].mlp.c_fc.weight : ?
checkpoint ?
'''


def _same(path: str) -> int:
    """Solve `path` with and without bounds; assert the same result; the number bounded out."""
    full = solve(path, prune=False)
    pruned = solve(path)
    assert pruned.text == full.text  # the plan and its header, byte for byte
    assert pruned.summary == full.summary and pruned.best.choices == full.best.choices
    assert not full.bounded
    assert not any(n.startswith("bounds by step time stopped") for n in pruned.notes)
    # the same candidates met: each priced in full, or bounded out at the step the full pricing gives it
    met = {c.choices: c for c in full.tried}
    assert {c.choices for c in pruned.tried} | {ch for ch, _ in pruned.bounded} == set(met)
    assert len(pruned.tried) + len(pruned.bounded) == len(full.tried)
    for c in pruned.tried:
        assert (c.step_time, c.peak, c.fits) == (met[c.choices].step_time, met[c.choices].peak, met[c.choices].fits)
    for choices, step in pruned.bounded:  # the step alone, or below it before the program is lowered
        assert step <= met[choices].step_time * (1 + 1e-12)
        assert step > pruned.best.step_time and pruned.best.fits
    return len(pruned.bounded)


def test_a_3d_mesh_search_bounds_out_slow_meshes_and_writes_the_same_plan(tmp_path):
    path = tmp_path / "small_3d.plan"
    path.write_text(SMALL_3D.replace("BUDGET", "40 GiB"))
    assert _same(str(path)) > 0  # stage 1's slow meshes


@pytest.mark.parametrize("which", ["gpt roomy", "gpt tight", "mlp tight", "cpu partial"])
def test_the_solve_tests_plans_give_the_same_plan_with_bounds(tmp_path, which):
    if which == "cpu partial":
        path = str(REPO / "examples" / "partial" / "gpt2_cpu_partial.plan")
    else:
        path = str(tmp_path / "partial.plan")
        text = {"gpt roomy": GPT.replace("BUDGET", "1 GiB"), "gpt tight": GPT.replace("BUDGET", "60 MiB"),
                "mlp tight": MLP.replace("BUDGET", "400 KiB")}[which]
        Path(path).write_text(text)
    _same(path)


@pytest.mark.parametrize("case", ["mesh axis size", "stage list", "chunks", "stage degree", "template argument"])
def test_documented_holes_give_the_same_plan_with_bounds(tmp_path, case):
    path = tmp_path / "partial.plan"
    path.write_text(HEAD + CASES[case][1])
    _same(str(path))


def test_other_objectives_are_not_bounded(tmp_path):
    path = tmp_path / "small_3d.plan"
    path.write_text(SMALL_3D.replace("BUDGET", "40 GiB"))
    assert not solve(str(path), objective="memory").bounded
