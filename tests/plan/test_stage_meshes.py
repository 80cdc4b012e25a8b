"""planlang.plan.stage_meshes: a stage of its own degrees (`stage ... with dp = 4, tp = 1`) as the runtime
runs it, checked against an independent computation: enumerate a mesh's devices by global rank, take each
device's replica rows with planlang.cost.layout.local_slices (the `data` spec on the stage's sizes) and cut
them over the stage's other axes in mesh order."""
from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest

from planlang.cost.layout import local_slices
from planlang.plan import types as T
from planlang.plan.checker import check_file, check_text
from planlang.plan.complete import complete
from planlang.plan.stage_meshes import heterogeneous, position_chunks, stage_plan, stage_shapes, stage_sizes

REPO = Path(__file__).resolve().parents[2]
HETERO = REPO / "tests" / "runtime" / "plans" / "gpt2_pp2_hetero.plan"
HETERO_REVERSE = REPO / "tests" / "runtime" / "plans" / "gpt2_pp2_hetero_reverse.plan"


def _plan(path: Path):
    res = check_file(str(path))
    assert res.plan is not None and not res.errors, [str(d) for d in res.diagnostics]
    return complete(res.plan)


def _unravel(rank: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major coordinates of a global rank (the last axis fastest), as torch's DeviceMesh lays ranks out."""
    out = []
    for n in reversed(shape):
        out.append(rank % n)
        rank //= n
    return tuple(reversed(out))


def rows_by_position(sizes: tuple[tuple[str, int], ...], pipeline: str, batch: tuple[str, ...],
                     rows: int) -> list[list[range]]:
    """For each pipeline rank, for each of its devices in global-rank order, the rows of a microbatch of
    `rows` rows it holds at a stage boundary: its replica's rows (local_slices of `[batch, _]` on a mesh of
    these sizes) cut into equal shares over the stage's axes that are neither the pipeline axis nor the
    batch's, the share numbered row-major over them in mesh order."""
    names = tuple(a for a, _ in sizes)
    shape = tuple(n for _, n in sizes)
    mesh = T.Mesh("m", None, tuple(T.Axis(a, n) for a, n in sizes))
    spec = T.Spec(dims=(batch, ()))
    cut = [(a, n) for a, n in sizes if a != pipeline and a not in batch]
    p = dict(sizes)[pipeline]
    out: list[list[range]] = [[] for _ in range(p)]
    for rank in range(math.prod(shape)):
        coords = dict(zip(names, _unravel(rank, shape)))
        replica = local_slices((rows, 1), spec, mesh, coords)[0]
        share, count = 0, 1
        for a, n in cut:
            share, count = share * n + coords[a], count * n
        width = (replica.stop - replica.start) // count
        start = replica.start + share * width
        out[coords[pipeline]].append(range(start, start + width))
    return out


def _shapes(n: int, axes: int) -> list[tuple[int, ...]]:
    """Every way to write n devices as `axes` sizes."""
    return [s for s in itertools.product(*[[d for d in range(1, n + 1) if n % d == 0]] * axes) if math.prod(s) == n]


# ------------------------------------------------------------------------------ position_chunks
@pytest.mark.parametrize("order", [("pp", "dp", "tp"), ("pp", "tp", "dp"), ("dp", "pp", "tp")])
def test_position_chunks_are_the_rows_each_device_holds(order):
    """Device k of every pipeline rank holds chunk position_chunks(...)[k] of n equal chunks, for every
    shape of 8 devices per rank over two other axes, the batch over one of them, both or neither (both
    orders)."""
    checked = 0
    for d, t in _shapes(8, 2):
        size = {"pp": 2, "dp": d, "tp": t}
        sizes = tuple((a, size[a]) for a in order)
        for batch in ((), ("dp",), ("tp",), ("dp", "tp"), ("tp", "dp")):
            n, rows = 8, 8 * 3  # 3 rows per device
            chunks = position_chunks(sizes, "pp", batch)
            assert sorted(chunks) == list(range(n)), (sizes, batch)  # every row held once per rank
            for held in rows_by_position(sizes, "pp", batch, rows):
                assert [r.start // (rows // n) for r in held] == list(chunks), (sizes, batch)
                assert all(len(r) == rows // n for r in held)
            checked += 1
    assert checked == 4 * 5


def test_position_chunks_of_three_other_axes_and_axes_of_one_device():
    for dp, cp, tp in _shapes(12, 3):
        sizes = (("pp", 3), ("dp", dp), ("cp", cp), ("tp", tp))
        for batch in (("dp",), ("dp", "cp"), ("cp",)):
            chunks = position_chunks(sizes, "pp", batch)
            for held in rows_by_position(sizes, "pp", batch, 12 * 2):
                assert [r.start // 2 for r in held] == list(chunks), (sizes, batch)


def test_the_two_example_stages_agree_on_every_position_and_a_tensor_axis_first_does_not():
    """gpt2_pp2_hetero: dp4 and dp2 x tp2 under `data idx : [dp, _]` on a mesh `pp, dp, tp` hold the same
    rows at each position (the dp replicas' devices adjacent); on `pp, tp, dp` they do not."""
    dp4 = position_chunks((("pp", 2), ("dp", 4), ("tp", 1)), "pp", ("dp",))
    dp2tp2 = position_chunks((("pp", 2), ("dp", 2), ("tp", 2)), "pp", ("dp",))
    assert dp4 == dp2tp2 == (0, 1, 2, 3)
    tp_first = position_chunks((("pp", 2), ("tp", 2), ("dp", 2)), "pp", ("dp",))
    assert tp_first != position_chunks((("pp", 2), ("tp", 1), ("dp", 4)), "pp", ("dp",))
    # device 1 of a rank: tp 0, dp 1, so the second replica's first half, chunk 2 of 4
    assert tp_first[1] == 2 and [r.start // 2 for r in rows_by_position(
        (("pp", 2), ("tp", 2), ("dp", 2)), "pp", ("dp",), 8)[0]] == list(tp_first)


# ------------------------------------------------------------------------------ stage sizes and plans
def test_stage_sizes_shapes_and_heterogeneous_of_the_example_plans():
    for path, odd in ((HETERO, 0), (HETERO_REVERSE, 1)):
        plan = _plan(path)
        own = (("pp", 2), ("dp", 2), ("tp", 2))
        mine = (("pp", 2), ("dp", 4), ("tp", 1))
        assert stage_sizes(plan, odd) == mine and stage_sizes(plan, 1 - odd) == own
        assert stage_shapes(plan) == tuple(mine if s == odd else own for s in range(2))
        assert heterogeneous(plan)
        assert stage_sizes(plan, 2) is None  # no such stage


HEAD = ("device gpu { memory = 80 GiB }\nlink nv { bandwidth = 300 GB/s }\n"
        "mesh m of 8 x gpu {\n    pp = 2 over nv\n    dp = 2 over nv\n    tp = 2 over nv\n}\n")


def _pipeline(first: str, second: str = "") -> T.Plan:
    res = check_text(HEAD + "pipeline over pp schedule 1f1b microbatches 4 {\n"
                     f"    stage h[0:6]{first}\n    stage h[6:12]{second}\n}}\n", path="t.plan")
    assert res.plan is not None
    return res.plan


def test_a_with_that_restates_the_mesh_is_not_heterogeneous_and_a_hole_has_no_sizes():
    same = _pipeline(" with tp = 2, dp = 2")
    assert stage_sizes(same, 0) == (("pp", 2), ("dp", 2), ("tp", 2)) and not heterogeneous(same)
    c = complete(same)
    assert stage_plan(c, 0) is c  # the plan itself
    hole = _pipeline(" with dp = ?, tp = 4")
    assert stage_sizes(hole, 0) is None and stage_sizes(hole, 1) is not None
    assert stage_shapes(hole) == () and not heterogeneous(hole)
    assert not heterogeneous(check_text(HEAD, path="t.plan").plan)  # no pipeline


def test_stage_plan_is_the_plan_on_the_stages_sizes_and_keeps_everything_else():
    plan = _plan(HETERO)
    for s in range(2):
        sp = stage_plan(plan, s)
        assert tuple(zip(sp.mesh.names, sp.mesh.shape)) == stage_sizes(plan, s)
        assert sp.mesh.size == plan.mesh.size == 8  # the same devices, laid out by the stage's sizes
        assert all(not st.degrees for st in sp.pipeline.stages) and not heterogeneous(sp)
        assert [str(st) for st in sp.pipeline.stages] == [str(st).split(" with ")[0] for st in plan.pipeline.stages]
        assert (sp.data, sp.shards, sp.optimizer, sp.inputs) == (plan.data, plan.shards, plan.optimizer, plan.inputs)
        assert sp.pipeline.schedule == plan.pipeline.schedule and sp.pipeline.microbatches == 2
        assert stage_plan(plan, s) is sp  # one per (plan, stage)
    # ZeRO over dp shards within each stage over its own data degree
    assert stage_plan(plan, 0).dims.zero_axis == "dp" and stage_plan(plan, 0).mesh.axis_size("dp") == 4
    assert stage_plan(plan, 1).mesh.axis_size("dp") == 2
