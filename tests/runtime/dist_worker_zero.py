"""Worker processes for the gloo tests of data parallelism, ZeRO and DCP checkpoints.

Two process groups are spawned per test session (cached here, shared by the test modules):

    world 2   DDP over dp=2; ZeRO-1/2/3 over dp=2 (3 AdamW steps against a single-process run);
              checkpoint A: plan A (tp=2, fc1.weight split on dim 0) after 3 steps, saved with DCP;
              checkpoint F: the ZeRO-3 (FSDP2) run, saved with DCP
    world 4   DDP on a dp x tp mesh (batch over dp, and over (dp, tp)); plan B (dp=2 x tp=2, fc1.weight
              split on dim 1) loads A with a plain AdamW and with ZeRO-1, and saves again (B1); a
              ZeRO-3 model split like plan B loads F and saves again (B3)

Each rank writes a JSON file of findings (errors, booleans, measured errors) that the tests assert on.
The "unsharded state" of a run is assembled independently of DCP: every rank sends its local pieces
and mesh coordinates (all_gather_object) and they are placed with `local_slices`.
"""
from __future__ import annotations

import functools
import json
import math
import os
import shutil
import socket
import tempfile
import time
import traceback
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

with warnings.catch_warnings():  # preloaded in the forkserver with the rest; torch.jit deprecations
    warnings.simplefilter("ignore", DeprecationWarning)
    import torch.distributed.checkpoint  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401
    import torch.distributed.optim  # noqa: F401
    import torch.distributed.tensor  # noqa: F401

from examples.mlp.model import build
from planlang.cost.layout import local_slices
from planlang.plan.complete import CompletePlan
from planlang.plan.types import Axis, DataSpec, Input, Mesh, Optimizer, Plan, Spec
from planlang.runtime.apply import load_plan
from planlang.runtime.placement import ParamLayout

IN, HIDDEN, OUT, BATCH = 8, 16, 4, 8
STEPS = 3
ADAMW = (("lr", 0.01), ("betas", (0.9, 0.95)), ("weight_decay", 0.01))
TIMEOUT_S = 120


# ------------------------------------------------------------------------------ plans and data
def mesh(**axes: int) -> Mesh:
    return Mesh("m", None, tuple(Axis(a, n) for a, n in axes.items()))


def plan(m: Mesh, data: tuple[str, ...], zero: int = 0, zero_axis: str | None = None) -> CompletePlan:
    """The plan, validated as the runtime takes it (planlang.runtime.apply.load_plan)."""
    return load_plan(Plan("<test>", inputs=(Input("x", "f32", (("batch", BATCH), ("features", IN))),), mesh=m,
                          optimizer=Optimizer("adamw", ADAMW, zero, zero_axis),
                          data=(DataSpec("x", Spec((data, ()))),)))


def layouts(**specs: tuple) -> dict[str, ParamLayout]:
    shapes = {"fc1.weight": (HIDDEN, IN), "fc1.bias": (HIDDEN,), "fc2.weight": (OUT, HIDDEN), "fc2.bias": (OUT,)}
    out = {}
    for key, dims in specs.items():
        name = key.replace("__", ".")
        out[name] = ParamLayout(name, shapes[name], Spec(tuple(tuple(d) for d in dims)))
    return out


MESH_A = mesh(tp=2)
LAYOUT_A = layouts(fc1__weight=(("tp",), ()), fc1__bias=(("tp",),), fc2__weight=((), ("tp",)), fc2__bias=((),))
MESH_B = mesh(dp=2, tp=2)
LAYOUT_B = layouts(fc1__weight=((), ("tp",)), fc1__bias=((),), fc2__weight=(("tp",), ()), fc2__bias=(("tp",),))


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build(IN, HIDDEN, OUT)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(BATCH, IN, generator=g), torch.randn(BATCH, OUT, generator=g)


@functools.cache
def reference(steps: int = STEPS + 1) -> list[dict]:
    """Single-process AdamW on the whole batch: per step the gradients and the parameters after it."""
    m = model()
    opt = torch.optim.AdamW(m.parameters(), **dict(ADAMW))
    out = []
    for s in range(steps):
        x, y = batch(s)
        opt.zero_grad()
        F.mse_loss(m(x), y).backward()
        grads = {n: p.grad.clone() for n, p in m.named_parameters()}
        opt.step()
        out.append({"grads": grads, "params": {n: p.detach().clone() for n, p in m.named_parameters()}})
    return out


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def full(t):
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


# ------------------------------------------------------------------------------ sharded pieces
def set_local_params(m: torch.nn.Module, values: dict[str, torch.Tensor], lay: dict, msh: Mesh, coords) -> None:
    """Replace m's parameters by this rank's pieces of `values` (zeros where values is None)."""
    for name, p in list(m.named_parameters()):
        sl = local_slices(tuple(p.shape), lay[name].spec, msh, coords)
        piece = values[name][sl].clone() if values is not None else torch.zeros_like(p[sl])
        owner, _, attr = name.rpartition(".")
        setattr(m.get_submodule(owner), attr, torch.nn.Parameter(piece))


def assemble(local: torch.Tensor, lay: ParamLayout, msh: Mesh, coords: dict) -> torch.Tensor:
    """The global tensor from every rank's piece (all_gather_object + local_slices; no DTensor)."""
    pieces: list = [None] * dist.get_world_size()
    dist.all_gather_object(pieces, (dict(coords), local.detach().clone()))
    out = torch.full(lay.shape, float("nan"), dtype=local.dtype)
    for c, piece in pieces:
        out[local_slices(lay.shape, lay.spec, msh, c)] = piece
    return out


def unsharded_state(m, opt, lay: dict, msh: Mesh, coords: dict) -> dict:
    """{"model": {name: tensor}, "state": {name: {key: tensor}}, "lr": float} assembled from pieces."""
    params = dict(m.named_parameters())
    out = {"model": {}, "state": {}, "lr": opt.param_groups[0]["lr"]}
    for name in sorted(lay):
        out["model"][name] = assemble(params[name], lay[name], msh, coords)
        st = opt.state[params[name]]
        out["state"][name] = {k: (v.clone() if v.dim() == 0 else assemble(v, lay[name], msh, coords))
                              for k, v in sorted(st.items())}
    return out


def compare_full(truth: dict, got: dict, what: str, res: dict) -> None:
    """torch.equal of every model and optimizer tensor of a load_full_state() result against `truth`."""
    bad = []
    for name, t in truth["model"].items():
        if not torch.equal(got["model"][name], t):
            bad.append(f"model.{name}")
        for k, v in truth["state"][name].items():
            g = got["optim"]["state"][name][k]
            if not (torch.equal(g, v) and g.dtype == v.dtype):
                bad.append(f"optim.{name}.{k}")
    res[what] = bad


# ------------------------------------------------------------------------------ world 2
def _dp_run(res: dict, key: str, stage: int, groups, p) -> tuple:
    from torch.distributed.tensor import DTensor
    from planlang.runtime.data_parallel import wrap_data_parallel
    from planlang.runtime.zero import build_optimizer

    ref = reference()
    m = model()
    wrapped = wrap_data_parallel(m, p, groups)
    opt = build_optimizer(wrapped, p.optimizer, groups)
    n, i = groups.size("dp"), groups.coords["dp"]
    grad_err, facts = 0.0, {}
    for s in range(STEPS):
        x, y = batch(s)
        opt.zero_grad()
        out = wrapped(x.chunk(n)[i])
        facts["param_sharded_after_forward"] = isinstance(m.fc1.weight, DTensor)
        F.mse_loss(out, y.chunk(n)[i]).backward()
        facts["grad_local_numel"] = 0
        for name, q in m.named_parameters():
            grad_err = max(grad_err, rel_err(full(q.grad), ref[s]["grads"][name]))
            if isinstance(q.grad, DTensor):
                facts["grad_local_numel"] += q.grad.to_local().numel()
        opt.step()
    param_err = max(rel_err(full(q), ref[STEPS - 1]["params"][name]) for name, q in m.named_parameters())
    res[key] = {"grad_err": grad_err, "param_err": param_err, "wrapper": type(wrapped).__name__,
                "optimizer": type(opt).__name__, **facts}
    return m, opt


def world2(rank: int, outdir: str, ckdir: str) -> dict:
    from planlang.runtime.checkpoint import load_full_state, save_checkpoint
    from planlang.runtime.redistribute import MeshGroups

    res: dict = {"errors": {}}
    dp = mesh(dp=2)
    g_dp = MeshGroups(dp)
    res["timing"] = {}
    for key, stage in (("ddp", 0), ("zero1", 1), ("zero2", 2), ("zero3", 3)):
        t0 = time.time()
        try:
            m, opt = _dp_run(res, key, stage, g_dp, plan(dp, ("dp",), stage, "dp" if stage else None))
            if key == "zero3":  # checkpoint F: an FSDP2 run
                path = os.path.join(ckdir, "F")
                save_checkpoint(path, m, opt, {}, g_dp)
                truth = {"model": {n: full(q) for n, q in m.named_parameters()},
                         "state": {n: {k: full(v) for k, v in opt.state[q].items()} for n, q in m.named_parameters()}}
                if rank == 0:
                    torch.save(truth, os.path.join(ckdir, "F.truth.pt"))
                    compare_full(truth, load_full_state(path), "F_vs_truth", res)
        except Exception:  # noqa: BLE001 - reported by the tests
            res["errors"][key] = traceback.format_exc()
        res["timing"][key] = time.time() - t0
    t0 = time.time()
    try:  # checkpoint A: plan A's pieces, 3 AdamW steps with the single-process gradients sliced
        g_a = MeshGroups(MESH_A)
        ref = reference()
        m = model()
        set_local_params(m, dict(model().named_parameters()), LAYOUT_A, MESH_A, g_a.coords)
        opt = torch.optim.AdamW(m.parameters(), **dict(ADAMW))
        for s in range(STEPS):
            for name, q in m.named_parameters():
                q.grad = ref[s]["grads"][name][local_slices(LAYOUT_A[name].shape, LAYOUT_A[name].spec, MESH_A,
                                                            g_a.coords)].clone()
            opt.step()
        path = os.path.join(ckdir, "A")
        save_checkpoint(path, m, opt, LAYOUT_A, g_a)
        truth = unsharded_state(m, opt, LAYOUT_A, MESH_A, g_a.coords)
        res["A_vs_reference"] = max(rel_err(truth["model"][n], ref[STEPS - 1]["params"][n]) for n in LAYOUT_A)
        if rank == 0:
            torch.save(truth, os.path.join(ckdir, "A.truth.pt"))
            got = load_full_state(path)
            compare_full(truth, got, "A_vs_truth", res)
            res["A_param_groups"] = [{k: v for k, v in g.items() if k in ("lr", "betas", "params")}
                                     for g in got["optim"]["param_groups"]]
    except Exception:  # noqa: BLE001
        res["errors"]["checkpoint_A"] = traceback.format_exc()
    res["timing"]["checkpoint_A"] = time.time() - t0
    return res


# ------------------------------------------------------------------------------ world 4
def _ddp_mesh_run(res: dict, key: str, groups, data: tuple[str, ...], zero: int = 0, axis=None) -> None:
    from planlang.runtime.data_parallel import wrap_data_parallel
    from planlang.runtime.zero import build_optimizer

    ref = reference()
    p = plan(MESH_B, data, zero, axis)
    m = model()
    wrapped = wrap_data_parallel(m, p, groups)
    opt = build_optimizer(wrapped, p.optimizer, groups)
    n = math.prod(groups.size(a) for a in data)
    i = 0
    for a in data:  # row-major index over the data axes
        i = i * groups.size(a) + groups.coords[a]
    grad_err = 0.0
    for s in range(STEPS):
        x, y = batch(s)
        opt.zero_grad()
        F.mse_loss(wrapped(x.chunk(n)[i]), y.chunk(n)[i]).backward()
        grad_err = max(grad_err, max(rel_err(full(q.grad), ref[s]["grads"][nm]) for nm, q in m.named_parameters()))
        opt.step()
    param_err = max(rel_err(full(q), ref[STEPS - 1]["params"][nm]) for nm, q in m.named_parameters())
    res[key] = {"grad_err": grad_err, "param_err": param_err, "group_size": n,
                "placements": [str(pl) for pl in getattr(m.fc1.weight, "placements", ())]}


def _sliced(t: torch.Tensor, lay: ParamLayout, coords) -> torch.Tensor:
    return t[local_slices(lay.shape, lay.spec, MESH_B, coords)]


def _load_b(res: dict, ckdir: str, groups, zero1: bool) -> None:
    """Plan B loads checkpoint A (plain AdamW, or ZeRO-1 over dp); one more step; ZeRO-1 saves B1."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from planlang.runtime.checkpoint import load_checkpoint, load_full_state, save_checkpoint

    key = "B_zero1" if zero1 else "B"
    truth = torch.load(os.path.join(ckdir, "A.truth.pt"), weights_only=True)
    m = model()
    set_local_params(m, None, LAYOUT_B, MESH_B, groups.coords)  # zeros: the load must fill them
    if zero1:
        opt = ZeroRedundancyOptimizer(m.parameters(), optimizer_class=torch.optim.AdamW,
                                      process_group=groups.group("dp"), lr=0.5)
        local_opt, owned = opt.optim, {id(p) for g in opt.optim.param_groups for p in g["params"]}
    else:
        opt = torch.optim.AdamW(m.parameters(), lr=0.5)  # lr comes from the checkpoint
        local_opt, owned = opt, {id(p) for p in m.parameters()}
    load_checkpoint(os.path.join(ckdir, "A"), m, opt, LAYOUT_B, groups)
    bad, checked = [], 0
    for name, q in m.named_parameters():
        lay = LAYOUT_B[name]
        if not torch.equal(q.detach(), _sliced(truth["model"][name], lay, groups.coords)):
            bad.append(f"model.{name}")
        if id(q) not in owned:
            if local_opt.state.get(q):
                bad.append(f"state of {name} on a rank that does not own it")
            continue
        st = local_opt.state[q]
        if sorted(st) != sorted(truth["state"][name]):
            bad.append(f"state keys of {name}: {sorted(st)}")
            continue
        for k, v in truth["state"][name].items():
            want = v if v.dim() == 0 else _sliced(v, lay, groups.coords)
            checked += 1
            if not (torch.equal(st[k], want) and st[k].dtype == want.dtype):
                bad.append(f"optim.{name}.{k}")
    res[key] = {"bad": bad, "states_checked": checked, "lr": opt.param_groups[0]["lr"]}
    if not zero1:  # gathered independently of DCP, and DCP's own view
        gathered = unsharded_state(m, opt, LAYOUT_B, MESH_B, groups.coords)
        if dist.get_rank() == 0:
            got = {"model": gathered["model"], "optim": {"state": gathered["state"]}}
            compare_full(truth, got, "B_gathered_vs_truth", res)
            compare_full(truth, load_full_state(os.path.join(ckdir, "A")), "A_full_vs_truth", res)
    else:
        path = os.path.join(ckdir, "B1")
        save_checkpoint(path, m, opt, LAYOUT_B, groups)
        if dist.get_rank() == 0:
            compare_full(truth, load_full_state(path), "B1_vs_truth", res)
    # the loaded state is usable: one more step with the reference's next gradient
    ref = reference()
    for name, q in m.named_parameters():
        q.grad = _sliced(ref[STEPS]["grads"][name], LAYOUT_B[name], groups.coords).clone()
    opt.step()
    res[key]["after_step"] = {n: q.detach().clone().tolist() for n, q in m.named_parameters()}
    full_opt_params = {n: torch.nn.Parameter(t.clone()) for n, t in truth["model"].items()}
    fo = torch.optim.AdamW(list(full_opt_params.values()), **dict(ADAMW))
    for n, t in full_opt_params.items():
        fo.state[t] = {k: v.clone() for k, v in truth["state"][n].items()}
        t.grad = ref[STEPS]["grads"][n].clone()
    fo.step()
    res[key]["step_err"] = max(rel_err(q.detach(), _sliced(full_opt_params[n].detach(), LAYOUT_B[n], groups.coords))
                               for n, q in m.named_parameters())


def _load_fsdp(res: dict, ckdir: str, groups) -> None:
    """A ZeRO-3 model split like plan B (fc2.weight dim 0 over tp, then over dp by FSDP2) loads F."""
    from planlang.runtime.checkpoint import load_checkpoint, load_full_state, save_checkpoint
    from planlang.runtime.data_parallel import wrap_data_parallel

    truth = torch.load(os.path.join(ckdir, "F.truth.pt"), weights_only=True)
    m = model()
    set_local_params(m, None, LAYOUT_B, MESH_B, groups.coords)
    p = plan(MESH_B, ("dp",), 3, "dp")
    wrap_data_parallel(m, p, groups, layouts=LAYOUT_B)
    opt = torch.optim.AdamW(m.parameters(), lr=0.5)
    load_checkpoint(os.path.join(ckdir, "F"), m, opt, LAYOUT_B, groups)
    bad = []
    for name, q in m.named_parameters():
        lay = LAYOUT_B[name]
        if not torch.equal(q.full_tensor(), _sliced(truth["model"][name], lay, groups.coords)):
            bad.append(f"model.{name}")
        for k, v in truth["state"][name].items():
            got = full(opt.state[q][k])
            if not torch.equal(got, v if v.dim() == 0 else _sliced(v, lay, groups.coords)):
                bad.append(f"optim.{name}.{k}")
    res["F_into_B3"] = {"bad": bad}
    path = os.path.join(ckdir, "B3")
    save_checkpoint(path, m, opt, LAYOUT_B, groups)
    if dist.get_rank() == 0:
        compare_full(truth, load_full_state(path), "B3_vs_truth", res)


def world4(rank: int, outdir: str, ckdir: str) -> dict:
    from planlang.runtime.redistribute import MeshGroups

    res: dict = {"errors": {}, "timing": {}}
    groups = MeshGroups(MESH_B)
    for key, fn in (("ddp_dp", lambda: _ddp_mesh_run(res, "ddp_dp", groups, ("dp",))),
                    ("ddp_dp_tp", lambda: _ddp_mesh_run(res, "ddp_dp_tp", groups, ("dp", "tp"))),
                    ("hsdp", lambda: _ddp_mesh_run(res, "hsdp", groups, ("dp", "tp"), 2, "tp")),
                    ("load_B", lambda: _load_b(res, ckdir, groups, zero1=False)),
                    ("load_B_zero1", lambda: _load_b(res, ckdir, groups, zero1=True)),
                    ("load_F", lambda: _load_fsdp(res, ckdir, groups))):
        t0 = time.time()
        try:
            fn()
        except Exception:  # noqa: BLE001
            res["errors"][key] = traceback.format_exc()
        res["timing"][key] = time.time() - t0
    return res


# ------------------------------------------------------------------------------ spawning
def _entry(rank: int, world: int, port: int, fn_name: str, outdir: str, ckdir: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    t0 = time.time()
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    try:
        res = globals()[fn_name](rank, outdir, ckdir)
    except Exception:  # noqa: BLE001
        res = {"errors": {"worker": traceback.format_exc()}}
    res["seconds"] = time.time() - t0
    with open(os.path.join(outdir, f"{fn_name}.rank{rank}.json"), "w") as f:
        json.dump(res, f)
    from planlang.runtime.teardown import leave

    leave()  # barrier, destroy, exit without finalization (see teardown.py)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(fn_name: str, world: int, outdir: str, ckdir: str) -> list[dict]:
    """Run `fn_name` on `world` fresh gloo ranks. They fork from a forkserver that imported torch and
    this module once (a clean process: no threads started), which saves ~3 s of CPU per rank."""
    import multiprocessing

    multiprocessing.get_context("forkserver").set_forkserver_preload([__name__])
    ctx = mp.start_processes(_entry, args=(world, _free_port(), fn_name, outdir, ckdir), nprocs=world,
                             join=False, start_method="forkserver")
    deadline = time.time() + TIMEOUT_S
    while not ctx.join(timeout=2):
        if time.time() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            raise TimeoutError(f"{fn_name}: gloo workers timed out after {TIMEOUT_S} s")
    out = []
    for r in range(world):
        with open(os.path.join(outdir, f"{fn_name}.rank{r}.json")) as f:
            out.append(json.load(f))
    return out


@functools.cache
def workdir() -> str:
    import atexit

    d = tempfile.mkdtemp(prefix="planlang-zero-")
    atexit.register(shutil.rmtree, d, True)
    return d


@functools.cache
def world2_results() -> list[dict]:
    return spawn("world2", 2, workdir(), workdir())


@functools.cache
def world4_results() -> list[dict]:
    world2_results()  # checkpoints A and F
    return spawn("world4", 4, workdir(), workdir())
