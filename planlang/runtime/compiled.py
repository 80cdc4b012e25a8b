"""`planlang.apply(..., compile=True)`: each rank's generated step under `torch.compile`.

The step planlang generates (planlang.runtime.codegen) is plain Python over `rt.run` / `rt.convert`;
Dynamo traces it, inlining the op strategies (planlang.runtime.local_ops) and the conversions'
autograd Functions with their collectives, into one graph per program. A conversion's checks
(`redistribute._check_step`) build layout values (`Spec`, whose default source `Span` Dynamo cannot
make, and `math.prod` over a generator, which Dynamo passes to the graph as it is: a graph break), so
`TracedRuntime.convert` runs the path's steps alone, after `check_paths` has checked every path of the
program once, eagerly, when it is compiled.

A pipeline of the model's modules has its stage modules compiled instead (`compile_pipeline`); under
ZeRO-2/3 Dynamo skips FSDP2's hooks, which run eagerly between one graph per block. What is not compiled
is said on rank 0's stderr (`note[PL390]`), never silently (`compile_blockers` for a program), and runs
eagerly instead (docs/runtime.md, "Compiling the step").
"""
from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from planlang.cost.ops import op_kind
from planlang.plan.types import SPLIT_BACKWARD
from planlang.model.program.lowering import Convert, Program, Run
from planlang.runtime.executor import Runtime
from planlang.runtime.program_pipeline import ProgramPipelinedModel
from planlang.runtime.redistribute import _check_step, _StepFunction

NOTE = "PL390"  # the compile notes' code (planlang.lang.codes: compile-around)
BACKENDS = ("inductor", "aot_eager", "eager")


def note(message: str) -> None:
    """A compile note on rank 0's stderr (every rank reaches the same decision)."""
    if not dist.is_initialized() or dist.get_rank() == 0:
        sys.stderr.write(f"note[{NOTE}]: {message}\n")


class TracedRuntime(Runtime):
    """The `rt` a compiled step sees: the eager runtime's own state (its `__dict__`, so the step counter
    and the block caller are shared), with conversions run step by step without re-checking layouts
    (`check_paths` checked them when the program was compiled)."""

    def __init__(self, base: Runtime) -> None:  # noqa: D107 - no super().__init__: the state is base's
        self.__dict__ = base.__dict__

    def convert(self, name: str, x: torch.Tensor) -> torch.Tensor:
        c = self.converts[name]
        for step in c.path.steps:
            x = _StepFunction.apply(x, step, self.groups, self.recorder)
        return x

    def checkpoint(self, fn, *args):
        # torch.compile takes no context_fn but selective checkpointing's (recompute.checkpoint's marks a
        # recomputation for BatchNorm, refused by compile_blockers); compiled, the recomputation is the
        # graph's own (AOT autograd's partitioner), not a second Python call of `fn`
        return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)


def check_paths(prog: Program) -> None:
    """Every conversion step of the program checked once (eagerly), as redistribute.execute_step would
    at each call."""
    for ins in prog.instructions:
        if isinstance(ins, Convert):
            for before, step in zip(ins.path.specs, ins.path.steps):
                _check_step(tuple(ins.shape), before, step, prog.mesh)


def compile_blockers(prog: Program, recorder: Any = None, model: nn.Module | None = None) -> list[str]:
    """Why `prog`'s step cannot be compiled (empty: it can). `model`: the live model, whose modules the
    program's opaque calls name."""
    out = []
    grouped = {k for a, b in prog.checkpoint_groups for k in range(a, b)}
    norms = [ins.node.name for k, ins in enumerate(prog.instructions) if k in grouped and isinstance(ins, Run)
             and ins.node.call is not None and ins.node.call.op == "call_module" and model is not None
             and isinstance(model.get_submodule(ins.node.call.target), _BatchNorm)]
    if norms:
        out.append(f"BatchNorm ({', '.join(norms[:3])}) in a checkpoint group: its recomputation must not update "
                   "the running statistics again, which the eager step marks from Python (recompute."
                   "is_recomputing) and a compiled graph's recomputation does not run")
    random = [ins.node.name for ins in prog.instructions if isinstance(ins, Run) and ins.strategy is not None
              and ins.node.op.kind != "opaque" and op_kind(ins.node.op.kind).draws(ins.node.op)]
    if random:
        out.append(f"random ops ({', '.join(random[:3])}{', ...' if len(random) > 3 else ''}) draw their mask "
                   "from a seed of the step's index, a Python int Dynamo specialises on: every step would "
                   "compile again (dropout 0 or eval mode compiles)")
    if recorder is not None:
        out.append("a collective recorder counts collectives from Python, which a compiled graph does not run")
    return out


class CompiledStep:
    """`step(rt, p, *inputs)` under torch.compile: called as the eager step is (ParallelModel.forward),
    it runs the compiled graph on a TracedRuntime view of `rt`. `seconds`: the first call's wall time
    (compilation and one step)."""

    def __init__(self, step: Callable, backend: str, mode: str | None = None) -> None:
        self.eager = step
        self.fn = torch.compile(step, backend=backend, mode=mode, dynamic=False)
        self._views: dict[int, TracedRuntime] = {}
        self.seconds: float | None = None

    def __call__(self, rt: Runtime, p: dict, *xs: torch.Tensor):
        view = self._views.get(id(rt))
        if view is None or view.__dict__ is not rt.__dict__:
            view = self._views[id(rt)] = TracedRuntime(rt)
        if self.seconds is not None:
            return self.fn(view, p, *xs)
        t = time.perf_counter()
        out = self.fn(view, p, *xs)
        self.seconds = time.perf_counter() - t
        return out


def compile_step(step: Callable, prog: Program, backend: str = "inductor", *, recorder: Any = None,
                 model: nn.Module | None = None, mode: str | None = None) -> Callable:
    """`step` (a generated program's) compiled, or `step` itself with a note saying why not."""
    if backend not in BACKENDS and not callable(backend):
        raise ValueError(f"compile backend {backend!r}: one of {', '.join(BACKENDS)}")
    blockers = compile_blockers(prog, recorder, model)
    if blockers:
        note("the step runs eagerly, not compiled: " + "; ".join(blockers))
        return step
    check_paths(prog)
    return CompiledStep(step, backend, mode)


def compile_model(pm: Any, backend: str = "inductor", mode: str | None = None) -> Any:
    """What `apply(..., compile=...)` does with the model it made: a ParallelModel's step compiled
    (`compile_parallel_model`), a pipeline's stage modules (`compile_pipeline`). Returns `pm`."""
    if hasattr(pm, "programs") and hasattr(pm, "_step"):  # a ParallelModel has both
        return compile_parallel_model(pm, backend, mode)
    return compile_pipeline(pm, backend, mode)


def compile_pipeline(pm: Any, backend: str = "inductor", mode: str | None = None) -> Any:
    """A pipeline of the model's own modules (planlang.runtime.pipeline_model.PipelinedModel): each stage
    module this rank holds compiled in place (`nn.Module.compile`), so torch's PipelineStage and schedule
    call the compiled forward and backward; the sends, receives and gradient sums stay the schedule's.
    What is not tried compiled runs eagerly, with a note."""
    mods = list(pm.runner.stage_modules.values())
    why = []
    if isinstance(pm, ProgramPipelinedModel):
        why.append("pipeline x tensor parallelism runs the program's stage functions (ProgramStage), not compiled "
                   "yet")
    if pm.checkpoint_groups:
        why.append("its checkpoint groups are wrapped with recompute.checkpoint's context_fn, which torch.compile "
                   "refuses")
    if pm.fsdp_axes:
        why.append("ZeRO-2/3 stage units (FSDP2) are not compiled yet")
    if pm.runner.layout.schedule in SPLIT_BACKWARD:
        why.append(f"torch splits a backward into input and weight gradients (`{pm.runner.layout.schedule}`) "
                   "only eagerly")
    if pm.plan.precision.mixed:
        why.append("mixed precision stages are not compiled yet")
    drops = [n for m in mods for n, d in m.named_modules() if isinstance(d, nn.modules.dropout._DropoutNd) and d.p]
    if drops:
        why.append(f"dropout ({', '.join(drops[:3])}) would draw the compiled graph's masks, not eager's")
    if why:
        note("the pipeline's stages run eagerly, not compiled: " + "; ".join(why))
        return pm
    for m in mods:
        m.compile(backend=backend, mode=mode, dynamic=False)
    return pm


def compile_parallel_model(pm: Any, backend: str = "inductor", mode: str | None = None) -> Any:
    """`pm` (a planlang.runtime.apply ParallelModel) running its programs compiled: the current one now,
    the programs lowered later for a shorter batch or the other mode when they are made (Programs.compile
    wrapped), and those cached already. Returns `pm`."""
    recorder = pm.rt.recorder
    if pm.fsdp_axes:
        note(f"ZeRO-2/3 over {', '.join(pm.fsdp_axes)}: FSDP2's hooks (each block's all-gather and reduce-scatter) run "
             "eagerly between compiled graphs: one graph per block and one for the rest of the step")
    pm._step = compile_step(pm._step, pm.program, backend, recorder=recorder, model=pm.module, mode=mode)
    programs = getattr(pm, "programs", None)
    if programs is None:
        return pm
    for key, c in list(programs.cache.items()):
        if key == pm.program_key:
            programs.cache[key] = dataclasses.replace(c, step=pm._step)
        else:
            programs.cache[key] = dataclasses.replace(c, step=compile_step(c.step, c.program, backend,
                                                                           recorder=recorder, model=pm.module,
                                                                           mode=mode))
    lower_compile = programs.compile

    def compiled(prog: Program):
        c = lower_compile(prog)
        return dataclasses.replace(c, step=compile_step(c.step, c.program, backend, recorder=recorder,
                                                        model=pm.module, mode=mode))

    programs.compile = compiled
    return pm
