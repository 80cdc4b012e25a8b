"""Cutting a lowered `Program` into the plan's pipeline stages (pipeline x tensor parallelism).

The plan's program is lowered once, for one microbatch of the global batch (`microbatch_plan`), on
the whole mesh: tensor-parallel layouts, conversions and gradient reductions are the same as without
a pipeline (the pipeline axis splits nothing). `cut_program` then gives each instruction to a stage:

- an op of a module a stage selects runs in that stage (the plan's `stage` lines);
- an op outside every selected module ("glue": the residual add of the root, the loss) runs with its
  latest producer;
- a conversion, and an op computed from the model's inputs, parameters and constants alone
  (`pos = arange(seq)`), runs in the first stage that reads it: a layout change happens where the
  value is used, so a value crosses a stage boundary in the layout its producer made it in;
- the instructions that read the target (the loss) form the `tail`, run by the schedule's loss
  function on the last stage (torch's pipeline schedules give targets to the loss, not to stages).

What crosses each boundary (`StageCut.inputs` / `outputs`) is every value a later stage (or the tail)
reads that an earlier stage made, or a model input a later stage reads, passed on through the stages
in between. Data flow that would go backwards, a checkpoint group split between stages, or a loss op
outside the last stage is a `LoweringError` naming the cause and the fix.

This module is pure (no torch, no processes): the runtime (planlang.runtime.program_pipeline) runs
the cut, and the check reads the same one.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from planlang.model.program.lowering import Convert, LoweringError, Program, Run
from planlang.plan.complete import CompletePlan
from planlang.plan.data import batch_dim


@dataclass(frozen=True)
class StageCut:
    """One pipeline stage of a lowered program: its instructions (indices into the program, in order),
    the values it receives and sends, and the parameters it reads."""

    index: int
    instructions: tuple[int, ...]
    inputs: tuple[str, ...]  # values received, in order (stage 0: the model's inputs)
    outputs: tuple[str, ...]  # values sent to the next stage (the last stage: what the tail reads)
    params: tuple[str, ...]  # FQNs of the parameters its instructions (and the tail's) read

    def __str__(self) -> str:
        return (f"stage {self.index}: {len(self.instructions)} instructions, "
                f"({', '.join(self.inputs)}) -> ({', '.join(self.outputs)})")


@dataclass(frozen=True)
class ProgramCut:
    """A program cut into stages, with the loss tail of the last stage."""

    stages: tuple[StageCut, ...]
    tail: tuple[int, ...]  # instructions reading the target: run by the loss function
    tail_inputs: tuple[str, ...]  # the last stage's outputs, in the order the tail takes them
    targets: tuple[str, ...]  # target values the tail reads (graph inputs that are not model inputs)

    def stage_of(self) -> dict[int, int]:
        """Instruction index -> stage (the tail counts as the last stage)."""
        out = {i: s.index for s in self.stages for i in s.instructions}
        out.update({i: len(self.stages) - 1 for i in self.tail})
        return out


def microbatch_plan(plan: CompletePlan) -> CompletePlan:
    """The plan a pipeline's program is lowered for: every input's batch dim divided by the pipeline's
    microbatches (one microbatch of the global batch, split over the data axes as the plan says, so each
    stage's local shapes are those of one microbatch on one replica), on the mesh with the pipeline axis
    of size 1 — the ranks along it run other stages, so no op may split its work over them."""
    p = plan.pipeline
    if p is None:
        return plan
    m = p.microbatches
    mesh = plan.mesh
    if mesh is not None and mesh.axis(p.axis) is not None:
        axes = tuple(dataclasses.replace(a, size=1) if a.name == p.axis else a for a in mesh.axes)
        plan = dataclasses.replace(plan, mesh=dataclasses.replace(mesh, axes=axes, device_count=None))
    if m == 1:
        return plan
    inputs = []
    for inp in plan.inputs:
        b = batch_dim(inp)
        name, size = inp.dims[b]
        if size % m:
            raise LoweringError(f"input `{inp.name}`: batch {size} does not split into {m} microbatches; "
                                f"use a batch that is a multiple of {m}")
        dims = inp.dims[:b] + ((name, size // m),) + inp.dims[b + 1:]
        inputs.append(dataclasses.replace(inp, dims=dims))
    return dataclasses.replace(plan, inputs=tuple(inputs))


def _module_stages(prog: Program, plan: CompletePlan) -> dict[str, int]:
    """Every module name the program's ops run in (with its ancestors) -> the stage selecting it."""
    p = plan.pipeline
    assert p is not None
    names: list[str] = []
    seen: set[str] = set()
    for ins in prog.instructions:
        if isinstance(ins, Run) and ins.node.module:
            parts = ins.node.module.split(".")
            for k in range(1, len(parts) + 1):
                n = ".".join(parts[:k])
                if n not in seen:
                    seen.add(n)
                    names.append(n)
    selected: dict[str, int] = {}
    for st in p.stages:
        for sel in st.modules:
            for hit in sel.select(names):
                if selected.get(hit, st.index) != st.index:
                    raise LoweringError(f"module `{hit}` is in stages {selected[hit]} and {st.index}; "
                                        "give each module to one stage")
                selected[hit] = st.index
    out: dict[str, int] = {}
    for n in names:
        # the selected module of the longest dotted prefix of `n` (`n` itself first)
        parts = n.split(".")
        owner = next((m for m in (".".join(parts[:k]) for k in range(len(parts), 0, -1)) if m in selected), None)
        if owner is not None:
            out[n] = selected[owner]
    return out


def _reads(ins: Convert | Run) -> tuple[str, ...]:
    return (ins.value,) if isinstance(ins, Convert) else tuple(ins.args)


def _makes(ins: Convert | Run) -> str:
    return ins.out if isinstance(ins, Convert) else ins.node.name


def _named(ins: Convert | Run) -> str:
    """An instruction as a message names it: an op by its node and module, a conversion by its value."""
    if isinstance(ins, Convert):
        return f"the conversion of `{ins.value}`"
    where = ins.node.module or "the model's forward"
    return f"`{ins.node.name}` of `{where}`"


def cut_program(prog: Program, plan: CompletePlan) -> ProgramCut:
    """The stages of `prog` under the plan's pipeline (see the module docstring)."""
    p = plan.pipeline
    if p is None:
        raise LoweringError("the plan has no pipeline to cut the program into")
    n = len(p.stages)
    g = prog.graph
    module_stage = _module_stages(prog, plan)
    model_inputs = [v.name for v in g.values.values() if v.kind == "input" and v.ref in {i.name for i in plan.inputs}]
    targets = {v.name for v in g.values.values() if v.kind == "input" and v.name not in model_inputs}
    made_by: dict[str, int] = {}  # value -> instruction index
    for k, ins in enumerate(prog.instructions):
        made_by[_makes(ins)] = k
    # the tail: instructions that read a target, directly or through another tail instruction
    tainted = set(targets)
    tail: list[int] = []
    for k, ins in enumerate(prog.instructions):
        if any(a in tainted for a in _reads(ins)):
            tainted.add(_makes(ins))
            tail.append(k)
    tail_set = set(tail)
    # forward pass: each instruction's earliest stage (`bound`: after its producers); an op of a selected
    # module (or of the tail) is fixed there, glue runs with its latest producer, and conversions and
    # ops of the inputs alone float, to be placed by their consumers
    bound: dict[int, int] = {}
    stage: dict[int, int] = {}
    floating: list[int] = []
    is_floating: set[int] = set()
    for k, ins in enumerate(prog.instructions):
        producers = [made_by[a] for a in _reads(ins) if a in made_by]
        lo = max((bound[j] for j in producers), default=0)
        fixed = module_stage.get(ins.node.module) if isinstance(ins, Run) and ins.node.module else None
        if k in tail_set:
            fixed = n - 1
        if fixed is not None:
            if fixed < lo:  # only an op of a selected module: the tail's stage is the last
                raise LoweringError(f"{_named(ins)} (stage {fixed}) reads a value made in stage {lo}: stages "
                                    "must follow the model's execution order; move the boundary")
            bound[k] = stage[k] = fixed
        elif isinstance(ins, Convert) or not producers or all(j in is_floating for j in producers):
            bound[k] = lo
            floating.append(k)
            is_floating.add(k)
        else:
            bound[k] = stage[k] = lo
    # backward pass: a floating instruction runs in the first stage that reads it
    consumers: dict[int, list[int]] = {k: [] for k in range(len(prog.instructions))}
    for k, ins in enumerate(prog.instructions):
        for a in _reads(ins):
            if a in made_by:
                consumers[made_by[a]].append(k)
    for k in reversed(floating):
        use = min((stage[c] for c in consumers[k]), default=bound[k])
        stage[k] = max(bound[k], use)
    if prog.loss in made_by and stage[made_by[prog.loss]] != n - 1:
        raise LoweringError(f"the loss is computed in stage {stage[made_by[prog.loss]]}, not the last stage; "
                            "give the last stage the modules the loss reads")
    for first, end in prog.checkpoint_groups:
        inside = {stage[k] for k in range(first, end)}
        if len(inside) > 1:
            raise LoweringError(f"a checkpoint group spans pipeline stages {', '.join(map(str, sorted(inside)))}; "
                                "keep each checkpoint group inside one stage")
    # what each stage reads from before it
    reads_at: list[list[str]] = [[] for _ in range(n)]

    def need(s: int, v: str) -> None:
        if v not in reads_at[s]:
            reads_at[s].append(v)

    body: list[list[int]] = [[] for _ in range(n)]  # each stage's instructions but the tail, in order
    for k in range(len(prog.instructions)):
        if 0 <= stage[k] < n and k not in tail_set:
            body[stage[k]].append(k)
    for s in range(n):
        ks = body[s] + (tail if s == n - 1 else [])
        mine = {_makes(prog.instructions[k]) for k in ks}
        for k in ks:
            for a in _reads(prog.instructions[k]):
                if a in mine or a in targets:
                    continue
                if a in made_by or a in model_inputs:
                    need(s, a)
    # received at stage s: read by stage >= s, made before s (or a model input)
    made_in = {_makes(prog.instructions[k]): stage[k] for k in range(len(prog.instructions))}
    received: list[list[str]] = [list(model_inputs)] + [[] for _ in range(n - 1)]
    for s in range(1, n):
        for later in range(s, n):
            for v in reads_at[later]:
                origin = made_in.get(v, -1)  # -1: a model input
                if origin < s and v not in received[s]:
                    received[s].append(v)
    tail_reads: list[str] = []
    tail_made = {_makes(prog.instructions[k]) for k in tail}
    for k in tail:
        for a in _reads(prog.instructions[k]):
            if a not in tail_made and a not in targets and (a in made_by or a in model_inputs) and a not in tail_reads:
                tail_reads.append(a)
    if not tail:
        tail_reads = [prog.loss]
    stages = []
    for s in range(n):
        outs = tuple(received[s + 1]) if s + 1 < n else tuple(tail_reads)
        ks = body[s] + (tail if s == n - 1 else [])
        params = []
        for k in ks:
            for a in _reads(prog.instructions[k]):
                value = g.values.get(a)
                if value is not None and value.kind == "param" and value.ref not in params:
                    params.append(value.ref)
        stages.append(StageCut(s, tuple(body[s]), tuple(received[s]), outs, tuple(params)))
    return ProgramCut(tuple(stages), tuple(tail), tuple(tail_reads), tuple(sorted(targets & tainted,
                                                                               key=list(g.values).index)))
