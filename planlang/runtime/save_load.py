"""`planlang.save(pm, optimizer, dir)` / `planlang.load(pm, optimizer, dir)`: a training checkpoint of a
model under a plan, with torch.distributed.checkpoint (planlang.runtime.checkpoint), that loads under
any other plan of the same model (dp4 -> dp2 x tp2, -> ZeRO-3, -> pp2 x dp2, another world size).

What is stored are the model's global tensors under the model's own parameter names (a tied parameter
once, under its first name), whichever ranks hold their pieces:

    ParallelModel      every parameter (its local piece, or FSDP2's shard of it under ZeRO-2/3) and the
                       module's persistent buffers
    PipelinedModel     this rank's stages' parameters; a parameter tied across stages is written once
                       (its copies are equal); the stages' persistent buffers
    optimizer          its state like its parameter's piece (ZeRO-1's state resharded by checkpoint.py);
                       `MasterWeights` (bf16/f16 parameters with an f32 master): the masters are stored
                       as the model's parameters, so the checkpoint holds the f32 values and loads into any
                       precision; a loss scale's current value (loading a checkpoint without one keeps
                       the plan's)
    scheduler          its state_dict (`scheduler=`), the same on every rank

`full_state_dict(pm)` gathers the whole tensors instead, for `save_pretrained`-style export.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

from .checkpoint import CheckpointError, _saved_keys, load_state, save_state
from .precision import LossScale, MasterWeights, ScaledOptimizer


def _named(pm) -> dict[str, torch.Tensor]:
    if hasattr(pm, "runner"):  # a PipelinedModel: this rank's stages
        return dict(pm.runner.named_parameters())
    return dict(pm.module.named_parameters())


def _buffers(pm) -> dict[str, torch.Tensor]:
    """Persistent buffers (state_dict entries that are not parameters) of what this rank runs."""
    if not hasattr(pm, "runner"):
        mods = [pm.module]
    elif hasattr(pm, "program"):  # pp x tp: the stages read the model's buffers, kept whole on every rank
        mods = []
        model = pm.runner.stage_modules[next(iter(pm.runner.stage_modules))]._rt.modules
        params = {n for n, _ in model.named_parameters(remove_duplicate=False)}
        held = [k for k, v in model.state_dict().items() if k not in params and isinstance(v, torch.Tensor)]
        if held:
            raise CheckpointError(f"the model has buffers ({', '.join(held[:3])}) and a pipeline x tensor-parallel "
                                  "plan keeps them outside its stages; planlang.save cannot tell which rank's "
                                  "copy is current yet: save under a plan without the pipeline")
    else:
        mods = list(pm.runner.stage_modules.values())
    out: dict[str, torch.Tensor] = {}
    for mod in mods:
        params = {n for n, _ in mod.named_parameters(remove_duplicate=False)}
        out.update({k: v for k, v in mod.state_dict().items() if k not in params and isinstance(v, torch.Tensor)})
    return out


def _layouts(pm) -> dict:
    return dict(getattr(pm, "layouts", {}))


def _unwrapped(pm, optimizer) -> tuple[dict[str, torch.Tensor], Any, Callable[[], None], LossScale | None]:
    """(the tensors the checkpoint reads and writes as the parameters, the optimizer whose state is keyed
    by them, what to run after a load, the loss scale or None)."""
    named = _named(pm)
    scale = getattr(optimizer, "loss_scale", None)
    if isinstance(optimizer, MasterWeights):
        ids = {id(p): n for n, p in named.items()}
        masters = {ids[id(p)]: m for p, m in zip(optimizer.params, optimizer.masters)}
        named = {n: masters.get(n, p) for n, p in named.items()}

        def copy_back() -> None:
            with torch.no_grad():
                for p, m in zip(optimizer.params, optimizer.masters):
                    p.copy_(m)
        return named, optimizer.inner, copy_back, scale
    if isinstance(optimizer, ScaledOptimizer):
        return named, optimizer.inner, lambda: None, scale
    return named, optimizer, lambda: None, scale


def resharded(pm) -> None:
    """Every FSDP2 unit of `pm` (ZeRO-2/3; a pipeline's stage modules) back to its shards: a forward
    without backward (an evaluation) leaves them gathered, the parameters then plain tensors, while
    saving, loading and gathering read the shards."""
    roots = list(pm.runner.stage_modules.values()) if hasattr(pm, "runner") else [pm]
    for root in roots:
        for unit in root.modules() if isinstance(root, torch.nn.Module) else ():
            if isinstance(unit, FSDPModule):
                unit.reshard()


def save(pm, optimizer, path: str | Path, *, scheduler=None) -> None:
    """Save `pm`'s parameters (and `optimizer`'s state, `scheduler`'s, when given) to the DCP directory
    `path`; every rank calls it. Load it with `load`, under this plan or another."""
    resharded(pm)
    named, opt, _, scale = _unwrapped(pm, optimizer)
    extra: dict = {}
    if scheduler is not None:
        extra["scheduler"] = scheduler.state_dict()
    if scale is not None:
        extra["loss_scale"] = {"value": scale.value, "clean": scale._clean}
    save_state(path, named, _buffers(pm), opt, _layouts(pm), pm.groups, extra or None)
    dist.barrier()  # the directory is complete on every rank when save returns


def load(pm, optimizer, path: str | Path, *, scheduler=None) -> None:
    """Load a checkpoint `save` wrote (under any plan of the same model) into `pm` (in place), `optimizer`
    (None: the parameters alone) and `scheduler`; every rank calls it. Hyperparameters (lr, betas, ...)
    come from the checkpoint."""
    resharded(pm)
    named, opt, after, scale = _unwrapped(pm, optimizer)
    extra: dict = {}
    if scheduler is not None:
        extra["scheduler"] = scheduler.state_dict()
    if scale is not None and any(key[:2] == ("extra", "loss_scale") for key in _saved_keys(path)):
        extra["loss_scale"] = {"value": scale.value, "clean": scale._clean}  # (a checkpoint without one: kept)
    got = load_state(path, named, _buffers(pm), opt, _layouts(pm), pm.groups, extra or None,
                     partial=hasattr(pm, "runner")) or {}
    after()
    if scheduler is not None:
        scheduler.load_state_dict(got["scheduler"])
    if "loss_scale" in got and scale is not None:
        scale.value, scale._clean = float(got["loss_scale"]["value"]), int(got["loss_scale"]["clean"])


def full_state_dict(pm, all_ranks: bool = False) -> dict[str, torch.Tensor]:
    """The model's parameters gathered whole (a tied one once, under its first name) and its persistent
    buffers, on the CPU, on rank 0 (every rank with `all_ranks`; the other ranks get {}); every rank calls
    it. The form `save_pretrained(state_dict=...)` and `torch.save` take. One parameter is whole on the
    device at a time; the CPU of a keeping rank holds the model."""
    keep = all_ranks or dist.get_rank() == 0
    resharded(pm)
    out: dict[str, torch.Tensor] = {}
    # one parameter whole at a time (full_parameters' gathers, picked one name per call): the device holds
    # the largest parameter whole, not the model
    names = list(pm._shapes) if hasattr(pm, "runner") else [n for n, _ in pm.module.named_parameters()]
    mine = {id(p): n for n, p in _named(pm).items()}
    for name in names:
        whole = pm._gathered(lambda p, name=name: p if mine.get(id(p)) == name else None)
        if keep:
            out.update({n: t.detach().cpu() for n, t in whole.items()})
        del whole
    bufs = _buffers(pm)
    if hasattr(pm, "runner"):  # a pipeline: each stage's buffers from the pipeline rank that runs it
        have: list = [None] * dist.get_world_size(pm.pp_group)
        dist.all_gather_object(have, {k: v.detach().cpu() for k, v in bufs.items()}, group=pm.pp_group)
        bufs = {k: v for part in have for k, v in part.items()}
    if keep:
        out.update({k: v.detach().cpu() for k, v in bufs.items()})
    return out


__all__ = ["save", "load", "full_state_dict"]
