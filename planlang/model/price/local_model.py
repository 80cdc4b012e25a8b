"""The local model: what one device of a plan holds and runs, built on the meta device for the estimator
(planlang.model.price.estimate) and the checkpoint solver (planlang.solve.checkpoint_plan).

    local_params(plan, facts)      every parameter (canonical names) with its global and local shape
                                   (`Spec.local_shape` under its shard rule) and the pipeline stages holding it
    with_local_params(module, ps)  the module's parameters replaced by meta tensors of their local shape, so
                                   Megatron-style column/row splits shrink the activations they produce
    local_inputs(plan, divide)     the plan's inputs with the batch dim divided by `divide` (data ranks x
                                   microbatches)
    LocalPieces(widths)            model code that cuts a fused projection by its global piece size, run on a
                                   local shard
    wrap_checkpoints(module, ...)  the plan's checkpoint groups under torch.utils.checkpoint, as the runtime
                                   wraps them
    in_precision, autocast_for     parameters in the plan's `params` dtype; the step's autocast on meta
    build_local_model              the model with the local parameters, in precision, checkpoints wrapped
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch

from planlang.plan import types as T
from planlang.plan.checkpoints import checkpoint_groups
from planlang.plan.complete import CompletePlan
from planlang.plan.data import batch_dim
from planlang.plan.selection import covered_modules, stage_targets

from planlang.model.capture.autocast import MetaAutocast
from planlang.model.capture.load import build_model, meta_inputs
from planlang.model.program.head_blocks import cut_per_head
from planlang.model.program.recompute import wrap_chain, wrap_each


@dataclass
class LocalParam:
    """One parameter (its canonical name) as a device holds it."""

    name: str
    shape: tuple[int, ...]  # global
    itemsize: int  # bytes per element of its own dtype
    local: tuple[int, ...]  # on one device, under its shard spec
    stages: frozenset  # the pipeline stages holding it (several for a parameter tied across stages)


def plan_model(plan: T.Plan) -> T.ModelRef:
    """The plan's model; ValueError when it declares none."""
    if plan.model is None:
        raise ValueError("the plan declares no model")
    return plan.model


def spec_for(name: str, plan: CompletePlan) -> T.Spec | None:
    """The spec of the last `shard` rule selecting parameter `name`, or None (replicated)."""
    shards = plan.shards
    if not isinstance(shards, tuple):  # a list could change under the kept answers
        return _spec_of(name, shards)
    kept = _SPECS.get(id(shards))
    if kept is None or kept[0] is not shards:  # kept holds its rules, so their id is not reused meanwhile
        if len(_SPECS) >= 16:
            _SPECS.clear()
        kept = _SPECS[id(shards)] = (shards, {})
    specs = kept[1]
    if name not in specs:
        specs[name] = _spec_of(name, shards)
    return specs[name]


def _spec_of(name: str, shards) -> T.Spec | None:
    found = None
    for r in shards:
        if r.kind == "param" and r.target.matches(name):
            found = r.spec
    return found


# each rule list's answers by parameter name (rules and specs are frozen): an estimate asks for each of
# Llama-3-70B's 723 parameters three times, against every rule, and a solve's candidates share rule lists
_SPECS: dict[int, tuple[tuple, dict[str, T.Spec | None]]] = {}


def local_shape(shape: tuple[int, ...], spec: T.Spec | None, mesh: T.Mesh | None) -> tuple[int, ...]:
    """`shape` on one device under `spec` (itself without a spec, a mesh, or with a spec of another rank)."""
    if spec is None or mesh is None or spec.rank != len(shape):
        return shape
    return spec.local_shape(shape, mesh) or shape


def axis_product(mesh: T.Mesh | None, axes) -> int:
    """The devices along `axes` of `mesh` (1 without a mesh)."""
    if mesh is None:
        return 1
    return math.prod(mesh.axis_size(a) or 1 for a in axes)


def local_inputs(plan: CompletePlan, divide: int) -> dict[str, torch.Tensor]:
    """The plan's inputs on meta with their batch dim divided by `divide` (at least 1)."""
    inputs = []
    for inp in plan.inputs:
        dims = list(inp.dims)
        if dims:
            i = batch_dim(inp)
            dims[i] = (dims[i][0], max(1, dims[i][1] // divide))
        inputs.append(T.Input(inp.name, inp.dtype, tuple(dims)))
    return meta_inputs(tuple(inputs))


def stage_of_modules(plan: CompletePlan, names: list[str]) -> dict[str, int]:
    """The pipeline stage of each module the plan's stages cover (empty without a pipeline)."""
    p = plan.pipeline
    if p is None:
        return {}
    # a solve meets the same stages with many meshes and microbatch counts: matching every stage's selections
    # against every module name was a sixth of a 1T candidate's price (128 stages, ~2000 modules)
    try:
        key = (p.stages, tuple(names))
        hash(key)
    except TypeError:
        return _stage_of_modules(p.stages, names)
    if key not in _STAGE_OF:
        if len(_STAGE_OF) > 64:
            _STAGE_OF.clear()
        _STAGE_OF[key] = _stage_of_modules(p.stages, names)
    return dict(_STAGE_OF[key])


_STAGE_OF: dict[tuple, dict[str, int]] = {}


def _stage_of_modules(stages, names: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for st in stages:
        for m in covered_modules(st.modules, names):
            out[m] = st.index
    return out


def local_params(plan: CompletePlan, facts) -> tuple[dict[str, int], dict[str, LocalParam]]:
    """The pipeline stage of each module, and every parameter (canonical names) with its local shape.
    `facts`: the probed model (planlang.model.capture.trace.ModuleFacts)."""
    stage_of = stage_of_modules(plan, stage_targets(facts.all_modules, facts.params))
    params: dict[str, LocalParam] = {}
    canonical = _canonical_names(facts)
    held: dict[str, set] = {}  # canonical name -> the stages of the modules using it under any of its names
    for name in facts.params:
        owner = name.rpartition(".")[0]  # a parameter of the root itself: the stage naming it
        held.setdefault(canonical.get(name, name), set()).add(stage_of.get(owner) if owner else stage_of.get(name))
    itemsizes: dict[str, int] = {}
    for name, (shape, dtype) in facts.params.items():
        if canonical.get(name, name) != name:
            continue
        if dtype not in itemsizes:
            itemsizes[dtype] = torch.empty((), dtype=getattr(torch, dtype)).element_size()
        itemsize = itemsizes[dtype]
        params[name] = LocalParam(name, shape, itemsize, local_shape(shape, spec_for(name, plan), plan.mesh),
                                  frozenset(held[name] - {None}))
    return stage_of, params


def _canonical_names(facts) -> dict[str, str]:
    """`facts.canonical` of every shared name at once (the first group naming it wins, as there): one
    lookup per parameter, not a scan of the groups per parameter (Llama-3-70B: ~1,400 scans)."""
    out: dict[str, str] = {}
    for group in facts.shared:
        for name in group:
            out.setdefault(name, group[0])
    return out


def with_local_params(module: torch.nn.Module, params: dict[str, LocalParam]) -> None:
    """Replace parameters by meta tensors of their local shape (in place; the module is a meta copy)."""
    for name, p in params.items():
        if p.local == p.shape:
            continue
        owner_name, _, attr = name.rpartition(".")
        owner = module.get_submodule(owner_name) if owner_name else module
        old = getattr(owner, attr)
        setattr(owner, attr, torch.nn.Parameter(torch.empty(p.local, dtype=old.dtype, device="meta"),
                                                requires_grad=old.requires_grad))
        # a size the module's forward reads from an attribute rather than its weight (HF Conv1D's `nf`,
        # the output features it views its product to): the local size, as the runtime's program has it
        whole = {g for g, lo in zip(p.shape, p.local) if g == lo}
        for key, value in list(vars(owner).items()):
            if type(value) is int and value not in whole:
                for g, lo in zip(p.shape, p.local):
                    if value == g and lo != g:
                        setattr(owner, key, lo)


class LocalPieces(torch.overrides.TorchFunctionMode):
    """Model code that cuts a fused projection's output by the *global* piece size (GPT-2's
    `c_attn(x).split(self.split_size, dim=2)`), run on a local shard: the runtime stores such a weight
    per head (planlang.model.program.head_blocks), so each device's output holds its share of every piece,
    and the local cut is by the global size over the split. `widths`: (local width, global width, devices)
    of every split parameter dim (`split_widths`)."""

    def __init__(self, widths: set[tuple[int, int, int]]) -> None:
        super().__init__()
        self.widths = widths

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in (torch.Tensor.split, torch.split) and len(args) >= 2 and isinstance(args[1], int):
            x, size = args[0], args[1]
            dim = kwargs.get("dim", args[2] if len(args) > 2 else 0)
            n = x.shape[dim]
            for local, width, f in self.widths:
                if n == local and n % size and cut_per_head(width, size, f):
                    args = (x, size // f) + tuple(args[2:])
                    break
        return func(*args, **kwargs)


def split_widths(params: dict[str, LocalParam]) -> set[tuple[int, int, int]]:
    """(local width, global width, devices) of every parameter dim a spec splits evenly."""
    return {(lo, g, g // lo) for p in params.values() for lo, g in zip(p.local, p.shape) if lo != g and g % lo == 0}


def has_module(module: torch.nn.Module, name: str) -> bool:
    try:
        module.get_submodule(name)
        return True
    except AttributeError:
        return False


def plan_checkpoint_groups(plan: CompletePlan, facts) -> list[list[str]]:
    """The plan's checkpoint groups over a probed model (planlang.plan.checkpoints)."""
    return checkpoint_groups(plan.checkpoints, facts.all_modules, facts.order)


def _consecutive_items(names: list[str]) -> bool:
    """`h.2`, `h.3`, `h.4`: children of one container with consecutive indices."""
    parents = {n.rpartition(".")[0] for n in names}
    last = [n.rpartition(".")[2] for n in names]
    if len(parents) != 1 or not all(x.isdigit() for x in last):
        return False
    idx = [int(x) for x in last]
    return idx == list(range(idx[0], idx[0] + len(idx)))


def is_chain(group: list[str], facts) -> bool:
    """Whether a checkpoint group is recomputed as one function (`wrap_checkpoints`): consecutive items of
    one container (`h.2`, `h.3`, ...), each taking one tensor of the shape the one before returns and no
    keyword arguments (an HF decoder layer's attention_mask and position embeddings, which may differ from
    layer to layer: Gemma2's sliding and global masks). Equal shapes alone are not enough (`attn`, `mlp`
    of a block have a residual and a norm between them, which running one on the other's output would
    skip). Other groups are checkpointed module by module."""
    calls = facts.calls
    return len(group) > 1 and _consecutive_items(group) and all(
        len(calls[n].inputs) == 1 and len(calls[n].outputs) == 1 and not calls[n].keywords for n in group
    ) and all(calls[a].output == calls[b].inputs[0] for a, b in zip(group, group[1:]))


def wrap_checkpoints(module: torch.nn.Module, plan: CompletePlan, facts) -> list[str]:
    """Apply the plan's checkpoint groups with non-reentrant torch.utils.checkpoint, as the runtime will;
    returns notes for the estimate's rows.

    A group of several modules that the model calls one after another on a single tensor (blocks of a
    ModuleList) is recomputed as one function: its first module runs the whole chain under checkpoint
    and the others pass their input through. Groups of other shapes are checkpointed module by module
    (a note says so)."""

    notes = []
    per_module = []
    for group in plan_checkpoint_groups(plan, facts):
        mods = [module.get_submodule(n) for n in group]
        if is_chain(group, facts):
            wrap_chain(mods)
        else:
            if len(group) > 1:
                per_module.append(group)
            wrap_each(mods)
    if per_module:
        notes.append(f"{len(per_module)} checkpoint group(s) ({per_module[0][0]}..{per_module[0][-1]}, ...) "
                     "estimated module by module: their modules take more than one tensor")
    return notes


def build_local_model(plan: CompletePlan, facts, params: dict[str, LocalParam]) -> tuple[torch.nn.Module, list[str]]:
    """The plan's model on meta as one device runs it: local parameter shapes, the `params` dtype, the
    checkpoint groups wrapped; and the notes wrapping them left."""
    module = build_model(plan_model(plan), plan.path)
    with_local_params(module, params)
    in_precision(module, plan.precision)
    return module, wrap_checkpoints(module, plan, facts)


TORCH_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def in_precision(module: torch.nn.Module, prec: T.Precision) -> None:
    """The simulated module's floating parameters in the dtype the step runs them in (`params`: what
    planlang.apply stores, or FSDP2 gathers)."""
    if prec.params != "f32" and prec.params in TORCH_DTYPES:
        for p in module.parameters():
            if p.is_floating_point():
                p.data = p.data.to(TORCH_DTYPES[prec.params])


def autocast_for(prec: T.Precision) -> contextlib.AbstractContextManager:
    """The simulated step's autocast (on meta: MetaAutocast), or nothing."""
    if prec.autocast and prec.compute in TORCH_DTYPES:
        return MetaAutocast(TORCH_DTYPES[prec.compute])
    return contextlib.nullcontext()


def sized(prec: T.Precision, ps, which: str) -> int:
    """Bytes of the parameters `ps` in the precision's `which` dtype (their own dtype without precision
    fields)."""
    return sum(math.prod(p.local) * (prec.bytes(which) if prec.mixed else p.itemsize) for p in ps)
