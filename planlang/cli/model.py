"""The commands that build, price or run a plan's model: `inspect`, `estimate`, `lower`, `verify`, `run`,
`solve`, `diff`, `report`, `probe`. Each imports torch when it runs, and each starts from the one validation
(planlang.model.validation) through `_validated`."""
from __future__ import annotations

import ast as pyast
import contextlib
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator, List, Optional

import typer

from planlang.lang.render import render
from planlang.lang.render.jsonfmt import to_dict
from planlang.plan.complete import IncompletePlan, complete as as_complete, plan_mesh, world_size
from planlang.plan.types import ModelRef
from planlang.cli import cached
from planlang.cli.app import Objective, TableFormat, TextFormat, _COLOR
from planlang.cli.common import fail_usage, use_color
from planlang.cli.progress import progress

# `--format json` of solve, verify and lower: an object whose "schema_version" says its layout (raised
# when a key changes meaning or goes; new keys may come without it)
SCHEMA_VERSION = 1


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
            fail_usage(f"{model} declares no model (or does not parse: run `planlang check {model}`)")
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
            fail_usage(str(err))
        ref = ModelRef("model", model, tuple(kwargs))
        if not inputs:
            fail_usage("give the model's inputs with --input, e.g. --input 'idx:i64[batch=4,seq=128]'")
    # lazy: torch loads only when this runs
    from planlang.model.inspect import inspect_model, render_json, render_text
    from planlang.model.capture.load import ModelLoadError

    try:
        with progress("inspect") as say:
            say(f"building {ref.factory} on meta and running it")
            info = inspect_model(ref, inputs, plan_path, depth)
    except ModelLoadError as err:
        fail_usage(f"{err.message}\n  help: {err.help}")
    except Exception as err:  # the forward failed on these inputs: the user's inputs, not our bug
        fail_usage(f"running the model on {', '.join(map(str, inputs))} raised {type(err).__name__}: {err}")
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
                sys.stderr.write(render(list(diagnostics), free.sources, "human", color=use_color(None, sys.stderr)))
            sys.stdout.write(outputs[format.value])
            return
    with progress("estimate") as say:
        say(f"validating {plan} against its model (built on meta) and pricing it")
        v = _validated(plan)
    checked = v.complete
    # lazy: torch loads only when this runs
    from planlang.report.estimate_table import render_table

    if v.estimate is None:  # validation estimates every plan it completes, or fails with PL369
        fail_usage(f"{plan} cannot be estimated (`planlang check --model {plan}` says why)")
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
        fail_usage(f"no such file: {plan}")
    v = validate_file(str(plan), program=measure)
    res = v.check
    if res.diagnostics:
        sys.stderr.write(render(list(res.diagnostics), res.sources, "human", color=use_color(None, sys.stderr)))
    if any(d.code == "PL364" for d in res.diagnostics):
        os.environ["PLANLANG_PL364_SHOWN"] = "1"  # shown here: the runtime (this process, the workers) stays quiet
    if res.errors or res.plan is None:
        fail_usage(f"{plan} has errors; fix them first (`planlang check --model {plan}` shows the same)")
    if res.plan.model is None:
        fail_usage(f"{plan} declares no model")
    if not complete or v.complete is not None:
        return v
    try:
        as_complete(res.plan)
    except IncompletePlan as err:
        where = ", ".join(f"{h.what} at {h.span.line}:{h.span.col}" for h in err.holes)
        fail_usage(f"{plan} has {len(err.holes)} holes (`?`: {where}); run `planlang solve {plan}` first")
    fail_usage(f"{plan} cannot be completed")  # validation completes every plan without errors or holes


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
    format: TextFormat = typer.Option(TextFormat.text, "--format", "-f", help="Output format."),
) -> None:
    """Print the per-rank Python the runtime generates and runs for this plan.

    With --format json, one object: schema_version (1), command ("lower"), plan_file, rank, world_size, mesh
    (axis: size), coords (this rank's, axis: index), pipeline (whether the plan has stages), kind ("program",
    or "traffic" with --traffic), text (what the text format prints) and lines (its line count)."""
    # lazy: torch loads only when this runs
    from planlang.model.capture.load import ModelLoadError
    from planlang.runtime.apply import PlanError
    from planlang.runtime.launch import coords_of, lower_source

    with progress("lower") as say:
        say(f"validating {plan} against its model (built on meta)")
        p = _runnable_plan(plan)
        say("lowering it")
        try:
            if traffic:
                # lazy: loaded by this command only, so `check` and `fmt` start fast
                from planlang.runtime.traffic import traffic_table

                text = traffic_table(str(plan))
            else:
                text = lower_source(p, rank, strict)
        except ModelLoadError as err:
            fail_usage(f"{err.message}\n  help: {err.help}")
        except (PlanError, ValueError) as err:
            fail_usage(str(err))
    if format is TextFormat.text:
        sys.stdout.write(text)
        return
    mesh = plan_mesh(p)
    _write_json({"schema_version": SCHEMA_VERSION, "command": "lower", "plan_file": str(plan), "rank": rank,
                 "world_size": world_size(p), "mesh": dict(zip(mesh.names, mesh.shape)),
                 "coords": coords_of(rank, mesh) if 0 <= rank < world_size(p) else None,
                 "pipeline": p.pipeline is not None, "kind": "traffic" if traffic else "program",
                 "text": text, "lines": text.count("\n")})


def _write_json(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


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
        fail_usage(f"{err.message}\n  help: {err.help}")
    except PlanError as err:
        fail_usage(str(err))


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
    format: TableFormat = typer.Option(TableFormat.table, "--format", "-f", help="Output format."),
) -> None:
    """Train a few steps under the plan (torchrun, one process per device) and in one process from the
    same seed; print loss, gradient and parameter errors per step with the bound each is judged against.
    Exit 1 (after the table) when an error exceeds its bound.
    Progress (checking, launching, each step) goes to stderr; the table to stdout. Several nodes: see
    docs/launch.md (exit 2 when nnodes × nproc-per-node is not the plan's device count).

    With --format json the table goes to stderr and stdout carries one object: schema_version (1), command
    ("verify"), plan_file, steps, tol, world_size, verdict ("PASS", "FAIL", "ERROR"; null on a node
    without rank 0, or when the workers ended before judging), exit_code, and checks: per step, its
    loss, gradient and parameter check, each with error, bound and ok (the gradient's and parameter's
    with the worst-judged one's name; the loss's with the plan's and the one process's value); null where
    the steps did not run here; and dropout_off: how many dropout calls with p > 0 ran as the identity on
    rank 0, the one-process runs' included (the plan's masks and one process's cannot be the same draws,
    so both sides run without dropout; 0 for a model without dropout, null where the steps did not run)."""
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
        fail_usage(str(err))
    say("checking what the runtime supports")
    _preflight(plan)
    say(f"launching {launch}")

    # lazy: torch loads only when this runs
    from planlang.runtime.verify import VERDICT_ENV

    as_json = format is TableFormat.json
    with tempfile.TemporaryDirectory(prefix="planlang-verify-") as tmp:
        verdict, rows_file = Path(tmp) / "verdict", Path(tmp) / "rows.json"
        with _stdout_to_stderr() if as_json else contextlib.nullcontext():  # the workers' table
            code = torchrun(launch, ["planlang.runtime.verify", str(plan), str(steps), str(tol)]
                            + ([str(rows_file)] if as_json else []),
                            env={**say.env(), VERDICT_ENV: str(verdict)}, module=True)
        word = verdict.read_text() if code == 0 and verdict.is_file() else ""
        written = json.loads(rows_file.read_text()) if rows_file.is_file() else {}
        rows = written.get("rows")
    exit_code = {"FAIL": 1, "ERROR": 2}.get(word, code)
    if as_json:
        _write_json({"schema_version": SCHEMA_VERSION, "command": "verify", "plan_file": str(plan), "steps": steps,
                     "tol": tol, "world_size": world_size(p), "verdict": word or None, "exit_code": exit_code,
                     "checks": None if rows is None else [_step_checks(r) for r in rows],
                     "dropout_off": written.get("dropout_off")})
    raise typer.Exit(exit_code)


def _step_checks(row: dict) -> dict:
    """One step of `verify --format json`, from planlang.runtime.verify.StepRow as the workers write it."""
    def check(kind: str, **more) -> dict:
        err, bound = row[f"{kind}_rel_err"], row[f"{kind}_bound"]
        return {"error": err, "bound": bound, "ok": err <= bound, **more}

    return {"step": row["step"],
            "loss": check("loss", plan=row["loss_plan"], reference=row["loss_reference"]),
            "gradient": check("grad", worst=row["worst_grad"]),
            "parameter": check("param", worst=row["worst_param"])}


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Processes started in the block write their standard output to stderr (file descriptor 1 is 2's)."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


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
        fail_usage("give the training script after `--`: planlang run PLAN -- train.py [ARGS]")
    try:
        launch = plan_launch(world_size(p), mesh=mesh_words(p), nnodes=nnodes, node_rank=node_rank,
                             nproc_per_node=nproc_per_node, rdzv_backend=rdzv_backend, rdzv_endpoint=rdzv_endpoint,
                             rdzv_id=rdzv_id, max_restarts=max_restarts, master_addr=master_addr,
                             master_port=master_port)
    except LaunchError as err:
        fail_usage(str(err))
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
    format: TextFormat = typer.Option(TextFormat.text, "--format", "-f", help="Output format: the plan, or "
                                      "a JSON object holding it and its figures."),
) -> None:
    """Fill every hole of PLAN (fixed choices are constraints) and write a complete, formatted plan with
    the predicted memory and step time per device; `planlang check` accepts it. Without -o, stdout carries
    the plan and nothing else. Progress goes to stderr (a bar on a terminal, plain lines otherwise), then
    the summary written at the top of the plan; solver and library output is kept off both.

    With --format json, stdout carries one object instead (the plan is still written to -o if given):
    schema_version (1), command ("solve"), plan_file, objective, status ("solved"; "cut": --time-limit
    ended the search, the best plan so far; "infeasible": no plan fits, exit 1), plan (the complete plan's
    text, null when infeasible), best (the chosen candidate: choices, hole -> value; peak_bytes of the
    largest device; step_time_s of the slowest; fits; devices, each device class's estimate as
    `estimate --format json` gives it), summary (the header's lines), candidates (priced, bounded),
    elapsed_s, and diagnostics (the validation's, as `check --format json` gives them, then the search's
    cut or infeasibility as a diagnostic with code, severity and message)."""
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
    head = {"schema_version": SCHEMA_VERSION, "command": "solve", "plan_file": str(plan),
            "objective": objective.value}
    shown = [to_dict(d) for d in validated.check.diagnostics]
    if failure is not None:
        sys.stderr.write(failure[1] + "\n")
        if failure[0] == 1 and format is TextFormat.json:
            _write_json(head | {"status": "infeasible", "plan": None, "best": None, "summary": [],
                                "diagnostics": shown + [{"code": INFEASIBLE, "severity": "error",
                                                         "message": failure[1].split(": ", 1)[1]}]})
        raise typer.Exit(failure[0])
    if res.cut is not None:  # anytime: the best plan priced before the limit, and what was left
        sys.stderr.write(f"warning[{SEARCH_CUT}]: {res.cut}; writing the best plan found so far (raise --time-limit to "
                         "search further)\n")
    if output == "-" and format is TextFormat.text:
        sys.stdout.write(res.text)
    elif output != "-":
        Path(output).write_text(res.text)
        sys.stderr.write(f"wrote {output}\n")
    sys.stderr.write("".join(line + "\n" for line in res.summary))  # the header at the top of the plan
    if format is TextFormat.json:
        best = res.best
        cut = [{"code": SEARCH_CUT, "severity": "warning", "message": res.cut}] if res.cut is not None else []
        _write_json(head | {
            "status": "solved" if res.cut is None else "cut", "plan": res.text,
            "best": {"choices": {str(what): str(value) for what, value in best.choices}, "peak_bytes": best.peak,
                     "step_time_s": best.step_time, "fits": best.fits, "devices": [r.as_dict() for r in best.rows]},
            "summary": list(res.summary), "candidates": {"priced": len(res.tried), "bounded": len(res.bounded)},
            "elapsed_s": res.elapsed, "diagnostics": shown + cut})


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
    with progress("diff") as say:
        for path in (a, b):  # both validated, so one run shows what to fix in either
            say(f"validating {path} against its model (built on meta) and pricing it")
            try:
                checked.append(_validated(path))
            except SystemExit:  # fail_usage has said what is wrong with this one; go on to the other
                failed = True
        if failed:
            raise typer.Exit(2)
        # lazy: torch loads only when this runs
        from planlang.model.capture.load import ModelLoadError
        from planlang.report.diff import compare, diff_json, render_diff, summarize

        say("comparing the plans")
        try:
            d = compare(*(summarize(v.complete, path.read_text(encoding="utf-8"), str(path), rows=v.estimate,
                                    traffic=v.traffic)
                          for v, path in zip(checked, (a, b))))  # validation's estimate and collectives: computed once
        except ModelLoadError as err:
            fail_usage(f"{err.message}\n  help: {err.help}")
    if format is TableFormat.json:
        sys.stdout.write(json.dumps(diff_json(d), indent=2) + "\n")
        return
    # lazy: rich loads only when this runs
    from rich.console import Console

    colour = use_color(color)
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

    with progress("report") as say:
        say(f"estimating {plan} and drawing its charts")
        code = report_command(str(plan), str(output), format)
    raise typer.Exit(code)


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
        fail_usage(str(err))
    if math.prod(s for _, s in axes) != nproc:
        fail_usage(f"--mesh {mesh} has {math.prod(s for _, s in axes)} devices but --nproc is {nproc}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--master-addr=127.0.0.1",
           f"--master-port={port}", "-m", "planlang.cost.probe", "--mesh", mesh, "--device", device,
           "--max-bytes", str(max_bytes), "-o", output]
    raise typer.Exit(subprocess.call(cmd))
