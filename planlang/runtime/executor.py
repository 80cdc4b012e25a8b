"""What generated per-rank code calls: `rt.run` (an op's strategy on local pieces), `rt.convert` (a
layout conversion), `rt.const`, `rt.checkpoint`, plus the gradient reductions the lowering asked for.

Collectives are autograd-aware: conversions go through planlang.runtime.redistribute (custom autograd
functions per step), op-internal ones through planlang.runtime.local_ops, and an input whose local
gradient is a partial sum (`Run.grad_reduce`) passes through `GradSum`, identity forward and an
all-reduce of the gradient in backward.
"""
from __future__ import annotations

import dataclasses
import math
import zlib
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.fx.node import map_aggregate
from torch.nn.modules.batchnorm import _BatchNorm

from planlang.cost.comm import Collective
from planlang.cost.ops import op_kind
from planlang.model.capture.opgraph import OpaqueCall, TensorArg
from planlang.runtime.local_ops import run_local
from planlang.runtime.no_dropout import count_program_op, is_off as dropout_is_off
from planlang.model.program.lowering import Convert, Program, Run
from planlang.model.program.recompute import checkpoint, is_recomputing
from planlang.runtime.redistribute import MeshGroups, run_path

if TYPE_CHECKING:  # named in an annotation only
    from planlang.runtime.zero_blocks import BlockCaller


class GradSum(torch.autograd.Function):
    """Identity forward; backward sums the gradient over `axes` (one all-reduce per axis)."""

    @staticmethod
    def forward(ctx, x, axes, groups, recorder):
        ctx.axes, ctx.groups, ctx.recorder = axes, groups, recorder
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous().clone()
        for a in ctx.axes:
            dist.all_reduce(g, group=ctx.groups.group(a))
            if ctx.recorder is not None:
                ctx.recorder.record(Collective.ALL_REDUCE, (a,), g.numel() * g.element_size())
        return g, None, None, None


def _sum_over(t: torch.Tensor, groups) -> torch.Tensor:
    """Sum over the ranks of every group in turn (a sum over several axes is one over their product)."""
    t = t.clone()
    for g in groups:
        dist.all_reduce(t, group=g)
    return t


class _SyncBatchNorm(torch.autograd.Function):
    """BatchNorm's training forward and backward with the statistics of the whole batch: each rank holds its
    own samples, the per-channel sums are all-reduced over the data axes. Saves what torch's own batch_norm
    saves (the input, the mean and 1/std per channel), so memory is one process's; the backward all-reduces
    the two per-channel sums its input gradient needs. Weight and bias gradients are this rank's share (the
    lowering sums them over the data axes once per step, as every parameter's)."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps, groups, count, stats):
        dims = [0] + list(range(2, x.dim()))
        shape = [1, -1] + [1] * (x.dim() - 2)
        mean = _sum_over(x.sum(dims), groups) / count
        var = _sum_over((x - mean.reshape(shape)).pow(2).sum(dims), groups) / count  # two passes: stable
        invstd = torch.rsqrt(var + eps)
        y = (x - mean.reshape(shape)) * invstd.reshape(shape)
        if weight is not None:
            y = y * weight.reshape(shape)
        if bias is not None:
            y = y + bias.reshape(shape)
        ctx.save_for_backward(x, weight, mean, invstd)
        ctx.groups, ctx.count, ctx.has_bias = groups, count, bias is not None
        stats += [mean.detach(), var.detach()]  # for the running statistics
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, invstd = ctx.saved_tensors
        dims = [0] + list(range(2, x.dim()))
        shape = [1, -1] + [1] * (x.dim() - 2)
        # one input-sized buffer, reused in place, as torch's own backward keeps it to one: xhat * dy for
        # its per-channel sum, then xhat again (recomputed: cheaper than a second buffer), then dx
        dx = torch.sub(x, mean.reshape(shape)).mul_(invstd.reshape(shape)).mul_(dy)
        local = torch.stack([dy.sum(dims), dx.sum(dims)])
        torch.sub(x, mean.reshape(shape), out=dx).mul_(invstd.reshape(shape))  # xhat
        total = _sum_over(local, ctx.groups)
        scale = invstd if weight is None else invstd * weight
        dx.mul_(-(total[1] / ctx.count).reshape(shape)).add_(dy).sub_((total[0] / ctx.count).reshape(shape))
        dx.mul_(scale.reshape(shape))
        dw = local[1] if weight is not None and ctx.needs_input_grad[1] else None
        db = local[0] if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, dw, db, None, None, None, None


def sync_batch_norm(x: torch.Tensor, weight, bias, bn: _BatchNorm, groups) -> torch.Tensor:
    """BatchNorm in training on this rank's samples with the statistics of the whole batch (all-reduced
    over the data axes): equal to one process's BatchNorm on the global batch, forward, backward and
    running statistics - SyncBatchNorm's semantics, which torch implements for accelerators only."""
    count = float(x.numel() // x.shape[1]) * math.prod(dist.get_world_size(g) for g in groups)
    stats: list[torch.Tensor] = []
    y = _SyncBatchNorm.apply(x, weight, bias, bn.eps, groups, count, stats)
    if bn.training and bn.track_running_stats and not is_recomputing():  # once per step (recompute.py)
        mean, var = stats
        tracked, running_mean, running_var = bn.num_batches_tracked, bn.running_mean, bn.running_var
        if tracked is None or running_mean is None or running_var is None:
            raise ValueError(f"{type(bn).__name__} tracks running statistics without their buffers")
        with torch.no_grad():
            tracked.add_(1)
            m = bn.momentum if bn.momentum is not None else 1.0 / float(tracked)
            running_mean.mul_(1 - m).add_(mean, alpha=m)
            running_var.mul_(1 - m).add_(var * (count / (count - 1)), alpha=m)
    return y


def batch_norm_recomputed(x: torch.Tensor, weight, bias, bn: _BatchNorm) -> torch.Tensor:
    """BatchNorm's training forward in a checkpoint's recomputation: the batch's statistics, as the first
    forward used, without updating the running statistics a second time."""
    return F.batch_norm(x, None, None, weight, bias, True, 0.0, bn.eps)


def _const_writers(prog: Program) -> dict[str, int]:
    """The opaque in-place ops (`add_`, `Tensor.mul_`) whose first tensor is a constant of the graph (T5's
    relative-position buckets, folded by torch.export, then `add_`-ed): instruction name -> the index of
    that input, which the op writes into."""
    out = {}
    for ins in prog.instructions:
        call = ins.node.call if isinstance(ins, Run) else None
        if not isinstance(ins, Run) or call is None or \
                not str(getattr(call.target, "__name__", call.target)).endswith("_"):
            continue
        first = next((a for a in call.args if isinstance(a, TensorArg)), None)
        if first is not None and ins.node.inputs[first.index] in prog.graph.consts:
            out[ins.node.name] = first.index
    return out


#: ops that read only a tensor's metadata (shape, dtype, device), never its values
_METADATA_ONLY = frozenset({torch.ops.aten.ones_like.default, torch.ops.aten.zeros_like.default,
                            torch.ops.aten.empty_like.default})


class _PendingLoss(funcol.AsyncCollectiveTensor):
    """The global loss while its all-reduce may be in flight: an AsyncCollectiveTensor (the first read of
    its values waits for the collective) that does not wait for `ones_like` and the like, which read only
    its metadata: `loss.backward()` makes its seed gradient with `ones_like(loss)`, and waiting there
    would hold every rank's backward until the slowest rank has finished its forward."""

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func in _METADATA_ONLY:
            return func(*[a.elem if isinstance(a, funcol.AsyncCollectiveTensor) else a for a in args],
                        **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)


class GlobalLoss(torch.autograd.Function):
    """Forward: the sum of the local loss pieces over the partial axes (every rank sees the global loss);
    backward: the gradient passes to the local piece unchanged (partial pieces each get the whole
    gradient, planlang.cost.layout's convention)."""

    @staticmethod
    def forward(ctx, x, axes, groups):
        # a functional all-reduce: its result waits for the collective only when first read (loss.item()),
        # so no rank blocks here on the slowest one's forward before its own backward starts (nor in
        # backward's seed gradient: _PendingLoss)

        y = x.detach()
        for a in axes:
            y = funcol.all_reduce(y, "sum", groups.group(a))
        if isinstance(y, funcol.AsyncCollectiveTensor) and not y.completed:
            y = _PendingLoss(y.elem)
        return y

    @staticmethod
    def backward(ctx, g):
        return g, None, None


class ScaleGrad(torch.autograd.Function):
    """Identity forward; backward multiplies the gradient by a constant."""

    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * ctx.factor, None


class Runtime:
    """The `rt` of generated code for one rank."""

    def __init__(self, prog: Program, groups: MeshGroups, device: torch.device, recorder=None) -> None:
        self.prog = prog
        self.groups = groups
        self.device = device
        self.recorder = recorder
        self.runs: dict[str, Run] = {}
        self.converts: dict[str, Convert] = {}
        for ins in prog.instructions:
            if isinstance(ins, Convert):
                self.converts[ins.out] = ins
            else:
                self.runs[ins.node.name] = ins
        self._consts = {k: v.to(device) for k, v in prog.graph.consts.items()}
        self._writers = _const_writers(prog)
        self.step_index = 0
        self.modules: torch.nn.Module | None = None  # the model (for opaque module calls), set by apply
        # ZeRO-2/3 per block: rt.block(name, fn, *xs) runs a block's instructions as its module's forward
        # (planlang.runtime.zero_blocks.BlockCaller), set by apply when the program has blocks
        self.block: BlockCaller | None = None

    # -- generated code's calls
    def const(self, name: str) -> torch.Tensor:
        return self._consts[name]

    def convert(self, name: str, x: torch.Tensor) -> torch.Tensor:
        c = self.converts[name]
        return run_path(x, c.shape, c.path, self.prog.mesh, self.groups, self.recorder)

    def checkpoint(self, fn, *args):
        return checkpoint(fn, *args)

    def run(self, name: str, *args: torch.Tensor) -> torch.Tensor:
        ins = self.runs[name]
        xs = list(args)
        if name in self._writers:
            # an in-place op on a constant writes into a copy: every run of it, the step's and a checkpoint's
            # recomputation in backward, starts from the captured value (recomputed into the constant
            # itself, T5's buckets were added twice and the tensor saved for backward changed under it)
            i = self._writers[name]
            xs[i] = xs[i].clone()
        for i, axes in ins.grad_reduce:
            if isinstance(xs[i], torch.Tensor) and xs[i].requires_grad:
                xs[i] = GradSum.apply(xs[i], axes, self.groups, self.recorder)
        if ins.strategy is None or ins.node.op.kind == "opaque":
            call = ins.node.call
            if call is None:
                raise ValueError(f"{name}: an opaque op without its call")
            # with a strategy: per sample on the local batch (planlang.cost.ops.per_sample)
            return self._opaque(call, xs, () if ins.strategy is None else ins.strategy.output.axes_of(0))
        op = ins.node.op
        kind = op_kind(op.kind)
        if kind.draws(op):
            if dropout_is_off() and kind.identity is not None:  # `planlang verify`'s comparison with one
                count_program_op()  # process (runtime/no_dropout.py): a dropout op is the identity; attention's
                return xs[0]  # dropout_p is set to 0 in its kernel call there
            # a fresh global mask (dropout) every step, the same on every rank (sliced to the local piece)
            seed = zlib.crc32(f"{name}:{self.step_index}".encode())
            op = dataclasses.replace(op, attrs=tuple(sorted(dict(op.attrs, seed=seed).items())))
        return run_local(op, ins.strategy, xs, self.groups.coords, self.prog.mesh, self.groups.group)

    def _opaque(self, call: OpaqueCall, xs: list[torch.Tensor], batch_axes: tuple[str, ...] = ()) -> torch.Tensor:
        def sub(a):
            return xs[a.index] if isinstance(a, TensorArg) else a

        kwargs = dict(call.kwargs)
        pnames = kwargs.pop("__params__", ())
        args = map_aggregate(call.args, sub)
        kwargs = map_aggregate(kwargs, sub)
        kwargs = {k: (self.device if k == "device" and v is None else v) for k, v in kwargs.items()}
        if call.op == "call_function":
            return call.target(*args, **kwargs)
        if call.op == "call_method":
            return getattr(args[0], call.target)(*args[1:], **kwargs)
        if self.modules is None:
            raise ValueError(f"opaque module call {call.target}: the runtime has no model (apply sets it)")
        module = self.modules.get_submodule(call.target)
        n_params = len(pnames)
        params = dict(zip(pnames, xs[len(xs) - n_params:])) if n_params else {}
        if batch_axes and isinstance(module, _BatchNorm) and (module.training or not module.track_running_stats):
            groups = [self.groups.group(a) for a in batch_axes]
            return sync_batch_norm(args[0], params.get("weight"), params.get("bias"), module, groups)
        if isinstance(module, _BatchNorm) and module.training and is_recomputing():
            return batch_norm_recomputed(args[0], params.get("weight"), params.get("bias"), module)
        return torch.func.functional_call(module, params, tuple(args), kwargs)
