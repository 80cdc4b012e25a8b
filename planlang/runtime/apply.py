"""`planlang.apply(model, plan)`: the parallel model for a training script under torchrun.

    model = build(...)                        # the single-process model, same seed on every rank
    pm = planlang.apply(model, "my.plan")     # parameters become this rank's pieces
    opt = pm.optimizer()                      # the plan's optimizer, ZeRO as the plan says
    for x, y in batches:                      # global batch, or this rank's piece of it
        loss = pm.step(x, y)                  # forward + backward + gradient sums: the global loss
        opt.step(); opt.zero_grad()

The same calls run a pipeline plan (a `PipelinedModel`: its schedule over the microbatches). `out =
pm(input_ids=x, labels=y)` returns the model's output (planlang.runtime.call_outputs): `out.loss` the global
loss with autograd, the rest this rank's pieces (`pm.whole(out)`); `compile=True`: torch.compile.

The passes, in order (each a function of this module or the modules it names):

1. `load_plan`           resolve and check the plan (errors stop here, rendered);
2. `op_graph`            trace model + loss with torch.fx into the op graph (planlang.model.capture.opgraph);
3. `lower`               layouts, strategies, conversions, gradient reductions (planlang.model.program.lowering);
4. `mark_checkpoints`    the plan's checkpoint groups as instruction ranges (planlang.model.program.lowering);
                         passes 2–4 run on rank 0 (planlang.runtime.plan_lowering.lower_once);
5. `shard_parameters`    each parameter replaced by its local piece (initial values = the single-process
                         model's, whatever the seed);
6. `generate`            per-rank Python (planlang.runtime.codegen), compiled and run by `ParallelModel`;
                         under ZeRO-2/3 each repeated block's instructions (`zero_blocks`) become a
                         function run as that block module's forward;
7. `shard_optimizer`     ZeRO-2/3 (`zero = 2 over dp`): FSDP2 `fully_shard` of each block module, then of
                         the ParallelModel (the rest: root unit), over the ZeRO axis (HSDP with one more
                         data axis), so the local pieces are sharded once more, on dim 0, over that axis
                         (ZeRO §5.2–5.3); each block's parameters are gathered while it runs, the next
                         block's prefetched.
"""
from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from planlang.cost.layout import local_shape, local_slices
from planlang.lang.diagnostics import Severity
from planlang.lang.render import render
from planlang.model.program.head_blocks import block_factor, unblocked_order
from planlang.model.capture.load import meta_inputs, plan_loss, sum_loss_note
from planlang.model.program.pipeline_program import microbatch_plan
from planlang.plan import types as T
from planlang.plan.complete import (CompleteMesh, CompleteOptimizer, CompletePlan, IncompletePlan, complete,
                                    plan_mesh, world_size)
from planlang.plan.data import batch_dim
from planlang.plan.microbatches import accumulation_microbatch
from planlang.plan.stage_meshes import heterogeneous
from planlang.plan.types import Spec
from planlang.runtime.call_outputs import (CallSignature, bind_call, build_output, gather_whole, output_pieces,
                                           sums_before_step, target_names, whole)
from planlang.runtime.clip import clip_model
from planlang.runtime.compiled import compile_model
from planlang.runtime.data_parallel import fsdp_mesh
from planlang.runtime.executor import GlobalLoss, Runtime, ScaleGrad
from planlang.runtime.grad_sync import GradSync
from planlang.runtime.heterogeneous import apply_heterogeneous
from planlang.model.program.lowering import LoweringError, Program, trained_parameters
from planlang.runtime.pipeline import PipelineError
from planlang.runtime.pipeline_model import apply_pipeline
from planlang.runtime.program_pipeline import Relower, build_program_pipeline
from planlang.runtime.placement import ParamLayout, shard_parameters  # noqa: F401 - shard_parameters: this module's API too
from planlang.runtime.programs import Compiled, Key, PlanError, Programs, compiler, fsdp_grad_scale, meta_copy
from planlang.runtime.plan_lowering import (  # noqa: F401 - lower_plan, report_fallbacks: this module's API too
    STRICT_ENV, lower_once, lower_plan, relowering, report_fallbacks)
from planlang.runtime.precision import (LossScale, autocast, cast_buffers, mp_policy, storage_dtype, torch_dtype,
                                        wrap_optimizer)
from planlang.runtime.redistribute import MeshGroups, redistribute
from planlang.runtime.save_load import full_state_dict, resharded
from planlang.runtime.zero import OptimizerError, build_optimizer
from planlang.runtime.zero_blocks import Block, BlockCaller, block_ranges


def load_plan(plan: T.Plan | str | Path) -> CompletePlan:
    """The plan (a Plan value, or a file) checked by the model-free rules, as a CompletePlan; a PlanError
    naming each error when they refuse it or it has holes. A Plan value is checked too: a complete plan
    comes out of validation only, so the runtime need not restate the checker's rules."""
    # lazy: lark loads only when this runs
    from planlang.plan.checker import RULES, CheckContext, check_file, run_rules

    if not isinstance(plan, T.Plan):
        res = check_file(str(plan))
        if res.errors or res.plan is None:
            errors = [d for d in res.diagnostics if d.severity is Severity.ERROR]
            raise PlanError(f"{plan} has errors:\n" + "".join(
                render([d], res.sources, "concise") + (f"  help: {d.help}\n" if d.help else "") for d in errors))
        plan = res.plan
    else:  # a value the resolver made (no sources): the rules alone
        errors = [d for d in run_rules(CheckContext(plan, {}, {}), RULES) if d.severity is Severity.ERROR]
        if errors:
            raise PlanError(f"{plan.path or 'the plan'} has errors:\n" + "".join(
                f"  error[{d.code}]: {d.message}\n" + (f"  help: {d.help}\n" if d.help else "") for d in errors))
    try:
        return complete(plan)
    except IncompletePlan as e:
        raise PlanError(str(e)) from e


# ------------------------------------------------------------------------------ passes
class ParallelModel(nn.Module):
    """The model under a plan on this rank. `forward(*args, **kwargs)`: the model's output with the global
    loss (a batch up to the plan's, either mode: runtime.programs); `step` the loss alone, with backward
    and gradient sums; `optimizer()`: ZeRO's."""

    def __init__(self, model: nn.Module, prog: Program, groups: MeshGroups, layouts: dict[str, ParamLayout],
                 code: str, device: torch.device, recorder=None, blocks: Sequence[Block] = ()) -> None:
        super().__init__()
        self.module = model
        self.program = prog
        self.groups = groups
        self.layouts = layouts
        self.code = code
        self.device = device
        self.rt = Runtime(prog, groups, device, recorder)
        self.rt.modules = model
        # ZeRO-2/3 per block: the blocks `code` runs through rt.block (their parameters are read there)
        self.blocks = tuple(blocks)
        self._in_blocks = {f for b in blocks for f, _ in model.get_submodule(b.name).named_parameters(
            prefix=b.name, remove_duplicate=False)}
        if blocks:
            self.rt.block = BlockCaller(model, self._scaled)
        scope: dict = {}
        exec(compile(code, f"<planlang rank {dist.get_rank()}>", "exec"), scope)  # noqa: S102 - our codegen
        self._step = scope["step"]
        self._inputs = [v for v in prog.graph.values.values() if v.kind == "input"]
        self.plan_optimizer: CompleteOptimizer | None = None  # set by apply
        self.fsdp_axes: tuple[str, ...] = ()  # the axes FSDP2 shards over (ZeRO-2/3), set by shard_optimizer
        self.grad_scale: dict[str, float] = {}  # parameter -> factor on its gradient (ZeRO-2/3, shard_optimizer)
        self._grad_sync: GradSync | None = None  # made at the first forward
        self._pending_loss: torch.Tensor | None = None  # the last global loss, its all-reduce possibly in flight
        self.precision = T.Precision()  # the plan's (set by apply): autocast, loss scale, reduce dtype
        self.loss_scale: LossScale | None = None
        # a step's microbatches (the plan's top-level `microbatches`, set by apply): the program is one
        # microbatch's, and `step` runs it this many times before the gradients are summed once
        self.microbatches = 1
        # one program per (input shapes, mode): apply's, and those lowered for a shorter batch or the other
        # mode (planlang.runtime.programs); None when the caller gave the program (no re-lowering)
        self.programs: Programs | None = None
        self.program_key: Key = (tuple(tuple(v.shape) for v in self._inputs), model.training, False)
        self.plan_shapes = self.program_key[0]  # the plan's (one microbatch's) shapes
        # `pm(...)` binds its arguments by this (set by apply: the plan's inputs, the loss' target names)
        self.call_signature = CallSignature(tuple(v.ref for v in self._inputs))
        self._loss_only = False  # `step`'s calls: the loss-only program (no output kept alive)
        self._sums_pending = False  # a backward ran since the last `sync_grads` (the optimizer finishes them)
        self.train(model.training)

    def install(self, c: Compiled, key: Key) -> None:
        """Run program `c` from now on (planlang.runtime.programs.Programs.select)."""
        if [b.name for b in c.blocks] != [b.name for b in self.blocks]:
            raise PlanError(f"the program for {list(key[0])} has ZeRO blocks {[b.name for b in c.blocks]}, the "
                            f"plan's {[b.name for b in self.blocks]}: run batches of the plan's shape")
        rt = Runtime(c.program, self.groups, self.device, self.rt.recorder)
        rt.modules, rt.block, rt.step_index = self.rt.modules, self.rt.block, self.rt.step_index
        if c.program.grad_sync != self.program.grad_sync:  # (a shorter sequence: a sum moved to the use)
            self.finish_grad_sums()  # the gradients so far get the sums of the program that made them
            if self._grad_sync is not None:
                self._grad_sync.remove()
            self._grad_sync = None  # made again at the next forward, from the new program's sums
            if self.fsdp_axes:
                self.grad_scale = fsdp_grad_scale(c.program, self.fsdp_axes, self.groups)
        self.program, self.code, self._step, self.rt, self.blocks = c.program, c.code, c.step, rt, c.blocks
        self._inputs = [v for v in c.program.graph.values.values() if v.kind == "input"]
        self.program_key = key

    @property
    def mesh(self) -> CompleteMesh:
        return self.program.mesh

    def local_input(self, value_name: str, t: torch.Tensor) -> torch.Tensor:
        """This rank's piece of an input given whole (the global batch) or already as the local piece."""
        v = self.program.graph.values[value_name]
        spec = self.program.input_specs[value_name]
        if tuple(t.shape) == v.shape:
            return t[local_slices(v.shape, spec, self.mesh, self.groups.coords)].to(self.device)
        if tuple(t.shape) == local_shape(v.shape, spec, self.mesh):
            return t.to(self.device)
        one = (f" for one of its {self.microbatches} microbatches (`step` cuts a step's batch into them; "
               "forward runs one)") if self.microbatches > 1 else ""
        raise PlanError(f"input `{v.ref}` has shape {list(t.shape)}; the plan declares {list(v.shape)}{one} "
                        f"(local piece {list(local_shape(v.shape, spec, self.mesh))} under {spec})")

    def forward(self, *args: torch.Tensor, **kwargs: torch.Tensor):
        """The model's forward under the plan: what the model returns (call_outputs.build_output) with
        `loss` the global loss, with autograd (`out.loss.backward()`, then the optimizer's step, which
        finishes the gradient sums); the output's other tensors are this rank's pieces, detached
        (`pm.whole(out)` gathers them). Keywords name the plan's inputs or the loss' targets."""
        loss_only = self._loss_only
        if not loss_only:
            args = bind_call(self.call_signature, args, kwargs)
        if len(args) != len(self._inputs):
            names = ", ".join(v.ref for v in self._inputs)
            raise PlanError(f"expected {len(self._inputs)} tensors ({names}), got {len(args)}")
        if self.programs is not None:  # a shorter batch, the other mode, the output: its own program
            self.programs.select(self, args, 1, outputs=not loss_only)
        elif not loss_only:  # apply(program=...): the caller's program returns the loss alone
            raise PlanError("this ParallelModel runs the program apply(program=...) was given: use `pm.step`")
        local = [self.local_input(v.name, a) for v, a in zip(self._inputs, args)]
        self._gradient_sums()  # before backward: its hooks start the bucket sums as gradients arrive
        params = {n: self._scaled(n, p) for n, p in self.module.named_parameters(remove_duplicate=False)
                  if n not in self._in_blocks}  # a block's own are read when it runs (rt.block)
        with autocast(self.precision, self.device.type):
            result = self._step(self.rt, params, *local)
        loss, leaves = (result, ()) if loss_only else result
        self.rt.step_index += 1
        axes = self.program.layouts[self.program.loss].partial
        if axes:
            self._wait_loss()
            self._pending_loss = loss = GlobalLoss.apply(loss, tuple(axes), self.groups)
        if loss.requires_grad:  # the gradient sums are due once a backward runs through it
            loss.register_hook(self._backward_ran)
        if loss_only:
            return loss
        if self.loss_scale is not None and loss.requires_grad:  # `out.loss.backward()` yields step's scaled gradients
            loss = ScaleGrad.apply(loss, self.loss_scale.value)
        return build_output(self.program.graph.output_tree, leaves, loss, output_pieces(self.program))

    def _backward_ran(self, grad: torch.Tensor) -> None:
        self._sums_pending = True

    def finish_grad_sums(self) -> None:
        """`sync_grads` if a backward ran since the last one (the optimizer's step and `clip_grad_norm_`)."""
        if self._sums_pending:
            self.sync_grads()

    def whole(self, out):
        """A copy of `pm(...)`'s output with every tensor whole on every rank: all-gathered over the axes
        that split it, a partial sum summed (call it on every rank). The loss is global already."""
        return whole(out, gather_whole(self.mesh, self.groups))

    def step_loss(self, *args: torch.Tensor) -> torch.Tensor:
        """`step`'s forward alone (inputs then targets): the global loss from the loss-only program."""
        with self._loss_call():
            return self(*args)

    @contextlib.contextmanager
    def _loss_call(self):
        """`self(...)` inside returns the global loss alone, from the loss-only program (`step`'s)."""
        before, self._loss_only = self._loss_only, True
        try:
            yield
        finally:
            self._loss_only = before

    def _scaled(self, fqn: str, p: torch.Tensor) -> torch.Tensor:
        return ScaleGrad.apply(p, self.grad_scale[fqn]) if fqn in self.grad_scale else p

    def _wait_loss(self) -> None:
        """Complete the previous step's loss all-reduce if nobody read the loss: a collective must not be
        left pending (at exit, gloo aborts on an unfinished one)."""
        pending, self._pending_loss = self._pending_loss, None
        if pending is not None and hasattr(pending, "wait"):
            pending.wait()

    def step(self, *args: torch.Tensor) -> torch.Tensor:
        """One training step's forward and backward (`args` = inputs then targets, as for forward) and
        the gradient sums the lowering deferred; returns the global loss (detached).

        With the plan's `microbatches N` (gradient accumulation) the step's inputs (the global batch or
        this rank's piece, as for forward) are cut into N equal microbatches along their batch dim, run
        one after another, each loss divided by N before its backward: the gradients accumulate in
        `.grad` with no sum between microbatches (GradSync's `no_sync`, FSDP2's
        `set_requires_gradient_sync(False)`), and are summed over the data axes once, after the last
        backward. The returned loss is the mean of the microbatches' losses: with a loss that is a mean
        over samples (or tokens), the loss and the gradients of the whole batch (as a pipeline's
        microbatches, planlang.runtime.pipeline)."""
        m = self.microbatches
        if m == 1:
            with self._loss_call():
                loss = self(*args)
            (loss if self.loss_scale is None else self.loss_scale.scale(loss)).backward()
            self.sync_grads()
            return loss.detach()
        if self.programs is not None and len(args) == len(self._inputs):
            self.programs.select(self, args, m)
        total: torch.Tensor | None = None
        for i, micro in enumerate(self.microbatch_inputs(args)):
            last = i == m - 1
            # no_sync: FSDP2 (ZeRO-2/3) and the data axes' sums start only in the last microbatch's backward
            with contextlib.nullcontext() if last else self.no_sync(), self._loss_call():
                loss = self(*micro) / m
                (loss if self.loss_scale is None else self.loss_scale.scale(loss)).backward()
            total = loss.detach() if total is None else total + loss.detach()
        self.sync_grads()
        assert total is not None
        return total

    def microbatch_inputs(self, args: Sequence[torch.Tensor]) -> list[tuple[torch.Tensor, ...]]:
        """`args` (a step's inputs then targets, each the global tensor or this rank's piece) cut into the
        step's microbatches: each along the one dim where it is `microbatches` times the program's
        (one microbatch's) global or local shape."""
        m = self.microbatches
        if len(args) != len(self._inputs):
            names = ", ".join(v.ref for v in self._inputs)
            raise PlanError(f"expected {len(self._inputs)} tensors ({names}), got {len(args)}")
        cut = []
        for v, t in zip(self._inputs, args):
            spec = self.program.input_specs[v.name]
            dim = None
            for want in (v.shape, local_shape(v.shape, spec, self.mesh)):
                diff = [d for d in range(t.dim()) if t.shape[d] != want[d]] if t.dim() == len(want) else None
                if diff is not None and len(diff) == 1 and t.shape[diff[0]] == m * want[diff[0]]:
                    dim = diff[0]
                    break
                if diff == [] and not want:  # a scalar: the same in every microbatch
                    dim = -1
                    break
            if dim is None:
                raise PlanError(f"input `{v.ref}` has shape {list(t.shape)}; a step of {m} microbatches takes "
                                f"{m} x {list(v.shape)} along its batch dim (or this rank's piece, {m} x "
                                f"{list(local_shape(v.shape, spec, self.mesh))})")
            cut.append([t] * m if dim < 0 else list(t.chunk(m, dim)))
        return [tuple(c[i] for c in cut) for i in range(m)]

    def optimizer(self, cls: type[torch.optim.Optimizer] | None = None, **kwargs) -> torch.optim.Optimizer:
        """The plan's optimizer over this rank's parameters: ZeroRedundancyOptimizer over the ZeRO axis
        for `zero = 1`, a plain optimizer over FSDP2's shards for `zero = 2 | 3` (apply sharded them),
        the torch class otherwise. `cls` and `kwargs` replace the plan's class and arguments."""

        try:
            params: list[torch.Tensor] = [p for p in self.parameters() if p.requires_grad]
            opt = wrap_optimizer(params, self.precision,
                                 lambda ps: build_optimizer(ps, self.plan_optimizer, self.groups, cls=cls, **kwargs),
                                 fsdp=bool(self.fsdp_axes), loss_scale=self.loss_scale)
        except OptimizerError as e:
            raise PlanError(str(e)) from e
        # after `out = pm(...); out.loss.backward()` the deferred sums are finished before the step (a
        # no-op after `step`, which finished them)
        return sums_before_step(opt, self.finish_grad_sums)

    def sync_grads(self) -> None:
        """Sum each parameter's gradient over the axes the lowering deferred (data parallelism), in flat
        buckets whose all-reduces started during backward (planlang.runtime.grad_sync); this waits for
        them and writes the sums back. Under ZeRO-2/3, FSDP2 has reduce-scattered over its axes in
        backward already; the other axes are summed here on the local shard (a sum is linear, so summing
        shards equals sharding the sum)."""
        self._sums_pending = False
        self._gradient_sums().finish()
        self._wait_loss()

    @contextlib.contextmanager
    def no_sync(self):
        """Backwards inside accumulate gradients without starting their sums (gradient accumulation):
        call `sync_grads` after the last backward, outside. Under ZeRO-2/3 FSDP2's reduce-scatters wait
        too (`set_requires_gradient_sync(False)` inside): the backward after the block reduce-scatters
        the accumulated gradients once, as DDP's `no_sync` does for its all-reduce."""
        gs = self._gradient_sums()
        fsdp = self if isinstance(self, FSDPModule) else None
        gs.no_sync = True
        if fsdp is not None:
            fsdp.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            gs.no_sync = False
            if fsdp is not None:
                fsdp.set_requires_gradient_sync(True)

    def _gradient_sums(self) -> GradSync:
        if self._grad_sync is None:
            # the parameters backward gives a gradient (a pooler the loss does not use gets none): the
            # buckets hold those alone, on every rank alike
            trained = trained_parameters(self.program)
            sync = {fqn: tuple(a for a in self.program.grad_sync.get(fqn, ()) if a not in self.fsdp_axes)
                    for fqn, _ in self.module.named_parameters() if fqn in trained}
            # FSDP2 (ZeRO-2/3) runs its own hooks on its sharded parameters: sum after backward there
            self._grad_sync = GradSync(list(self.module.named_parameters()), sync, self.groups, self.rt.recorder,
                                       overlap=not self.fsdp_axes, reduce_dtype=torch_dtype(self.precision.reduce))
        return self._grad_sync

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Every parameter gathered whole (for tests and export)."""
        return self._gathered(lambda p: p)

    def full_grads(self) -> dict[str, torch.Tensor]:
        """Every parameter's gradient gathered whole (parameters without a gradient are left out), the
        deferred sums finished first (`finish_grad_sums`)."""
        self.finish_grad_sums()
        return self._gathered(lambda p: p.grad)

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0,
                        error_if_nonfinite: bool = False) -> torch.Tensor:
        """torch.nn.utils.clip_grad_norm_ of the whole model (planlang.runtime.clip): the norm of every
        gradient element once, over all ranks' pieces, returned (f32) on every rank; after `step`, before
        the optimizer's step."""
        self.finish_grad_sums()
        return clip_model(self, list(self.module.named_parameters()), self.layouts, max_norm, norm_type,
                          error_if_nonfinite, self.loss_scale)

    def full_state_dict(self, all_ranks: bool = False) -> dict[str, torch.Tensor]:
        """The whole parameters and buffers on the CPU, on rank 0 or `all_ranks` (planlang.runtime.save_load)."""
        return full_state_dict(self, all_ranks)

    def _gathered(self, pick) -> dict[str, torch.Tensor]:
        out = {}
        resharded(self)  # a forward without backward (no_grad) leaves FSDP2 units unsharded
        for fqn, p in self.module.named_parameters():
            t = pick(p)
            if t is None:
                continue
            if isinstance(t, DTensor):  # ZeRO-2/3: FSDP2's dim-0 shard of the local piece
                t = t.full_tensor()
            lay = self.layouts[fqn]
            rep = Spec(tuple(() for _ in lay.shape))
            t = redistribute(t.detach(), lay.shape, lay.spec, rep, self.mesh, self.groups)
            if lay.blocked is not None:
                t = unblocked_order(t, lay.blocked, block_factor(lay.blocked, self.mesh))
            out[fqn] = t
        return out


def _fsdp_setup(plan: CompletePlan, groups: MeshGroups):
    """(stage, DeviceMesh, its axis names) when the plan's ZeRO-2/3 shards over more than one rank
    (`plan.dims.fsdp`: the ZeRO axis, or HSDP's two axes), else None."""
    dims = plan.dims
    if not dims.fsdp:
        return None
    return dims.zero_stage, fsdp_mesh(groups, dims.fsdp), dims.fsdp


def zero_blocks(model: nn.Module, prog: Program, plan: CompletePlan) -> list[Block]:
    """The blocks pass 7 shards as FSDP2 units of their own (planlang.runtime.zero_blocks): none
    without ZeRO-2/3 over an axis of more than one device. (Generated code runs a block through
    `rt.block` whether or not FSDP2 wraps its module: the same step either way.)"""
    if not plan.dims.fsdp:
        return []
    return block_ranges(model, prog)[0]


def shard_optimizer(pm: ParallelModel, plan: CompletePlan, groups: MeshGroups) -> None:
    """Pass 7, ZeRO-2/3: FSDP2 `fully_shard` over the ZeRO axis (with one more data axis before it in the
    mesh: HSDP) of every block module `pm.blocks` names (one unit each; ZeRO-3 reshards it after its
    forward, and each block prefetches the next one's all-gather in forward, the previous one's in
    backward), then of `pm` itself, the root unit holding every other parameter. FSDP2 gathers a unit's
    parameters before it runs and reduce-scatters its gradients after its backward; that sum replaces
    `sync_grads`' all-reduce over those axes, so the gradient divide factor is 1 (the lowering's loss is
    already the global one). ZeRO-1 needs nothing here: `pm.optimizer()` shards the optimizer state
    with ZeroRedundancyOptimizer."""

    setup = _fsdp_setup(plan, groups)
    if setup is None:
        return
    stage, mesh, mesh_axes = setup
    z = mesh_axes[-1]
    for fqn, lay in pm.layouts.items():
        split = [a for a in mesh_axes if a in lay.spec.used_axes()]
        if split:
            raise PlanError(f"ZeRO-{stage} over `{z}`: parameter `{fqn}` is already split over `{split[0]}` "
                            f"({lay.spec}); FSDP2 shards parameters replicated over {', '.join(mesh_axes)}; "
                            f"take `{split[0]}` out of its spec")
    pm.grad_scale = fsdp_grad_scale(pm.program, mesh_axes, groups)

    units = [pm.module.get_submodule(b.name) for b in pm.blocks]
    mp = {} if mp_policy(plan.precision) is None else {"mp_policy": mp_policy(plan.precision)}
    sharded = [fully_shard(unit, mesh=mesh, reshard_after_forward=(stage == 3), **mp) for unit in units]
    # the root unit is never resharded after forward (FSDP2's own default for the root): its forward spans
    # the whole step's forward, and backward starts with the head it holds, so resharding it would only
    # all-gather it again at once (one all-gather of the embeddings and head per step, tests/runtime/
    # test_zero_traffic_gloo.py); its peak is the same either way (planlang.model.price.estimate counts it whole)
    root = fully_shard(pm, mesh=mesh, reshard_after_forward=False, **mp)
    for unit in [*sharded, root]:  # per unit: the FSDPModule setters act on their own module's parameters
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
    for before, after in zip(sharded, sharded[1:]):
        before.set_modules_to_forward_prefetch([after])
        after.set_modules_to_backward_prefetch([before])
    pm.fsdp_axes = mesh_axes


def _apply_program_pipeline(model: nn.Module, plan: CompletePlan, groups: MeshGroups, loss_fn, targets, device,
                            recorder, strict):
    """`apply` for a pipeline plan with tensor parallelism: the program lowered for one microbatch, its
    parameters placed, then cut into this rank's stages (planlang.runtime.program_pipeline)."""
    try:
        micro = microbatch_plan(plan)
    except LoweringError as e:
        raise PlanError(str(e)) from e
    m = plan.pipeline.microbatches if plan.pipeline is not None else 1
    if targets is not None:  # examples for the global batch: one microbatch's
        targets = tuple(t[: max(1, t.shape[0] // m)] if t.dim() else t for t in targets)
    strict = os.environ.get(STRICT_ENV) == "1" if strict is None else strict
    prog = report_fallbacks(lower_once(model, micro, loss_fn, targets), strict)
    meta = meta_copy(model)  # another batch or mode lowers again from it (ProgramPipelinedModel.relower)
    prec = plan.precision
    fsdp = bool(plan.dims.fsdp)
    layouts = shard_parameters(model, prog, groups.coords, device, storage_dtype(prec, fsdp) if prec.mixed else None)
    cast_buffers(model, prec)
    try:
        pm = build_program_pipeline(model, plan, prog, layouts, groups, device, recorder)
    except (PipelineError, LoweringError) as e:
        raise PlanError(str(e)) from e
    pm.relower, pm.fixed_shape = Relower(meta, loss_fn, relowering(strict)), False
    return pm


def apply(model: nn.Module, plan: T.Plan | str | Path, *, loss_fn: Callable | None = None,
          targets: tuple[torch.Tensor, ...] | None = None, device: torch.device | str | None = None,
          recorder=None, strict: bool | None = None, program: Program | None = None, compile: bool | str = False):
    """Parallelise `model` (built the same way on every rank) under `plan` on this rank: a `ParallelModel`,
    or for a plan with a `pipeline` a `PipelinedModel` (docs/runtime.md: `pm(...)`, `step`, `optimizer`, ...).
    An op that must run on the whole batch although the plan splits it (PL364) is a warning on rank 0's
    stderr; with `strict` (default: the environment's PLANLANG_STRICT=1, which `--strict` sets) a PlanError.
    `program`: the plan's program when the caller lowered it already (validation, for the estimate's run
    on meta), for a plan without a pipeline. `compile`: True (inductor) or a torch.compile backend's name."""
    if compile:  # planlang.runtime.compiled: the step (a pipeline: its stage modules) under torch.compile
        return compile_model(apply(model, plan, loss_fn=loss_fn, targets=targets, device=device, recorder=recorder,
                                   strict=strict, program=program), "inductor" if compile is True else str(compile))
    plan = load_plan(plan)
    user_loss = loss_fn
    # found once, on this model: a `loss` method is bound to it, whichever runtime path runs the plan
    loss_fn = loss_fn or plan_loss(plan, model)
    if not dist.is_initialized():
        raise PlanError("torch.distributed is not initialised: launch with `planlang run` or torchrun and call "
                        "torch.distributed.init_process_group first")
    if loss_fn is None and dist.get_rank() == 0:  # the output's sum trains: said, not silent (PL370)
        note = sum_loss_note(model, meta_inputs(plan.inputs))
        if note:
            sys.stderr.write(note + "\n")
    world = world_size(plan)
    if world != dist.get_world_size():
        raise PlanError(f"the plan's mesh has {world} devices but {dist.get_world_size()} processes were "
                        f"launched; run with --nproc-per-node {world}")
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    device = torch.device(device)
    if plan.pipeline is not None and heterogeneous(plan):  # stages of their own degrees: each on its own mesh
        return apply_heterogeneous(model, plan, loss_fn, targets, device, recorder,
                                   os.environ.get(STRICT_ENV) == "1" if strict is None else strict)
    groups = MeshGroups(plan_mesh(plan), device.type)
    if plan.pipeline is not None and not plan.dims.tensor:
        try:
            return apply_pipeline(model, plan, groups, loss_fn=loss_fn, device=device)
        except PipelineError as e:
            raise PlanError(str(e)) from e
    if plan.pipeline is not None:  # pipeline x tensor parallelism: the program, cut into stages
        return _apply_program_pipeline(model, plan, groups, loss_fn, targets, device, recorder, strict)
    # with `microbatches N` (gradient accumulation) the program is one microbatch's; `step` runs it N times
    m = plan.microbatches
    if targets is not None and m > 1:  # examples for the global batch: one microbatch's
        targets = tuple(t[: max(1, t.shape[0] // m)] if t.dim() else t for t in targets)
    prog = program if program is not None else lower_once(model, accumulation_microbatch(plan), loss_fn, targets)
    strict = os.environ.get(STRICT_ENV) == "1" if strict is None else strict
    report_fallbacks(prog, strict)
    meta = meta_copy(model) if program is None else None  # re-lowering (shorter batches, eval) traces it
    fsdp = _fsdp_setup(plan, groups) is not None
    dtype = storage_dtype(plan.precision, fsdp) if plan.precision.mixed else None
    layouts = shard_parameters(model, prog, groups.coords, device, dtype)
    cast_buffers(model, plan.precision)
    compile_program = compiler({"model": model, "plan": plan, "rank": dist.get_rank(), "coords": groups.coords,
                                "zero_blocks": zero_blocks})
    first = compile_program(prog)
    pm = ParallelModel(model, prog, groups, layouts, first.code, device, recorder, first.blocks)
    if meta is not None:
        pm.programs = Programs(meta, plan, user_loss if user_loss is not None else plan_loss(plan, meta),
                               relowering(strict), compile_program)
        pm.programs.add(pm.program_key, first)
    refs = [v.ref for v in pm._inputs]
    k = len(plan.inputs)
    pm.call_signature = CallSignature(tuple(refs[:k]), target_names(loss_fn, refs[k:]),
                                      tuple(tuple(inp.shape) for inp in plan.inputs),
                                      tuple(batch_dim(inp) for inp in plan.inputs))
    pm.plan_optimizer = plan.optimizer
    pm.precision = plan.precision
    pm.microbatches = m
    pm.loss_scale = None if plan.precision.loss_scale is None else LossScale(plan.precision.loss_scale)
    shard_optimizer(pm, plan, groups)
    return pm
