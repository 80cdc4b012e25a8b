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
    coords = coords_of(rank, plan.mesh)
    if plan.pipeline is not None:
        return pipeline_source(model, plan, rank, coords)
    prog = lower_plan(model, plan)
    return generate(prog, rank, coords, title=os.path.relpath(plan.path))


def pipeline_source(model, plan: T.Plan, rank: int, coords: dict[str, int]) -> str:
    """For a pipeline plan: the stages `rank` holds, what crosses each boundary, and each stage's
    forward as torch.fx prints it (the pipeline runs the model's own modules inside the stages)."""
    from planlang.runtime.pipeline import check_pipeline_plan, pipeline_layout
    from planlang.runtime.stages import split_stages, stage_values

    check_pipeline_plan(plan)
    axis = str(plan.pipeline.axis)  # type: ignore[union-attr]
    layout = pipeline_layout(plan, int(plan.mesh.axis_size(axis)))  # type: ignore[arg-type]
    mine = layout.stages_of(coords[axis])
    sels = [st.modules for st in plan.pipeline.stages]  # type: ignore[union-attr]
    values = stage_values(model, sels)
    stages = split_stages(model, plan)
    where = ", ".join(f"{a}={c}" for a, c in coords.items())
    out = [f"# {os.path.relpath(plan.path)}: rank {rank} ({where}), {layout}", f"# holds stages {mine}"]
    for i in mine:
        out += ["", f"# {values[i]}", stages[i].code.strip()]
    return "\n".join(out) + "\n"
