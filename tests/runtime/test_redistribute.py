"""Conversion paths executed on torch.distributed: 4 gloo processes on a 2x2 (dp, tp) mesh.

One spawned process group runs every case; each worker writes its failures to a JSON file and the tests
assert there are none. Cases, for shapes (4, 8) and (4, 2, 8):
  * every one-step transform from every layout (`neighbors`), values and recorded bytes;
  * every ordered pair of `enumerate_layouts`: values (partial results summed over their axes), the
    forward collectives recorded = `path.forward`, and backward (gradient = w sliced for src on every
    rank; backward collectives = `backward_collectives`) on every pair.
Data are integer-valued float64, so every comparison is exact (torch.equal).
"""
from __future__ import annotations

import json
import math
import os
import socket
import time
import traceback
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from planlang.cost.comm import Collective
from planlang.cost.layout import Step, conversion_path, enumerate_layouts, local_slices, neighbors, step_comms
from planlang.plan.types import Axis, Mesh, Spec
from planlang.runtime.redistribute import (
    ByteRecorder, MeshGroups, backward_collectives, execute_step, redistribute,
)

MESH = Mesh("m", None, (Axis("dp", 2), Axis("tp", 2)))
WORLD = 4
SHAPES = [(4, 8), (4, 2, 8)]
ITEMSIZE = 8  # float64
TIMEOUT_S = 240


# ------------------------------------------------------------------------------ data
def global_value(shape) -> torch.Tensor:
    return torch.arange(1, math.prod(shape) + 1, dtype=torch.float64).reshape(shape)


def global_weight(shape) -> torch.Tensor:
    return (torch.arange(math.prod(shape), dtype=torch.float64) * 5 % 17 - 8).reshape(shape)


def piece_factor(n: int, c: int) -> int:
    """Integer weights summing to 1 over the n coordinates of a partial axis: 2, 3, ..., 1 - sum."""
    return c + 2 if c < n - 1 else 1 - sum(i + 2 for i in range(n - 1))


def make_local(glob: torch.Tensor, spec: Spec, coords: dict[str, int]) -> torch.Tensor:
    """This rank's piece of `glob` in `spec`; partial pieces are coordinate-dependent multiples."""
    local = glob[local_slices(tuple(glob.shape), spec, MESH, coords)].clone()
    for a in spec.partial:
        local = local * piece_factor(MESH.axis_size(a), coords[a])
    return local


def summed_over_partial(t: torch.Tensor, spec: Spec, groups: MeshGroups) -> torch.Tensor:
    t = t.detach().clone()
    for a in spec.partial:
        dist.all_reduce(t, group=groups.group(a))
    return t


def _records(recs):
    return [(Collective(k).value, list(ax), int(b)) for k, ax, b in recs]


# ------------------------------------------------------------------------------ worker
def _check_value(out, shape, dst, groups, failures, case) -> None:
    coords = groups.coords
    want = global_value(shape)[local_slices(shape, dst, MESH, coords)]
    got = summed_over_partial(out, dst, groups)  # collective on the partial axes: same order on all ranks
    if tuple(out.shape) != tuple(want.shape) or not torch.equal(got, want):
        failures.append(f"{case}: value mismatch on {coords}: got {got.tolist()} want {want.tolist()}")


def _run_cases(groups: MeshGroups, failures: list[str], stats: dict) -> None:
    coords = groups.coords
    kinds_in_paths: set[str] = set()
    for shape in SHAPES:
        glob = global_value(shape)
        layouts = enumerate_layouts(shape, MESH)
        # every one-step transform from every layout
        for before in layouts:
            for step, after in neighbors(shape, before, MESH):
                case = f"{shape} {before} --{step}-->"
                try:
                    rec = ByteRecorder()
                    out = execute_step(make_local(glob, before, coords), shape, before, step, MESH, groups, rec)
                    _check_value(out, shape, after, groups, failures, case)
                    f, _ = step_comms(shape, before, step, MESH, ITEMSIZE)
                    want = [] if f is None else [(f.kind, f.axes, f.size_bytes)]
                    if _records(rec.records) != _records(want):
                        failures.append(f"{case}: forward records {_records(rec.records)} != {_records(want)}")
                except Exception:
                    failures.append(f"{case}: {traceback.format_exc()}")
                stats["steps"] += 1
        # every ordered pair: forward values and bytes, backward gradients and bytes
        w = global_weight(shape)
        for src in layouts:
            for dst in layouts:
                case = f"{shape} {src} -> {dst}"
                try:
                    path = conversion_path(shape, src, dst, MESH, itemsize=ITEMSIZE)
                    kinds_in_paths.update(s.kind for s in path.steps)
                    x = make_local(glob, src, coords).requires_grad_(True)
                    rec = ByteRecorder()
                    out = redistribute(x, shape, src, dst, MESH, groups, rec)
                    _check_value(out, shape, dst, groups, failures, case)
                    want = [(c.kind, c.axes, c.size_bytes) for c in path.forward]
                    if _records(rec.records) != _records(want):
                        failures.append(f"{case}: forward records {_records(rec.records)} != {_records(want)}")
                    n_fwd = len(rec)
                    (out * w[local_slices(shape, dst, MESH, coords)]).sum().backward()
                    want_grad = w[local_slices(shape, src, MESH, coords)]
                    if x.grad is None or not torch.equal(x.grad, want_grad):
                        got = None if x.grad is None else x.grad.tolist()
                        failures.append(f"{case}: grad on {coords}: got {got} want {want_grad.tolist()}")
                    want_b = [(c.kind, c.axes, c.size_bytes) for c in path.backward_in_issue_order]
                    if _records(rec.records[n_fwd:]) != _records(want_b):
                        failures.append(f"{case}: backward records {_records(rec.records[n_fwd:])} "
                                        f"!= {_records(want_b)}")
                except Exception:
                    failures.append(f"{case}: {traceback.format_exc()}")
                stats["pairs"] += 1
    stats["kinds_in_paths"] = sorted(kinds_in_paths)


def _run_unit_cases(groups: MeshGroups, failures: list[str]) -> None:
    """The step semantics spelled out on small tensors, independently of local_slices."""
    c = groups.coords
    rank = dist.get_rank()
    # to_partial: coordinate 0 of the axis keeps the value, the others hold zeros
    x = torch.full((2, 2), 7.0, dtype=torch.float64)
    out = execute_step(x, (2, 2), Spec(((), ())), Step("to_partial", "tp"), MESH, groups)
    if not torch.equal(out, x if c["tp"] == 0 else torch.zeros_like(x)):
        failures.append(f"to_partial on {c}: {out.tolist()}")
    # all_gather of the minor axis of dim 0 split by (dp, tp): concatenation in tp order
    x = torch.tensor([[float(2 * c["dp"] + c["tp"])]], dtype=torch.float64)
    out = execute_step(x, (4, 1), Spec((("dp", "tp"), ())), Step("all_gather", "tp", 0), MESH, groups)
    if out.flatten().tolist() != [2.0 * c["dp"], 2.0 * c["dp"] + 1]:
        failures.append(f"all_gather(tp) of (dp, tp) on {c}: {out.tolist()}")
    # shard appends the axis as minor-most: [dp] -> [(dp, tp)] keeps chunk tp of the local piece
    x = torch.arange(2, dtype=torch.float64) + 10 * c["dp"]
    out = execute_step(x, (4,), Spec((("dp",),)), Step("shard", "tp", 0), MESH, groups)
    if out.tolist() != [10.0 * c["dp"] + c["tp"]]:
        failures.append(f"shard(tp) after dp on {c}: {out.tolist()}")
    # bad inputs are refused before any collective
    for bad in (lambda: execute_step(torch.zeros(3), (4,), Spec((("dp",),)), Step("all_gather", "dp", 0), MESH, groups),
                lambda: execute_step(torch.zeros(4), (4,), Spec(((),)), Step("all_gather", "dp", 0), MESH, groups),
                lambda: execute_step(torch.zeros(4), (4,), Spec(((),)), Step("all_reduce", "dp"), MESH, groups),
                lambda: execute_step(torch.zeros(4), (4,), Spec(((),)), Step("shard", "dp", 1), MESH, groups)):
        try:
            bad()
            failures.append(f"rank {rank}: an invalid step was accepted")
        except ValueError:
            pass


def _worker(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD))
    torch.set_num_threads(1)
    failures: list[str] = []
    stats = {"steps": 0, "pairs": 0, "kinds_in_paths": []}
    t0 = time.perf_counter()
    try:
        dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
        groups = MeshGroups(MESH)
        stats["coords"] = groups.coords
        stats["group_sizes"] = {a: groups.size(a) for a in MESH.names}
        _run_unit_cases(groups, failures)
        _run_cases(groups, failures, stats)
        dist.barrier()
    except Exception:
        failures.append(f"rank {rank}: {traceback.format_exc()}")
    finally:
        stats["seconds"] = time.perf_counter() - t0
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"failures": failures, "stats": stats}))
        from planlang.runtime.teardown import leave

        leave()  # barrier, destroy, exit without finalization (see teardown.py)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("redistribute")
    ctx = mp.spawn(_worker, args=(_free_port(), str(out_dir)), nprocs=WORLD, join=False)
    deadline = time.monotonic() + TIMEOUT_S
    while not ctx.join(timeout=max(1.0, deadline - time.monotonic())):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            pytest.fail(f"workers did not finish in {TIMEOUT_S} s")
    out = {}
    for r in range(WORLD):
        f = out_dir / f"rank{r}.json"
        assert f.exists(), f"rank {r} wrote no results"
        out[r] = json.loads(f.read_text())
    return out


def _expected_counts():
    steps = sum(len(neighbors(s, spec, MESH)) for s in SHAPES for spec in enumerate_layouts(s, MESH))
    pairs = sum(len(enumerate_layouts(s, MESH)) ** 2 for s in SHAPES)
    return steps, pairs


def test_mesh_groups(results):
    coords = {r: results[r]["stats"]["coords"] for r in range(WORLD)}
    assert coords == {0: {"dp": 0, "tp": 0}, 1: {"dp": 0, "tp": 1}, 2: {"dp": 1, "tp": 0}, 3: {"dp": 1, "tp": 1}}
    assert all(results[r]["stats"]["group_sizes"] == {"dp": 2, "tp": 2} for r in range(WORLD))


def test_all_steps_and_pairs_ran(results):
    steps, pairs = _expected_counts()
    assert pairs == 18 ** 2 + 26 ** 2
    for r in range(WORLD):
        assert results[r]["stats"]["steps"] == steps
        assert results[r]["stats"]["pairs"] == pairs
    # the paths exercise every kind of step
    assert set(results[0]["stats"]["kinds_in_paths"]) == {
        "all_gather", "shard", "all_to_all", "all_reduce", "reduce_scatter", "to_partial"}


def test_no_failures(results):
    failures = [f for r in range(WORLD) for f in results[r]["failures"]]
    assert not failures, f"{len(failures)} failures, first ones:\n" + "\n".join(failures[:10])


def test_backward_collectives_equal_the_cost_model():
    shape = (4, 8)
    src, dst = Spec((("tp",), ())), Spec(((), ()))
    path = conversion_path(shape, src, dst, MESH)
    assert [s.kind for s in path.steps] == ["all_gather"]
    assert path.backward == () and backward_collectives(shape, path, MESH) == []
    for a in enumerate_layouts(shape, MESH):
        for b in enumerate_layouts(shape, MESH):
            p = conversion_path(shape, a, b, MESH)
            assert backward_collectives(shape, p, MESH) == [
                (c.kind, c.axes, int(c.size_bytes)) for c in p.backward_in_issue_order]
    path = conversion_path(shape, dst, src, MESH)
    assert [s.kind for s in path.steps] == ["shard"]
    assert backward_collectives(shape, path, MESH) == [(Collective.ALL_GATHER, ("tp",), 4 * 8 * 4)]


def test_byte_recorder():
    rec = ByteRecorder()
    rec.record(Collective.ALL_GATHER, ("dp",), 128)
    rec.record("all_reduce", ["tp"], 64.0)
    assert rec.records == [(Collective.ALL_GATHER, ("dp",), 128), (Collective.ALL_REDUCE, ("tp",), 64)]
    assert rec.total_bytes == 192 and len(rec) == 2
    rec.clear()
    assert rec.records == []
