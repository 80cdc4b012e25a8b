"""Layouts and conversion paths: exact (= brute force), never worse than the greedy baseline."""
import itertools

import pytest

from planlang.cost.layout import (
    NoPath, apply_step, brute_force_cost, conversion_path, enumerate_layouts, greedy_path, is_valid,
    local_shape, local_slices, neighbors,
)
from planlang.plan.types import Axis, Link, Mesh, Spec

NV = Link("nv", 300e9, 2e-6)
IB = Link("ib", 25e9, 5e-6)
MESH1 = Mesh("m1", None, (Axis("x", 4, NV),))
MESH2 = Mesh("m2", None, (Axis("dp", 2, IB), Axis("tp", 2, NV)))
MESH3 = Mesh("m3", None, (Axis("a", 2, IB), Axis("b", 3, NV)))


def S(*dims, partial=()):
    return Spec(tuple(tuple(d) if isinstance(d, (tuple, list)) else ((d,) if d else ()) for d in dims), tuple(partial))


def test_enumeration_counts_and_validity():
    # 2x2 mesh, rank 2: each axis R/P/S0/S1 (16) + the other order of both axes on one dim (2)
    assert len(enumerate_layouts((8, 8), MESH2)) == 18
    assert len(enumerate_layouts((8, 8, 8), MESH2)) == 28
    # divisibility prunes: dim 0 of size 2 cannot take both axes
    assert S(("dp", "tp"), None) not in enumerate_layouts((2, 8), MESH2)
    assert all(is_valid((8, 8), s, MESH2) for s in enumerate_layouts((8, 8), MESH2))
    assert not is_valid((8, 8), S("dp", "dp"), MESH2)


def test_local_slices_major_to_minor():
    spec = S(("dp", "tp"), None)
    assert local_shape((8, 4), spec, MESH2) == (2, 4)
    assert local_slices((8, 4), spec, MESH2, {"dp": 1, "tp": 0}) == (slice(4, 6), slice(0, 4))
    assert local_slices((8, 4), S(("tp", "dp"), None), MESH2, {"dp": 1, "tp": 0}) == (slice(2, 4), slice(0, 4))


def test_steps_and_neighbors():
    s = S("dp", None)
    moves = {str(st): str(n) for st, n in neighbors((8, 8), s, MESH2)}
    assert moves["all_gather(dp, dim 0)"] == "[_, _]"
    assert moves["all_to_all(dp: 0->1)"] == "[_, dp]"
    assert moves["shard(tp, dim 0)"] == "[(dp, tp), _]"
    assert moves["to_partial(tp)"] == "[dp, _] partial(tp)"
    p = S(None, None, partial=["tp"])
    assert {str(st) for st, _ in neighbors((8, 8), p, MESH2)} >= {"all_reduce(tp)", "reduce_scatter(tp, dim 1)"}


@pytest.mark.parametrize("mesh,shape,stride", [
    (MESH1, (8, 4), 1), (MESH2, (8, 8), 1), (MESH3, (6, 12), 1), (MESH2, (4, 2, 8), 1),
])
def test_dijkstra_equals_brute_force_and_beats_greedy(mesh, shape, stride):
    layouts = enumerate_layouts(shape, mesh)
    pairs = list(itertools.product(layouts, layouts))[::stride]
    strictly_better = 0
    for a, b in pairs:
        p = conversion_path(shape, a, b, mesh)
        assert p.specs[0] == a and p.specs[-1] == b
        # the path is a real chain of steps
        for before, st, after in zip(p.specs, p.steps, p.specs[1:]):
            assert apply_step(before, st) == after or sorted(apply_step(before, st).partial) == sorted(after.partial)
        assert p.cost == pytest.approx(brute_force_cost(shape, a, b, mesh), rel=1e-12, abs=1e-15)
        g = greedy_path(shape, a, b, mesh)
        if g is not None:
            assert p.cost <= g.cost + 1e-15
            strictly_better += p.cost < g.cost - 1e-15
    if mesh is MESH2 and shape == (8, 8):
        assert strictly_better > 0  # the greedy heuristic is really suboptimal somewhere


def test_transpose_of_a_2d_sharding_uses_all_to_all():
    p = conversion_path((8, 8), S("dp", "tp"), S("tp", "dp"), MESH2)
    kinds = [st.kind for st in p.steps]
    assert "all_gather" not in kinds or "all_to_all" in kinds
    assert p.cost > 0


def test_identity_and_invalid():
    p = conversion_path((8, 8), S("dp", None), S("dp", None), MESH2)
    assert p.steps == () and p.cost == 0
    with pytest.raises(NoPath):
        conversion_path((3, 8), S("dp", None), S(None, None), MESH2)


def test_partial_to_shard_prefers_reduce_scatter():
    p = conversion_path((8, 8), S(None, None, partial=["tp"]), S("tp", None), MESH2)
    assert [st.kind for st in p.steps] == ["reduce_scatter"]


def test_an_interrupted_search_starts_again(monkeypatch):
    """A path search resumed for each target of one source (layout._Search) that an error interrupts is
    not left half done: the next target's path is the one a fresh search finds."""
    import planlang.cost.layout as layout

    shape, mesh = (8, 8, 8), MESH2
    layouts = enumerate_layouts(shape, mesh)
    src = layouts[0]

    real, calls = layout.step_cost, []

    def clear():
        for f in (layout._dijkstra, layout._search, layout._moves, real):
            f.cache_clear()

    clear()
    want = {str(b): str(conversion_path(shape, src, b, mesh)) for b in layouts}
    clear()

    def failing(*args):
        calls.append(args)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(layout, "step_cost", failing)
    with pytest.raises(KeyboardInterrupt):
        for b in layouts:
            conversion_path(shape, src, b, mesh)
    got = {str(b): str(conversion_path(shape, src, b, mesh)) for b in layouts}
    assert got == want
    clear()
