"""Distributed checkpoints with torch.distributed.checkpoint (DCP), resharded on load.

Every rank exposes its pieces as DTensors on the plan's DeviceMesh, so DCP stores *global* tensors
(each chunk written once) and a later run reads the chunks its own pieces need, under another plan or
world size. The state dict has torch's `get_state_dict` shape:

    {"model": {fqn: tensor},                                 parameters and persistent buffers
     "optim": {"state": {fqn: {name: tensor}},               e.g. AdamW's exp_avg, exp_avg_sq, step
               "param_groups": [{"lr": ..., ..., "params": [fqn, ...]}]}}

How a rank's piece of a tensor is described:

    plain parameter     the local piece under its Spec: `to_placements(spec)`
    FSDP2 parameter     (ZeRO 2/3) FSDP2 slices the local piece along dim 0 over the ZeRO axis: that axis
                        becomes the minor-most splitter of dim 0; it is `Shard(0)` when it comes after the
                        dim's other axes in mesh order, else `_StridedShard(0, split_factor)` (the
                        FSDP2 + TP convention)
    optimizer state     shaped like its parameter: described like it; 0-d state (`step`): a plain tensor,
                        equal on every rank
    ZeRO-1 state        ZeroRedundancyOptimizer keeps each parameter's state whole on one rank of the ZeRO
                        axis. On save the owner broadcasts each state tensor over the axis and every rank
                        keeps its dim-0 slice (as FSDP2 would), so each rank writes 1/N of the state and all
                        ranks present the same keys (DCP's contract); at most one state tensor is whole on
                        a rank at a time. On load each rank reads its slice and the owner gathers them. A
                        tensor whose slice cannot be described (strided and not divisible) is stored whole,
                        replicated over the axis.

Parameters are updated in place (the DTensors' local tensors are the parameters' own storage).
`load_full_state` reads a checkpoint into whole tensors in one process (DCP's format utilities).
"""
from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.placement_types import _StridedShard  # FSDP2 + TP's dim-0 convention

from planlang.model.program.head_blocks import Blocked, blocked_order, unblocked_order
from planlang.plan.types import Spec

from .data_parallel import unwrap
from .placement import ParamLayout, to_placements
from .zero import is_zero1


class CheckpointError(ValueError):
    """A checkpoint does not fit the model, optimizer or layouts it is loaded into (or cannot be saved)."""


# ------------------------------------------------------------------------------ placements
def _contiguous_stride(shape) -> tuple[int, ...]:
    out, acc = [], 1
    for n in reversed(tuple(shape)):
        out.append(acc)
        acc *= n
    return tuple(reversed(out))


def placements_with(spec: Spec, mesh, extra: Mapping[str, int]) -> tuple:
    """`to_placements(spec)` with each axis of `extra` (axis -> dim) splitting that dim as its minor-most
    splitter (how FSDP2 and our ZeRO-1 slicing cut a local piece)."""
    if spec.partial:
        raise CheckpointError(f"a parameter cannot be stored as a partial sum ({spec})")
    out = list(to_placements(spec, mesh))
    names = mesh.names
    for axis, dim in extra.items():
        if axis not in names:
            raise CheckpointError(f"`{axis}` is not an axis of mesh {mesh}")
        if axis in spec.used_axes():
            raise CheckpointError(f"spec {spec} already splits over `{axis}`, which also shards its state")
        i = names.index(axis)
        # the dim's axes that come later in the mesh: DTensor would apply them after `axis`
        split = math.prod(mesh.axis_size(b) for b in spec.axes_of(dim) if names.index(b) > i)
        out[i] = Shard(dim) if split == 1 else _StridedShard(dim, split_factor=split)
    return tuple(out)


def _is_strided(spec: Spec, mesh, axis: str, dim: int) -> bool:
    i = mesh.names.index(axis)
    return any(mesh.names.index(b) > i and mesh.axis_size(b) > 1 for b in spec.axes_of(dim))


def chunk_bounds(n: int, parts: int, index: int) -> tuple[int, int]:
    """[start, stop) of chunk `index` of `n` rows cut into `parts` (torch.chunk / DTensor: ceil-sized
    chunks, the last ones short or empty)."""
    size = -(-n // parts)
    start = min(index * size, n)
    return start, min(start + size, n)


@dataclass(frozen=True)
class _HeadSplit:
    """How a per-head parameter's piece is cut: its blocked dim, split over the one mesh axis `axis`."""

    blocked: Blocked
    axis: str


def _head_split(name: str, layout: ParamLayout, mesh, extra: Mapping[str, int]) -> _HeadSplit | None:
    """The one axis a per-head parameter's blocked dim is split over (None for other parameters)."""
    b = layout.blocked
    if b is None:
        return None
    axes = [a for a in b.axes if mesh.axis_size(a) > 1]
    if len(axes) != 1 or b.dim in extra.values():
        raise CheckpointError(f"{name} is stored per head ({b}) and its dim {b.dim} is also split another way "
                              "(several axes, or ZeRO-2/3 sharding it); a checkpoint cannot describe that piece "
                              "yet: save under a plan that splits the heads over one axis, or use ZeRO-1")
    return _HeadSplit(b, axes[0])


def _tp_shape(name: str, layout: ParamLayout, mesh) -> tuple[int, ...]:
    """The local shape `layout`'s spec gives a parameter on `mesh`."""
    shape = layout.spec.local_shape(layout.shape, mesh)
    if shape is None:
        raise CheckpointError(f"parameter {name}: layout {layout} gives no local shape on mesh {mesh}")
    return shape


def _dtensor(local: torch.Tensor, shape, placements, groups):
    shape = torch.Size(shape)
    return DTensor.from_local(local, groups.device_mesh, placements, run_check=False, shape=shape,
                              stride=_contiguous_stride(shape))


# ------------------------------------------------------------------------------ parameters
class _Param:
    """One parameter as the checkpoint sees it: its local piece and how that piece is placed."""

    def __init__(self, name: str, param: torch.Tensor, layout: ParamLayout, groups) -> None:
        self.name, self.param, self.layout, self.groups = name, param, layout, groups
        self.extra: dict[str, int] = {}
        want: tuple[int, ...] | None
        if isinstance(param, DTensor):  # FSDP2: a DTensor over (replicate, shard) data axes, sharded on dim 0
            self.local = param.to_local()
            for axis, pl in zip(param.device_mesh.mesh_dim_names or (), param.placements):
                if isinstance(pl, Shard):
                    self.extra[axis] = pl.dim
            for axis, dim in self.extra.items():
                n = _tp_shape(name, layout, groups.mesh)[dim]
                if _is_strided(layout.spec, groups.mesh, axis, dim) and n % groups.size(axis):
                    raise CheckpointError(f"{name}: FSDP2 splits dim {dim} ({n} rows) unevenly over `{axis}` "
                                          "after the tensor-parallel split; DCP cannot describe that piece")
            want = tuple(param.shape)
        else:
            self.local = param.detach()
            want = layout.spec.local_shape(layout.shape, groups.mesh)
        if want is None or tuple(want) != (tuple(param.shape)):
            raise CheckpointError(f"parameter {name} has local shape {list(param.shape)}, layout {layout} "
                                  f"gives {list(want) if want else '?'} on mesh {groups.mesh}")
        self.placements = placements_with(layout.spec, groups.mesh, self.extra)
        self.heads = _head_split(name, layout, groups.mesh, self.extra)

    def piece(self, local: torch.Tensor | None = None, placements: tuple | None = None):
        """This piece (or `local`, a tensor placed like it) as a DTensor of the global shape, to save. A
        parameter stored per head (planlang.model.program.head_blocks) holds its share of every block, which no
        DTensor placement describes: its pieces are gathered over the block axis and put in the model's
        order, replicated over that axis (one parameter whole at a time; every rank calls this in the
        same order)."""
        local = self.local if local is None else local
        placements = self.placements if placements is None else placements
        h = self.heads
        if h is None:
            return _dtensor(local, self.layout.shape, placements, self.groups)
        b, n = h.blocked, self.groups.size(h.axis)
        parts = [torch.empty_like(local) for _ in range(n)]
        dist.all_gather(parts, local.contiguous(), group=self.groups.group(h.axis))
        whole = unblocked_order(torch.cat(parts, dim=b.dim), b, n)
        return _dtensor(whole, self.layout.shape, self._replicated_on(h.axis, placements), self.groups)

    def target(self, local: torch.Tensor | None = None, placements: tuple | None = None):
        """A DTensor for DCP to load this piece into (the parameter's own storage when it can be); read
        the loaded piece back with `from_loaded`."""
        local = self.local if local is None else local
        placements = self.placements if placements is None else placements
        h = self.heads
        if h is None:
            return _dtensor(local, self.layout.shape, placements, self.groups)
        shape = list(local.shape)
        shape[h.blocked.dim] *= self.groups.size(h.axis)
        return _dtensor(torch.empty(shape, dtype=local.dtype, device=local.device), self.layout.shape,
                        self._replicated_on(h.axis, placements), self.groups)

    def from_loaded(self, local: torch.Tensor) -> torch.Tensor:
        """The local piece of what `target` loaded (its share of every block for a per-head parameter)."""
        h = self.heads
        if h is None:
            return local
        b, n = h.blocked, self.groups.size(h.axis)
        size = local.shape[b.dim] // n
        me = self.groups.coords[h.axis]
        return blocked_order(local, b, n).narrow(b.dim, me * size, size)

    def _replicated_on(self, axis: str, placements: tuple) -> tuple:
        out = list(placements)
        out[self.groups.mesh.names.index(axis)] = Replicate()
        return tuple(out)


def _params(named: Mapping[str, torch.Tensor], layouts: Mapping[str, ParamLayout], groups) -> dict[str, _Param]:
    extra = sorted(set(layouts) - set(named))
    if extra:
        raise CheckpointError(f"layouts name parameters the module lacks: {', '.join(extra[:5])}")
    out = {}
    for name, p in named.items():
        lay = layouts.get(name)
        if lay is None:  # not in the plan's layouts: replicated (an FSDP2 DTensor's shape is the whole one)
            lay = ParamLayout(name, tuple(p.shape), Spec(tuple(() for _ in p.shape)))
        out[name] = _Param(name, p, lay, groups)
    return out


def _buffers(module: nn.Module) -> dict[str, torch.Tensor]:
    m = unwrap(module)
    params = {n for n, _ in m.named_parameters()}
    return {k: v for k, v in m.state_dict().items() if k not in params and isinstance(v, torch.Tensor)}


# ------------------------------------------------------------------------------ optimizer state
def _param_groups(optimizer, names_of: dict[int, str]) -> list[dict]:
    groups = []
    for g in optimizer.param_groups:
        d = {k: v for k, v in g.items() if k != "params"}
        d["params"] = [names_of[id(p)] for p in g["params"]]
        groups.append(d)
    return groups


def _set_param_groups(optimizer, saved: list[dict]) -> None:
    if len(saved) != len(optimizer.param_groups):
        raise CheckpointError(f"the checkpoint has {len(saved)} parameter groups, the optimizer "
                              f"{len(optimizer.param_groups)}")
    for g, s in zip(optimizer.param_groups, saved):
        g.update({k: v for k, v in s.items() if k != "params"})


def _state_piece(par: _Param, name: str, value):
    """A plain optimizer's state tensor as what DCP stores (DTensor like its parameter, or 0-d tensor)."""
    if isinstance(value, DTensor):
        value = value.to_local()
    if value.dim() == 0:
        return value
    if tuple(value.shape) != tuple(par.local.shape):
        raise CheckpointError(f"optimizer state {par.name}.{name} has shape {list(value.shape)}, not its "
                              f"parameter's {list(par.local.shape)}; such state cannot be resharded")
    return par.piece(value)


class _Zero1:
    """Where ZeroRedundancyOptimizer keeps each parameter's state, and how it is sliced for DCP."""

    def __init__(self, zero, params: dict[str, _Param], groups) -> None:
        self.zero, self.params, self.groups = zero, params, groups
        self.group = zero.process_group
        ranks = dist.get_process_group_ranks(self.group)
        axes = [a for a in groups.mesh.names if dist.get_process_group_ranks(groups.group(a)) == ranks]
        if not axes:
            raise CheckpointError("the ZeroRedundancyOptimizer's process group is not an axis of the mesh")
        self.axis = axes[0]
        self.n, self.me = groups.size(self.axis), groups.coords[self.axis]
        owned = {id(p) for g in zero.optim.param_groups for p in g["params"]}
        mine = [name for name, q in params.items() if id(q.param) in owned]
        gathered: list = [None] * self.n
        dist.all_gather_object(gathered, mine, group=self.group)
        self.owner = {name: r for r, names in enumerate(gathered) for name in names}

    def sliced(self, par: _Param) -> bool:
        """Whether a state tensor of `par` is stored as dim-0 slices over the axis (else whole)."""
        spec, mesh = par.layout.spec, self.groups.mesh
        if par.local.dim() == 0 or (par.heads is not None and par.heads.blocked.dim == 0):
            return False  # a per-head dim 0 (a fused projection's bias): its state is stored whole on the axis
        return not (_is_strided(spec, mesh, self.axis, 0) and par.local.shape[0] % self.n)

    def placements(self, par: _Param):
        extra = {self.axis: 0} if self.sliced(par) else {}
        return placements_with(par.layout.spec, self.groups.mesh, extra)

    def my_rows(self, par: _Param) -> tuple[int, int]:
        n = par.local.shape[0]
        return chunk_bounds(n, self.n, self.me) if self.sliced(par) else (0, n)

    def catalogue(self) -> dict[str, dict[str, tuple[tuple[int, ...], torch.dtype]]]:
        """name -> state name -> (shape, dtype), from the owners."""
        mine = {}
        for name, par in self.params.items():
            if self.owner.get(name) == self.me:
                st = self.zero.optim.state.get(par.param, {})
                mine[name] = {k: (tuple(v.shape), v.dtype) for k, v in st.items() if isinstance(v, torch.Tensor)}
        gathered: list = [None] * self.n
        dist.all_gather_object(gathered, mine, group=self.group)
        out: dict = {}
        for part in gathered:
            out.update(part)
        return out

    def save_state(self) -> dict[str, dict]:
        out: dict[str, dict] = {}
        for name, states in sorted(self.catalogue().items()):  # same order on every rank: collectives
            par, owner = self.params[name], self.owner[name]
            st = self.zero.optim.state.get(par.param, {})
            out[name] = {}
            for key, (shape, dtype) in sorted(states.items()):
                # on the parameter's device (NCCL broadcasts device tensors; Adam's 0-d step lives on the CPU)
                dev = par.local.device
                buf = st[key].detach().to(dev, copy=True) if owner == self.me else torch.empty(shape, dtype=dtype,
                                                                                                device=dev)
                dist.broadcast(buf, group=self.group, group_src=owner)
                if buf.dim() == 0:
                    out[name][key] = buf
                    continue
                start, stop = self.my_rows(par)
                piece = buf[start:stop].clone()
                del buf
                out[name][key] = par.piece(piece, self.placements(par))
        return out

    def targets(self, saved: dict[str, dict[str, tuple]]) -> dict[str, dict]:
        out: dict[str, dict] = {}
        for name, states in saved.items():
            par = self.params[name]
            out[name] = {}
            for key, (shape, dtype) in states.items():
                if len(shape) == 0:
                    out[name][key] = torch.empty((), dtype=dtype)
                    continue
                start, stop = self.my_rows(par)
                local = torch.empty((stop - start, *par.local.shape[1:]), dtype=dtype, device=par.local.device)
                out[name][key] = par.target(local, self.placements(par))
        return out

    def install(self, loaded: dict[str, dict]) -> None:
        """Gather each state tensor's slices to its owner and put them in its optimizer."""
        for name in sorted(loaded):
            par, owner = self.params[name], self.owner[name]
            state = {}
            for key in sorted(loaded[name]):
                t = loaded[name][key]
                if not isinstance(t, DTensor):
                    state[key] = t
                    continue
                local = par.from_loaded(t.to_local())
                if not self.sliced(par):
                    state[key] = local
                    continue
                n = par.local.shape[0]
                size = -(-n // self.n)
                padded = torch.zeros((size, *local.shape[1:]), dtype=local.dtype, device=local.device)
                padded[: local.shape[0]] = local
                if owner == self.me:
                    parts = [torch.empty_like(padded) for _ in range(self.n)]
                    dist.gather(padded, parts, group=self.group, group_dst=owner)
                    state[key] = torch.cat(parts)[:n].contiguous()
                else:
                    dist.gather(padded, None, group=self.group, group_dst=owner)
            if owner == self.me:
                self.zero.optim.state[par.param] = state


# ------------------------------------------------------------------------------ save / load
def _names_of(params: dict[str, _Param]) -> dict[int, str]:
    return {id(q.param): name for name, q in params.items()}


def _check_optimizer(optimizer, params: dict[str, _Param]) -> dict[int, str]:
    names_of = _names_of(params)
    missing = [p for g in optimizer.param_groups for p in g["params"] if id(p) not in names_of]
    if missing:
        raise CheckpointError(f"the optimizer steps {len(missing)} tensor(s) that are not parameters of the module")
    return names_of


def save_checkpoint(path, module: nn.Module, optimizer, layouts: Mapping[str, ParamLayout], groups) -> None:
    """Save the model (and the optimizer, if given) to the DCP directory `path`; every rank calls it.

    `module` may be wrapped by DDP or sharded by FSDP2; `layouts` maps parameter names to their
    ParamLayout (parameters without one are taken as replicated); `groups` is the plan's MeshGroups.
    `optimizer` is a torch optimizer or a ZeroRedundancyOptimizer."""
    save_state(path, dict(unwrap(module).named_parameters()), _buffers(module), optimizer, layouts, groups)


def save_state(path, named: Mapping[str, torch.Tensor], buffers: Mapping[str, torch.Tensor], optimizer,
               layouts: Mapping[str, ParamLayout], groups, extra: dict | None = None) -> None:
    """`save_checkpoint` of this rank's parameters `named` (name -> local piece, or FSDP2 DTensor) and
    persistent `buffers`, as a pipeline rank holds them (its stages'); `extra`: small objects saved as
    they are (a scheduler's state_dict), equal on every rank."""
    params = _params(named, layouts, groups)
    sd: dict = {"model": {name: q.piece() for name, q in params.items()} | dict(buffers)}
    if extra:
        sd["extra"] = extra
    if optimizer is not None:
        names_of = _check_optimizer(optimizer, params)
        if is_zero1(optimizer):
            state = _Zero1(optimizer, params, groups).save_state()
        else:
            state = {}
            for name, q in params.items():
                st = optimizer.state.get(q.param)
                if st:
                    state[name] = {k: _state_piece(q, k, v) for k, v in st.items() if isinstance(v, torch.Tensor)}
        sd["optim"] = {"state": state, "param_groups": _param_groups(optimizer, names_of)}
    dcp.save(sd, checkpoint_id=str(path))


def _saved_keys(path) -> dict[tuple, object]:
    """Path tuple (("model", fqn), ("optim", "state", fqn, name), ...) -> storage metadata."""
    meta = dcp.FileSystemReader(str(path)).read_metadata()
    mapping = meta.planner_data or {}
    return {tuple(mapping.get(k, (k,))): v for k, v in meta.state_dict_metadata.items()}


def _saved_optimizer(saved: dict, params: dict[str, _Param], path, partial: bool = False) -> tuple[dict, list[dict]]:
    """The checkpoint's optimizer state entries (fqn -> name -> (shape, dtype)) and a placeholder of its
    param_groups (DCP stores each hyperparameter of each group as a key of its own). `partial`: this rank
    holds some of the model's parameters (a pipeline stage's); the state of the others is not its own."""
    states: dict[str, dict[str, tuple]] = {}
    groups: dict[int, dict] = {}
    for key, md in saved.items():
        if len(key) == 4 and key[:2] == ("optim", "state"):
            name = key[2]
            if name not in params and partial:
                continue
            if name not in params:
                raise CheckpointError(f"the checkpoint has optimizer state for {name}, which the model lacks")
            if len(md.size):
                _check_saved(saved, key, params[name].layout.shape)
            states.setdefault(name, {})[key[3]] = (tuple(md.size), md.properties.dtype)
        elif len(key) == 4 and key[:2] == ("optim", "param_groups"):
            groups.setdefault(int(key[2]), {})[key[3]] = None
    if not groups:
        raise CheckpointError(f"{path} holds no optimizer state (it was saved without an optimizer)")
    return states, [groups[i] for i in sorted(groups)]


def _plain_targets(states: dict, params: dict[str, _Param]) -> dict[str, dict]:
    """Tensors for DCP to fill: each state tensor placed like its parameter's piece, 0-d ones whole."""
    out: dict[str, dict] = {}
    for name, st in states.items():
        q = params[name]
        out[name] = {key: torch.empty((), dtype=dtype) if len(shape) == 0
                     else q.target(torch.empty(q.local.shape, dtype=dtype, device=q.local.device))
                     for key, (shape, dtype) in st.items()}
    return out


def _install_plain(optimizer, loaded: dict[str, dict], params: dict[str, _Param]) -> None:
    for name, st in loaded.items():
        q = params[name]
        state = {}
        for key, t in st.items():
            if isinstance(t, DTensor):
                t = q.from_loaded(t.to_local())
                if isinstance(q.param, DTensor):  # the optimizer of FSDP2 parameters keeps DTensors like them
                    t = DTensor.from_local(t, q.param.device_mesh, q.param.placements, run_check=False,
                                           shape=q.param.shape, stride=q.param.stride())
            state[key] = t
        optimizer.state[q.param] = state


def load_checkpoint(path, module: nn.Module, optimizer, layouts: Mapping[str, ParamLayout], groups) -> None:
    """Load a checkpoint saved by `save_checkpoint` (under any plan and world size) into `module` and
    `optimizer` (if given; a torch optimizer or a ZeroRedundancyOptimizer), laid out by `layouts` on
    `groups`' mesh; every rank calls it. Hyperparameters (lr, betas, ...) come from the checkpoint."""
    load_state(path, dict(unwrap(module).named_parameters()), _buffers(module), optimizer, layouts, groups)


def load_state(path, named: Mapping[str, torch.Tensor], bufs: Mapping[str, torch.Tensor], optimizer,
               layouts: Mapping[str, ParamLayout], groups, extra: dict | None = None,
               partial: bool = False) -> dict | None:
    """`load_checkpoint` into this rank's parameters `named` and `bufs` (as `save_state` takes them), in
    place; `extra`: objects shaped like those `save_state` was given (their current values), returned
    with the checkpoint's values. `partial`: `named` is part of the model (a pipeline rank's stages)."""
    saved = _saved_keys(path)
    params = _params(named, layouts, groups)
    sd: dict = {"model": {}}
    if extra:
        missing = [k for k in extra if not any(key[:2] == ("extra", k) for key in saved)]
        if missing:
            raise CheckpointError(f"{path} holds no {', '.join(missing)} (saved without it)")
        sd["extra"] = extra
    for name, q in params.items():
        _check_saved(saved, ("model", name), q.layout.shape)
        sd["model"][name] = q.target()  # DCP reads into the parameter's own storage
    for name, b in bufs.items():
        _check_saved(saved, ("model", name), tuple(b.shape))
        sd["model"][name] = b
    zero1 = None
    if optimizer is not None:
        _check_optimizer(optimizer, params)
        states, param_groups = _saved_optimizer(saved, params, path, partial)
        zero1 = _Zero1(optimizer, params, groups) if is_zero1(optimizer) else None
        targets = zero1.targets(states) if zero1 else _plain_targets(states, params)
        sd["optim"] = {"state": targets, "param_groups": param_groups}
    dcp.load(sd, checkpoint_id=str(path))
    with torch.no_grad():  # DCP loads in place; copy where it had to allocate
        for name, q in params.items():
            t = sd["model"][name]
            local = t.to_local() if isinstance(t, DTensor) else t
            if local.data_ptr() != q.local.data_ptr():
                q.local.copy_(q.from_loaded(local))
        for name, b in bufs.items():
            if sd["model"][name] is not b:
                b.copy_(sd["model"][name])
    if optimizer is not None:
        _set_param_groups(optimizer, sd["optim"]["param_groups"])
        if zero1 is not None:
            zero1.install(sd["optim"]["state"])
        else:
            _install_plain(optimizer, sd["optim"]["state"], params)
    return sd.get("extra")


def _check_saved(saved: dict, key: tuple, shape) -> None:
    md = saved.get(key)
    what = ".".join(key[1:]) if key[0] == "model" else ".".join(key[2:])
    if md is None:
        raise CheckpointError(f"the checkpoint has no {'optimizer state ' if key[0] == 'optim' else ''}{what}")
    size = getattr(md, "size", None)
    if size is not None and tuple(size) != tuple(shape):
        raise CheckpointError(f"the checkpoint has {what} of shape {list(size)}, the model {list(shape)}")


def load_full_state(path) -> dict:
    """Read a whole checkpoint in this process into unsharded tensors (no process group used):
    {"model": {fqn: tensor}, "optim": {"state": {fqn: {name: tensor}}, "param_groups": [...]}}."""

    with tempfile.TemporaryDirectory() as tmp:  # dcp_to_torch_save writes to a file
        whole = os.path.join(tmp, "whole.pt")
        dcp_to_torch_save(str(path), whole)
        return torch.load(whole, weights_only=True)


__all__ = ["CheckpointError", "save_checkpoint", "load_checkpoint", "save_state", "load_state", "load_full_state", "placements_with", "chunk_bounds"]
