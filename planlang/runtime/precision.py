"""The plan's precision (planlang.plan.types.Precision) with torch's own mechanisms.

    params   parameters are cast to it (`shard_parameters`); their gradients come in it from autograd.
             Under ZeRO-2/3 the parameters FSDP2 stores (its shards) stay in `master` and FSDP2 gathers
             them in `params`: MixedPrecisionPolicy(param_dtype=params, reduce_dtype=reduce)
    compute  `torch.autocast(device, dtype=compute)` around forward and loss when compute is below f32
             (matmuls in compute, the ops autocast keeps in f32 in f32)
    reduce   the dtype of the gradient all-reduces (planlang.runtime.grad_sync: a bucket in another dtype
             is cast for the collective and back), FSDP2's reduce_dtype under ZeRO-2/3
    master   without ZeRO-2/3, when it differs from params: `MasterWeights`, an optimizer whose torch
             optimizer steps an f32 copy of the weights (its state in f32 too) and copies the result back
             into the bf16/f16 parameters (Micikevicius et al., Mixed Precision Training, ICLR 2018, §3.1)
    loss_scale  the loss is multiplied by the scale before backward (`LossScale.scale`) and the
             gradients divided by it in the master's f32 before the step; "dynamic" halves the scale and
             skips the step when any rank's gradients overflowed, and doubles it after 2000 clean steps
             (torch.amp.GradScaler's rule, kept in one place here so every rank agrees on a skip)

The same module builds the one-process reference `planlang verify` compares against (`reference_model`),
so a plan is judged against one process in its own precision.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy

from planlang.model.capture.autocast import MetaAutocast
from planlang.plan.types import Precision

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "f64": torch.float64}
#: unit roundoff of each dtype (half the gap between 1 and the next number): verify's tolerance floor
UNIT_ROUNDOFF = {"f64": 2.0 ** -53, "f32": 2.0 ** -24, "bf16": 2.0 ** -8, "f16": 2.0 ** -11}


def torch_dtype(name: str) -> torch.dtype:
    return DTYPES[name]


def storage_dtype(prec: Precision, fsdp: bool) -> torch.dtype:
    """The dtype the module's parameters are stored in on this rank: FSDP2 stores its shards in the
    master dtype (they are what the optimizer steps) and gathers them in `params`; otherwise `params`."""
    return torch_dtype(prec.master if fsdp else prec.params)


def mp_policy(prec: Precision):
    """FSDP2's MixedPrecisionPolicy for ZeRO-2/3: gathered parameters in `params`, gradients
    reduce-scattered in `reduce`; None for the all-f32 step. Under autocast, FSDP2 casts no unit's floating
    inputs to `params` (the block units' and the root's alike): autocast casts what each op reads, as in
    the step without ZeRO. The root unit's inputs are the whole batch, of which the rank reads its slice:
    cast whole, the slice an op saves would keep the whole copy alive through backward."""
    if not prec.mixed:
        return None
    param = None if prec.params == prec.master else torch_dtype(prec.params)
    return MixedPrecisionPolicy(param_dtype=param, reduce_dtype=torch_dtype(prec.reduce),
                                cast_forward_inputs=not prec.autocast)


def autocast(prec: Precision, device_type: str):
    """`torch.autocast` in the compute dtype when it is below f32, else nothing (on meta, where torch has
    no autocast, planlang.model.capture.autocast.MetaAutocast)."""
    if not prec.autocast:
        return contextlib.nullcontext()
    if device_type == "meta":  # the program run on meta (program_memory): torch has no meta autocast
        return MetaAutocast(torch_dtype(prec.compute))
    return torch.autocast(device_type, dtype=torch_dtype(prec.compute))


class LossScale:
    """The loss scale of one run (see the module docstring): `scale(loss)` before backward, `unscale` and
    `update` around the step."""

    GROWTH_INTERVAL = 2000

    def __init__(self, setting: str | float) -> None:
        self.dynamic = setting == "dynamic"
        self.value = 2.0 ** 16 if self.dynamic else float(setting)
        self._clean = 0

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.value

    def update(self, overflow: bool) -> None:
        if not self.dynamic:
            return
        if overflow:
            self.value, self._clean = self.value / 2, 0
            return
        self._clean += 1
        if self._clean % self.GROWTH_INTERVAL == 0:
            self.value *= 2


def _any_rank(flag: bool, device) -> bool:
    """Whether `flag` holds on any rank (every rank agrees on skipping a step). `device`: where the flag's
    tensor goes; None (a rank with no gradients, a pipeline rank without parameters) takes the backend's."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return flag
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" \
            else torch.device("cpu")
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t)
    return bool(t.item() > 0)


class _Wrapping(torch.optim.Optimizer):
    """An optimizer that steps through `inner`: its groups and state are the inner optimizer's (so
    schedulers and checkpoints see them), with torch.optim.Optimizer's hook bookkeeping."""

    def _wrap(self, inner: torch.optim.Optimizer) -> None:
        self.inner = inner
        self.defaults = inner.defaults
        self._optimizer_step_pre_hooks: dict = {}
        self._optimizer_step_post_hooks: dict = {}

    @property
    def param_groups(self):
        return self.inner.param_groups

    @property
    def state(self):
        return self.inner.state


class MasterWeights(_Wrapping):
    """An optimizer over parameters kept in a narrow dtype whose step is taken on a copy in the master
    dtype: `inner` (a torch optimizer, ZeroRedundancyOptimizer included, built by `make(masters)`) steps
    the copy; the result is copied back into the parameters. With a `LossScale`, the gradients are
    divided by its value in the master dtype and a step whose gradients overflowed on any rank is
    skipped. `zero_grad` clears the parameters' gradients."""

    def __init__(self, params: list[torch.Tensor], master: torch.dtype, make, loss_scale: LossScale | None = None):
        self.params = list(params)
        self.masters = [p.detach().to(master).clone().requires_grad_(True) for p in self.params]
        self._wrap(make(self.masters))
        self.loss_scale = loss_scale

    def state_dict(self):
        return {"inner": self.inner.state_dict(), "masters": [m.detach() for m in self.masters],
                "loss_scale": None if self.loss_scale is None else self.loss_scale.value}

    def load_state_dict(self, state) -> None:
        self.inner.load_state_dict(state["inner"])
        with torch.no_grad():
            for m, saved in zip(self.masters, state["masters"]):
                m.copy_(saved)
            for p, m in zip(self.params, self.masters):
                p.copy_(m)
        if self.loss_scale is not None and state.get("loss_scale") is not None:
            self.loss_scale.value = state["loss_scale"]

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise NotImplementedError("MasterWeights.step takes no closure")
        inv = None if self.loss_scale is None else 1.0 / self.loss_scale.value
        overflow = False
        for p, m in zip(self.params, self.masters):
            g = p.grad
            if g is None:
                m.grad = None
                continue
            m.grad = g.to(m.dtype)
            if inv is not None:
                m.grad.mul_(inv)
                overflow = overflow or not bool(torch.isfinite(m.grad).all())
        if self.loss_scale is not None:
            overflow = _any_rank(overflow, self.masters[0].device if self.masters else None)
            self.loss_scale.update(overflow)
        if not overflow:
            self.inner.step()
            for p, m in zip(self.params, self.masters):
                p.copy_(m)
        for m in self.masters:
            m.grad = None  # the f32 gradients live only during the step

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()


class ScaledOptimizer(_Wrapping):
    """Loss scaling without a master copy (f16 parameters stepped in f16, or f32 parameters under f16
    autocast): gradients divided by the scale before `inner.step`, the step skipped on an overflow."""

    def __init__(self, inner: torch.optim.Optimizer, loss_scale: LossScale):
        self._wrap(inner)
        self.loss_scale = loss_scale

    def state_dict(self):
        return self.inner.state_dict()

    def load_state_dict(self, state) -> None:
        self.inner.load_state_dict(state)

    @torch.no_grad()
    def step(self, closure=None):
        inv, overflow, device = 1.0 / self.loss_scale.value, False, None
        for group in self.inner.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                g.mul_(inv)
                device = g.device
                overflow = overflow or not bool(torch.isfinite(g).all())
        overflow = _any_rank(overflow, device)
        self.loss_scale.update(overflow)
        if not overflow:
            self.inner.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)


def wrap_optimizer(params: list[torch.Tensor], prec: Precision, make, fsdp: bool,
                   loss_scale: LossScale | None) -> torch.optim.Optimizer:
    """The plan's optimizer in its precision: `make(params)` builds the torch optimizer (ZeRO wrapping
    included). A master copy when `master` differs from `params` (not under FSDP2, whose f32 shards are
    the master copy already); loss scaling when the plan asks for it."""
    if prec.master_copy and not fsdp:
        return MasterWeights(params, torch_dtype(prec.master), make, loss_scale)
    inner = make(params)
    return inner if loss_scale is None else ScaledOptimizer(inner, loss_scale)


def reference_model(model: nn.Module, prec: Precision) -> nn.Module:
    """The one-process model in the plan's precision: its floating parameters in `params` and its buffers
    as `cast_buffers` leaves them, as `planlang.apply` places them (the run then wraps forward in
    `autocast` and steps with `wrap_optimizer`, as the plan does)."""
    if prec.params != "f32":
        with torch.no_grad():
            for p in model.parameters():
                if p.is_floating_point():
                    p.data = p.data.to(torch_dtype(prec.params))
    cast_buffers(model, prec)
    return model


def cast_buffers(model: nn.Module, prec: Precision) -> None:
    """A module's floating buffers in the dtype its parameters run in (`params`): BatchNorm's running
    statistics with its weight, as torch's batch_norm requires of them (bf16 weight, f32 statistics:
    "expected scalar type BFloat16 but found Float"). Buffers of modules without parameters of their own
    (rotary frequency tables, masks) stay as the model built them: they are not the module's state in
    the parameters' precision, and rounding a frequency table to bf16 would move every position."""
    if prec.params == "f32":
        return
    dtype = torch_dtype(prec.params)
    with torch.no_grad():
        for module in model.modules():
            if next(module.parameters(recurse=False), None) is None:
                continue
            for name, b in list(module.named_buffers(recurse=False)):
                if b is not None and b.is_floating_point() and b.dtype != dtype:
                    setattr(module, name, b.to(dtype))


def tolerance(prec: Precision, tol: float) -> float:
    """verify's floor on a relative error for a plan in `prec`: `tol`, or TOL_ROUNDOFFS unit roundoffs of
    the narrowest dtype the step computes, sums or stores in, whichever is larger (bf16: 1.6e-2, f16:
    2.0e-3; f32 plans keep `tol`)."""
    narrowest = max(UNIT_ROUNDOFF[d] for d in (prec.params, prec.compute, prec.reduce))
    return max(tol, TOL_ROUNDOFFS * narrowest) if prec.mixed else tol


#: how many unit roundoffs of its narrowest dtype a plan's error may be at least (verify's floor)
TOL_ROUNDOFFS = 4.0


__all__ = ["DTYPES", "UNIT_ROUNDOFF", "torch_dtype", "storage_dtype", "mp_policy", "autocast", "LossScale",
           "MasterWeights", "ScaledOptimizer", "wrap_optimizer", "reference_model", "cast_buffers", "tolerance", "TOL_ROUNDOFFS"]
