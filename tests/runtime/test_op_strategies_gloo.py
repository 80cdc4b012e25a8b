"""Every strategy of every op kind, executed on 4 gloo ranks (2x2 mesh dp x tp), gives the single-process
result; and DTensor's sharding propagation agrees with our output layouts where it takes our inputs as
they are.

One group of 4 processes is spawned per module; each rank runs all cases and writes its findings to a
JSON file that the tests below read.
"""
from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from planlang.cost.layout import local_slices
from planlang.cost.ops import OpSpec, strategies
from planlang.cost.ops import rules  # noqa: F401  (registers the rules)
from planlang.plan.types import Axis, Link, Mesh, Partial, Shard
from planlang.runtime.local_ops import all_reduce, dropout_mask, partial_pieces, run_local

MESH = Mesh("m", None, (Axis("dp", 2, Link("ib", 25e9, 5e-6)), Axis("tp", 2, Link("nv", 300e9, 2e-6))))
WORLD = 4
TIMEOUT_S = 240


# ------------------------------------------------------------------------------ cases
@dataclass
class Case:
    name: str
    op: OpSpec
    ref: Callable  # global inputs -> global output
    ints: dict  # input index -> (low, high) for integer inputs
    pos: tuple = ()  # inputs that must be positive (divisors)
    dtensor: Callable | None = None  # the torch call to cross-check on DTensors
    ignored: tuple = ()  # rows of integer input 1 set to torch's ignore_index (-100)


def op(kind, inputs, output, ints=(), **attrs):
    dts = tuple("i64" if i in ints else "f64" for i in range(len(inputs)))
    return OpSpec(kind, tuple(map(tuple, inputs)), tuple(output), "f64", tuple(attrs.items()), dts)


def _sdpa_ref(q, k, v, causal):
    if not causal:
        return F.scaled_dot_product_attention(q, k, v)
    mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _cases() -> list[Case]:
    C = []

    def add(name, o, ref, ints=None, pos=(), dtensor=None, ignored=()):
        C.append(Case(name, o, ref, ints or {}, pos, dtensor, ignored))

    add("linear+bias", op("linear", [(4, 8, 8), (8, 8), (8,)], (4, 8, 8)), F.linear)
    add("linear2d+bias", op("linear", [(8, 8), (8, 8), (8,)], (8, 8)), F.linear, dtensor=F.linear)
    add("linear", op("linear", [(8, 8), (4, 8)], (8, 4)), F.linear, dtensor=F.linear)
    add("matmul3d", op("matmul", [(4, 8, 8), (8, 4)], (4, 8, 4)), torch.matmul)
    add("matmul2d", op("matmul", [(8, 8), (8, 4)], (8, 4)), torch.matmul, dtensor=torch.matmul)
    add("matmul-bcast", op("matmul", [(4, 4, 8, 4), (4, 8)], (4, 4, 8, 8)), torch.matmul)
    add("bmm", op("bmm", [(4, 8, 4), (4, 4, 8)], (4, 8, 8)), torch.bmm)
    add("addmm", op("addmm", [(8,), (4, 8), (8, 8)], (4, 8), beta=0.5, alpha=2.0),
        lambda b, x, y: torch.addmm(b, x, y, beta=0.5, alpha=2.0))
    add("conv2d", op("conv2d", [(4, 4, 8, 8), (4, 4, 3, 3), (4,)], (4, 4, 8, 8), padding=1),
        lambda x, w, b: F.conv2d(x, w, b, padding=1))
    add("embedding", op("embedding", [(4, 8), (16, 8)], (4, 8, 8), ints=(0,)), F.embedding, ints={0: (0, 16)})
    add("layer_norm", op("layer_norm", [(4, 4, 8), (8,), (8,)], (4, 4, 8)),
        lambda x, w, b: F.layer_norm(x, (8,), w, b), dtensor=lambda x, w, b: F.layer_norm(x, (8,), w, b))
    add("rms_norm", op("rms_norm", [(4, 4, 8), (8,)], (4, 4, 8), eps=1e-6),
        lambda x, w: F.rms_norm(x, (8,), w, eps=1e-6))
    add("softmax", op("softmax", [(4, 8, 8)], (4, 8, 8), dim=-1), lambda x: torch.softmax(x, -1),
        dtensor=lambda x: torch.softmax(x, -1))
    add("log_softmax", op("log_softmax", [(4, 8, 8)], (4, 8, 8), dim=1), lambda x: torch.log_softmax(x, 1))
    for u, fn in {"gelu": F.gelu, "relu": torch.relu, "silu": F.silu, "tanh": torch.tanh, "exp": torch.exp,
                  "neg": torch.neg}.items():
        add(u, op(u, [(4, 8)], (4, 8)), fn, dtensor=fn if u in ("relu", "neg") else None)
    for u, fn in {"rsqrt": torch.rsqrt, "sqrt": torch.sqrt, "sigmoid": torch.sigmoid, "sin": torch.sin,
                  "cos": torch.cos}.items():
        add(u, op(u, [(4, 8)], (4, 8)), fn, pos=(0,) if u in ("rsqrt", "sqrt") else ())
    add("expand-dim0", op("expand", [(1, 8)], (4, 8)), lambda x: x.expand(4, 8))
    add("expand-middle", op("expand", [(4, 1, 8)], (4, 4, 8)), lambda x: x.expand(4, 4, 8))
    add("expand-new-dim", op("expand", [(8,)], (4, 8)), lambda x: x.expand(4, 8))
    add("embedding-padding", op("embedding", [(4, 8), (16, 8)], (4, 8, 8), ints=(0,), padding_idx=5),
        lambda i, w: F.embedding(i, w, padding_idx=5), ints={0: (0, 16)})
    add("add-bcast", op("add", [(4, 8), (8,)], (4, 8)), torch.add, dtensor=torch.add)
    add("sub-bcast", op("sub", [(4, 1, 8), (4, 4, 8)], (4, 4, 8)), torch.sub)
    add("mul", op("mul", [(4, 8), (4, 8)], (4, 8)), torch.mul, dtensor=torch.mul)
    add("div-bcast", op("div", [(4, 8), (1, 8)], (4, 8)), torch.div, pos=(1,))
    add("sum", op("sum", [(4, 8, 8)], (4, 8), dim=1), lambda x: x.sum(1), dtensor=lambda x: x.sum(1))
    add("sum-all", op("sum", [(4, 8)], ()), lambda x: x.sum(), dtensor=lambda x: x.sum())
    add("mean-keepdim", op("mean", [(4, 8, 8)], (1, 8, 1), dim=(0, 2), keepdim=True),
        lambda x: x.mean((0, 2), keepdim=True))
    add("amax", op("amax", [(4, 8, 8)], (4, 8), dim=-1), lambda x: x.amax(-1))
    add("reshape", op("reshape", [(4, 8, 8)], (4, 64)), lambda x: x.reshape(4, 64))
    add("flatten", op("flatten", [(4, 4, 8)], (16, 8)), lambda x: x.flatten(0, 1))
    add("view-split", op("view", [(32, 4)], (4, 8, 4)), lambda x: x.view(4, 8, 4))
    add("unflatten", op("unflatten", [(4, 32)], (4, 4, 8)), lambda x: x.unflatten(1, (4, 8)))
    add("transpose", op("transpose", [(4, 8, 4)], (4, 8, 4)[::-1], dim0=0, dim1=2), lambda x: x.transpose(0, 2))
    add("permute", op("permute", [(4, 8, 12)], (12, 4, 8), dims=(2, 0, 1)), lambda x: x.permute(2, 0, 1))
    add("cat", op("cat", [(4, 8), (4, 4)], (4, 12), dim=1), lambda a, b: torch.cat([a, b], 1))
    add("split", op("split", [(8, 12)], (8, 4), dim=1, split_size=4, index=1), lambda x: x.split(4, 1)[1])
    add("slice", op("slice", [(8, 8)], (4, 8), dim=0, start=2, end=6), lambda x: x[2:6])
    add("getitem", op("getitem", [(4, 8, 8)], (4, 4, 8), dim=1, start=4, end=8), lambda x: x[:, 4:8])
    add("sdpa", op("scaled_dot_product_attention", [(4, 4, 8, 4)] * 3, (4, 4, 8, 4)),
        lambda q, k, v: _sdpa_ref(q, k, v, False))
    add("sdpa-causal", op("scaled_dot_product_attention", [(4, 4, 8, 4), (4, 4, 8, 4), (4, 4, 8, 4)],
                          (4, 4, 8, 4), is_causal=True), lambda q, k, v: _sdpa_ref(q, k, v, True))
    add("cross_entropy", op("cross_entropy", [(8, 16), (8,)], (), ints=(1,)), F.cross_entropy, ints={1: (0, 16)})
    add("cross_entropy-sum", op("cross_entropy", [(8, 16), (8,)], (), ints=(1,), reduction="sum"),
        lambda x, t: F.cross_entropy(x, t, reduction="sum"), ints={1: (0, 16)})
    add("cross_entropy-none", op("cross_entropy", [(8, 16), (8,)], (8,), ints=(1,), reduction="none"),
        lambda x, t: F.cross_entropy(x, t, reduction="none"), ints={1: (0, 16)})
    # rows with ignore_index (Hugging Face's padded labels), three in the first half and one in the second:
    # a mean over the counted rows of the whole batch, whichever way the rows are split
    for red, out in (("mean", ()), ("sum", ()), ("none", (8,))):
        add(f"cross_entropy-ignored-{red}", op("cross_entropy", [(8, 16), (8,)], out, ints=(1,), reduction=red),
            lambda x, t, red=red: F.cross_entropy(x, t, reduction=red), ints={1: (0, 16)}, ignored=(0, 1, 2, 5))
    add("dropout", op("dropout", [(4, 8, 8)], (4, 8, 8), p=0.25, seed=7),
        lambda x: x * dropout_mask((4, 8, 8), 0.25, 7) / 0.75)
    # issue 27's ops (planlang/cost/ops/tensor_ops.py; slice with a step, attention with fewer k/v heads)
    add("softmax-dtype", op("softmax", [(4, 8, 8)], (4, 8, 8), dim=-1, dtype="f32"),
        lambda x: torch.softmax(x, -1, dtype=torch.float32))
    add("slice-step", op("slice", [(4, 8, 8)], (4, 8, 4), dim=2, start=1, end=8, step=2), lambda x: x[..., 1::2])
    add("stack", op("stack", [(4, 8, 4), (4, 8, 4)], (4, 8, 4, 2), dim=-1), lambda a, b: torch.stack([a, b], -1))
    add("roll", op("roll", [(4, 8, 8)], (4, 8, 8), shifts=(3,), dims=(1,)), lambda x: torch.roll(x, 3, 1))
    # an explicit cast (x.to(torch.float32) in RMSNorm): kept even where the f32 trace made it the identity
    # (to f64 here: these cases compare in f64; tests/runtime/test_casts_gloo.py runs it in f16)
    add("cast", op("cast", [(4, 8, 8)], (4, 8, 8), dtype="f64"), lambda x: x.to(torch.float64))
    add("index_select", op("index_select", [(4, 8, 8), (2,)], (4, 2, 8), ints=(1,), dim=1),
        lambda x, i: x.index_select(1, i), ints={1: (0, 8)})
    add("einsum-scores", op("einsum", [(4, 8, 2, 4), (4, 8, 2, 4)], (4, 2, 8, 8), equation="bthd,bshd->bhts"),
        lambda q, k: torch.einsum("bthd,bshd->bhts", q, k))
    add("einsum-ellipsis", op("einsum", [(4, 8, 8), (8, 4)], (4, 8, 4), equation="...k,kn->...n"),
        lambda x, w: torch.einsum("...k,kn->...n", x, w))
    add("sdpa-mqa", op("scaled_dot_product_attention", [(4, 4, 8, 4), (4, 1, 8, 4), (4, 1, 8, 4)], (4, 4, 8, 4),
                       is_causal=True), lambda q, k, v: _sdpa_ref(q, k, v, True))
    add("sdpa-gqa", op("scaled_dot_product_attention", [(4, 4, 8, 4), (4, 2, 8, 4), (4, 2, 8, 4)], (4, 4, 8, 4)),
        lambda q, k, v: _sdpa_ref(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), False))
    return C


CASES = _cases()


def global_inputs(case: Case, index: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + index)
    out = []
    for i, shape in enumerate(case.op.inputs):
        if i in case.ints:
            lo, hi = case.ints[i]
            t = torch.randint(lo, hi, shape, generator=g)
            if case.ignored:
                t[list(case.ignored)] = -100
            out.append(t)
        else:
            t = torch.randn(shape, generator=g, dtype=torch.float64)
            out.append(t.abs() + 0.5 if i in case.pos else t)
    return out


# ------------------------------------------------------------------------------ the worker
def _torch_placement(p):
    from torch.distributed.tensor import Partial as TP, Replicate as TR, Shard as TS
    if isinstance(p, Shard):
        return TS(p.dim)
    if isinstance(p, Partial):
        return TP("sum")
    return TR()


def _ours(spec) -> str:
    return str([str(_torch_placement(p)) for p in spec.placements(MESH)])


def _worker(rank: int, port: int, outdir: str, launched: float) -> None:
    started = time.time()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.utils._debug_mode import DebugMode

    dm = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    c = dm.get_coordinate()
    coords = {"dp": c[0], "tp": c[1]}
    groups = {"dp": dm.get_group("dp"), "tp": dm.get_group("tp")}
    res = {"executed": [], "failures": [], "dtensor": [], "seconds": 0.0}
    # the redistribution detector sees a redistribution DTensor must do (softmax over a split dim)
    from torch.distributed.tensor import Shard as TS
    probe = DTensor.from_local(torch.randn(4, 2, dtype=torch.float64), dm, [TS(1), TS(1)], run_check=False)
    with DebugMode() as dbg:
        torch.softmax(probe, 1)
    res["probe_redistributed"] = "redistribute_input" in dbg.debug_string()
    t0 = time.time()
    res["startup"] = [round(started - launched, 1), round(t0 - launched, 1)]
    res["case_seconds"] = {}
    for ci, case in enumerate(CASES):
        tc = time.time()
        ins = global_inputs(case, ci)
        ref = case.ref(*ins)
        for si, s in enumerate(strategies(case.op, MESH)):
            tag = f"{case.name} :: {s}"
            try:
                local = []
                for j, (x, spec) in enumerate(zip(ins, s.inputs)):
                    piece = x[local_slices(tuple(x.shape), spec, MESH, coords)]
                    local.append(partial_pieces(piece, spec, MESH, coords, seed=ci * 1000 + si * 10 + j)
                                 if spec.partial else piece.clone())
                y = run_local(case.op, s, local, coords, MESH, groups.__getitem__)
                full = all_reduce(y, s.output.partial, groups.__getitem__)
                want = ref[local_slices(tuple(ref.shape), s.output, MESH, coords)]
                if tuple(full.shape) != tuple(want.shape):
                    res["failures"].append(f"{tag}: shape {list(full.shape)} != {list(want.shape)}")
                elif not torch.allclose(full, want, rtol=1e-9, atol=1e-10):
                    err = (full - want).abs().max().item()
                    res["failures"].append(f"{tag}: max error {err:.3g}")
                res["executed"].append([case.name, case.op.kind, s.name])
            except Exception as e:  # noqa: BLE001 - reported by the test
                res["failures"].append(f"{tag}: {type(e).__name__}: {e}")
                res["executed"].append([case.name, case.op.kind, s.name])
            if case.dtensor is None:
                continue
            # DTensor cross-check on the same local inputs
            try:
                dts = [DTensor.from_local(t, dm, [_torch_placement(p) for p in spec.placements(MESH)],
                                          run_check=False, shape=x.shape, stride=x.stride())
                       for t, spec, x in zip(local, s.inputs, ins)]
                with DebugMode() as dbg:
                    out = case.dtensor(*dts)
                redistributed = "redistribute_input" in dbg.debug_string()
                theirs = str([str(p) for p in out.placements])
                if redistributed:
                    status = "redistributed"
                elif theirs == _ours(s.output):
                    status = "agree"
                else:
                    status = "disagree"
                value_ok = torch.allclose(out.full_tensor(), ref, rtol=1e-9, atol=1e-10)
                res["dtensor"].append([case.name, s.name, status, theirs, _ours(s.output), bool(value_ok)])
            except Exception as e:  # noqa: BLE001
                res["dtensor"].append([case.name, s.name, "error", f"{type(e).__name__}: {e}"[:200],
                                       _ours(s.output), False])
        res["case_seconds"][case.name] = round(time.time() - tc, 2)
    res["seconds"] = time.time() - t0
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    from planlang.runtime.teardown import leave

    leave()  # barrier, destroy, exit without finalization (see teardown.py)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def gloo_results(tmp_path_factory):
    outdir = str(tmp_path_factory.mktemp("gloo"))
    ctx = mp.start_processes(_worker, args=(_free_port(), outdir, time.time()), nprocs=WORLD, join=False, start_method="spawn")
    deadline = time.time() + TIMEOUT_S
    while not ctx.join(timeout=5):
        if time.time() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            pytest.fail("gloo workers timed out")
    out = []
    for r in range(WORLD):
        with open(os.path.join(outdir, f"rank{r}.json")) as f:
            out.append(json.load(f))
    return out


# ------------------------------------------------------------------------------ tests
KINDS = sorted({c.op.kind for c in CASES})


def test_cases_cover_every_registered_kind():
    from planlang.cost.ops import registry
    assert set(registry()) <= set(KINDS), set(registry()) - set(KINDS)


@pytest.mark.parametrize("kind", KINDS)
def test_every_strategy_matches_single_process(gloo_results, kind):
    want = sum(len(strategies(c.op, MESH)) for c in CASES if c.op.kind == kind)
    for r, res in enumerate(gloo_results):
        ran = [e for e in res["executed"] if e[1] == kind]
        assert len(ran) == want, f"rank {r} ran {len(ran)} of {want} strategies of {kind}"
        names = {c.name for c in CASES if c.op.kind == kind}
        bad = [f for f in res["failures"] if f.split(" :: ")[0] in names]
        assert not bad, f"rank {r}:\n" + "\n".join(bad)


def test_dtensor_cross_check(gloo_results):
    rows = gloo_results[0]["dtensor"]
    for res in gloo_results[1:]:
        assert [r[2] for r in res["dtensor"]] == [r[2] for r in rows], "ranks disagree on DTensor outcomes"
    summary: dict[str, dict[str, int]] = {}
    for name, _, status, *_ in rows:
        summary.setdefault(name, {}).setdefault(status, 0)
        summary[name][status] += 1
    assert all(r["probe_redistributed"] for r in gloo_results)
    print("\nworker startup:", gloo_results[0]["startup"], "seconds:", [round(r["seconds"], 1) for r in gloo_results], gloo_results[0]["case_seconds"])
    for r in rows:
        if r[2] == "error":
            print("  error:", r[0], "::", r[1], r[3])
    print("DTensor cross-check (case: agree / redistributed / disagree / error):")
    for name, d in summary.items():
        print(f"  {name:14s} {d.get('agree', 0):3d} / {d.get('redistributed', 0):3d} / "
              f"{d.get('disagree', 0):3d} / {d.get('error', 0):3d}")
    disagree = [r for r in rows if r[2] == "disagree"]
    assert not disagree, "\n".join(f"{r[0]} :: {r[1]}: DTensor {r[3]} vs ours {r[4]}" for r in disagree)
    wrong = [r for r in rows if r[2] in ("agree", "redistributed") and not r[5]]
    assert not wrong, wrong
    assert sum(d.get("agree", 0) for d in summary.values()) >= 20
