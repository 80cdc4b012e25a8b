"""Launching plans with torchrun: `planlang run PLAN -- SCRIPT ARGS`, `planlang verify PLAN`, and the
per-rank program without launching anything (`planlang lower PLAN --rank R`)."""
from __future__ import annotations

import math
import os
import socket
import subprocess
import sys

from planlang.plan import types as T


def world_size(plan: T.Plan) -> int:
    if plan.mesh is None or plan.mesh.has_holes:
        raise ValueError("the plan's mesh has holes; run `planlang solve` first")
    return math.prod(plan.mesh.shape)  # type: ignore[arg-type]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nproc: int, target: list[str], env: dict[str, str] | None = None, module: bool = False) -> int:
    """Run `target` (a script and its arguments, or `-m module ...`) on `nproc` local processes."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
           f"--nproc-per-node={nproc}", f"--master-port={free_port()}", "--master-addr=127.0.0.1"]
    if module:
        cmd.append("-m")
    cmd += target
    full_env = dict(os.environ)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env.update(env or {})
    return subprocess.call(cmd, env=full_env)


def coords_of(rank: int, mesh: T.Mesh) -> dict[str, int]:
    """Row-major coordinates of `rank` (DeviceMesh's layout)."""
    out = {}
    for name, size in reversed(list(zip(mesh.names, mesh.shape))):
        out[name] = rank % size  # type: ignore[operator]
        rank //= size  # type: ignore[operator]
    return dict(reversed(list(out.items())))


def lower_source(plan: T.Plan, rank: int) -> str:
    """The generated per-rank Python for `rank`, from the model built on meta (no processes)."""
    from planlang.model.load import build_model
    from planlang.runtime.apply import lower_plan
    from planlang.runtime.codegen import generate

    n = world_size(plan)
    if not 0 <= rank < n:
        raise ValueError(f"rank {rank} is outside the plan's {n} devices (0..{n - 1})")
    model = build_model(plan.model, plan.path)
    prog = lower_plan(model, plan)
    return generate(prog, rank, coords_of(rank, plan.mesh), title=os.path.relpath(plan.path))
