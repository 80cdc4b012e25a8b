"""The `planlang` command line: thin commands, each calling one library function.

Exit codes: 0 clean, 1 findings (errors; for `lint` also warnings; for `fmt --check` unformatted
files), 2 usage errors and internal errors. `check`, `lint`, `fmt` and `explain` never import torch.
"""
from __future__ import annotations

import ast as pyast
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import List, NoReturn, Optional

import typer

from planlang.lang.version import __version__
from planlang.lang.codes import CODES, explain as explain_code
from planlang.lang.config import Config, ConfigError, load_config
from planlang.lang.diagnostics import Diagnostic, did_you_mean
from planlang.lang.render import render, summary_line
from planlang.lang.source import SourceFile, decode_plan, plan_text
from planlang.plan.complete import IncompletePlan, complete as as_complete
from planlang.plan.types import ModelRef

app = typer.Typer(
    name="planlang",
    help="A declarative language and toolchain for distributed-training plans.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


class OutputFormat(str, Enum):
    human = "human"
    concise = "concise"
    json = "json"
    sarif = "sarif"
    github = "github"


class TableFormat(str, Enum):
    table = "table"
    json = "json"


class Objective(str, Enum):
    time = "time"
    memory = "memory"
    balanced = "balanced"


class UsageError(Exception):
    pass


STDIN = "-"


def _version(value: bool) -> None:
    if value:
        typer.echo(f"planlang {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
    color: Optional[bool] = typer.Option(None, "--color/--no-color",
                                         help="Colour for every command (default: NO_COLOR, FORCE_COLOR, a terminal)."),
) -> None:
    if color is not None:  # rich (progress, tables) reads these too
        os.environ.pop("NO_COLOR" if color else "FORCE_COLOR", None)
        os.environ["FORCE_COLOR" if color else "NO_COLOR"] = "1"


def _config(config: Optional[Path], isolated: bool, select=(), extend_select=(), ignore=()):
    """The project configuration (planlang.toml / pyproject.toml [tool.planlang]) with the command line on top."""

    try:
        base = Config(root=Path.cwd()) if isolated else load_config(config)
        return base.with_options(select, extend_select, ignore)
    except ConfigError as err:
        _fail_usage(str(err))


def plan_files(paths: List[Path], config=None) -> list[str]:
    """Expand arguments: files as given, folders to every *.plan below them (sorted; less what the
    configuration excludes and git ignores), `-` for standard input."""

    config = config or Config(root=Path.cwd(), respect_gitignore=False)
    out: list[str] = []
    for p in paths:
        if str(p) == STDIN:
            if STDIN in out:
                raise UsageError("`-` (standard input) is given twice")
            out.append(STDIN)
        elif p.is_dir():
            out += [str(f) for f in config.plan_files(p)]
        elif p.is_file():
            out.append(str(p))
        else:
            raise UsageError(f"no such file or folder: {p}")
    if not out:
        raise UsageError("no .plan files given")
    return out


def _use_color(flag: Optional[bool], stream=None) -> bool:
    """--color/--no-color, else NO_COLOR (off), else FORCE_COLOR (on), else whether `stream` is a terminal."""
    if flag is not None:
        return flag
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return (stream or sys.stdout).isatty()


def _fail_usage(msg: str) -> NoReturn:
    typer.echo(f"planlang: error: {msg}", err=True)
    raise typer.Exit(2)


@dataclass(frozen=True)
class _PlanInput:
    """A file argument as read: the name diagnostics use, its text, its bytes, and PL105 when they are
    not UTF-8 (the text then shows U+FFFD for the bad bytes)."""

    name: str
    text: str
    data: bytes
    undecodable: Diagnostic | None = None  # PL105


def _read_plan(name: str, stdin_filename: Optional[str]) -> _PlanInput:
    """A file argument; `-` reads standard input once. A file that cannot be read at all is a usage error."""

    if name == STDIN:
        data, name = sys.stdin.buffer.read(), stdin_filename or "<stdin>"
    else:
        try:
            data = Path(name).read_bytes()
        except OSError as err:
            _fail_usage(f"cannot read {name}: {err.strerror or err}")
    try:  # the text as written: `fmt` rewrites a byte-order mark or "\r" line ends, the parser reads past them
        return _PlanInput(name, data.decode("utf-8"), data)
    except UnicodeDecodeError:
        source, bad = decode_plan(data, name)
        assert bad is not None  # the bytes did not decode: decode_plan says where
    return _PlanInput(name, source.text, data, Diagnostic(
        "PL105", CODES["PL105"].severity, "the file is not UTF-8 text: this byte is not valid UTF-8",
        source.span(*bad), help="save the file as UTF-8"))


def _check_one(name: str, text: str, model: bool, use_paths: tuple[str, ...] = ()):
    """Check one plan given as text: its `use "file"` imports resolve next to `name` (and in `use_paths`)."""
    if model:  # imports torch: only on request
        # lazy: torch loads only when this runs
        from planlang.model.validation import check_with_model
        from planlang.runtime.program_memory import measure

        return check_with_model(name, text=text, search_paths=use_paths, program=measure)
    # lazy: lark loads only when this runs
    from planlang.plan.checker import check_text

    return check_text(text, name, search_paths=use_paths)


def _statistics(diags) -> str:
    counts = Counter(d.code for d in diags)
    width = len(str(max(counts.values(), default=0)))
    rows = [f"{n:>{width}}  {code}  {CODES[code].name if code in CODES else ''}".rstrip()
            for code, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    return "".join(r + "\n" for r in rows) + f"Found {sum(counts.values())} finding{'s' if len(diags) != 1 else ''}.\n"


def _run_checks(paths: List[Path], fmt: OutputFormat, color: Optional[bool], fail_on_warnings: bool,
                model: bool = False, *, config=None, stdin_filename: Optional[str] = None,
                exit_zero: bool = False, statistics: bool = False) -> int:
    try:
        files = plan_files(paths, config)
    except UsageError as err:
        _fail_usage(str(err))
    diags: list[Diagnostic] = []
    sources: dict[str, SourceFile] = {}

    for f in files:
        plan = _read_plan(f, stdin_filename)
        if plan.undecodable is not None:  # reported where it is; the other files are still checked
            diags.append(plan.undecodable)
            sources[plan.name] = SourceFile(plan.name, plan.text)
            continue
        res = _check_one(plan.name, plan.text, model, config.use_paths if config is not None else ())
        diags.extend(config.keep(res.diagnostics) if config is not None else res.diagnostics)
        sources.update(res.sources)
    if statistics:
        sys.stdout.write(_statistics(diags))
    else:
        out = render(diags, sources, fmt.value, color=_use_color(color) if fmt is OutputFormat.human else False)
        if out:
            sys.stdout.write(out if out.endswith("\n") else out + "\n")
    if fmt is OutputFormat.human:
        label = f"{len(files)} file{'s' if len(files) != 1 else ''}"
        typer.echo(f"{label}: {summary_line(diags)}", err=True)
    bad = {"error"} | ({"warning"} if fail_on_warnings else set())
    return 1 if not exit_zero and any(d.severity.value in bad for d in diags) else 0


# Options `check` and `lint` share (ruff's names).
_PATHS = typer.Argument(..., help="Plan files or folders (every *.plan below), or - for standard input.")
_STDIN_NAME = typer.Option(None, "--stdin-filename", help="The name of the plan read from - (for locations, "
                           "per-file-ignores and `use` of files next to it).")
_SELECT = typer.Option([], "--select", help="Codes or prefixes to report, replacing the configuration's "
                       "(comma-separated, repeatable): --select PL3,PL501.")
_EXTEND = typer.Option([], "--extend-select", help="Codes or prefixes to report in addition.")
_IGNORE = typer.Option([], "--ignore", help="Codes or prefixes not to report.")
_CONFIG = typer.Option(None, "--config", help="A planlang.toml or pyproject.toml to read (default: the nearest one).")
_ISOLATED = typer.Option(False, "--isolated", help="Read no configuration file.")
_EXIT_ZERO = typer.Option(False, "--exit-zero", help="Exit 0 even when something is found.")
_STATS = typer.Option(False, "--statistics", help="Print the number of findings per code instead of the findings.")
_COLOR = typer.Option(None, "--color/--no-color", help="Colour (default: NO_COLOR, FORCE_COLOR, a terminal).")
_MODEL = typer.Option(False, "--model", help="Also load the model on meta and check paths and shapes.")


@app.command()
def check(
    paths: List[Path] = _PATHS,
    format: OutputFormat = typer.Option(OutputFormat.human, "--format", "-f", help="Output format."),
    color: Optional[bool] = _COLOR,
    model: bool = _MODEL,
    stdin_filename: Optional[str] = _STDIN_NAME,
    select: List[str] = _SELECT,
    extend_select: List[str] = _EXTEND,
    ignore: List[str] = _IGNORE,
    config: Optional[Path] = _CONFIG,
    isolated: bool = _ISOLATED,
    exit_zero: bool = _EXIT_ZERO,
    statistics: bool = _STATS,
    fail_on_warnings: bool = typer.Option(False, "--fail-on-warnings",
                                          help="Exit 1 on warnings too (as `lint` does), not only on errors."),
) -> None:
    """Check plans: syntax, names, units, mesh, specs, pipeline, checkpointing, budget. Exit 1 on errors
    (and on warnings with --fail-on-warnings)."""
    cfg = _config(config, isolated, select, extend_select, ignore)
    raise typer.Exit(_run_checks(paths, format, color, fail_on_warnings=fail_on_warnings, model=model, config=cfg,
                                 stdin_filename=stdin_filename, exit_zero=exit_zero, statistics=statistics))


@app.command()
def lint(
    paths: List[Path] = _PATHS,
    format: OutputFormat = typer.Option(OutputFormat.concise, "--format", "-f", help="Output format."),
    color: Optional[bool] = _COLOR,
    model: bool = _MODEL,
    stdin_filename: Optional[str] = _STDIN_NAME,
    select: List[str] = _SELECT,
    extend_select: List[str] = _EXTEND,
    ignore: List[str] = _IGNORE,
    config: Optional[Path] = _CONFIG,
    isolated: bool = _ISOLATED,
    exit_zero: bool = _EXIT_ZERO,
    statistics: bool = _STATS,
) -> None:
    """Check plans for CI: concise output by default; exit 1 on errors or warnings."""
    cfg = _config(config, isolated, select, extend_select, ignore)
    raise typer.Exit(_run_checks(paths, format, color if format is OutputFormat.human else False,
                                 fail_on_warnings=True, model=model, config=cfg, stdin_filename=stdin_filename,
                                 exit_zero=exit_zero, statistics=statistics))


@app.command()
def fmt(
    paths: List[Path] = typer.Argument(..., help="Plan files or folders, or - (standard input to standard output)."),
    check_only: bool = typer.Option(False, "--check", help="Write nothing; exit 1 if a file would change."),
    diff: bool = typer.Option(False, "--diff", help="Write nothing; print a unified diff of the changes."),
    stdin_filename: Optional[str] = _STDIN_NAME,
    config: Optional[Path] = _CONFIG,
    isolated: bool = _ISOLATED,
) -> None:
    """Format plans in place (canonical layout, comments kept); `planlang fmt -` formats standard input to
    standard output (a plan with syntax errors is written back unchanged, the errors on stderr)."""
    # lazy: lark loads only when this runs
    from planlang.lang.fmt import FormatError, format_text, unified_diff

    try:
        files = plan_files(paths, _config(config, isolated))
    except UsageError as err:
        _fail_usage(str(err))
    changed, broken = [], 0
    for f in files:
        plan = _read_plan(f, stdin_filename)
        name, text = plan.name, plan.text
        if plan.undecodable is not None:
            sys.stderr.write(render([plan.undecodable], {name: SourceFile(name, text)}, "human",
                                    color=_use_color(None, sys.stderr)))
            broken += 1
            if f == STDIN and not (check_only or diff):
                sys.stdout.flush()
                sys.stdout.buffer.write(plan.data)  # a filter gives back what it got, byte for byte
            continue
        try:
            new = format_text(text, name)
        except FormatError as err:
            sys.stderr.write(render(list(err.diagnostics), {name: SourceFile(name, plan_text(text))}, "human",
                                    color=_use_color(None, sys.stderr)))
            broken += 1
            if f == STDIN and not (check_only or diff):
                sys.stdout.write(text)  # a filter (vim's formatprg) must not lose the buffer
            continue
        if f == STDIN and not (check_only or diff):
            sys.stdout.write(new)
        if new == text:
            continue
        changed.append(name)
        if diff:
            sys.stdout.write(unified_diff(text, new, name))
        elif check_only:
            typer.echo(f"would reformat {name}")
        elif f != STDIN:
            Path(f).write_text(new, encoding="utf-8")
            typer.echo(f"reformatted {name}", err=True)
    verb = "would be reformatted" if (check_only or diff) else "reformatted"
    typer.echo(f"{len(changed)} file{'s' if len(changed) != 1 else ''} {verb}, "
               f"{len(files) - len(changed) - broken} unchanged" + (f", {broken} with syntax errors" if broken else ""),
               err=True)
    if broken:
        raise typer.Exit(1)
    raise typer.Exit(1 if changed and (check_only or diff) else 0)


@app.command()
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


@app.command()
def estimate(
    plan: Path = typer.Argument(..., help="A plan file with a model."),
    format: TableFormat = typer.Option(TableFormat.table, "--format", "-f", help="Output format."),
) -> None:
    """Estimate per-device peak memory (by class) and step time of a plan, from its model on meta."""

    v = _validated(plan)
    checked = v.complete
    # lazy: torch loads only when this runs
    from planlang.report.estimate_table import render_table

    if v.estimate is None:  # validation estimates every plan it completes, or fails with PL369
        _fail_usage(f"{plan} cannot be estimated (`planlang check --model {plan}` says why)")
    rows = list(v.estimate)
    if format is TableFormat.json:
        sys.stdout.write(json.dumps([r.as_dict() for r in rows], indent=2) + "\n")
    else:
        sys.stdout.write(render_table(checked, rows))


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




@app.command()
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


@app.command()
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


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
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


@app.command()
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


@app.command()
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
            checked.append(_runnable_plan(path))
        except typer.Exit:
            failed = True
    if failed:
        raise typer.Exit(2)
    # lazy: torch loads only when this runs
    from planlang.model.capture.load import ModelLoadError
    from planlang.report.diff import compare, diff_json, render_diff, summarize

    try:
        d = compare(*(summarize(p, path.read_text(encoding="utf-8"), str(path)) for p, path in zip(checked, (a, b))))
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


@app.command()
def lsp(
    stdio: bool = typer.Option(True, "--stdio", help="Serve on stdin/stdout (the default; editors pass it)."),
    log_level: str = typer.Option("WARNING", "--log-level", help="stderr log level: DEBUG, INFO, WARNING, ERROR."),
) -> None:
    """Run the language server on stdio (for editors)."""
    # lazy: the language server's packages load only for `planlang lsp`
    from planlang.lsp.server import main as serve

    serve(["--log-level", log_level])


@app.command()
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


@app.command()
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


@app.command()
def explain(code: str = typer.Argument(..., help="A diagnostic code such as PL301.")) -> None:
    """Explain a diagnostic code."""

    text = explain_code(code)
    if text is None:
        guess = did_you_mean(code.upper(), CODES)
        _fail_usage(f"unknown code {code}" + (f"; did you mean {guess}?" if guess else
                                              f"; codes are {min(CODES)} ... {max(CODES)} (docs/diagnostics.md)"))
    typer.echo(text, nl=False)


# What the `torch` extra brings (pyproject.toml): commands that price or run a model import them.
TORCH_EXTRA = {"torch", "numpy", "networkx", "pulp", "highspy", "matplotlib"}


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
    except SystemExit:
        raise
    except Exception as err:  # an internal error: a bug in planlang, never the user's input
        missing = err.name.split(".")[0] if isinstance(err, ModuleNotFoundError) and err.name else None
        if missing in TORCH_EXTRA:  # the language-only install: a missing extra, not a bug
            typer.echo(f"planlang: error: this command needs {missing}, which is not installed; install "
                       f"planlang's torch extra: pip install 'planlang[torch]'", err=True)
            sys.exit(2)

        traceback.print_exc()
        typer.echo(f"planlang: internal error: {err!r} — please report this with the plan that caused it", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
