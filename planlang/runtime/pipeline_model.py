"""`planlang.apply` for a pipeline plan: `apply_pipeline` cuts and wraps the stages of a validated plan
(the plan's checkpoint groups, its precision, ZeRO-2/3 as one FSDP2 unit per stage; the checker's PL401,
PL402, PL415 and PL416 have matched the pipeline to what runs) and returns a `PipelinedModel`, the
runner of planlang.runtime.pipeline behind ParallelModel's training-loop interface (`step`, `optimizer`,
`full_grads`, ...)."""
from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from typing import Callable

import torch
import torch.distributed as dist
from torch import fx, nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_flatten, tree_unflatten

from planlang.cost.layout import local_shape, local_slices
from planlang.model.capture.graph_values import flatten_output
from planlang.model.capture.load import build_model, meta_inputs, plan_loss
from planlang.model.capture.trace import probe_modules
from planlang.model.program.recompute import wrap_chain, wrap_each
from planlang.plan.checkpoints import checkpoint_groups
from planlang.plan.complete import CompletePlan, plan_mesh
from planlang.plan.data import batch_dim
from planlang.plan.types import Spec

from .call_outputs import (CallSignature, Piece, PlanOutput, bind_call, build_output, gather_whole, target_names,
                           whole, with_loss)
from .clip import clip_model
from .pipeline import PipelineError, PipelineRunner, build_pipeline
from .save_load import full_state_dict, resharded
from .stage_rows import microbatch_major
from .programs import PlanError
from .precision import LossScale, autocast, cast_buffers, mp_policy, storage_dtype, torch_dtype, wrap_optimizer
from .zero import OptimizerError, build_optimizer


class PipelinedModel:
    """`planlang.apply(model, plan)` for a plan with a `pipeline`: this rank's stages and the schedule,
    with the interface of `planlang.runtime.apply.ParallelModel` that a training loop uses.

    `step(*inputs, *targets)` runs forward and backward of the plan's microbatches (the schedule) on this
    data replica's piece of the batch (given whole, or already as the piece) and returns the global mean
    loss on every rank (the last stage's, broadcast over the pipeline axis). `optimizer()` is the plan's
    optimizer over this rank's stage parameters (ZeRO-1 over a data axis: ZeroRedundancyOptimizer).
    `full_parameters()` / `full_grads()` gather every parameter of the model from the stage that holds
    it (for tests and export). `pm(*args, **kwargs)` returns the model's output with the global loss (with
    autograd when training: the whole step runs in the call, `_StepGradients`), `whole(out)` its outputs
    whole on every rank."""

    def __init__(self, runner: PipelineRunner, plan: CompletePlan, groups,
                 shapes: dict[str, tuple[torch.Size, torch.dtype]],
                 fsdp_axes: tuple[str, ...] = ()):
        self.runner, self.plan, self.groups = runner, plan, groups
        if plan.precision.loss_scale is not None:  # the optimizer unscales, and skips a step that overflowed
            runner.loss_scale = LossScale(plan.precision.loss_scale)
        self.fsdp_axes = fsdp_axes  # ZeRO-2/3: the stage modules are FSDP2 units over these axes
        # as ParallelModel's: the persistent gradient buckets (benches register them with MemTracker)
        self._grad_sync = runner.grad_sync
        self.checkpoint_groups: list[list[str]] = []  # the plan's checkpoint groups, as wrapped
        self.pp_group = runner.pp_group
        self.training = all(m.training for m in runner.stage_modules.values())  # the model's mode
        self._shapes = shapes  # every parameter of the model (all stages), in model order
        owned: list = [None] * dist.get_world_size(self.pp_group)
        dist.all_gather_object(owned, [n for n, _ in runner.named_parameters()], group=self.pp_group)
        self._owner = {n: r for r, names in enumerate(owned) for n in names}
        self._last = runner.layout.rank_of(runner.layout.num_stages - 1)
        self._specs = {d.input: d.spec for d in plan.data}
        mesh = plan_mesh(plan)
        self._local_shape = lambda inp: local_shape(inp.shape, self._spec(inp), mesh)

    def __repr__(self) -> str:
        return f"PipelinedModel({self.runner})"

    def __call__(self, *args: torch.Tensor, **kwargs: torch.Tensor):
        """The model's output for one batch (inputs then at most one target, by position or by name:
        call_outputs.bind_call) with `loss` the global mean loss on every rank. Training with gradients on, the whole step runs here (forward and backward of every
        microbatch, as `step`: a pipeline has no forward alone) and `loss.backward()` hands its gradients to
        `.grad` (`_StepGradients`); otherwise the forward-only schedule runs (`evaluate`). The model's other
        outputs (logits) are this data replica's piece on the ranks of the last stage, None elsewhere."""
        args = self._bound(args, kwargs)
        self._prepared(args, self.returns_outputs)
        inputs, target = self._pieces(args)
        runner = self.runner
        self._rows = int(inputs[0].shape[0]) if inputs and inputs[0].dim() else -1  # this replica's batch
        if not (torch.is_grad_enabled() and self.training):
            loss, out = runner.run(inputs, target, backward=False, outputs=self.returns_outputs)
            return self._output(self._everywhere(loss), out)
        prev = runner.take_grads()
        try:
            loss, out = runner.run(inputs, target, outputs=self.returns_outputs)
            fresh = runner.take_grads()  # the step's gradients, until backward hands them back
        finally:
            runner.put_grads(prev)
        anchor = torch.zeros((), device=runner.device, requires_grad=True)
        return self._output(_StepGradients.apply(anchor, self._everywhere(loss), runner, fresh), out)

    training = True

    def train(self, mode: bool = True) -> "PipelinedModel":
        """Every stage module of this rank in training mode (dropout on, BatchNorm's batch statistics) or not."""
        for mod in self.runner.stage_modules.values():
            mod.train(mode)
        self.training = mode
        return self

    def eval(self) -> "PipelinedModel":
        return self.train(False)

    @property
    def mesh(self):
        return self.plan.mesh

    def named_parameters(self):
        return self.runner.named_parameters()

    def parameters(self):
        return self.runner.parameters()

    def zero_grad(self) -> None:
        self.runner.zero_grad()

    def optimizer(self, cls: type[torch.optim.Optimizer] | None = None, **kwargs) -> torch.optim.Optimizer:
        """The plan's optimizer over this rank's stage parameters (`cls`, `kwargs` replace the plan's)."""

        try:
            params = [p for p in self.parameters() if p.requires_grad]
            return wrap_optimizer(params, self.plan.precision,
                                  lambda ps: build_optimizer(ps, self.plan.optimizer, self.groups, cls=cls, **kwargs),
                                  fsdp=bool(self.fsdp_axes), loss_scale=self.runner.loss_scale)
        except OptimizerError as e:
            raise PipelineError(str(e), "fix the plan's `optimizer` or the arguments of pm.optimizer()") from e

    # ------------------------------------------------------------------ a step
    def _spec(self, inp):
        spec = self._specs.get(inp.name)
        return spec if spec is not None else Spec(tuple(() for _ in inp.shape))

    def _piece(self, inp, t: torch.Tensor) -> torch.Tensor:
        """This replica's piece of input `inp` given whole (the plan's batch or a shorter one: planlang.runtime.
        programs says what divides what) or as the piece."""
        if tuple(t.shape) == tuple(self._local_shape(inp)):
            return t
        b, spec = batch_dim(inp), self._spec(inp)
        n, full = (t.shape[b], inp.shape[b]) if t.dim() == len(inp.shape) else (-1, 0)
        if n < 0 or any(t.shape[d] != inp.shape[d] for d in range(t.dim()) if d != b):
            raise PipelineError(f"input `{inp.name}` has shape {list(t.shape)}; the plan declares {list(inp.shape)}",
                                f"pass the global batch {list(inp.shape)} (or a shorter one) or this replica's "
                                f"piece {list(self._local_shape(inp))}")
        if n != full:
            self._check_shorter(inp.name, n, full, spec.dims[b] if b < len(spec.dims) else ())
        return t[local_slices(tuple(t.shape), spec, self.mesh, self.groups.coords)]

    def _check_shorter(self, name: str, n: int, full: int, axes) -> None:
        m, axes = self.runner.layout.microbatches, tuple(axes) if isinstance(axes, tuple) else ()
        degree = math.prod(self.groups.size(a) for a in axes)
        if n > full:
            raise PlanError(f"input `{name}` has a batch of {n}, larger than the plan's {full}: a larger batch "
                            "needs a plan that declares it")
        if n % (m * degree):
            raise PlanError(f"input `{name}` has a batch of {n}: it must split over {degree} ranks "
                            f"({', '.join(axes) or 'no data axis'}) into {m} microbatches each, so a multiple of "
                            f"{m * degree}")
        if self.fixed_shape:
            raise PlanError(f"input `{name}` has a batch of {n}, the plan's {full}: pipeline x tensor parallelism "
                            "runs the program lowered for the plan's microbatch only; pass batches of the plan's size")

    fixed_shape = False  # pipeline x tensor parallelism: the stages are one lowered program's (its batch only)

    def _target_piece(self, t: torch.Tensor, n: int | None) -> torch.Tensor:
        """A target split like the first input's batch dim (dim 0) when given for the global batch of `n`
        samples (None: the inputs were given as this replica's pieces)."""

        first = self.plan.inputs[0]
        spec = self._spec(first)
        if n is not None and t.dim() and t.shape[0] == n and spec.dims and spec.dims[0]:
            tspec = Spec((tuple(spec.dims[0]),) + tuple(() for _ in t.shape[1:]))
            return t[local_slices(tuple(t.shape), tspec, self.mesh, self.groups.coords)]
        return t

    def _pieces(self, args) -> tuple[tuple[torch.Tensor, ...], torch.Tensor | None]:
        k = len(self.plan.inputs)
        if len(args) not in (k, k + 1):
            names = ", ".join(i.name for i in self.plan.inputs)
            raise PipelineError(f"expected the {k} inputs ({names}) and at most one target, got {len(args)} tensors",
                                "call pm.step(*inputs, target)")
        if self.own_degrees:
            self._whole_batch(args, k)
        dev = self.runner.device
        first = self.plan.inputs[0]
        n = None if tuple(args[0].shape) == tuple(self._local_shape(first)) else int(args[0].shape[0])
        inputs = tuple(self._piece(i, t).to(dev) for i, t in zip(self.plan.inputs, args[:k]))
        target = self._target_piece(args[k], n).to(dev) if len(args) > k else None
        if self.shares != (1, 1):  # stages of their own degrees: each microbatch as the boundaries move it
            m = self.runner.layout.microbatches
            split = [bool(self._spec(i).dims and self._spec(i).dims[0]) for i in self.plan.inputs]
            if self.runner.has_first:  # (the other ranks' pieces are not read)
                inputs = tuple(microbatch_major(x, self.shares[0], m) if sp else x for x, sp in zip(inputs, split))
            if target is not None and self.runner.has_last and split and split[0]:
                target = microbatch_major(target, self.shares[1], m)
        return inputs, target

    # stages of their own degrees: how many devices of a replica share its rows at a boundary, in the first
    # stage and in the last (planlang.runtime.stage_rows.microbatch_major)
    shares: tuple[int, int] = (1, 1)
    own_degrees = False  # stages of their own degrees (planlang.runtime.heterogeneous)
    needs_target = False  # the loss reads a target (stages of their own degrees refuse a call without one)

    def _whole_batch(self, args, k: int) -> None:
        """Stages of their own degrees take a piece of each argument under their own sizes, so only the plan's
        global batch means the same on every rank: anything else is refused on every rank alike, before the
        schedule starts (a piece one stage took and another refused would leave the first waiting)."""
        for inp, t in zip(self.plan.inputs, args[:k]):
            if tuple(t.shape) != tuple(inp.shape):
                raise PlanError(f"input `{inp.name}` has shape {list(t.shape)}; a pipeline whose stages run on their "
                                f"own degrees runs the plan's global batch {list(inp.shape)} only")
        if self.needs_target and len(args) == k:
            raise PlanError("the loss reads a target, and none was given: pass it after the inputs "
                            "(pm.step(*inputs, target))")

    def _prepared(self, args: tuple, outputs: bool = False) -> None:
        """Ready the stages for these arguments (pp x tp: the program for their batch and the mode)."""

    def _bound(self, args: tuple, kwargs: dict) -> tuple:
        """Inputs then the target (planlang.runtime.call_outputs.bind_call: by position or by the plan's
        input names and the loss' target names, e.g. `labels` of `loss(output, labels)`)."""
        if self._call is None:
            inputs = self.plan.inputs
            loss = getattr(getattr(self, "relower", None), "loss_fn", None) or self.runner.user_loss
            targets = target_names(loss, ("target",)[:_target_count(loss)])
            self._call = CallSignature(tuple(i.name for i in inputs), targets,
                                       tuple(tuple(i.shape) for i in inputs), tuple(batch_dim(i) for i in inputs))
        return bind_call(self._call, args, kwargs)

    _call: CallSignature | None = None

    @property
    def returns_outputs(self) -> bool:
        """Whether the last stage's outputs are the model's (pp x tp: only in a program lowered with them)."""
        return True
    _rows = -1  # this replica's batch in the last call (which outputs are its pieces)

    def _output(self, loss: torch.Tensor, out):
        """The model's output (its own class, or a PlanOutput) with `loss`: on the last stage's ranks
        this replica's pieces, each registered for `whole`; elsewhere its fields None."""
        if not self.runner.has_last or out is None:
            form = self.runner.output_form
            return with_loss(form(None), loss) if form is not None else PlanOutput(loss, None)
        leaves, tree = flatten_output(out)
        return build_output(tree, leaves, loss, [self._batch_piece(t) for t in leaves])

    def _batch_piece(self, t: torch.Tensor) -> Piece | None:
        """An output split like the first input's batch (dim 0 this replica's rows): its global shape
        and layout; None for any other (the same on every replica)."""
        first = self.plan.inputs[0]
        axes = self._spec(first).dims[0] if self._spec(first).dims else ()
        axes = tuple(axes) if isinstance(axes, tuple) else ()
        degree = math.prod(self.groups.size(a) for a in axes)
        if not t.dim() or degree == 1 or t.shape[0] != self._rows:
            return None
        spec = Spec((axes,) + tuple(() for _ in t.shape[1:]))
        return Piece((t.shape[0] * degree,) + tuple(t.shape[1:]), spec)

    def whole(self, out):
        """`out` of `pm(...)` with every output whole on every rank: this replica's pieces gathered over
        the data axes on the last stage's ranks, then sent over the pipeline axis (the loss stays each
        rank's own, with its autograd). A collective: call it on every rank."""
        if self.runner.has_last:
            out = whole(out, gather_whole(self.mesh, self.groups))
        return self._from_last(out)

    def _from_last(self, out):
        """`out` as the last stage's ranks hold it, on every rank of the pipeline axis: its structure with
        each tensor's shape and dtype in place of the tensor (pickled), then the tensors; the loss stays
        each rank's own. (Every rank holds the same kind of output: a PlanOutput, or the model's class.)"""
        if isinstance(out, PlanOutput):
            return PlanOutput(out.loss, self._sent(out.output, out.loss))
        return self._sent(out, out.loss)

    def _sent(self, value, loss: torch.Tensor):
        last = dist.get_rank(self.pp_group) == self._last
        box = [None]
        if last:
            leaves, spec = tree_flatten(value)
            box = [tree_unflatten([_Slot(None, None) if x is loss else _Slot(tuple(x.shape), x.dtype)
                                   if isinstance(x, torch.Tensor) else x for x in leaves], spec)]
        dist.broadcast_object_list(box, group=self.pp_group, group_src=self._last)
        slots, spec = tree_flatten(box[0])
        mine = tree_flatten(value)[0] if last else slots
        got = []
        for x, slot in zip(mine, slots):
            if isinstance(slot, _Slot) and slot.shape is not None:
                t = x.contiguous() if last else torch.empty(slot.shape, dtype=slot.dtype, device=self.runner.device)
                dist.broadcast(t, group=self.pp_group, group_src=self._last)
                got.append(t)
            else:
                got.append(loss if isinstance(slot, _Slot) else slot)
        return tree_unflatten(got, spec)

    def evaluate(self, *args: torch.Tensor) -> torch.Tensor:
        """The loss of one batch (inputs then target, as for `step`), forward only under a forward-only
        schedule (torch's `schedule.eval`): no gradients, no sums, no optimizer state; the global mean loss
        on every rank. In `pm.eval()` mode dropout is off, as `model.eval()` in one process."""
        self._prepared(args)
        inputs, target = self._pieces(args)
        return self._everywhere(self.runner.evaluate(*inputs, target=target))

    def _everywhere(self, loss: torch.Tensor | None) -> torch.Tensor:
        out = loss.detach().clone() if loss is not None else torch.zeros((), device=self.runner.device)
        dist.broadcast(out, group=self.pp_group, group_src=self._last)
        return out

    def step(self, *args: torch.Tensor) -> torch.Tensor:
        """Forward and backward of one batch under the schedule; the global mean loss on every rank."""
        self._prepared(args)
        inputs, target = self._pieces(args)
        return self._everywhere(self.runner.step(*inputs, target=target))

    # ------------------------------------------------------------------ gathering
    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Every parameter of the model, sent by the pipeline rank that holds it."""
        return self._gathered(lambda p: p)

    def full_grads(self) -> dict[str, torch.Tensor]:
        """Every parameter's gradient (those without one are left out), sent by the rank that holds it."""
        return self._gathered(lambda p: p.grad)

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0,
                        error_if_nonfinite: bool = False) -> torch.Tensor:
        """torch.nn.utils.clip_grad_norm_ of the whole model over every stage (planlang.runtime.clip): a
        tied parameter's copies counted once; the norm (f32) on every rank. After `step`."""
        return clip_model(self, list(self.runner.named_parameters()), getattr(self, "layouts", {}), max_norm,
                          norm_type, error_if_nonfinite, self.runner.loss_scale)

    def full_state_dict(self, all_ranks: bool = False) -> dict[str, torch.Tensor]:
        """The whole parameters and buffers on the CPU, on rank 0 or `all_ranks` (planlang.runtime.save_load)."""
        return full_state_dict(self, all_ranks)

    def _whole(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """This rank's copy of a parameter (or gradient) whole: a ZeRO-2/3 shard gathered."""
        return t.full_tensor() if isinstance(t, DTensor) else t

    def _gathered(self, pick) -> dict[str, torch.Tensor]:
        resharded(self)  # an evaluation leaves ZeRO-2/3 stage units gathered: read the shards
        mine = {n: pick(p) for n, p in self.runner.named_parameters()}
        mine = {n: self._whole(n, t) if t is not None else None for n, t in mine.items()}
        have: list = [None] * dist.get_world_size(self.pp_group)
        dist.all_gather_object(have, [n for n, t in mine.items() if t is not None], group=self.pp_group)
        present = {n for names in have for n in names}
        me = dist.get_rank(self.pp_group)
        out = {}
        for name, (shape, dtype) in self._shapes.items():
            if name not in present:
                continue
            owner = self._owner[name]
            t = mine[name].detach().contiguous().clone() if owner == me else \
                torch.empty(shape, dtype=dtype, device=self.runner.device)
            dist.broadcast(t, group=self.pp_group, group_src=owner)
            out[name] = t
        return out


@dataclasses.dataclass(frozen=True)
class _Slot:
    """A tensor of an output sent over the pipeline axis (its shape and dtype; None: the loss, which every
    rank holds)."""
    shape: tuple[int, ...] | None
    dtype: torch.dtype | None


class _StepGradients(torch.autograd.Function):
    """The loss of a step `pm(...)` ran, differentiable: its backward adds the step's gradients (taken
    out of `.grad` when the step ended) times the loss's incoming gradient to `.grad`. The sums over the
    data axes, the tied copies and FSDP2's reduce-scatter are linear, so scaling after them is exact:
    `(out.loss / k).backward()` accumulates a k-th of the step's gradients. Once only (the gradients are
    handed over, not copied)."""

    @staticmethod
    def forward(ctx, anchor: torch.Tensor, loss: torch.Tensor, runner: PipelineRunner,
                grads: dict) -> torch.Tensor:
        ctx.runner, ctx.grads = runner, grads
        return loss.clone()

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        grads, ctx.grads = ctx.grads, None
        if grads is None:
            raise PipelineError("the loss of a pipeline's pm(...) was backpropagated twice: its step's "
                                "gradients were handed to .grad the first time",
                                "call pm(...) again for another backward (or pm.step)")
        ctx.runner.put_grads(grads, grad_output.detach())
        return None, None, None, None


def apply_pipeline(model: nn.Module, plan: CompletePlan, groups, *, loss_fn: Callable | None = None,
                   device: torch.device | None = None) -> PipelinedModel:
    """`planlang.apply` for a pipeline plan (validated: planlang.runtime.apply.load_plan): `build_pipeline`
    and the PipelinedModel around it (pp, pp x dp, ZeRO-1 over a data axis, ZeRO-2/3 with each stage
    one FSDP2 unit over the ZeRO axis)."""
    dims = plan.dims
    stage = dims.zero_stage
    fsdp_axis = dims.fsdp[0] if dims.fsdp else None  # ZeRO-2/3 over more than one device: the ZeRO axis alone
    fsdp = fsdp_axis is not None
    prec = plan.precision
    if prec.mixed:  # the parameters in the dtype they are stored in (FSDP2: its shards, the master copy)
        cast_parameters(model, storage_dtype(prec, fsdp))
        cast_buffers(model, prec)
        loss_fn = loss_fn or plan_loss(plan, model)
        if loss_fn is not None:
            loss_fn = in_precision(loss_fn, prec, device)
    shapes = {n: (p.shape, p.dtype) for n, p in model.named_parameters()}
    checkpoints = plan_checkpoint_groups(plan)
    wrapped: list[list[str]] = []

    def ckpt(module: fx.GraphModule) -> fx.GraphModule:
        wrapped.extend(wrap_checkpoints(module, checkpoints))
        if prec.mixed:
            module.forward = in_precision(module.forward, prec, device)
        return module

    if fsdp_axis is None:
        runner = build_pipeline(model, plan, groups, device=device, loss_fn=loss_fn,
                                transform_stage=lambda _i, module: ckpt(module))
        if runner.grad_sync is not None:  # the plan's precision `reduce`: the dtype the sums run in
            runner.grad_sync.reduce_dtype = torch_dtype(prec.reduce) if prec.mixed else None
        pm = PipelinedModel(runner, plan, groups, shapes)
        pm.checkpoint_groups = wrapped
        return pm
    # ZeRO-2/3: each stage module is one FSDP2 unit over the data axis. torch's pipeline stages drive it
    # (no gradient sync until the last microbatch, then one reduce-scatter); FSDP2 averages over the
    # replicas, which replaces average_gradients (a plain SUM then a division: gloo has no AVG).

    def shard(_index: int, module: fx.GraphModule) -> nn.Module:
        module = ckpt(module)  # FSDP2 goes around the wrapped modules
        policy = mp_policy(prec)
        unit = fully_shard(module, mesh=groups.device_mesh[fsdp_axis], reshard_after_forward=(stage == 3),
                           **({"mp_policy": policy} if policy is not None else {}))
        unit.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
        return module

    runner = build_pipeline(model, plan, groups, device=device, loss_fn=loss_fn, transform_stage=shard,
                            reduce_grads=False)
    pm = PipelinedModel(runner, plan, groups, shapes, fsdp_axes=(fsdp_axis,))
    pm.checkpoint_groups = wrapped
    return pm


def _target_count(loss: Callable | None) -> int:
    """How many targets `loss(output, *targets)` takes: its positional parameters after the output (a
    pipeline passes at most one; `*targets` counts as one)."""
    if loss is None:
        return 0
    try:
        ps = list(inspect.signature(loss).parameters.values())
    except (TypeError, ValueError):
        return 1
    if any(p.kind == p.VAR_POSITIONAL for p in ps):
        return 1
    n = sum(1 for p in ps if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty) - 1
    if n > 1:
        raise PipelineError(f"the loss takes {n} targets; a pipeline passes one to its last stage",
                            "combine the targets into one tensor (or one loss argument)")
    return max(n, 0)


def cast_parameters(model: nn.Module, dtype: torch.dtype) -> None:
    """Every floating parameter of `model` stored in `dtype` (the plan's precision, before the cut)."""
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point():
                p.data = p.data.to(dtype)


def in_precision(fn: Callable, prec, device) -> Callable:
    """`fn` run under the plan's autocast (a stage's forward, the loss on the last stage)."""
    dev = torch.device(device) if device is not None else torch.device("cpu")

    @functools.wraps(fn)
    def run(*args, **kwargs):
        with autocast(prec, dev.type):
            return fn(*args, **kwargs)
    return run


def plan_checkpoint_groups(plan: CompletePlan) -> list[list[str]]:
    """The plan's checkpoint groups as module names in execution order (planlang.model.price.estimate's
    expansion: planlang.plan.checkpoints), the order found by running the model on meta."""

    if not plan.checkpoints or plan.model is None:
        return []
    facts = probe_modules(build_model(plan.model, plan.path), meta_inputs(plan.inputs))
    return checkpoint_groups(plan.checkpoints, facts.all_modules, facts.order)


def wrap_checkpoints(stage: fx.GraphModule, groups: list[list[str]]) -> list[list[str]]:
    """Recompute the checkpoint groups that live in `stage` (a GraphModule of stages.py) in backward,
    with non-reentrant torch.utils.checkpoint; returns those groups.

    A group whose modules the stage calls one after another, each taking exactly the previous one's
    output and nothing else reading it (checked on the stage's graph: blocks of a ModuleList), is
    recomputed as one function — its first module runs the chain, the others pass their input on.
    Any other group is checkpointed module by module (the same numerics; each module's input is kept).
    A group module the stage does not call as a whole (a stage selects a module inside it, so its code
    is inlined) cannot be recomputed and is refused."""

    calls = {str(n.target): n for n in stage.graph.nodes if n.op == "call_module"}
    done = []
    for group in groups:
        inlined = [c for m in group for c in calls if c.startswith(m + ".")]
        if inlined:
            raise PipelineError(
                f"checkpoint group {', '.join(group)} contains `{inlined[0]}`, which a stage selects on its "
                f"own: the pipeline runs the group's modules piece by piece, so they cannot be recomputed",
                "select the group's modules as a whole in their stage, or checkpoint modules inside them")
        here = [m for m in group if any(m == c or m.startswith(c + ".") for c in calls)]
        if not here:
            continue  # another stage's group
        if len(here) < len(group):
            raise PipelineError(f"checkpoint group {', '.join(group)} spans pipeline stages",
                                "keep each checkpoint group inside one stage")
        mods = [stage.get_submodule(m) for m in group]
        nodes = [n for m in group if (n := calls.get(m)) is not None]
        chain = len(group) > 1 and len(nodes) == len(group) and all(
            b.args == (a,) and not b.kwargs and list(a.users) == [b] for a, b in zip(nodes, nodes[1:]))
        if chain:
            wrap_chain(mods)
        else:
            wrap_each(mods)
        done.append(group)
    return done
