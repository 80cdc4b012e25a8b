"""The one validation of a plan against its model, for every command and the language server.

`validate_plan` computes each fact the model-aware rules read once, in this order, and runs the rules:

  0. the model-free rules: a plan they refuse ends here, before the model is built (its errors are the
     plan's own: a PL501 budget the devices cannot hold is said in a second, not after the model's work);
  1. the model, built on meta once (facts.build_for_check) and probed (facts.probe_facts): "model";
  2. the lowered program, from one op graph and one lowering (`planlang.apply`'s, on meta): "lowered"
     (its fallbacks, ZeRO's root blocks, gathered weights) for a plan without a pipeline; one
     microbatch's program for pipeline x tensor parallelism, kept for the stage cut;
  3. the estimate, from the facts probed in 1 and the collectives of the program lowered in 2, with the
     runtime's program run on meta (`program`) handed that same program: "estimate";
  4. the rules in their phases (planlang.model.checks.PHASES): the model-free and model rules; on a plan
     they accept, the program's (2 and 3 are computed only then); on a plan those accept, the pipeline's
     stages cut as the runtime cuts them ("stage_cut").

A fact that cannot be computed is a failure (PL369: "failures"), never a silent pass; a plan with errors
or holes gets only the facts it can have. The result, `Validated`, carries the plan, the complete plan,
the facts, the estimate and the program, so a command that goes on (estimate, solve, report, diff) reads
them instead of computing them again.
"""
from __future__ import annotations

import atexit
import contextlib
import copy
import gc
from dataclasses import dataclass, field
from typing import Callable, Iterator

from planlang.lang.diagnostics import Diagnostic, Severity
from planlang.lang.parser import no_cycle_collection
from planlang.plan.checker import CheckResult
from planlang.plan.complete import CompletePlan, complete
from planlang.plan.microbatches import accumulation_microbatch
from planlang.plan.resolve import Resolution, Resolver
from planlang.plan.stage_meshes import describe, heterogeneous, shape_plans, stage_shapes

# torch's import and this layer's (~1.5 CPU-s, most of any model command's imports but the model's own) make
# some million objects and almost no garbage: the cycle collector walked them again and again as they came
with no_cycle_collection():
    from torch import nn
    from torch.nn.modules.batchnorm import _BatchNorm

    from .capture.load import ModelLoadError, guess_targets, meta_inputs, plan_loss
    from .capture.fold import find_fold
    from .capture.fold_graph import op_graph_of
    from .checks import PHASES, validate
    from .facts import LoweringFailure, ModelFacts, NoTargets, build_for_check, probe_facts
    from .price.estimate import estimate_plan
    from .price.accumulation import step_traffic
    from .price.traffic import Traffic, program_zero_units, stage_traffic
    from .price.weight_gathers import WeightGather, weight_gathers
    from .program.lowering import Fallback, LoweringError, Program, Replicated, lower, mark_checkpoints
    from .program.pipeline_program import cut_program, microbatch_plan
    from .program.stages import OUT_SPEC, StageSplitError, split_stages
    from .program.zero_units import block_ranges

#: how the estimate runs the runtime's program on meta (planlang.runtime.program_memory.measure, which
#: this layer cannot import): (plan, the program lowered here or None) -> its memory, or why not
ProgramMeasure = Callable[..., object]


@dataclass(frozen=True)
class Lowered:
    """What the rules read off the runtime's lowering of a plan without a pipeline: the ops run on the
    whole batch (PL364), under ZeRO-2/3 the repeated blocks left in the root FSDP2 unit with why (PL468),
    the sharded weights moved every step (PL366), the opaque ops run whole over other axes (PL367)."""

    fallbacks: tuple[Fallback, ...]
    root_blocks: dict[str, str]
    gathers: tuple[WeightGather, ...] = ()
    replicated: tuple[Replicated, ...] = ()  # opaque ops run whole over tensor-parallel axes (PL367)


@dataclass(frozen=True)
class StageCut:
    """The pipeline's stages cut out of the model as the runtime cuts them: why not (`error`: code,
    message, help), an op of the cut program that cannot be lowered (`failure`), or the BatchNorm
    modules torch.export's cut inlines (`inlined_norms`, PL466 under data parallelism)."""

    error: tuple[str, str, str] | None = None
    failure: LoweringFailure | None = None
    inlined_norms: tuple[str, ...] = ()


@dataclass(frozen=True)
class Validated:
    """A plan validated against its model: the checker's result (diagnostics, sources, the plan) and what
    validation computed on the way, each once: the probed model, the complete plan (None while the plan
    has errors or holes), the estimate's rows and the lowered program (None where not computed)."""

    check: CheckResult
    resolution: Resolution | None = field(default=None, repr=False)  # what was checked (solve edits it)
    facts: ModelFacts | None = None
    complete: CompletePlan | None = None
    estimate: tuple | None = None
    program: Program | None = None
    traffic: list[Traffic] | dict | None = field(default=None, repr=False)  # a dict by stage sizes: stages of their own degrees

    @property
    def diagnostics(self) -> tuple[Diagnostic, ...]:
        return self.check.diagnostics

    @property
    def errors(self) -> int:
        return self.check.errors


def validate_file(path: str, text: str | None = None, search_paths: tuple[str, ...] = (),
                  program: ProgramMeasure | None = None, read=None, steps: bool = True) -> Validated:
    """Resolve the plan at `path` (or `text`, named `path`: standard input, an editor's buffer) and
    validate it against its model (`validate_plan`)."""
    resolver = Resolver(search_paths=search_paths, **({"read": read} if read is not None else {}))
    res = resolver.resolve_file(path) if text is None else resolver.resolve_text(text, path)
    return validate_plan(res, path, program, steps=steps)


def check_with_model(path: str, text: str | None = None, search_paths: tuple[str, ...] = (),
                     program: ProgramMeasure | None = None) -> CheckResult:
    """`planlang check --model`: the diagnostics of `validate_file`, whose estimate prices memory only
    (the budget's rules read the peak; no diagnostic reads a step time, so the model is not profiled)."""
    return validate_file(path, text, search_paths, program, steps=False).check


@dataclass(frozen=True)
class Probed:
    """The model built on meta and probed (steps 1 of `validate_plan`), which a caller that validates one
    plan again and again (the language server) keeps while the model's source is unchanged."""

    module: nn.Module | None
    facts: ModelFacts | None
    diagnostics: tuple[Diagnostic, ...] = ()


def probe(plan) -> Probed:
    """Build the plan's model on meta and probe it (its diagnostics when that fails)."""
    module, diags = build_for_check(plan)
    mf, more = probe_facts(plan, module) if module is not None else (None, [])
    return Probed(module if mf is not None else None, mf, tuple(diags + more))


def validate_plan(res: Resolution, path: str, program: ProgramMeasure | None = None,
                  probed: Probed | None = None, steps: bool = True) -> Validated:
    """The one validation (see the module docstring). `program`: how the estimate runs the runtime's
    program on meta (planlang.runtime.program_memory.measure); `probed`: the model built and probed for
    this plan's model declaration and source, when the caller kept it (`probe`); without `steps` the
    estimate is of memory only (its step times NaN: `check_with_model`)."""
    plan = res.plan
    if plan is None or plan.model is None:
        return Validated(validate(res, path), res)
    free = validate(res, path)
    if free.errors:  # the plan alone is wrong: said before any model work (a PL501 in a second, not minutes)
        return Validated(free, res)
    with collector_paused():
        return _validate_model(res, path, program, probed, steps)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the model work: its millions of objects (torch's,
    transformers', the op graph's) made each full collection traverse them all, 1.2 of Llama-3-70B's
    ~10 CPU-s of `check --model` in 8 full collections, for ~20 MB of cycles freed. Reference counting
    still frees the rest; the collector is on again afterwards (as it was: a caller's choice is kept).
    The process's exit is spared the same traversals (`_frozen_at_exit`)."""
    _frozen_at_exit()
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


_AT_EXIT: list[bool] = []


def _frozen_at_exit() -> None:
    """At the process's exit, before the interpreter's own collections, move every object to the
    collector's permanent generation (gc.freeze): those collections would traverse all of torch's,
    transformers' and the model work's objects (Llama-3-70B's `estimate`: ~1 of its ~9.5 CPU-s) only to
    find the little cyclic garbage the operating system reclaims with the process anyway. Registered once,
    by the first validation against a model; a long-running process (the language server) collects as
    usual until it ends."""
    if not _AT_EXIT:
        _AT_EXIT.append(True)
        atexit.register(gc.freeze)


def _validate_model(res: Resolution, path: str, program: ProgramMeasure | None, probed: Probed | None,
                    steps: bool = True) -> Validated:
    """`validate_plan` from step 1 on, for a plan the model-free rules accept."""
    plan = res.plan
    assert plan is not None and plan.model is not None
    probed = probed if probed is not None else probe(plan)
    module, mf, load_diags = probed.module, probed.facts, list(probed.diagnostics)
    if mf is None:
        return Validated(_with(validate(res, path), load_diags), res)
    facts: dict = {"model": mf, "failures": []}
    result = validate(res, path, facts, PHASES[0])
    ready = plan.mesh is not None and not plan.holes() and not mf.failures and not result.errors
    cp = complete(plan) if ready else None
    prog = micro = None
    traffic: list[Traffic] | dict | None = None
    shapes: dict | None = None  # stages of their own degrees: by stage sizes, each shape's plan and program
    if cp is not None:
        assert module is not None
        try:
            if heterogeneous(cp):  # each distinct stage shape's program, lowered once (planlang.model.price.stage_meshes)
                shapes = {sizes: (sp, _lowered(module, microbatch_plan(sp)) if sp.dims.tensor else None)
                          for sizes, sp in shape_plans(cp).items()}
                traffic = {sizes: None if m is None else _cut_traffic(sp, m) for sizes, (sp, m) in shapes.items()}
            elif cp.pipeline is None:
                prog = _lowered(module, accumulation_microbatch(cp))  # one microbatch's, when it accumulates
                facts["lowered"] = _lowered_facts(module, cp, prog)
                traffic = [step_traffic(cp, prog, _zero_units(module, cp, prog))]
            elif cp.dims.tensor:  # pipeline x tensor parallelism: one microbatch's program, cut into stages
                micro = _lowered(module, microbatch_plan(cp))
                traffic = _cut_traffic(cp, micro)
        except Exception as err:  # noqa: BLE001 - the model's op or the plan's layouts: PL369 names which
            facts["failures"] = [LoweringFailure.of(err, err.stage if isinstance(err, NoTargets) else None)]
        if not facts["failures"]:  # the estimate measures the same program: one error is enough
            try:
                facts["estimate"] = estimate_plan(cp, facts=mf, program=_measure_with(program, prog),
                                                  traffic=traffic, steps=steps)
            except Exception as err:  # noqa: BLE001 - the budget cannot be checked: PL369, never a silent pass
                facts["failures"] = [LoweringFailure.of(err, "estimate")]
        result = _merged(result, validate(res, path, facts, PHASES[1], resolution=False))
        if cp.pipeline is not None and not result.errors:
            facts["stage_cut"] = _stage_cut(module, cp, micro) if shapes is None else _stage_cuts(module, cp, shapes)
            result = _merged(result, validate(res, path, facts, PHASES[2], resolution=False))
    return Validated(_with(result, load_diags), res, mf, cp, tuple(facts.get("estimate") or ()) or None,
                     prog if prog is not None else micro, traffic)


def _merged(first: CheckResult, then: CheckResult) -> CheckResult:
    """`first` with what a later phase found (`then`, without the resolver's diagnostics)."""
    seen = set(first.diagnostics)
    new = [d for d in then.diagnostics if d not in seen]  # PL369 for the probe's failures: said once
    if not new and not then.suppressed:
        return first
    path = first.path
    kept = sorted([*first.diagnostics, *new], key=lambda d: (d.span.file != path, d.sort_key))
    return CheckResult(path, tuple(kept), first.sources, first.plan, first.modules, first.suppressed + then.suppressed)


def _with(result: CheckResult, first: list[Diagnostic]) -> CheckResult:
    if not first:
        return result
    return CheckResult(result.path, tuple(first) + result.diagnostics, result.sources, result.plan,
                       result.modules, result.suppressed)


def _lowered(model: nn.Module, plan: CompletePlan) -> Program:
    """The plan's program as planlang.apply lowers it (NoTargets when no targets fit the loss, as apply
    refuses the plan then)."""
    inputs = meta_inputs(plan.inputs)
    loss = plan_loss(plan, model)
    targets = guess_targets(model, loss, inputs) if loss is not None else ()
    if targets is None:
        raise NoTargets("the plan's loss")
    # a model of N identical blocks is exported cut to three and expanded: the same graph (fold_graph.py)
    graph, _ = op_graph_of(model, inputs, loss, tuple(targets), find_fold(model))
    prog = lower(graph, plan)
    prog.checkpoint_groups = mark_checkpoints(prog, plan)
    return prog


def _zero_units(model: nn.Module, plan: CompletePlan, prog: Program):
    zero = plan.optimizer is not None and plan.optimizer.zero_stage > 0
    return program_zero_units(model, prog, plan) if zero else []


def _lowered_facts(model: nn.Module, plan: CompletePlan, prog: Program) -> Lowered:
    zero = bool(plan.dims.fsdp)  # ZeRO-2/3 over more than one device: the blocks are FSDP2 units
    return Lowered(tuple(prog.fallbacks), block_ranges(model, prog)[1] if zero else {},
                   tuple(weight_gathers(prog, plan)), tuple(prog.replicated))


def _cut_traffic(plan: CompletePlan, micro: Program) -> list[Traffic] | None:
    """The collectives of each stage of a pipeline x tensor-parallel plan; None when the program cannot be
    cut (the stage rules report why)."""
    try:
        return stage_traffic(plan, micro)
    except LoweringError:
        return None


def _stage_cuts(model: nn.Module, plan: CompletePlan, shapes: dict) -> StageCut:
    """`_stage_cut` of each distinct stage shape's plan and program (stages of their own degrees): the first
    that fails, its message saying which stages run on those sizes."""
    p = plan.pipeline
    assert p is not None
    said = set()
    for sizes, (sp, micro) in shapes.items():
        if micro is None and None in said:  # the model's modules cut as the stages say, whatever the sizes
            continue
        said.add(None if micro is None else sizes)
        cut = _stage_cut(model, sp, micro)
        if cut.error is not None:
            which = [s for s, sh in enumerate(stage_shapes(plan)) if sh == sizes]
            code, message, help = cut.error
            return StageCut((code, f"in stage{'s' if len(which) > 1 else ''} {', '.join(map(str, which))} "
                                   f"({describe(plan, sizes)}): {message}", help))
        if cut.failure is not None or cut.inlined_norms:
            return cut
    return _boundary_names(model, plan, shapes)


def _boundary_names(model: nn.Module, plan: CompletePlan, shapes: dict) -> StageCut:
    """Between two stages of different degrees the runtime pairs what one stage's program sends with what
    the next one's receives, value by value (planlang.runtime.stage_rows): both programs must cut the same
    values there (a value the receiving program converts early, in the sending stage, does not)."""
    p = plan.pipeline
    assert p is not None
    per_stage = stage_shapes(plan)
    # the runtime lowers every shape's program, one without tensor parallelism too (its module cut is priced)
    cuts = {sizes: cut_program(micro if micro is not None else _lowered(model, microbatch_plan(sp)), sp)
            for sizes, (sp, micro) in shapes.items()}
    for s in range(len(per_stage) - 1):
        a, b = per_stage[s], per_stage[s + 1]
        if a == b:
            continue
        sent, got = cuts[a].stages[s].outputs, cuts[b].stages[s + 1].inputs
        if tuple(sent) != tuple(got):
            return StageCut(("PL467", f"stage {s} ({describe(plan, a)}) sends ({', '.join(sent)}) but stage {s + 1} "
                             f"({describe(plan, b)}) receives ({', '.join(got)}): under the second's sizes a value is "
                             "converted before the boundary", "move the boundary to where both stages' programs pass "
                             "the same values (between blocks), or give the two stages the same degrees"))
    return StageCut()


def _measure_with(program: ProgramMeasure | None, prog: Program | None):
    """`program` handed the program lowered here, so the runtime does not lower it again."""
    if program is None or prog is None:
        return program
    # a copy (the runtime's apply changes the program it runs), made only when the program does run
    return lambda plan: program(plan, lowered=lambda: copy.deepcopy(prog))


def _stage_cut(model: nn.Module, plan: CompletePlan, micro: Program | None) -> StageCut:
    """The pipeline's stages as the runtime cuts them: the program of one microbatch (`micro`, pipeline x
    tensor parallelism) or the model's modules."""
    if micro is not None:
        try:
            cut_program(micro, plan)
        except LoweringError as err:
            return StageCut(("PL467", str(err), "keep whole modules in each stage in the model's execution order, "
                                                "each checkpoint group inside one stage; `planlang lower --rank R` "
                                                "prints the stages rank R runs"))
        return StageCut()
    try:
        cut = split_stages(copy.deepcopy(model), plan)
    except StageSplitError as err:
        return StageCut((err.code or "PL467", err.message, err.help))
    except Exception as err:  # noqa: BLE001 - an op the cut cannot trace: the run would raise it
        return StageCut(failure=LoweringFailure.of(err))
    norms = [n for n, m in model.named_modules() if isinstance(m, _BatchNorm)]
    if norms and getattr(cut[-1], OUT_SPEC, None) is not None and plan.dims.data_degree > 1:
        return StageCut(inlined_norms=tuple(norms))
    return StageCut()
