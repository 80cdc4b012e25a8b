"""`pm.clip_grad_norm_`: torch.nn.utils.clip_grad_norm_ over a model whose gradients are sharded.

The norm is the one a single process computes on the unsharded model: every distinct gradient element
counted once, however the plan places it. A rank's gradients are local pieces; one piece may sit on
several ranks (replicated over the data axes, a parameter a tensor-parallel spec leaves whole, a
parameter tied across pipeline stages whose copies hold the same summed gradient). So each rank adds up
`|g|^p` of its pieces with the weight 1 / (the number of ranks holding that same piece), and one
all-reduce over the world gives `sum |g|^p` of the whole model:

    copies(parameter) = ranks holding the parameter / distinct pieces of it
    distinct pieces   = product of the sizes of the axes its spec splits it over (tensor parallelism)
                        x the sizes of the axes FSDP2 shards it over (ZeRO-2/3: a DTensor's Shard dims)

Ranks holding a parameter are counted once per model (one all_gather_object of the names): all of them
for a model without a pipeline, the pipeline ranks of its stage (both, for a tied embedding) otherwise.
The inf norm is a max, where copies do not matter: one all-reduce with MAX.

With a loss scale (f16) the gradients are still multiplied by it until the optimizer's step; the norm
returned and compared against `max_norm` is the unscaled one, and the scaled gradients are multiplied by
the same factor (what torch.amp's `scaler.unscale_(opt)` before clipping achieves). torchtitan clips
DTensor gradients with `full_tensor()` of per-parameter norms and an all-reduce over the pipeline group;
here the pieces are plain local tensors (or FSDP2 DTensors, read by their local shards), so the weights
above replace the DTensor bookkeeping with one collective.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard

from .placement import ParamLayout


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def distinct_pieces(p: torch.Tensor, layout: ParamLayout | None, groups) -> int:
    """How many different pieces of a parameter the ranks hold (see the module docstring)."""
    n = math.prod(groups.size(a) for a in set(layout.spec.used_axes())) if layout is not None else 1
    if isinstance(p, DTensor):
        for i, pl in enumerate(p.placements):
            if isinstance(pl, Shard):
                n *= p.device_mesh.size(i)
    return n


def copy_weights(named: Iterable[tuple[str, torch.Tensor]], layouts: Mapping[str, ParamLayout],
                 groups) -> dict[str, float]:
    """name -> 1 / (ranks holding the same piece of it as this rank); every rank calls it (a collective)."""
    named = list(named)
    held: list = [None] * dist.get_world_size()
    dist.all_gather_object(held, [n for n, _ in named])
    holders: dict[str, int] = {}
    for names in held:
        for n in names:
            holders[n] = holders.get(n, 0) + 1
    out = {}
    for name, p in named:
        pieces = distinct_pieces(p, layouts.get(name), groups)
        copies, rest = divmod(holders[name], pieces)
        if rest or copies < 1:
            raise ValueError(f"{name}: {holders[name]} ranks hold it in {pieces} pieces; a piece is not held "
                             "equally often, so its gradient norm cannot be weighted (report this as a bug)")
        out[name] = 1.0 / copies
    return out


@torch.no_grad()
def clip_grad_norm_(named: Iterable[tuple[str, torch.Tensor]], weights: Mapping[str, float], max_norm: float,
                    norm_type: float = 2.0, *, error_if_nonfinite: bool = False, loss_scale: float = 1.0,
                    device: torch.device | None = None) -> torch.Tensor:
    """Clip the gradients of `named` (this rank's parameters) so that the global norm (every rank's pieces,
    each weighted by `weights`, from `copy_weights`) is at most `max_norm`; returns that norm before
    clipping (f32, the same on every rank). `loss_scale`: the factor the gradients still carry."""
    norm_type = float(norm_type)
    by_weight: dict[float, list[torch.Tensor]] = {}
    for name, p in named:
        if p.grad is not None:
            by_weight.setdefault(weights[name], []).append(_local(p.grad))
    grads = [g for gs in by_weight.values() for g in gs]
    if device is None:
        device = grads[0].device if grads else torch.device("cpu")
    acc = torch.zeros((), dtype=torch.float64, device=device)
    for w, gs in by_weight.items():
        gs = [g for g in gs if g.numel()]  # an empty FSDP2 shard (uneven dim 0) adds nothing
        if not gs:
            continue
        # each tensor's norm accumulated and returned in f32 (a bf16/f16 gradient's own dtype would round it)
        norms = torch._foreach_norm(gs, norm_type, dtype=torch.float32)
        part = torch.linalg.vector_norm(torch.stack([n.to(device) for n in norms]), norm_type).to(torch.float64)
        acc = torch.maximum(acc, part) if math.isinf(norm_type) else acc + w * part ** norm_type
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(acc, op=dist.ReduceOp.MAX if math.isinf(norm_type) else dist.ReduceOp.SUM)
    total = acc if math.isinf(norm_type) else acc ** (1.0 / norm_type)
    total = (total / loss_scale).to(torch.float32)
    if error_if_nonfinite and not bool(torch.isfinite(total)):
        raise RuntimeError(f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, "
                           "so it cannot be clipped. To disable this error and scale the gradients by the "
                           "non-finite norm anyway, set `error_if_nonfinite=False`")
    # torch's own factor, max_norm / (norm + 1e-6) at most 1, on the local pieces in place
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    by_kind: dict[tuple, list[torch.Tensor]] = {}
    for g in grads:
        by_kind.setdefault((g.device, g.dtype), []).append(g)
    for (dev, dtype), gs in by_kind.items():
        torch._foreach_mul_(gs, coef.to(dev, dtype))
    return total


def clip_model(pm, named: list[tuple[str, torch.Tensor]], layouts: Mapping[str, ParamLayout], max_norm: float,
               norm_type: float, error_if_nonfinite: bool, loss_scale) -> torch.Tensor:
    """`pm.clip_grad_norm_` of a ParallelModel or PipelinedModel: `named` its parameters on this rank,
    `layouts` their specs, `loss_scale` its LossScale or None. The weights are found at the first call."""
    weights = getattr(pm, "_clip_weights", None)
    if weights is None:  # a collective: every rank's first call
        weights = copy_weights(named, layouts, pm.groups)
        pm._clip_weights = weights
    return clip_grad_norm_(named, weights, max_norm, norm_type, error_if_nonfinite=error_if_nonfinite,
                           loss_scale=1.0 if loss_scale is None else loss_scale.value)


__all__ = ["distinct_pieces", "copy_weights", "clip_grad_norm_", "clip_model"]
