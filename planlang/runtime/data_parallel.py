"""Data parallelism: gradient synchronisation over the mesh axes that split the batch.

`wrap_data_parallel` picks torch's own mechanism from the plan's optimizer, read from the validated
plan's parallel dimensions (`CompletePlan.dims`, planlang.plan.parallel: the checker has refused ZeRO
stages, axes and FSDP2 arrangements it cannot run, PL313, PL502–PL504, PL507):

    ZeRO 0 or 1   DistributedDataParallel over one process group spanning every data axis; gradients
                  are all-reduced in buckets while backward still runs (DDP's overlap). ZeRO-1 then
                  shards only the optimizer (zero.py). So does ZeRO-2/3 over an axis of one device
                  (`dims.fsdp` is empty: FSDP2 would shard nothing).
    ZeRO 2        FSDP2 `fully_shard` over `dims.fsdp` (the ZeRO axis; HSDP with one more) with reshard_after_forward=False: parameters
                  stay gathered from forward to backward, gradients are reduce-scattered (Rajbhandari
                  et al. 2020, ZeRO §5.2, P_os+g).
    ZeRO 3        the same with reshard_after_forward=True: parameters are gathered when a unit runs and
                  freed after (ZeRO §5.3, P_os+g+p).

Every rank computes the *mean* loss over its local batch; DDP and FSDP2 average gradients over the
group, so with equal local batches the result is the gradient of the mean loss over the global batch,
i.e. the single-process gradient.

Parameters are this device's local pieces under their Specs (plain tensors). Data parallelism assumes a
parameter is replicated over the data axes; a parameter split over a data axis needs its gradient
reduced by the tensor-parallel runtime, and is refused here.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

from planlang.plan.complete import CompletePlan

from .placement import ParamLayout


class DataParallelError(ValueError):
    """The plan asks for a data-parallel setup this runtime cannot build."""


def data_mesh(groups, axes: Iterable[str]):
    """A 1-D DeviceMesh spanning `axes` (flattened when there are several)."""
    names = tuple(a for a in groups.mesh.names if a in set(axes))
    if not names:
        raise DataParallelError("no data axes")
    sub = groups.device_mesh[names]
    return sub if len(names) == 1 else sub._flatten()  # one group whose rank order is row-major over `names`


def data_group(groups, axes: Iterable[str]):
    """The process group spanning every axis of `axes`."""
    names = tuple(axes)
    if len(names) == 1:
        return groups.group(names[0])
    return data_mesh(groups, names).get_group()


def _check_replicated(layouts: Mapping[str, ParamLayout] | None, axes: tuple[str, ...]) -> None:
    for lay in (layouts or {}).values():
        bad = [a for a in lay.spec.used_axes() if a in axes]
        if bad:
            raise DataParallelError(
                f"parameter {lay} is split over data axis `{bad[0]}`: data parallelism needs parameters "
                f"replicated over {', '.join(axes)}; take `{bad[0]}` out of its spec (`zero = 3 over {bad[0]}` "
                "shards parameters over a data axis for you)")


def _default_units(module: nn.Module) -> list[str]:
    """The modules FSDP2 shards as their own units: every entry of an nn.ModuleList (transformer blocks)."""
    out = []
    for name, m in module.named_modules():
        if isinstance(m, nn.ModuleList):
            out += [f"{name}.{i}" if name else str(i) for i in range(len(m))]
    return out


def _local_size(groups, axes) -> int:
    return math.prod(groups.size(a) for a in axes)


def wrap_data_parallel(module: nn.Module, plan: CompletePlan, groups, *,
                       layouts: Mapping[str, ParamLayout] | None = None,
                       units: Iterable[str] | None = None,
                       bucket_cap_mb: float = 25.0,
                       gradient_as_bucket_view: bool = False) -> nn.Module:
    """Make `module`'s gradients data-parallel under `plan` (see the module docstring).

    Returns the DDP wrapper (ZeRO 0/1), the module itself sharded in place by FSDP2 (ZeRO 2/3), or the
    module unchanged when the data axes hold a single rank. `groups` is the plan mesh's MeshGroups;
    `layouts` (name -> ParamLayout) lets it check that no parameter is split over a data axis; `units`
    names the submodules FSDP2 shards separately (default: every nn.ModuleList entry), the root is
    always a unit. `gradient_as_bucket_view=False` keeps DDP's bucket copy of the gradients, which the
    estimator counts as `buffers`."""
    dims = plan.dims
    axes = dims.data
    _check_replicated(layouts, axes)
    if not axes or _local_size(groups, axes) == 1:
        return module
    if not dims.fsdp:
        return DDP(module, process_group=data_group(groups, axes), bucket_cap_mb=bucket_cap_mb,
                   gradient_as_bucket_view=gradient_as_bucket_view)
    return _fully_shard(module, groups, dims.fsdp, reshard=(dims.zero_stage == 3),
                        units=_default_units(module) if units is None else list(units))


def fsdp_mesh(groups, axes: tuple[str, ...]):
    """The DeviceMesh FSDP2 shards over: the plan's `dims.fsdp` axes `axes`, the ZeRO axis alone or
    (r, ZeRO axis) for HSDP (replicated over r, sharded over the ZeRO axis; planlang.plan.parallel)."""
    return groups.device_mesh[axes[0] if len(axes) == 1 else axes]


def _fully_shard(module: nn.Module, groups, axes: tuple[str, ...], reshard: bool, units: list[str]):
    mesh = fsdp_mesh(groups, axes)
    for name in units:
        fully_shard(module.get_submodule(name), mesh=mesh, reshard_after_forward=reshard)
    fully_shard(module, mesh=mesh, reshard_after_forward=reshard)
    return module


def unwrap(module: nn.Module) -> nn.Module:
    """The user's module inside a DDP wrapper (FSDP2 shards in place: nothing to unwrap)."""

    return module.module if isinstance(module, DDP) else module


def is_fsdp_sharded(module: nn.Module) -> bool:
    return any(isinstance(p, DTensor) for p in unwrap(module).parameters())


__all__ = ["DataParallelError", "data_mesh", "fsdp_mesh", "data_group", "wrap_data_parallel",
           "unwrap", "is_fsdp_sharded"]
