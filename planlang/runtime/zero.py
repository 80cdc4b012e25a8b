"""The plan's optimizer, built with torch's optimizers and ZeRO (Rajbhandari et al. 2020).

    ZeRO 0     a plain torch optimizer (gradients already averaged by DDP)
    ZeRO 1     torch.distributed.optim.ZeroRedundancyOptimizer over the ZeRO axis' process group: each
               rank keeps the state of a subset of whole parameters (ZeRO §5.1, P_os), steps them and
               broadcasts the new values to the other ranks of the axis
    ZeRO 2, 3  a plain optimizer over the FSDP2-sharded parameters (data_parallel.wrap_data_parallel
               must run first): each rank's state covers its dim-0 slice of every parameter

The estimator (planlang.model.price.estimate) divides the optimizer state by the ZeRO axis size for every
stage. That is exact for FSDP2 (every tensor sliced), but ZeroRedundancyOptimizer partitions *whole
parameters*, greedily by size, so a rank holding the largest tensor (e.g. an embedding) can carry more
than 1/N of the state.
"""
from __future__ import annotations

import inspect
import sys
import warnings
from collections.abc import Iterable

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from planlang.plan import types as T
from planlang.plan.complete import CompleteOptimizer
from planlang.runtime.lion import Lion

# plan optimizer name -> (torch.optim class name, defaults the plan name implies)
TORCH_OPTIMIZERS: dict[str, tuple[str, dict]] = {
    "sgd": ("SGD", {}),
    "momentum": ("SGD", {"momentum": 0.9}),
    "adam": ("Adam", {}),
    "adamw": ("AdamW", {}),
    "adagrad": ("Adagrad", {}),
    "rmsprop": ("RMSprop", {}),
    "adafactor": ("Adafactor", {}),
    "lion": ("Lion", {}),
}


class OptimizerError(ValueError):
    """The plan's optimizer cannot be built (unknown name or argument, missing FSDP2 wrapping)."""


def optimizer_class(name: str) -> tuple[type[torch.optim.Optimizer], dict]:
    """The torch optimizer class for a plan optimizer name and the defaults the name implies."""
    if name not in TORCH_OPTIMIZERS:
        what = f"optimizer `{name}` has no torch implementation" if name in T.OPTIMIZERS else f"unknown optimizer `{name}`"
        raise OptimizerError(f"{what}; known: {', '.join(TORCH_OPTIMIZERS)}")
    cls_name, defaults = TORCH_OPTIMIZERS[name]
    if cls_name == "Lion":  # not in torch.optim: planlang's own (planlang/runtime/lion.py)

        return Lion, dict(defaults)
    cls = getattr(torch.optim, cls_name, None)
    if cls is None:
        raise OptimizerError(f"optimizer `{name}` needs torch.optim.{cls_name}, which this torch lacks")
    return cls, dict(defaults)


def optimizer_kwargs(opt: T.Optimizer) -> dict:
    """Keyword arguments for the torch class: the name's defaults, then the plan's arguments (lists
    become tuples, e.g. betas), checked against the class signature."""
    cls, kwargs = optimizer_class(opt.name)
    accepted = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "params")]
    for key, value in opt.kwargs:
        if key not in accepted:
            raise OptimizerError(f"optimizer `{opt.name}` has no argument `{key}`; it takes {', '.join(accepted)}")
        kwargs[key] = tuple(value) if isinstance(value, list) else value
    return kwargs


def _params(params) -> list[nn.Parameter]:
    if isinstance(params, nn.Module):
        return [p for p in params.parameters() if p.requires_grad]
    out = []
    for item in params:
        p = item[1] if isinstance(item, tuple) else item
        if p.requires_grad:
            out.append(p)
    if not out:
        raise OptimizerError("no trainable parameters to optimize")
    return out


def build_optimizer(params: nn.Module | Iterable, opt: CompleteOptimizer | None, groups=None, *,
                    cls: type[torch.optim.Optimizer] | None = None, **overrides) -> torch.optim.Optimizer:
    """The plan's optimizer over `params` (a module, (name, param) pairs or parameters).

    `opt` is a validated plan's (planlang.runtime.apply.load_plan: its ZeRO stage is 0-3 and names a mesh
    axis, PL201, PL502, PL503). `groups` is the plan mesh's MeshGroups; it is needed for ZeRO stages >= 1
    (the ZeRO axis' group).
    For stages 2 and 3 pass the module after `wrap_data_parallel` (its parameters are FSDP2's shards).
    `cls` replaces the plan's torch class (the plan's arguments are kept only when `cls` is the plan's
    own class) and `overrides` replace single arguments (`lr=...`); the ZeRO wrapping stays the plan's."""
    if opt is None:
        if cls is None:
            raise OptimizerError("the plan declares no optimizer; add `optimizer adamw(lr = 0.001)` to the plan "
                                 "or pass the class: optimizer(torch.optim.AdamW, lr=1e-3)")
        opt = CompleteOptimizer(cls.__name__.lower())
    if cls is None:
        cls, _ = optimizer_class(opt.name)
        kwargs = optimizer_kwargs(opt)
    else:
        plan_cls = optimizer_class(opt.name)[0] if opt.name in TORCH_OPTIMIZERS else None
        kwargs = optimizer_kwargs(opt) if plan_cls is cls else {}
    kwargs.update(overrides)
    ps = _params(params)
    stage, axis = opt.zero_stage, opt.zero_axis
    if stage == 0:
        return cls(ps, **kwargs)
    if groups is None or axis is None:  # (an axis: the checker's PL503 asks for one)
        raise OptimizerError(f"ZeRO-{stage} over `{axis}` shards over that axis' process group: pass the plan "
                             "mesh's MeshGroups as `groups`")
    if groups.size(axis) == 1:
        return cls(ps, **kwargs)
    if stage == 1:
        return _zero_redundancy_optimizer()(ps, optimizer_class=cls, process_group=groups.group(axis), **kwargs)

    if not all(isinstance(p, DTensor) for p in ps):
        raise OptimizerError(f"ZeRO-{stage} steps FSDP2's sharded parameters: call wrap_data_parallel on the "
                             "module before build_optimizer")
    return cls(ps, **kwargs)


def _zero_redundancy_optimizer():
    with warnings.catch_warnings():  # torch.distributed.optim scripts functions at import (deprecated torch.jit)
        warnings.simplefilter("ignore", DeprecationWarning)
        # lazy: imported under the warning filter above
        from torch.distributed.optim import ZeroRedundancyOptimizer
    return ZeroRedundancyOptimizer


def is_zero1(optimizer) -> bool:
    """Whether `optimizer` is a ZeroRedundancyOptimizer (without importing torch.distributed.optim)."""
    mod = sys.modules.get("torch.distributed.optim")  # not imported: no ZeroRedundancyOptimizer exists
    return mod is not None and isinstance(optimizer, mod.ZeroRedundancyOptimizer)


__all__ = ["TORCH_OPTIMIZERS", "OptimizerError", "optimizer_class", "optimizer_kwargs", "build_optimizer", "is_zero1"]
