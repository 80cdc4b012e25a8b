"""Pipeline x tensor (x data) parallelism: the plan's lowered program, cut into its stages, driven by
torch.distributed.pipelining's schedules.

A pipeline plan whose `shard` specs split over a tensor axis (planlang.plan.data.tensor_axes) runs
here; a pipeline of data parallelism alone keeps planlang.runtime.pipeline's module cut. The program is
lowered once for one microbatch of the global batch (planlang.model.program.pipeline_program.microbatch_plan),
on the whole mesh, exactly as without a pipeline: the same layouts, conversions, collectives and
per-parameter gradient sums. `cut_program` gives each instruction to a stage; `generate_pipeline` writes
one function per stage, and this rank's stages become `ProgramStage` modules:

- a `ProgramStage` holds the local pieces of the parameters its instructions read, under the model's
  names (so the optimizer, ZeRO-1's ZeroRedundancyOptimizer and FSDP2 see the usual FQNs), and runs its
  stage function as `forward`; torch's `PipelineStage` sends its outputs, local pieces in their lowered
  layout, to the same tensor coordinate of the next pipeline rank;
- the schedule's loss function runs the program's loss instructions (the `tail`: those reading the
  target) on the last stage, sums the local loss over the axes it is partial on (GlobalLoss: the
  microbatch's global loss) and divides it by the number of microbatches, so the step's loss and
  gradients are those of the batch mean, as in one process;
- after the schedule's backward, each parameter's gradient is summed over the axes the program defers
  (`Program.grad_sync`: the data axes, and a tensor axis where a use leaves it partial), in buckets
  (planlang.runtime.grad_sync), and a parameter tied across pipeline ranks (GPT-2's `wte` used by the
  head) is summed over the pipeline axis (PipelineRunner.sum_tied_gradients);
- ZeRO-1 shards the optimizer state over its axis (`pm.optimizer()`); ZeRO-2/3 makes each stage an
  FSDP2 unit over the ZeRO axis, whose reduce-scatter sums the gradients there (divide factor 1: the
  loss is already the global one);
- `pm(...)` runs the program lowered again with the model's output (`Program.outputs`, kept per batch
  and mode as the others), which the last stage returns after what the loss tail reads; switching
  between it and `step`'s program rebuilds the PipelineStages (the last stage's outputs change).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.utils._pytree import tree_unflatten

from planlang.cost.layout import local_shape
from planlang.model.program.head_blocks import block_factor, unblocked_order
from planlang.model.capture.load import TORCH_DTYPES
from planlang.model.program.lowering import Convert, Program, trained_parameters
from planlang.model.program.pipeline_program import ProgramCut, cut_program, microbatch_plan
from planlang.plan.checkpoints import checkpoint_groups
from planlang.plan.complete import CompletePlan
from planlang.plan.data import batch_dim
from planlang.plan.types import Precision, Spec
from planlang.runtime.call_outputs import Piece, PlanOutput, build_output, output_pieces, with_loss
from planlang.runtime.codegen import generate_pipeline
from planlang.runtime.executor import GlobalLoss, Runtime, ScaleGrad
from planlang.runtime.grad_sync import GradSync
from planlang.runtime.pipeline import (PipelineError, PipelineRunner, TiedParameter, pipeline_layout,
                                      refuse_sharded_shared)
from planlang.runtime.pipeline_model import PipelinedModel
from planlang.runtime.placement import ParamLayout
from planlang.runtime.precision import autocast, mp_policy, torch_dtype
from planlang.runtime.programs import PlanError, live_consts
from planlang.runtime.redistribute import MeshGroups, redistribute
from planlang.runtime.stage_rows import StageRows


class ProgramStage(nn.Module):
    """One pipeline stage of the lowered program on this rank: the parameters its instructions read
    (local pieces, under the model's names) and its generated function as `forward`."""

    def __init__(self, index: int, fn: Callable, params: dict[str, nn.Parameter], rt: Runtime,
                 grad_scale: dict[str, float], precision: Precision | None = None, rows: StageRows | None = None) -> None:
        super().__init__()
        self.index = index
        self._fn, self._rt, self._scale = fn, rt, grad_scale
        self._precision = precision or Precision()
        self._rows = rows  # stages of their own degrees: the rows its boundaries move (planlang.runtime.stage_rows)
        for fqn, p in params.items():
            _register(self, fqn, p)

    def __repr__(self) -> str:
        return f"ProgramStage({self.index}, {sum(1 for _ in self.parameters())} parameters)"

    def local_parameters(self) -> dict[str, torch.Tensor]:
        """Name -> the parameter as the stage function reads it (with its gradient factor, ZeRO-2/3)."""
        return {n: ScaleGrad.apply(p, self._scale[n]) if n in self._scale else p
                for n, p in self.named_parameters(remove_duplicate=False)}

    def forward(self, *xs: torch.Tensor):
        if self._rows is not None:
            xs = self._rows.convert_inputs(xs)
        with autocast(self._precision, self._rt.device.type):  # the plan's compute dtype
            out = self._fn(self._rt, self.local_parameters(), *xs)
        return self._rows.convert_outputs(out) if self._rows is not None else out


def _register(root: nn.Module, fqn: str, p: nn.Parameter) -> None:
    """Register `p` under its dotted name, making empty container modules on the way."""
    *path, attr = fqn.split(".")
    mod = root
    for part in path:
        child = mod._modules.get(part)
        if child is None:
            child = nn.Module()
            mod.add_module(part, child)
        mod = child
    mod.register_parameter(attr, p)


class _TailLoss:
    """The schedule's loss: the program's loss instructions on the last stage's outputs and the target,
    summed over the axes the local loss is partial on (the microbatch's global loss)."""

    def __init__(self, fn: Callable, rt: Runtime, last: ProgramStage | None, axes: tuple[str, ...],
                 groups: MeshGroups) -> None:
        self.fn, self.rt, self.last, self.axes, self.groups = fn, rt, last, axes, groups
        self.n: int | None = None  # how many of the last stage's outputs the tail reads (None: all)

    def __call__(self, output, *targets):
        outs = output if isinstance(output, tuple) else (output,)
        outs = outs[:self.n] if self.n is not None else outs
        params = self.last.local_parameters() if self.last is not None else {}
        with autocast(self.last._precision if self.last is not None else Precision(), self.rt.device.type):
            loss = self.fn(self.rt, params, *outs, *targets)
        return GlobalLoss.apply(loss, self.axes, self.groups) if self.axes else loss


class ProgramPipelinedModel(PipelinedModel):
    """`planlang.apply` of a pipeline x tensor parallel plan: PipelinedModel's training-loop interface
    over ProgramStages; `layouts` are this rank's parameters' lowered layouts, `code` its source."""

    def __init__(self, runner: PipelineRunner, plan: CompletePlan, groups: MeshGroups,
                 shapes: dict, program: Program, cut: ProgramCut, layouts: dict[str, ParamLayout], code: str,
                 fsdp_axes: tuple[str, ...] = ()) -> None:
        super().__init__(runner, plan, groups, shapes, fsdp_axes)
        self.program, self.cut, self.code = program, cut, code
        # the batch, mode and whether the model's output is returned, of the program the stages run now
        # (None: apply's)
        self._key: tuple[int, bool, bool] | None = None
        self._cache: dict[tuple[int, bool, bool], tuple] = {}  # key -> (program, cut, code, functions, Runtime)
        mine = {n for n, _ in runner.named_parameters()}
        self.layouts = {n: lay for n, lay in layouts.items() if n in mine}

    lowered_training = True  # the model's mode when the program was lowered (set by build_program_pipeline)
    # what lowers the program again for another batch or mode (set by apply; None: neither can change)
    relower: Relower | None = None

    fixed_shape = True  # without `relower` the stages run the plan's microbatch only (apply clears it)
    def __repr__(self) -> str:
        return f"ProgramPipelinedModel({self.runner})"

    def train(self, mode: bool = True) -> "ProgramPipelinedModel":
        """The mode of the next step or evaluation: the program's ops were lowered in one mode (dropout,
        BatchNorm baked in), so another mode runs a program lowered again for it (`relower`)."""
        if mode != self.lowered_training and self.relower is None:
            raise PlanError(f"{'stages of their own degrees run' if self.own_degrees else 'pipeline x tensor parallelism runs'} "
                            f"the program lowered with the model in "
                            f"{'training' if self.lowered_training else 'eval'} mode; pm.train({mode}) would "
                            "need another program: apply a model in that mode (pm.evaluate runs forward only "
                            "in this one)")
        self.training = mode
        rt = self._rt()
        if rt.modules is not None:  # opaque module calls (BatchNorm) read the live model's mode
            rt.modules.train(mode)
        return self

    def _prepared(self, args: tuple, outputs: bool = False) -> None:
        self._program_for(args, outputs)

    @property
    def returns_outputs(self) -> bool:
        """Whether `pm(...)` runs a program whose last stage also returns the model's output (lowered
        again with `Program.outputs`: only with `relower`)."""
        return self.relower is not None

    def _output(self, loss: torch.Tensor, out):
        """The model's output from the last stage's extra outputs (after what the loss tail reads): this
        rank's pieces, each registered with its global shape (the replica's batch) and layout."""
        tree = self.program.graph.output_tree
        if tree is None:
            return PlanOutput(loss, None)
        if out is None or not self.runner.has_last:
            return with_loss(tree_unflatten(list(tree.template), tree.spec), loss)
        outs = out if isinstance(out, tuple) else (out,)
        leaves = list(outs[len(self.cut.tail_inputs):])
        m = self.runner.layout.microbatches
        first = next(v for v in self.program.graph.values.values() if v.kind == "input")
        micro = first.shape[0] if first.shape else -1
        pieces = [Piece((p.shape[0] * m,) + tuple(p.shape[1:]), p.spec) if p.shape and p.shape[0] == micro else None
                  for p in output_pieces(self.program)]
        return build_output(tree, leaves, loss, pieces)

    def _rt(self) -> Runtime:
        stage = next(iter(self.runner.stage_modules.values()))
        assert isinstance(stage, ProgramStage)
        return stage._rt

    def _program_for(self, args, outputs: bool = False) -> None:
        """The stages run the program for this batch size and mode: lowered again from the meta copy
        (once per key, kept), cut into the same stages, its code swapped into each ProgramStage and the
        loss tail (the runner rebuilds the PipelineStages for new shapes itself)."""
        if self.relower is None or not args:
            return
        first = self.plan.inputs[0]
        b = batch_dim(first)
        given = tuple(args[0].shape)
        n = first.shape[b] if given == tuple(self._local_shape(first)) or len(given) <= b else given[b]
        key = (n, self.training, outputs)
        if key == (self._key or (first.shape[b], self.lowered_training, False)):
            return
        if n != first.shape[b]:
            spec = self._spec(first)
            self._check_shorter(first.name, n, first.shape[b], spec.dims[b] if b < len(spec.dims) else ())
        loss = self.runner._scaled.fn
        tail = loss if isinstance(loss, _TailLoss) else None
        self._cache.setdefault((first.shape[b], self.lowered_training, False), (
            self.program, self.cut, self.code, {s: st._fn for s, st in self.runner.stage_modules.items()},
            tail.fn if tail is not None else None, self._rt()))
        if key not in self._cache:
            self._cache[key] = self._compile(key, args)
        prog, cut, code, fns, tail_fn, rt = self._cache[key]
        if outputs != (self._key or (0, True, False))[2]:  # the last stage returns more or fewer tensors
            self.runner.schedule = None
        if tail is not None:  # the tail reads the last stage's first outputs; the model's output follows
            tail.n = len(cut.tail_inputs)
        for s, st in self.runner.stage_modules.items():
            st._fn, st._rt = fns[s], rt
        if tail is not None:
            tail.fn, tail.rt = tail_fn, rt
        self.program, self.cut, self.code, self._key = prog, cut, code, key

    def _compile(self, key: tuple[int, bool, bool], args) -> tuple:
        n, training, outputs = key
        r = self.relower
        assert r is not None
        inputs = tuple(dataclasses.replace(inp, dims=tuple((nm, n if d == batch_dim(inp) else s)
                                                           for d, (nm, s) in enumerate(inp.dims)))
                       for inp in self.plan.inputs)
        plan = dataclasses.replace(self.plan, inputs=inputs)
        m, k = self.runner.layout.microbatches, len(self.plan.inputs)
        targets = tuple(torch.empty(((n // m,) + tuple(t.shape[1:])) if t.dim() else (), dtype=t.dtype,
                                    device="meta") for t in args[k:]) or None
        r.meta.train(training)
        base = self._cache[(self.plan.inputs[0].shape[batch_dim(self.plan.inputs[0])], self.lowered_training,
                            False)][0]
        prog = live_consts(r.lower(r.meta, microbatch_plan(plan), r.loss_fn, targets, outputs=outputs), base, [n])
        cut = cut_program(prog, plan)
        if prog.outputs:  # the last stage also returns the model's output, after what the tail reads
            last = cut.stages[-1]
            tail = set(cut.tail)
            here = set(last.inputs) | {ins.out if isinstance(ins, Convert) else ins.node.name
                                       for k, ins in ((k, prog.instructions[k]) for k in last.instructions)
                                       if k not in tail}
            early = [o for o in prog.outputs if o not in here]
            if early:
                raise PlanError(f"the model's output {early} is computed before the pipeline's last stage, which "
                                "returns the output under pipeline x tensor parallelism; call pm.step for the "
                                "loss, or return the output from the last stage's modules")
            cut = dataclasses.replace(cut, stages=cut.stages[:-1] + (
                dataclasses.replace(last, outputs=tuple(last.outputs) + tuple(prog.outputs)),))
        if prog.param_specs != base.param_specs or [s.params for s in cut.stages] != [s.params for s in self.cut.stages]:
            raise PlanError(f"the program for a batch of {n} places or cuts the parameters otherwise than the "
                            "plan's; run batches of the plan's size")
        mine = sorted(self.runner.stage_modules)
        code = generate_pipeline(prog, cut, dist.get_rank(), self.groups.coords, title=plan.path, stages=mine)
        scope: dict = {}
        exec(compile(code, f"<planlang rank {dist.get_rank()}>", "exec"), scope)  # noqa: S102 - our codegen
        old = self._rt()
        rt = Runtime(prog, self.groups, self.runner.device, old.recorder)
        rt.modules = old.modules
        return prog, cut, code, {s: scope[f"stage_{s}"] for s in mine}, scope.get("tail"), rt

    def _whole(self, name: str, t: torch.Tensor) -> torch.Tensor:
        t = super()._whole(name, t)
        lay = self.layouts[name]
        t = redistribute(t.detach(), lay.shape, lay.spec, Spec(tuple(() for _ in lay.shape)), self.mesh, self.groups)
        if lay.blocked is not None:
            t = unblocked_order(t, lay.blocked, block_factor(lay.blocked, self.mesh))
        return t


@dataclasses.dataclass
class Relower:
    """What a ProgramPipelinedModel lowers its program again with (planlang.runtime.programs): the model
    on the meta device, the loss, and apply's lowering (rank 0 lowers, every rank gets the program)."""
    meta: nn.Module
    loss_fn: Callable | None
    lower: Callable


def build_program_pipeline(model: nn.Module, plan: CompletePlan, prog: Program,
                           layouts: dict[str, ParamLayout], groups: MeshGroups, device: torch.device,
                           recorder=None, rows: StageRows | None = None) -> ProgramPipelinedModel:
    """This rank's stages of `prog` (lowered for one microbatch; parameters of `model` already replaced
    by their local pieces) under the plan's schedule, as a ProgramPipelinedModel. `rows`: a stage of its
    own degrees, what its boundaries move (planlang.runtime.heterogeneous; `plan` is then the stage's)."""
    p = plan.pipeline
    assert p is not None
    layout = pipeline_layout(plan)
    cut = cut_program(prog, plan)
    mine = layout.stages_of(groups.coords[p.axis])
    code = generate_pipeline(prog, cut, dist.get_rank(), groups.coords, title=plan.path, stages=mine)
    scope: dict = {}
    exec(compile(code, f"<planlang rank {dist.get_rank()}>", "exec"), scope)  # noqa: S102 - our codegen
    rt = Runtime(prog, groups, device, recorder)
    rt.modules = model
    fsdp = _fsdp(plan)
    grad_scale: dict[str, float] = {}
    if fsdp is not None:  # a gradient already complete over the ZeRO axis would be added up by FSDP2
        for fqn in prog.param_specs:
            if fsdp[1] not in prog.grad_sync.get(fqn, ()):
                grad_scale[fqn] = 1.0 / groups.size(fsdp[1])
    params = dict(model.named_parameters())
    refuse_sharded_shared(plan, layout, {s: list(cut.stages[s].params) for s in mine}, {f: id(q) for f, q in params.items()})
    prec = plan.precision
    stages = {s: ProgramStage(s, scope[f"stage_{s}"], {f: params[f] for f in cut.stages[s].params}, rt, grad_scale,
                              prec, rows) for s in mine}
    _free_others(model, {f for s in mine for f in cut.stages[s].params})
    last = stages.get(len(cut.stages) - 1)
    loss_axes = tuple(prog.layouts[prog.loss].partial)
    loss = _TailLoss(scope["tail"], rt, last, loss_axes, groups) if last is not None else _no_loss
    if fsdp is not None:
        stage_no, z = fsdp
        policy = mp_policy(prec)
        for st in stages.values():
            unit = fully_shard(st, mesh=groups.device_mesh[z], reshard_after_forward=(stage_no == 3),
                               **({"mp_policy": policy} if policy is not None else {}))
            unit.set_gradient_divide_factor(1.0)
            unit.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
    runner = PipelineRunner(stages, layout, groups.group(p.axis), loss, device, dp_groups=(), reduce_grads=False,
                            tied=_tied(cut, layout, layouts, prog))
    fsdp_axes = (fsdp[1],) if fsdp is not None else ()
    trained = trained_parameters(prog)
    sync = {n: tuple(a for a in prog.grad_sync.get(n, ()) if a not in fsdp_axes)
            for n, _ in runner.named_parameters() if n in trained}
    # the runner holds them in `no_sync` until the last backward of this rank's last stage to run, during
    # which they start bucket by bucket (planlang.runtime.recv_buffers.InFlightStage)
    grad_sync = GradSync(list(runner.named_parameters()), sync, groups, recorder, overlap=not fsdp_axes,
                         reduce_dtype=torch_dtype(prec.reduce) if prec.mixed else None)
    runner.grad_sync = grad_sync
    runner.release_grad_buffers = grad_sync.new_buffers
    shapes = {n: (torch.Size(lay.shape), p_.dtype) for (n, lay), p_ in
              ((item, params[item[0]]) for item in layouts.items())}
    pm = ProgramPipelinedModel(runner, plan, groups, shapes, prog, cut, layouts, code, fsdp_axes)
    pm.training = pm.lowered_training = model.training
    pm.checkpoint_groups = _checkpoint_modules(prog, plan, cut, mine)
    return pm


def _no_loss(output, *targets):  # pragma: no cover - only the last stage's rank calls the loss
    raise PipelineError("the loss ran on a rank without the last stage", "report this as a planlang bug")


def _fsdp(plan: CompletePlan) -> tuple[int, str] | None:
    """(ZeRO stage, axis) when ZeRO-2/3 shards each stage with FSDP2 over an axis of more than one device
    (in a pipeline `plan.dims.fsdp` is that axis alone)."""
    dims = plan.dims
    return (dims.zero_stage, dims.fsdp[0]) if dims.fsdp else None


def _free_others(model: nn.Module, keep: set[str]) -> None:
    """Drop the model's parameters this rank's stages do not read (other pipeline ranks hold them)."""
    for fqn, _ in list(model.named_parameters(remove_duplicate=False)):
        if fqn in keep:
            continue
        owner_name, _, attr = fqn.rpartition(".")
        owner = model.get_submodule(owner_name) if owner_name else model
        owner._parameters[attr] = None


def _tied(cut: ProgramCut, layout, layouts: dict[str, ParamLayout], prog: Program) -> list[TiedParameter]:
    """Parameters read by stages on different pipeline ranks (GPT-2's `wte`, also the head's weight):
    each holds a copy, and their gradients are summed over the pipeline axis."""
    ranks: dict[str, set[int]] = {}
    for st in cut.stages:
        for f in st.params:
            ranks.setdefault(f, set()).add(layout.rank_of(st.index))
    out = []
    for f, rs in ranks.items():
        if len(rs) > 1:
            lay = layouts[f]
            out.append(TiedParameter((f,), local_shape(lay.shape, lay.spec, prog.mesh),
                                     TORCH_DTYPES.get(lay.dtype, torch.float32)))
    return out


def _checkpoint_modules(prog: Program, plan: CompletePlan, cut: ProgramCut, mine: list[int]) -> list[list[str]]:
    """The plan's checkpoint groups (module names) whose instructions this rank's stages run."""
    modules = list(prog.graph.module_outputs())
    groups = checkpoint_groups(plan.checkpoints, modules, modules) if plan.checkpoints else []
    here = {i for s in mine for i in cut.stages[s].instructions}
    runs = [ins.node.module for i, ins in enumerate(prog.instructions) if i in here and hasattr(ins, "node")]
    return [g for g in groups if any(r == m or r.startswith(m + ".") for m in g for r in runs)]

