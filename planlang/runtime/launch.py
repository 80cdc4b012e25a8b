"""Launching plans with torchrun: `planlang run PLAN -- SCRIPT ARGS`, `planlang verify PLAN`, and the
per-rank program without launching anything (`planlang lower PLAN --rank R`).

`plan_launch` checks torchrun's node options against the plan's world size before anything starts (one
node with every process local by default; several nodes over a static or c10d rendezvous); `torchrun`
runs the target under them. docs/launch.md shows single node, multi-node, SLURM and Kubernetes."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

from planlang.plan.complete import CompleteMesh, CompletePlan, plan_mesh, plan_model, world_size
from planlang.plan.stage_meshes import heterogeneous, stage_plan


def mesh_words(plan: CompletePlan) -> str:
    """The mesh as messages name it: `ranks (dp=2 × tp=2)`."""
    m = plan.mesh
    if m is None:
        return "no mesh"
    return f"{m.name} (" + " × ".join(f"{n}={s}" for n, s in zip(m.names, m.shape)) + ")"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LaunchError(ValueError):
    """torchrun options that cannot run the plan (a usage error): the message names the numbers and the fix."""


DEFAULT_MASTER_PORT = 29500  # torchrun's


@dataclass(frozen=True)
class Launch:
    """What one `planlang run` / `planlang verify` hands torchrun on this node."""

    world: int  # the plan's devices = nnodes × nproc_per_node
    nnodes: int
    nproc_per_node: int
    node_rank: int
    rdzv_backend: str  # "static" (torchrun's default), "c10d", "etcd", ...
    rdzv_endpoint: str  # host:port of the rendezvous (for static: node 0's master address)
    rdzv_id: str | None = None
    max_restarts: int | None = None

    @property
    def static(self) -> bool:
        return self.rdzv_backend == "static"

    def args(self) -> list[str]:
        """torchrun's options (before the target)."""
        out = [f"--nnodes={self.nnodes}", f"--nproc-per-node={self.nproc_per_node}"]
        if self.static:
            host, _, port = self.rdzv_endpoint.rpartition(":")
            out += [f"--node-rank={self.node_rank}", f"--master-addr={host}", f"--master-port={port}"]
        else:
            out += [f"--rdzv-backend={self.rdzv_backend}", f"--rdzv-endpoint={self.rdzv_endpoint}"]
        if self.rdzv_id is not None:
            out.append(f"--rdzv-id={self.rdzv_id}")
        if self.max_restarts is not None:
            out.append(f"--max-restarts={self.max_restarts}")
        return out

    def __str__(self) -> str:
        procs = f"{self.nproc_per_node} process{'es' if self.nproc_per_node != 1 else ''}"
        if self.nnodes == 1:
            where = f"{procs} on this machine"
        elif self.static:
            where = f"{procs} on node {self.node_rank} of {self.nnodes} ({self.world} in all)"
        else:
            where = f"{procs} on this node, one of {self.nnodes} ({self.world} in all)"
        how = ("static rendezvous at " if self.static else f"{self.rdzv_backend} rendezvous at ") + self.rdzv_endpoint
        return f"{where}, {how}" + (f", id {self.rdzv_id}" if self.rdzv_id else "")


def _count(value, option: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        n = int(str(value).strip())
    except ValueError:
        raise LaunchError(f"{option} takes a whole number, not {value!r}") from None
    return n


def _nnodes(value, world: int) -> int | None:
    """`--nnodes N` (or the range `N:N`); an elastic range is refused: the plan fixes the world size."""
    if value is None or value == "":
        return None
    text = str(value).strip()
    if ":" in text:
        lo, _, hi = text.partition(":")
        lo_n, hi_n = _count(lo, "--nnodes"), _count(hi, "--nnodes")
        if lo_n != hi_n:
            raise LaunchError(
                f"--nnodes {text} is an elastic range, and a plan's mesh fixes the world size ({world} devices): "
                "the number of nodes cannot change while it trains. Give a fixed count, --nnodes N with "
                f"N × --nproc-per-node = {world}; torchrun still restarts failed workers (--max-restarts) and, "
                "with --rdzv-backend c10d, a replaced node joins the next rendezvous")
        text = lo
    return _count(text, "--nnodes")


def plan_launch(world: int, *, nnodes=None, node_rank=None, nproc_per_node=None, rdzv_backend=None,
                rdzv_endpoint=None, rdzv_id=None, max_restarts=None, master_addr=None, master_port=None,
                mesh: str = "") -> Launch:
    """Check torchrun's options against the plan's `world` size (`mesh` names it in messages) and fill
    the defaults: one node with every process local (static rendezvous on 127.0.0.1, a free port); with
    `nnodes` and no `nproc_per_node` (or torchrun's `auto`), world / nnodes processes per node. Values
    may be strings (as typed, or from torchrun's PET_* variables). Raises LaunchError."""
    what = f"the plan's mesh {mesh} has {world} devices" if mesh else f"the plan has {world} devices"
    nodes = _nnodes(nnodes, world)
    nodes_given = nodes is not None
    # torchrun's auto/gpu/cpu/xpu count the machine's devices; the plan fixes the count: world / nnodes
    auto = str(nproc_per_node).strip().lower() in ("auto", "gpu", "cpu", "xpu", "cuda")
    procs = None if auto else _count(nproc_per_node, "--nproc-per-node")
    if nodes is not None and nodes < 1:
        raise LaunchError(f"--nnodes must be at least 1, not {nodes}")
    if procs is not None and procs < 1:
        raise LaunchError(f"--nproc-per-node must be at least 1, not {procs}")
    if procs is None:
        if nodes is None:
            nodes, procs = 1, world
        elif world % nodes:
            divisors = ", ".join(str(d) for d in range(1, world + 1) if world % d == 0)
            raise LaunchError(f"{what}, which --nnodes {nodes} cannot share evenly (every node runs the same number "
                              f"of processes): give a node count that divides {world} ({divisors}), or change the "
                              "plan's mesh")
        else:
            procs = world // nodes
    elif nodes is None:
        nodes = 1
    if nodes * procs != world:
        keep_nodes = f"--nnodes {nodes} --nproc-per-node {world // nodes}" if world % nodes == 0 else ""
        keep_procs = f"--nnodes {world // procs} --nproc-per-node {procs}" if world % procs == 0 else ""
        # a suggestion keeps the node count when the user gave one, else the processes per node
        fix = ((keep_nodes or keep_procs) if nodes_given else (keep_procs or keep_nodes)) or (
            f"--nnodes 1 --nproc-per-node {world}")
        raise LaunchError(f"{what}, but --nnodes {nodes} × --nproc-per-node {procs} = {nodes * procs} processes; "
                          f"torchrun must start exactly one process per device: make nnodes × nproc-per-node = "
                          f"{world}, e.g. {fix} (or change the plan's mesh)")
    rank = _count(node_rank, "--node-rank")
    if rank is not None and not 0 <= rank < nodes:
        raise LaunchError(f"--node-rank {rank} is outside 0..{nodes - 1} (--nnodes {nodes})")
    restarts = _count(max_restarts, "--max-restarts")
    if restarts is not None and restarts < 0:
        raise LaunchError(f"--max-restarts must be 0 or more, not {restarts}")
    port = _count(master_port, "--master-port")
    if port is not None and not 0 < port < 65536:
        raise LaunchError(f"--master-port {port} is not a port (1..65535)")
    backend = (rdzv_backend or "static").strip().lower()
    endpoint = (rdzv_endpoint or "").strip()
    if endpoint:
        host, colon, p = endpoint.rpartition(":")
        if not colon or not host or not p.isdigit():
            raise LaunchError(f"--rdzv-endpoint {endpoint!r} is not HOST:PORT (e.g. node0.example.com:29400)")
    if backend == "static":
        if endpoint and (master_addr or port is not None):
            raise LaunchError("give the static rendezvous once: --rdzv-endpoint HOST:PORT or "
                              "--master-addr HOST --master-port PORT, not both")
        if not endpoint:
            if master_addr:
                endpoint = f"{master_addr}:{port if port is not None else DEFAULT_MASTER_PORT}"
            elif nodes == 1:
                endpoint = f"127.0.0.1:{port if port is not None else free_port()}"
            else:
                raise LaunchError(
                    f"with --nnodes {nodes} every node must find node 0: give --master-addr HOST (node 0's "
                    f"address; --master-port PORT, default {DEFAULT_MASTER_PORT}) or --rdzv-endpoint HOST:PORT, "
                    "the same on every node; or use --rdzv-backend c10d --rdzv-endpoint HOST:PORT")
        if nodes > 1 and rank is None:
            raise LaunchError(f"with --nnodes {nodes} and the static rendezvous each node needs its own "
                              f"--node-rank (0..{nodes - 1}; 0 on the node at the rendezvous address)")
    else:
        if master_addr or port is not None:
            raise LaunchError(f"--master-addr and --master-port are for the static rendezvous; with "
                              f"--rdzv-backend {backend} give --rdzv-endpoint HOST:PORT instead")
        if not endpoint:
            raise LaunchError(f"--rdzv-backend {backend} needs --rdzv-endpoint HOST:PORT, the same on every node "
                              "(for c10d: a host every node reaches, e.g. node 0's, and a free port such as 29400)")
    return Launch(world, nodes, procs, rank or 0, backend, endpoint, rdzv_id or None, restarts)


def torchrun(launch: Launch | int, target: list[str], env: dict[str, str] | None = None,
             module: bool = False) -> int:
    """Run `target` (a script and its arguments, or `-m module ...`) under torchrun: `launch` says how
    (a bare number: that many processes on this machine). Returns torchrun's exit status."""
    if isinstance(launch, int):
        launch = plan_launch(launch)
    cmd = [sys.executable, "-m", "torch.distributed.run", *launch.args()]
    if module:
        cmd.append("-m")
    cmd += target
    full_env = dict(os.environ)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env.update(env or {})
    return subprocess.call(cmd, env=full_env)


T0_ENV = "PLANLANG_T0"  # when the command started (time.time()), for the processes it launches
QUIET_ENV = "PLANLANG_QUIET"  # "1": no progress lines


class Progress:
    """Progress lines on stderr, `planlang COMMAND: MESSAGE  [ELAPSED s]` (stdout keeps the command's
    product), the time counted from when the command started: in a process it launched, from
    $PLANLANG_T0, which `env()` hands on. Silent when `quiet`, or when $PLANLANG_QUIET is 1 and `quiet`
    is None."""

    def __init__(self, command: str, quiet: bool | None = None):
        self.command = command
        self.quiet = os.environ.get(QUIET_ENV, "") == "1" if quiet is None else quiet
        try:
            self.t0 = float(os.environ[T0_ENV])
        except (KeyError, ValueError):
            self.t0 = time.time()

    def __call__(self, msg: str) -> None:
        if not self.quiet:
            sys.stderr.write(f"planlang {self.command}: {msg}  [{time.time() - self.t0:.1f} s]\n")
            sys.stderr.flush()

    def env(self) -> dict[str, str]:
        """What the launched processes need to go on with the same clock (and the same quietness)."""
        return {T0_ENV: repr(self.t0), QUIET_ENV: "1" if self.quiet else "0"}


def coords_of(rank: int, mesh: CompleteMesh) -> dict[str, int]:
    """Row-major coordinates of `rank` (DeviceMesh's layout)."""
    out = {}
    for name, size in reversed(list(zip(mesh.names, mesh.shape))):
        out[name] = rank % size
        rank //= size
    return dict(reversed(list(out.items())))


def lower_source(plan: CompletePlan, rank: int, strict: bool = False) -> str:
    """The generated per-rank Python for `rank`, from the model built on meta (no processes). Ops that run
    on the whole batch (PL364) are warnings on stderr, or with `strict` a PlanError. `plan`: a validated
    complete plan (planlang.model.validation, or planlang.runtime.apply.load_plan)."""
    # lazy: torch loads only when this runs
    from planlang.model.capture.load import build_model
    from planlang.runtime.apply import lower_plan, report_fallbacks, zero_blocks
    from planlang.runtime.codegen import generate

    n = world_size(plan)
    if not 0 <= rank < n:
        raise ValueError(f"rank {rank} is outside the plan's {n} devices (0..{n - 1})")
    model = build_model(plan_model(plan), plan.path)
    if heterogeneous(plan):  # stages of their own degrees: the rank's stage's plan, on its sizes, as apply runs it
        own = stage_plan(plan, coords_of(rank, plan_mesh(plan))[plan.dims.pipeline or ""])
        return program_pipeline_source(model, own, rank, coords_of(rank, plan_mesh(own)), strict)
    coords = coords_of(rank, plan_mesh(plan))
    if plan.pipeline is not None and not plan.dims.tensor:
        return pipeline_source(model, plan, rank, coords)
    if plan.pipeline is not None:  # pipeline x tensor parallelism: the program of one microbatch, cut
        return program_pipeline_source(model, plan, rank, coords, strict)
    prog = lower_plan(model, plan)
    report_fallbacks(prog, strict)
    blocks = zero_blocks(model, prog, plan)  # ZeRO-2/3: each block run as its FSDP2 unit's forward
    return generate(prog, rank, coords, title=os.path.relpath(plan.path),
                    blocks=[(b.start, b.end, b.name) for b in blocks])


def program_pipeline_source(model, plan: CompletePlan, rank: int, coords: dict[str, int], strict: bool) -> str:
    """For a pipeline plan with tensor parallelism: the functions of the stages `rank` holds and the loss
    tail, as planlang.runtime.program_pipeline runs them (one microbatch's program, cut into stages)."""
    # lazy: torch loads only when this runs
    from planlang.model.program.pipeline_program import cut_program, microbatch_plan
    from planlang.runtime.apply import lower_plan, report_fallbacks
    from planlang.runtime.codegen import generate_pipeline
    from planlang.runtime.pipeline import pipeline_layout

    p = plan.pipeline
    assert p is not None
    layout = pipeline_layout(plan)
    mine = layout.stages_of(coords[p.axis])
    prog = lower_plan(model, microbatch_plan(plan))
    report_fallbacks(prog, strict)
    cut = cut_program(prog, plan)
    head = f"# {layout}; rank {rank} holds stages {mine}\n"
    return head + generate_pipeline(prog, cut, rank, coords, title=os.path.relpath(plan.path), stages=mine)


def pipeline_source(model, plan: CompletePlan, rank: int, coords: dict[str, int]) -> str:
    """For a pipeline plan: the stages `rank` holds, what crosses each boundary, and each stage's
    forward as torch.fx prints it (the pipeline runs the model's own modules inside the stages)."""
    # lazy: torch loads only when this runs
    from planlang.runtime.pipeline import pipeline_layout
    from planlang.model.program.stages import cut_values, split_stages

    p = plan.pipeline
    assert p is not None  # lower_source's pipeline branch
    layout = pipeline_layout(plan)
    mine = layout.stages_of(coords[p.axis])
    # the cut the runtime makes (fx, or torch.export's for models fx cannot trace between stages),
    # and what crosses its boundaries read from it: one cut, no second trace that could fail alone
    stages = split_stages(model, plan)
    values = cut_values(stages)
    where = ", ".join(f"{a}={c}" for a, c in coords.items())
    out = [f"# {os.path.relpath(plan.path)}: rank {rank} ({where}), {layout}", f"# holds stages {mine}"]
    for i in mine:
        out += ["", f"# {values[i]}", stages[i].code.strip()]
    return "\n".join(out) + "\n"
