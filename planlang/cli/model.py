"""The commands that build, price or run a plan's model: `inspect`, `estimate`, `lower`, `verify`, `run`,
`solve`, `diff`, `report`, `probe`. Each imports torch when it runs, and each starts from the one validation
(planlang.model.validation) through `_validated`."""
from __future__ import annotations

import ast as pyast
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List, Optional

import typer

from planlang.lang.render import render
from planlang.plan.complete import IncompletePlan, complete as as_complete
from planlang.plan.types import ModelRef
from planlang.cli import cached
from planlang.cli.app import Objective, TableFormat, _COLOR, _fail_usage, _use_color


def inspect(
    model: str = typer.Argument(..., help='A plan file, or a factory "package.module:callable".'),
    arg: List[str] = typer.Option([], "--arg", "-a", help="Factory keyword argument NAME=VALUE (repeatable)."),
    input: List[str] = typer.Option([], "--input", "-i", help="An input, e.g. idx:i64[batch=4,seq=128]."),
    depth: Optional[int] = typer.Option(None, "--depth", help="Show modules down to this nesting depth."),
    format: TableFormat = typer.Option(TableFormat.table, "--format", "-f", help="Output format."),
) -> None:
    """Show a model's modules in execution order: parameters, shapes, flops, saved activations."""

    plan_path = None
    if model.endswith(".plan"):
        # lazy: lark loads only when this runs
        from planlang.plan.checker import check_file

        res = check_file(model)
        if res.plan is None or res.plan.model is None:
            _fail_usage(f"{model} declares no model (or does not parse: run `planlang check {model}`)")
        ref, inputs, plan_path = res.plan.model, res.plan.inputs, model
    else:
        # lazy: torch loads only when this runs
        from planlang.model.inspect import parse_input

        kwargs = []
        for a in arg:
            k, _, v = a.partition("=")
            try:
                kwargs.append((k, pyast.literal_eval(v)))
            except (ValueError, SyntaxError):
                kwargs.append((k, v))
        try:
            inputs = tuple(parse_input(i) for i in input)
        except ValueError as err:
            _fail_usage(str(err))
        ref = ModelRef("model", model, tuple(kwargs))
        if not inputs:
            _fail_usage("give the model's inputs with --input, e.g. --input 'idx:i64[batch=4,seq=128]'")
    # lazy: torch loads only when this runs
    from planlang.model.inspect import inspect_model, render_json, render_text
    from planlang.model.capture.load import ModelLoadError

    try:
        info = inspect_model(ref, inputs, plan_path, depth)
    except ModelLoadError as err:
        _fail_usage(f"{err.message}\n  help: {err.help}")
    except Exception as err:  # the forward failed on these inputs: the user's inputs, not our bug
        _fail_usage(f"running the model on {', '.join(map(str, inputs))} raised {type(err).__name__}: {err}")
    sys.stdout.write(render_json(info) if format is TableFormat.json else render_text(info))


def estimate(
    plan: Path = typer.Argument(..., help="A plan file with a model."),
    format: TableFormat = typer.Option(TableFormat.table, "--format", "-f", help="Output format."),
    no_cache: bool = typer.Option(False, "--no-cache", help=cached.NO_CACHE_HELP),
) -> None:
    """Estimate per-device peak memory (by class) and step time of a plan, from its model on meta."""
    k = free = None
    if not no_cache and plan.is_file():  # the same plan and model estimated before: its tables, no torch
        free = cached.model_free(str(plan), plan.read_text(encoding="utf-8"))
        k = cached.result_key("estimate", free)
        hit = cached.load(k)
        if hit is not None:
            diagnostics, outputs = hit
            if diagnostics:
                sys.stderr.write(render(list(diagnostics), free.sources, "human", color=_use_color(None, sys.stderr)))
            sys.stdout.write(outputs[format.value])
            return
    v = _validated(plan)
    checked = v.complete
    # lazy: torch loads only when this runs
    from planlang.report.estimate_table import render_table

    if v.estimate is None:  # validation estimates every plan it completes, or fails with PL369
        _fail_usage(f"{plan} cannot be estimated (`planlang check --model {plan}` says why)")
    rows = list(v.estimate)
    outputs = {TableFormat.json.value: json.dumps([r.as_dict() for r in rows], indent=2) + "\n",
               TableFormat.table.value: render_table(checked, rows)}
    cached.store(k, v.check.plan, (v.check.diagnostics, outputs))
    sys.stdout.write(outputs[format.value])


def _validated(plan: Path, *, complete: bool = True):
    """The plan validated against its model (planlang.model.validation: the checks of `planlang check
    --model`, so every command that runs or prices a plan rejects what `check --model` rejects, with the
    same codes) — or an error naming what to fix (its diagnostics, holes left for `solve`, no model).
    Warnings are shown and do not stop. With `complete` (the default) its `complete` plan is set: no
    holes, concrete fields."""
    # lazy: torch loads only when this runs
    from planlang.model.validation import validate_file
    from planlang.runtime.program_memory import measure

    if not plan.is_file():
        _fail_usage(f"no such file: {plan}")
    v = validate_file(str(plan), program=measure)
    res = v.check
    if res.diagnostics:
        sys.stderr.write(render(list(res.diagnostics), res.sources, "human", color=_use_color(None, sys.stderr)))
    if any(d.code == "PL364" for d in res.diagnostics):
        os.environ["PLANLANG_PL364_SHOWN"] = "1"  # shown here: the runtime (this process, the workers) stays quiet
    if res.errors or res.plan is None:
        _fail_usage(f"{plan} has errors; fix them first (`planlang check --model {plan}` shows the same)")
    if res.plan.model is None:
        _fail_usage(f"{plan} declares no model")
    if not complete or v.complete is not None:
        return v
    try:
        as_complete(res.plan)
    except IncompletePlan as err:
        where = ", ".join(f"{h.what} at {h.span.line}:{h.span.col}" for h in err.holes)
        _fail_usage(f"{plan} has {len(err.holes)} holes (`?`: {where}); run `planlang solve {plan}` first")
    _fail_usage(f"{plan} cannot be completed")  # validation completes every plan without errors or holes


def _runnable_plan(plan: Path):
    """The complete plan of `_validated` (the commands that run or price it)."""
    return _validated(plan).complete


def lower(
    plan: Path = typer.Argument(..., help="A complete plan file with a model."),
    rank: int = typer.Option(0, "--rank", "-r", help="The rank whose program to print."),
    traffic: bool = typer.Option(False, "--traffic", help="Print the collectives one step issues instead "
                                 "(kind, mesh axes, bytes sent per rank, the cost model's time)."),
    strict: bool = typer.Option(False, "--strict", envvar="PLANLANG_STRICT",
                                help="Stop when an op must run on the whole batch the plan splits (PL364)."),
) -> None:
    """Print the per-rank Python the runtime generates and runs for this plan."""
    # lazy: torch loads only when this runs
    from planlang.model.capture.load import ModelLoadError
    from planlang.runtime.apply import PlanError
    from planlang.runtime.launch import lower_source

    p = _runnable_plan(plan)
    try:
        if traffic:
            # lazy: loaded by this command only, so `check` and `fmt` start fast
            from planlang.runtime.traffic import traffic_table

            sys.stdout.write(traffic_table(str(plan)))
            return
        sys.stdout.write(lower_source(p, rank, strict))
    except ModelLoadError as err:
        _fail_usage(f"{err.message}\n  help: {err.help}")
    except (PlanError, ValueError) as err:
        _fail_usage(str(err))


def _preflight(plan: Path) -> None:
    """The runtime's checks that need no processes (combinations it refuses, ZeRO and schedule rules),
    reported before torchrun starts anything."""
    # lazy: torch loads only when this runs
    from planlang.model.capture.load import ModelLoadError
    from planlang.runtime.apply import PlanError
    from planlang.runtime.verify import preflight

    try:
        preflight(plan)
    except ModelLoadError as err:
        _fail_usage(f"{err.message}\n  help: {err.help}")
    except PlanError as err:
        _fail_usage(str(err))


def verify(
    plan: Path = typer.Argument(..., help="A complete plan file with a model."),
    steps: int = typer.Option(3, "--steps", help="Training steps to compare."),
    tol: float = typer.Option(1e-5, "--tol", help="Relative error always accepted; above it an error passes only "
                              "within 10x of one process's own rounding against float64 (docs/runtime.md)."),
    nnodes: Optional[str] = typer.Option(None, "--nnodes", envvar="PET_NNODES", rich_help_panel="torchrun",
                                         help="Nodes (default 1); nnodes × nproc-per-node = the plan's devices."),
    node_rank: Optional[int] = typer.Option(None, "--node-rank", envvar="PET_NODE_RANK", rich_help_panel="torchrun",
                                            help="This node's rank, 0..nnodes-1 (static rendezvous)."),
    nproc_per_node: Optional[str] = typer.Option(None, "--nproc-per-node", envvar="PET_NPROC_PER_NODE",
                                                 rich_help_panel="torchrun",
                                                 help="Processes on this node (default: devices / nnodes)."),
    rdzv_backend: Optional[str] = typer.Option(None, "--rdzv-backend", envvar="PET_RDZV_BACKEND",
                                               rich_help_panel="torchrun", help="static (default) or c10d."),
    rdzv_endpoint: Optional[str] = typer.Option(None, "--rdzv-endpoint", envvar="PET_RDZV_ENDPOINT",
                                                rich_help_panel="torchrun", help="HOST:PORT of the rendezvous."),
    rdzv_id: Optional[str] = typer.Option(None, "--rdzv-id", envvar="PET_RDZV_ID", rich_help_panel="torchrun",
                                          help="The job's id at the rendezvous (c10d)."),
    max_restarts: Optional[int] = typer.Option(None, "--max-restarts", envvar="PET_MAX_RESTARTS",
                                               rich_help_panel="torchrun", help="Worker restarts on failure."),
    master_addr: Optional[str] = typer.Option(None, "--master-addr", envvar="PET_MASTER_ADDR",
                                              rich_help_panel="torchrun", help="Node 0's address (static)."),
    master_port: Optional[int] = typer.Option(None, "--master-port", envvar="PET_MASTER_PORT",
                                              rich_help_panel="torchrun", help="Node 0's port (default 29500)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress lines on stderr."),
    strict: bool = typer.Option(False, "--strict", envvar="PLANLANG_STRICT",
                                help="Stop when an op must run on the whole batch the plan splits (PL364)."),
) -> None:
    """Train a few steps under the plan (torchrun, one process per device) and in one process from the
    same seed; print loss, gradient and parameter errors per step with the bound each is judged against.
    Exit 1 (after the table) when an error exceeds its bound.
    Progress (checking, launching, each step) goes to stderr; the table to stdout. Several nodes: see
    docs/launch.md (exit 2 when nnodes × nproc-per-node is not the plan's device count)."""
    # lazy: loaded by this command only, so `check` and `fmt` start fast
    from planlang.runtime.launch import LaunchError, Progress, mesh_words, plan_launch, torchrun, world_size

    if strict:  # the workers read it (planlang.apply)
        os.environ["PLANLANG_STRICT"] = "1"
    say = Progress("verify", quiet)
    say(f"checking {plan} with its model")
    p = _runnable_plan(plan)
    try:
        launch = plan_launch(world_size(p), mesh=mesh_words(p), nnodes=nnodes, node_rank=node_rank,
                             nproc_per_node=nproc_per_node, rdzv_backend=rdzv_backend, rdzv_endpoint=rdzv_endpoint,
                             rdzv_id=rdzv_id, max_restarts=max_restarts, master_addr=master_addr,
                             master_port=master_port)
    except LaunchError as err:
        _fail_usage(str(err))
    say("checking what the runtime supports")
    _preflight(plan)
    say(f"launching {launch}")

    # lazy: torch loads only when this runs
    from planlang.runtime.verify import VERDICT_ENV

    with tempfile.TemporaryDirectory(prefix="planlang-verify-") as tmp:
        verdict = Path(tmp) / "verdict"
        code = torchrun(launch, ["planlang.runtime.verify", str(plan), str(steps), str(tol)],
                        env={**say.env(), VERDICT_ENV: str(verdict)}, module=True)
        word = verdict.read_text() if code == 0 and verdict.is_file() else ""
    raise typer.Exit({"FAIL": 1, "ERROR": 2}.get(word, code))


def run(
    ctx: typer.Context,
    plan: Path = typer.Argument(..., help="A complete plan file."),
    nnodes: Optional[str] = typer.Option(None, "--nnodes", envvar="PET_NNODES", rich_help_panel="torchrun",
                                         help="Nodes (default 1); nnodes × nproc-per-node = the plan's devices."),
    node_rank: Optional[int] = typer.Option(None, "--node-rank", envvar="PET_NODE_RANK", rich_help_panel="torchrun",
                                            help="This node's rank, 0..nnodes-1 (static rendezvous)."),
    nproc_per_node: Optional[str] = typer.Option(None, "--nproc-per-node", envvar="PET_NPROC_PER_NODE",
                                                 rich_help_panel="torchrun",
                                                 help="Processes on this node (default: devices / nnodes)."),
    rdzv_backend: Optional[str] = typer.Option(None, "--rdzv-backend", envvar="PET_RDZV_BACKEND",
                                               rich_help_panel="torchrun", help="static (default) or c10d."),
    rdzv_endpoint: Optional[str] = typer.Option(None, "--rdzv-endpoint", envvar="PET_RDZV_ENDPOINT",
                                                rich_help_panel="torchrun", help="HOST:PORT of the rendezvous."),
    rdzv_id: Optional[str] = typer.Option(None, "--rdzv-id", envvar="PET_RDZV_ID", rich_help_panel="torchrun",
                                          help="The job's id at the rendezvous (c10d)."),
    max_restarts: Optional[int] = typer.Option(None, "--max-restarts", envvar="PET_MAX_RESTARTS",
                                               rich_help_panel="torchrun", help="Worker restarts on failure."),
    master_addr: Optional[str] = typer.Option(None, "--master-addr", envvar="PET_MASTER_ADDR",
                                              rich_help_panel="torchrun", help="Node 0's address (static)."),
    master_port: Optional[int] = typer.Option(None, "--master-port", envvar="PET_MASTER_PORT",
                                              rich_help_panel="torchrun", help="Node 0's port (default 29500)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress lines on stderr."),
    strict: bool = typer.Option(False, "--strict", envvar="PLANLANG_STRICT",
                                help="Stop when an op must run on the whole batch the plan splits (PL364)."),
) -> None:
    """Launch `SCRIPT ARGS` (after `--`) with torchrun on the plan's world size; the script reads the plan
    from $PLANLANG_PLAN (e.g. `planlang.apply(model, os.environ["PLANLANG_PLAN"])`). Several nodes: see
    docs/launch.md (exit 2 when nnodes × nproc-per-node is not the plan's device count)."""
    # lazy: loaded by this command only, so `check` and `fmt` start fast
    from planlang.runtime.launch import LaunchError, Progress, mesh_words, plan_launch, torchrun, world_size

    if strict:  # the workers read it (planlang.apply)
        os.environ["PLANLANG_STRICT"] = "1"
    say = Progress("run", quiet)
    say(f"checking {plan} with its model")
    p = _runnable_plan(plan)
    args = list(ctx.args)
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        _fail_usage("give the training script after `--`: planlang run PLAN -- train.py [ARGS]")
    try:
        launch = plan_launch(world_size(p), mesh=mesh_words(p), nnodes=nnodes, node_rank=node_rank,
                             nproc_per_node=nproc_per_node, rdzv_backend=rdzv_backend, rdzv_endpoint=rdzv_endpoint,
                             rdzv_id=rdzv_id, max_restarts=max_restarts, master_addr=master_addr,
                             master_port=master_port)
    except LaunchError as err:
        _fail_usage(str(err))
    say("checking what the runtime supports")
    _preflight(plan)
    say(f"launching {' '.join(args)}: {launch}")
    code = torchrun(launch, args, env={"PLANLANG_PLAN": str(plan), **say.env()})
    say("done" if code == 0 else f"torchrun exited with status {code}")
    raise typer.Exit(code)


def solve(
    plan: Path = typer.Argument(..., help="A plan with holes (`?`)."),
    output: str = typer.Option("-", "--output", "-o", help="Where to write the complete plan (- = stdout)."),
    objective: Objective = typer.Option(Objective.time, "--objective", help="What the solver minimises."),
    time_limit: float = typer.Option(600.0, "--time-limit", help="Seconds for the whole command (checked between "
                                     "candidates); when reached, the best plan found so far is written, with a "
                                     "warning."),
) -> None:
    """Fill every hole of PLAN (fixed choices are constraints) and write a complete, formatted plan with
    the predicted memory and step time per device; `planlang check` accepts it. Without -o, stdout carries
    the plan and nothing else. Progress goes to stderr (a bar on a terminal, plain lines otherwise), then
    the summary written at the top of the plan; solver and library output is kept off both."""
    # lazy: loaded by this command only, so `check` and `fmt` start fast (no torch)
    from planlang.solve.progress import SolveProgress, captured_output

    say = SolveProgress(sys.stderr)
    say.line(f"checking {plan} with its model (builds it on meta)")  # before torch loads: a few seconds
    # lazy: torch loads only when this runs
    from planlang.model.capture.load import ModelLoadError
    from planlang.solve.driver import INFEASIBLE, SEARCH_CUT, Infeasible, SolveError, solve as run_solve

    validated = _validated(plan, complete=False)  # what `check --model` rejects, solve rejects before searching

    failure = None
    with captured_output() as (user_err, captured):  # banners, logging, warnings: not the user's
        t0, say = say.t0, SolveProgress(user_err)
        say.t0 = t0  # elapsed from the command's start
        try:
            # candidates are priced by planlang.model.price.step_time, as `planlang estimate` prices the result
            res = run_solve(str(plan), objective.value, say, time_limit=time_limit,
                            started=t0, validated=validated)  # the limit bounds the whole command, model checks included
        except Infeasible as e:
            failure = (1, f"error[{INFEASIBLE}]: {e}")
        except (SolveError, ModelLoadError) as e:
            failure = (2, f"planlang: error: {getattr(e, 'message', None) or str(e)}")
        finally:
            say.close()
    if failure is not None:
        sys.stderr.write(failure[1] + "\n")
        raise typer.Exit(failure[0])
    if res.cut is not None:  # anytime: the best plan priced before the limit, and what was left
        sys.stderr.write(f"warning[{SEARCH_CUT}]: {res.cut}; writing the best plan found so far (raise --time-limit to "
                         "search further)\n")
    if output == "-":
        sys.stdout.write(res.text)
    else:
        Path(output).write_text(res.text)
        sys.stderr.write(f"wrote {output}\n")
    sys.stderr.write("".join(line + "\n" for line in res.summary))  # the header at the top of the plan


def diff(
    a: Path = typer.Argument(..., help="Plan A (the baseline): a complete plan file with a model."),
    b: Path = typer.Argument(..., help="Plan B (the what-if): a complete plan file with a model."),
    format: TableFormat = typer.Option(TableFormat.table, "--format", "-f", help="Output format."),
    color: Optional[bool] = _COLOR,
) -> None:
    """Compare two plans side by side: per-device memory by class and step time (the estimator's), the
    collectives of one step per kind and mesh axes (the lowered program's), with B - A and B / A, then a
    unified diff of their formatted text. Both plans are validated as `check --model` does (exit 2)."""
    failed = False
    checked = []
    for path in (a, b):  # both validated, so one run shows what to fix in either
        try:
            checked.append(_validated(path))
        except typer.Exit:
            failed = True
    if failed:
        raise typer.Exit(2)
    # lazy: torch loads only when this runs
    from planlang.model.capture.load import ModelLoadError
    from planlang.report.diff import compare, diff_json, render_diff, summarize

    try:
        d = compare(*(summarize(v.complete, path.read_text(encoding="utf-8"), str(path), rows=v.estimate, traffic=v.traffic)
                      for v, path in zip(checked, (a, b))))  # validation's estimate and collectives: computed once
    except ModelLoadError as err:
        _fail_usage(f"{err.message}\n  help: {err.help}")
    if format is TableFormat.json:
        sys.stdout.write(json.dumps(diff_json(d), indent=2) + "\n")
        return
    # lazy: rich loads only when this runs
    from rich.console import Console

    colour = _use_color(color)
    # a terminal's own width; piped, wide enough that no row wraps (a file has no width to fit)
    render_diff(d, Console(file=sys.stdout, highlight=False, width=None if sys.stdout.isatty() else 200,
                           force_terminal=colour, no_color=not colour))


def report(
    plan: Path = typer.Argument(..., help="A complete plan file with a model."),
    output: Path = typer.Option(..., "--output", "-o", help="Directory to write the report into."),
    format: str = typer.Option("png,svg", "--format", "-f", help="Image formats: png, svg, pdf (comma-separated)."),
) -> None:
    """Charts of a plan's per-device memory (by class, with the budget) and pipeline schedule (bubble
    ratio), and an HTML page with both and the plan's summary. Prints each device's estimated peak against
    the budget, and a warning on stderr for each over it (exit 0 all the same: the report was written;
    `planlang check --model` is the check that fails)."""
    # lazy: loaded by this command only, so `check` and `fmt` start fast
    from planlang.report import report_command

    raise typer.Exit(report_command(str(plan), str(output), format))


def probe(
    mesh: str = typer.Option(..., "--mesh", help="Axes to measure, e.g. dp=2,tp=2 (product = --nproc)."),
    nproc: int = typer.Option(..., "--nproc", help="Processes to launch on this machine (torchrun)."),
    device: str = typer.Option("hardware.cpu", "--device", help="Device of the written mesh."),
    max_bytes: int = typer.Option(16 << 20, "--max-bytes", help="Largest all-reduce message."),
    output: str = typer.Option("-", "--output", "-o", help="Where to write the planlang module (- = stdout)."),
) -> None:
    """Measure latency and bandwidth per mesh axis with torchrun and write links in planlang syntax."""

    # lazy: loaded by this command only, so `check` and `fmt` start fast
    from planlang.cost.probe import parse_mesh

    try:
        axes = parse_mesh(mesh)
    except ValueError as err:
        _fail_usage(str(err))
    if math.prod(s for _, s in axes) != nproc:
        _fail_usage(f"--mesh {mesh} has {math.prod(s for _, s in axes)} devices but --nproc is {nproc}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--master-addr=127.0.0.1",
           f"--master-port={port}", "-m", "planlang.cost.probe", "--mesh", mesh, "--device", device,
           "--max-bytes", str(max_bytes), "-o", output]
    raise typer.Exit(subprocess.call(cmd))
