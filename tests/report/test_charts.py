"""The schedule chart (planlang.report.charts.draw_schedule) on simulated schedules: under a split backward
(zero_bubble) the weight gradients W have their own shade and legend entry, and the input gradients B
keep the backward's; dualpipev's whole backwards (BW) the backward's shade, hatched, with their own legend
entry; the V schedules' ranks are labelled with the stages they hold (r and 2p - 1 - r)."""
from __future__ import annotations

import re

import pytest

from planlang.cost.schedule import simulate
from planlang.report.charts import BACKWARD_SHADES, FORWARD_SHADES, WEIGHT_SHADES, draw_schedule


def _svg(tmp_path, kind: str, p: int, m: int, v: int):
    sim = simulate(kind, [1.0] * (p * v), [2.0] * (p * v), m, v)
    (path,) = draw_schedule(sim, f"{kind} p={p} m={m} v={v}", tmp_path / kind, ["svg"])
    return sim, path.read_text(encoding="utf-8")


@pytest.mark.parametrize("v", [1, 2])
def test_zero_bubble_draws_weight_gradients_in_their_own_shade(tmp_path, v):
    sim, svg = _svg(tmp_path, "zero_bubble", 2, 4, v)
    drawn = [b for b in sim.boxes if b.end > b.start]  # model stage 0's B takes no time: its W is all of it
    weights = sum(b.kind == "W" for b in drawn)
    backs = sum(b.kind == "B" for b in drawn)
    assert weights == 2 * v * 4 and backs == (2 * v - 1) * 4  # model stage 0's B boxes are not drawn
    for c in range(v):
        # each shade is written once per box and as often in the legend: the difference is the boxes'
        assert svg.count(WEIGHT_SHADES[c]) - svg.count(BACKWARD_SHADES[c]) == (
            sum(b.kind == "W" and b.chunk == c for b in drawn) - sum(b.kind == "B" and b.chunk == c for b in drawn))
    suffix = "" if v == 1 else ", chunk 1"
    for label in ("forward", "input gradient (B)", "weight gradient (W)"):
        assert label + suffix in svg
    assert ("(p−1)/(3·m+p−1)" if v == 1 else "(p−1)/(3·v·m+p−1)") in svg


def test_a_whole_backward_has_no_weight_gradient_shade(tmp_path):
    sim, svg = _svg(tmp_path, "1f1b", 2, 4, 1)
    assert {b.kind for b in sim.boxes} == {"F", "B"}
    assert FORWARD_SHADES[0] in svg and BACKWARD_SHADES[0] in svg
    assert not any(shade in svg for shade in WEIGHT_SHADES)
    assert "weight gradient" not in svg and "input gradient" not in svg and "(p−1)/(m+p−1)" in svg


def test_dualpipev_draws_whole_backwards_hatched_in_the_backward_shade(tmp_path):
    p, m = 2, 4
    sim, svg = _svg(tmp_path, "dualpipev", p, m, 2)
    drawn = [b for b in sim.boxes if b.end > b.start]
    assert {b.kind for b in drawn} == {"F", "B", "W", "BW"}
    # each hatch is an SVG pattern filled with its shade, used once per box and once in the legend
    pattern_shade = dict(re.findall(r'<pattern id="(\w+)".*?<rect [^>]*fill="(#[0-9a-f]{6})"', svg, re.S))
    uses = {shade: svg.count(f"url(#{pid})") for pid, shade in pattern_shade.items()}
    assert uses == {BACKWARD_SHADES[c]: sum(b.kind == "BW" and b.chunk == c for b in drawn) + 1 for c in range(2)}
    for label in ("forward", "input gradient (B)", "weight gradient (W)", "whole backward (B+W)"):
        assert label + ", chunk 1" in svg
    assert "(p−1)/(3·m+p−1)" in svg  # two stages per rank, but not 3·v·m: planlang.cost.schedule
    for r in range(p):  # the V: rank r holds stages r and 2p - 1 - r
        assert f"(stages {r}, {2 * p - 1 - r})" in svg


def test_zbv_labels_its_ranks_with_the_v_placement(tmp_path):
    sim, svg = _svg(tmp_path, "zbv", 3, 5, 2)
    assert {b.kind for b in sim.boxes} == {"F", "B", "W"} and "whole backward" not in svg
    assert all(f"(stages {r}, {5 - r})" in svg for r in range(3)) and "(p−1)/(3·v·m+p−1)" in svg
