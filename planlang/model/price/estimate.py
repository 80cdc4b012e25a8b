"""Per-device memory and step-time estimates of a plan.

For each device class (one per pipeline stage, or one for the whole mesh):

    parameters   local bytes of every parameter under its shard spec (ZeRO-3 divides by the ZeRO axis)
    gradients    the same shapes (ZeRO-2/3 divide by the ZeRO axis)
    optimizer    states per parameter element by optimizer (Adam/AdamW: two fp32 moments, plus a step
                 counter per tensor); ZeRO-2/3 divide by the ZeRO axis; ZeRO-1 (torch's
                 ZeroRedundancyOptimizer, which the runtime uses) gives each rank whole parameters, so the
                 figure is the fullest rank's share of a greedy partition by size
    buffers      the runtime's persistent tensors: gradient buckets (a data axis of more than one rank, ZeRO
                 0 or 1: DDP's with `grad_sync="ddp"`; planlang's, whose slices the gradients are, so that
                 `gradients` is 0 there) and torch.distributed.pipelining's receive buffers (one per
                 microbatch: the activation from the previous stage, the gradient from the next one)
    activations  what one microbatch saves for backward on this device, times the microbatches in flight
                 (1F1B: min(p - i, m) on stage i; GPipe: m; no pipeline: 1)
    transient    the live set beyond saved activations at backward's peak (parameter gradients produced so
                 far, the output's gradient, op temporaries, recomputation of a checkpoint group), and the
                 optimizer's temporaries

peak = parameters + optimizer + buffers + max(backward phase, after-backward phase):

    backward phase        activations + transient. In a pipeline the stage runs one backward per
                          microbatch and accumulates into `.grad`: from the second backward on, every
                          gradient of the stage is live beside the in-flight activations (simulated by a
                          second backward, simulate.py)
    after-backward phase  all gradients (none beyond the buckets where they are their slices) + the larger
                          of the optimizer step's temporaries and, for a pipeline's data-parallel gradient
                          sum (`grad_sync="flat"`), the flat copy of the gradients it all-reduces
                          (pipeline.average_gradients) just before the step

`transient` reports the backward transient plus that after-backward figure (planlang.report splits them).
Activations and transients come from a simulated step on the meta device (`simulate.py`) of the local
model: the batch each device sees, parameters replaced by their local shards (so Megatron-style
column/row splits shrink the activations they produce), checkpoint groups wrapped in
torch.utils.checkpoint. Step time: planlang.model.price.step_time (docs/step_time.md).

Precision (the optimizer block's precision fields, planlang.plan.types.Precision; all f32 without them):
parameters and gradients in `params` (under ZeRO-2/3 FSDP2 keeps its shards and their gradients in
`master` and gathers in `params`); optimizer state in `master`, plus the master copy of the weights
(`master` ≠ `params`, not under ZeRO-2/3, whose shards are the copy) and, during the step, the copy's f32
gradients; gradient buckets in `params`, summed in `reduce` (a bucket cast to it lives until the sums
finish); activations as the step makes them under autocast (the simulated step and the program on meta
run with planlang.model.capture.autocast.MetaAutocast); compute time at the device's `flops.<compute>`; the
data-parallel gradient all-reduce priced in `reduce`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch

from planlang.plan import types as T
from planlang.plan.checkpoints import checkpoint_groups
from planlang.plan.complete import CompletePlan
from planlang.plan.data import batch_dim, data_degree, tensor_axes
from planlang.plan.schedule import activation_peaks, in_flight
from planlang.plan.selection import covered_modules
from planlang.plan.units import format_bytes

from planlang.model.capture.autocast import MetaAutocast
from planlang.model.program.head_blocks import cut_per_head
from planlang.model.capture.load import build_model, meta_inputs, model_loss
from planlang.model.capture.profile import profile_model
from planlang.model.program.recompute import wrap_chain, wrap_each
from planlang.model.capture.simulate import simulate_step
from planlang.model.price.step_time import StageWork, StepTime, lowered_traffic, plan_traffic, stage_seconds, step_times
from planlang.model.price.traffic import Traffic, ZeroUnit, fsdp_numel
from planlang.model.capture.source import imported_source, model_source
from planlang.model.capture.trace import probe_modules

STATE_ELEMENTS = {  # optimizer state elements per parameter element (fp32)
    "adam": 2, "adamw": 2, "lion": 1, "momentum": 1, "rmsprop": 1, "adagrad": 1, "sgd": 0, "adafactor": 0,
}
STEP_COUNTER = {"adam", "adamw", "adagrad", "rmsprop"}  # a float32 scalar tensor per parameter tensor


@dataclass(frozen=True)
class DeviceEstimate:
    device: str  # "all devices" or "stage 0", ...
    parameters: int
    gradients: int
    optimizer: int
    buffers: int
    activations: int
    transient: int
    peak: int
    step_time: float
    notes: tuple[str, ...] = ()
    # where the peak was measured when it comes from the lowered program ("backward" or "optimizer
    # step"; planlang.runtime.program_memory); "" when the classes above compose it (see the docstring)
    measured_phase: str = ""
    # the optimizer step's temporaries, which `transient` includes (the report's bars split the phases)
    step_temporaries: int = 0
    # a pipeline rank's model stages (several under an interleaved schedule) and each one's step time
    stages: tuple[int, ...] = ()
    stage_times: tuple[float, ...] = ()
    step: StepTime | None = None  # step_time by the parts of planlang.model.price.step_time's formula

    def __str__(self) -> str:
        return f"{self.device}: peak {format_bytes(self.peak)}"

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("device", "parameters", "gradients", "optimizer", "buffers",
                                              "activations", "transient", "peak", "step_time",
                                              "measured_phase", "step_temporaries")} | {
            "stages": list(self.stages), "notes": list(self.notes),
            "step": None if self.step is None else dataclasses.asdict(self.step)}


@dataclass
class _Param:
    name: str
    shape: tuple[int, ...]
    itemsize: int
    local: tuple[int, ...]
    stages: frozenset  # the pipeline stages holding it (several for a parameter tied across stages)


def _spec_for(name: str, plan: CompletePlan) -> T.Spec | None:
    found = None
    for r in plan.shards:
        if r.kind == "param" and r.target.matches(name):
            found = r.spec
    return found


def _local_shape(shape: tuple[int, ...], spec: T.Spec | None, mesh: T.Mesh | None) -> tuple[int, ...]:
    if spec is None or mesh is None or spec.rank != len(shape):
        return shape
    return spec.local_shape(shape, mesh) or shape


def _axis_product(mesh: T.Mesh | None, axes) -> int:
    if mesh is None:
        return 1
    return math.prod(mesh.axis_size(a) or 1 for a in axes)


def _local_inputs(plan: CompletePlan, divide: int) -> dict[str, torch.Tensor]:
    inputs = []
    for inp in plan.inputs:
        dims = list(inp.dims)
        if dims:
            i = batch_dim(inp)
            dims[i] = (dims[i][0], max(1, dims[i][1] // divide))
        inputs.append(T.Input(inp.name, inp.dtype, tuple(dims)))
    return meta_inputs(tuple(inputs))


def _stage_of_modules(plan: CompletePlan, names: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    p = plan.pipeline
    if p is None:
        return out
    for st in p.stages:
        for m in covered_modules(st.modules, names):
            out[m] = st.index
    return out


def _in_flight(plan: CompletePlan, stage: int) -> int:
    p = plan.pipeline
    if p is None:
        return 1
    pp = len(p.stages)
    return in_flight(p.schedule.kind, pp, min(stage, pp - 1), p.microbatches, chunks=p.schedule.chunks)


def _with_local_params(module: torch.nn.Module, params: dict[str, _Param]) -> None:
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


class _LocalPieces(torch.overrides.TorchFunctionMode):
    """Model code that cuts a fused projection's output by the *global* piece size (GPT-2's
    `c_attn(x).split(self.split_size, dim=2)`), run on a local shard: the runtime stores such a weight
    per head (planlang.model.program.head_blocks), so each device's output holds its share of every piece, and
    the local cut is by the global size over the split. `widths`: (local width, global width, devices)
    of every split parameter dim."""

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


def _has_module(module: torch.nn.Module, name: str) -> bool:
    try:
        module.get_submodule(name)
        return True
    except AttributeError:
        return False


def _split_widths(params: dict[str, _Param]) -> set[tuple[int, int, int]]:
    return {(lo, g, g // lo) for p in params.values() for lo, g in zip(p.local, p.shape) if lo != g and g % lo == 0}


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


def _wrap_checkpoints(module: torch.nn.Module, plan: CompletePlan, facts) -> list[str]:
    """Apply the plan's checkpoint groups with non-reentrant torch.utils.checkpoint, as the runtime will.

    A group of several modules that the model calls one after another on a single tensor (blocks of a
    ModuleList) is recomputed as one function: its first module runs the whole chain under checkpoint
    and the others pass their input through. Groups of other shapes are checkpointed module by module
    (a note says so)."""

    notes = []
    per_module = []
    for group in plan_checkpoint_groups(plan, facts):
        mods = [module.get_submodule(n) for n in group]
        # a chain: consecutive items of one container (`h.2`, `h.3`, ...), each taking one tensor of the
        # shape the one before returns and no keyword arguments (an HF decoder layer's attention_mask and
        # position embeddings, which may differ from layer to layer: Gemma2's sliding and global masks);
        # equal shapes alone are not enough (`attn`, `mlp` of a block have a residual and a norm between
        # them, which running one on the other's output would skip)
        chain_ok = len(group) > 1 and _consecutive_items(group) and all(
            len(facts.calls[n].inputs) == 1 and len(facts.calls[n].outputs) == 1 and not facts.calls[n].keywords
            for n in group
        ) and all(facts.calls[a].output == facts.calls[b].inputs[0] for a, b in zip(group, group[1:]))
        if chain_ok:
            wrap_chain(mods)
        else:
            if len(group) > 1:
                per_module.append(group)
            wrap_each(mods)
    if per_module:
        notes.append(f"{len(per_module)} checkpoint group(s) ({per_module[0][0]}..{per_module[0][-1]}, ...) "
                     "estimated module by module: their modules take more than one tensor")
    return notes


GRAD_SYNC = ("flat", "ddp")


# Caches for commands that estimate many plans of one model in one process (solve, the language server),
# keyed by the model's source (planlang.model.capture.source: the content of its files), so an edited model is
# probed and simulated again; least recently used first out.
FACTS_SIZE = 8
SIMULATED_SIZE = 32
_FACTS: OrderedDict[tuple, object] = OrderedDict()  # (source, model, path, inputs) -> ModuleFacts
_SIMULATED: OrderedDict[tuple, tuple] = OrderedDict()  # what a simulation depends on -> (sim, profile, trained, notes)
# the flop profile depends on less than the simulation (not on microbatches accumulating or on the stages
# bytes are attributed to): the solver's candidates that differ only there share one
_PROFILED: OrderedDict[tuple, object] = OrderedDict()


_CACHE_LOCK = threading.Lock()


def _cache_get(cache: OrderedDict, key):
    with _CACHE_LOCK:
        value = cache.get(key)
        if value is not None:
            cache.move_to_end(key)
        return value


def _cache_put(cache: OrderedDict, key, value, size: int):
    with _CACHE_LOCK:
        cache[key] = value
        cache.move_to_end(key)
        while len(cache) > size:
            cache.popitem(last=False)
        return value


def _model_key(plan: T.Plan, source) -> tuple:
    return (source.files, str(plan.model), plan.path, tuple(str(i) for i in plan.inputs))


def _model_facts(plan: T.Plan, facts=None) -> tuple[object, tuple]:
    """The probed model of `plan` and its cache key (the model's source as read now). `facts`: the
    caller's, probed from that source; kept for the next call."""
    key = _model_key(plan, model_source(plan.model, plan.path))
    if facts is None:
        facts = _cache_get(_FACTS, key)
    if facts is None:
        facts = probe_modules(build_model(plan.model, plan.path), meta_inputs(plan.inputs))
        key = _model_key(plan, imported_source(plan.model) or model_source(plan.model, plan.path))
    return _cache_put(_FACTS, key, facts, FACTS_SIZE), key


def _simulate_local(plan: CompletePlan, facts, params: dict[str, _Param], divide: int, micro: int, stage_of,
                    profile_key: tuple = (), profiled: OrderedDict | None = None, size: int = SIMULATED_SIZE):
    """One simulated step and profile of the local model (parameters replaced by their shards, the
    batch divided by `divide`, the plan's checkpoint groups wrapped); the parameters that got a gradient.
    The profile of a local model is reused (`profile_key`: what it depends on) when one was made (in
    `profiled`, the module's cache unless the caller keeps its own)."""
    profiled = _PROFILED if profiled is None else profiled
    module = build_model(plan.model, plan.path)
    _with_local_params(module, params)
    _in_precision(module, plan.precision)
    notes = _wrap_checkpoints(module, plan, facts)
    local_in = _local_inputs(plan, divide)
    loss = model_loss(plan.model)
    stage_map = stage_of or None
    # the parts of the step FSDP2's per-block units change (ZeRO-2/3 without a pipeline: _zero_blocks_peak)
    blocks = () if stage_map else tuple(b for b in getattr(facts, "blocks", ()) if _has_module(module, b))
    try:
        with _LocalPieces(_split_widths(params)), _autocast(plan.precision):
            sim = simulate_step(module, local_in, loss, stage_map, accumulate=micro > 1, blocks=blocks)
            prof = _cache_get(profiled, profile_key) if profile_key else None
            if prof is None:
                prof = profile_model(module, local_in, loss)
                if profile_key:
                    _cache_put(profiled, profile_key, prof, size)
    except Exception as err:  # a model whose code does not follow its local parameter shapes
        notes.append(f"local simulation failed ({type(err).__name__}); activations from the unsharded model")
        module = build_model(plan.model, plan.path)
        _in_precision(module, plan.precision)
        notes += _wrap_checkpoints(module, plan, facts)
        with _autocast(plan.precision):
            sim = simulate_step(module, local_in, loss, stage_map, accumulate=micro > 1, blocks=blocks)
            prof = profile_model(module, local_in, loss)
    trained = frozenset(n for n, p in module.named_parameters(remove_duplicate=False) if p.grad is not None)
    return sim, prof, trained, tuple(notes)


_TORCH_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def _in_precision(module: torch.nn.Module, prec: T.Precision) -> None:
    """The simulated module's floating parameters in the dtype the step runs them in (`params`: what
    planlang.apply stores, or FSDP2 gathers)."""
    if prec.params != "f32" and prec.params in _TORCH_DTYPES:
        for p in module.parameters():
            if p.is_floating_point():
                p.data = p.data.to(_TORCH_DTYPES[prec.params])


def _autocast(prec: T.Precision):
    """The simulated step's autocast (on meta: MetaAutocast), or nothing."""
    return MetaAutocast(_TORCH_DTYPES[prec.compute]) if prec.autocast and prec.compute in _TORCH_DTYPES \
        else contextlib.nullcontext()


def _local_params(plan: CompletePlan, facts) -> tuple[dict[str, int], dict[str, _Param]]:
    """The pipeline stage of each module, and every parameter (canonical names) with its local shape."""
    stage_of = _stage_of_modules(plan, facts.all_modules)
    params: dict[str, _Param] = {}
    held: dict[str, set] = {}  # canonical name -> the stages of the modules using it under any of its names
    for name in facts.params:
        held.setdefault(facts.canonical(name), set()).add(stage_of.get(name.rpartition(".")[0]))
    for name, (shape, dtype) in facts.params.items():
        if facts.canonical(name) != name:
            continue
        itemsize = torch.empty((), dtype=getattr(torch, dtype)).element_size()
        params[name] = _Param(name, shape, itemsize, _local_shape(shape, _spec_for(name, plan), plan.mesh),
                              frozenset(held[name] - {None}))
    return stage_of, params


def _profile_key(plan: CompletePlan, facts, model_key: tuple, params: dict[str, _Param]) -> tuple:
    """What the profile of the local model depends on: local shapes, batch, checkpoint groups, dtypes."""
    micro = plan.pipeline.microbatches if plan.pipeline else 1
    prec = plan.precision
    return (model_key, tuple((n, p.local) for n, p in params.items()), data_degree(plan) * micro,
            tuple(tuple(g) for g in plan_checkpoint_groups(plan, facts)),
            (prec.params, prec.compute) if prec.mixed else ())


def _sized(prec: T.Precision, ps, which: str) -> int:
    """Bytes of `ps` in the precision's `which` dtype (their own dtype without precision fields)."""
    return sum(math.prod(p.local) * (prec.bytes(which) if prec.mixed else p.itemsize) for p in ps)


def estimate_steps(plan: CompletePlan, efficiency: float = 0.5, *, facts=None,
                   cache: dict | None = None) -> "StepInputs | None":
    """What each row's step time comes from, exactly as `estimate_plan` prices it, from the profile of the
    local model alone — no simulated step (the expensive half of an estimate, and the only one memory
    needs). The solver prices a candidate's step time this way first and skips its memory when that step
    cannot win (planlang.solve.driver). The profile is kept in `cache` (or the module's), where
    `estimate_plan` finds it. None when the local model cannot be profiled (the estimate then falls back
    to the unsharded model)."""
    if plan.model is None:
        raise ValueError("the plan declares no model")
    facts, model_key = _model_facts(plan, facts)
    micro = plan.pipeline.microbatches if plan.pipeline else 1
    stage_of, params = _local_params(plan, facts)
    profile_key = _profile_key(plan, facts, model_key, params)
    profiled = _PROFILED if cache is None else cache.setdefault("profiled", OrderedDict())
    size = SIMULATED_SIZE if cache is None else sys.maxsize
    prof = _cache_get(profiled, profile_key)
    if prof is None:
        try:
            module = build_model(plan.model, plan.path)
            _with_local_params(module, params)
            _in_precision(module, plan.precision)
            _wrap_checkpoints(module, plan, facts)
            with _LocalPieces(_split_widths(params)), _autocast(plan.precision):
                prof = profile_model(module, _local_inputs(plan, data_degree(plan) * micro), model_loss(plan.model))
        except Exception:  # noqa: BLE001 - estimate_plan falls back to the unsharded model; no step here
            return None
        _cache_put(profiled, profile_key, prof, size)
    prec = plan.precision
    stages = sorted(set(stage_of.values())) if stage_of else [None]
    total = sum(m.saved_bytes for m in prof.modules.values()) or 1
    work, units = [], []
    for s in stages:  # as estimate_plan's loop over stages
        mine = [p for p in params.values() if s is None or s in p.stages]
        frac = 1.0 if s is None else sum(m.saved_bytes for n, m in prof.modules.items() if stage_of.get(n) == s) / total
        work.append(StageWork(prof.total_fwd_flops * frac * micro, prof.total_bwd_flops * frac * micro))
        units.append(_zero_unit(plan, s, mine, mine))
    return StepInputs(tuple(work), tuple(units))


@dataclass(frozen=True)
class StepInputs:
    """What planlang.model.price.step_time needs of a plan besides its lowered program's traffic: each model
    stage's work and the bytes of its parameters (a ZeroUnit). `steps(plan, lowered)` gives each row's
    step as `estimate_plan` does with that traffic; `lower_bound(plan)` a step no larger, without it."""

    work: tuple[StageWork, ...]
    units: tuple[ZeroUnit, ...]

    def steps(self, plan: CompletePlan, lowered: list[Traffic] | None, efficiency: float = 0.5) -> list[StepTime]:
        if lowered is not None and len(lowered) != len(self.units):  # as estimate_plan: priced without it
            lowered = None
        return step_times(plan, list(self.work), plan_traffic(plan, list(self.units), lowered), efficiency)

    def lower_bound(self, plan: CompletePlan, efficiency: float = 0.5) -> list[StepTime]:
        """Each row's step without the program's collectives: never above `steps` (every exposed part
        grows with the communication). Exact for a pipeline without tensor parallelism (no program)."""
        if plan.pipeline is not None and not tensor_axes(plan):
            return self.steps(plan, None, efficiency)
        return self.steps(plan, [Traffic() for _ in self.units], efficiency)


def _zero_unit(plan: CompletePlan, s: int | None, mine: list, learn: list) -> ZeroUnit:
    """A stage's parameters as the step-time model prices their collectives: gathered in `params`,
    gradients summed in `reduce`, each padded as FSDP2 pads it under ZeRO-2/3 (traffic.fsdp_numel)."""
    prec, opt = plan.precision, plan.optimizer
    shards = _axis_product(plan.mesh, [opt.zero_axis]) if opt and opt.zero_stage >= 2 and opt.zero_axis else 1

    def size(p, which: str) -> int:
        return fsdp_numel(p.local, shards) * (prec.bytes(which) if prec.mixed else p.itemsize)

    return ZeroUnit("model" if s is None else f"stage {s}", tuple(size(p, "params") for p in mine),
                    sum(size(p, "reduce") for p in learn))


def estimate_plan(plan: CompletePlan, efficiency: float = 0.5, *, grad_sync: str = "flat",
                  facts=None, program=None, cache: dict | None = None,
                  traffic: "list[Traffic] | str | None" = None, graph=None) -> list[DeviceEstimate]:
    """Estimate every device class of `plan` (its model is built on meta).

    `grad_sync` is how data-parallel gradients are summed: "flat" is the planlang runtime (one flat
    all-reduce after backward: a transient copy of the gradients), "ddp" torch's DistributedDataParallel
    (persistent gradient buckets as large as the gradients, gradient_as_bucket_view=False). `facts`: the
    plan's model as the caller probed it from its current source (planlang.model.checks.model_facts_for),
    spares probing it again. `program`: planlang.runtime.program_memory.measure (the runtime's layer, which
    this one cannot import), to take the activations and the peak of a plan without a pipeline from its
    lowered program, run on meta - what the planlang runtime executes; each row's notes say which
    plans keep the simulation of the model's code, and why. `cache`: a dict the caller keeps for the
    plans of one model (the solver's planlang.solve.facts.ModelFacts, one per solve), holding the
    simulations and profiles of local models in place of the module's bounded caches. `traffic`: the
    lowered program's collectives (planlang.model.price.step_time.lowered_traffic) when the caller has them,
    or why it could not lower the plan; lowered here otherwise (`graph`: the model's op graph, when the
    caller has it)."""
    if grad_sync not in GRAD_SYNC:
        raise ValueError(f"grad_sync must be one of {', '.join(GRAD_SYNC)}, not {grad_sync!r}")
    if plan.model is None:
        raise ValueError("the plan declares no model")
    mesh = plan.mesh
    facts, model_key = _model_facts(plan, facts)
    dp = data_degree(plan)
    micro = plan.pipeline.microbatches if plan.pipeline else 1
    stage_of, params = _local_params(plan, facts)
    opt = plan.optimizer
    zero = opt.zero_stage if opt else 0
    zero_n = _axis_product(mesh, [opt.zero_axis]) if opt and opt.zero_axis is not None else 1
    states = STATE_ELEMENTS.get(opt.name, 2) if opt else 0

    # one simulated step of the local model for one microbatch (the whole model; stages split below).
    # It depends only on the local shapes, the checkpoint groups and the stages, not on the optimizer or
    # ZeRO: plans that differ only there (the solver prices many) share one simulation
    prec = plan.precision
    profile_key = _profile_key(plan, facts, model_key, params)
    sim_key = profile_key + (micro > 1, tuple(sorted(stage_of.items())))
    simulated = _SIMULATED if cache is None else cache.setdefault("simulated", OrderedDict())
    profiled = _PROFILED if cache is None else cache.setdefault("profiled", OrderedDict())
    size = SIMULATED_SIZE if cache is None else sys.maxsize  # the caller's cache lives as long as it keeps it
    cached = _cache_get(simulated, sim_key)
    if cached is None:
        cached = _cache_put(simulated, sim_key, _simulate_local(plan, facts, params, dp * micro, micro, stage_of,
                                                                profile_key, profiled, size), size)
    sim, prof, trained, sim_notes = cached
    notes = list(sim_notes)

    # parameters the loss does not reach (BERT's pooler under an MLM loss) get no gradient in the
    # simulated backward; torch's optimizers keep no state for a parameter whose .grad is None
    if not trained:  # no backward was simulated: assume every parameter trains
        trained = set(params)
    stages = sorted(set(stage_of.values())) if stage_of else [None]
    counter = opt is not None and opt.name in STEP_COUNTER
    fsdp = zero >= 2 and zero_n > 1

    def sized(ps, which: str) -> int:
        return _sized(prec, ps, which)

    master_b = prec.bytes("master") if prec.mixed else 4  # optimizer state's bytes per element
    copy = prec.mixed and prec.master_copy and not fsdp  # planlang.runtime.precision.MasterWeights
    out = []
    parts: list[_StagePart] = []
    work, units = [], []
    for s in stages:
        # a parameter tied across stages has a copy on each (planlang.runtime.pipeline sums their gradients)
        mine = [p for p in params.values() if s is None or s in p.stages]
        learn = [p for p in mine if p.name in trained]
        p_bytes = sized(mine, "params")  # in the dtype the step runs them in
        g_bytes = sized(learn, "params")
        # ZeRO-2/3 run as FSDP2 over the ZeRO axis: parameters rest as shards (both stages). A pipeline
        # stage is one unit, whose whole parameters are gathered while its forward and backward run (ZeRO-2
        # keeps them from forward to backward, ZeRO-3 gathers again); without a pipeline, planlang.apply
        # makes each repeated block a unit of its own (`_zero_blocks_peak`)
        # FSDP2 keeps its shards and their gradients in the master dtype and gathers in `params`
        params_b = sized(mine, "master") // zero_n if fsdp else p_bytes
        gathered = p_bytes if fsdp else 0
        grads_b = (sized(learn, "master") if fsdp else g_bytes) // zero_n if zero >= 2 else g_bytes
        if zero == 1 and zero_n > 1:
            opt_b = _zero1_state_bytes(mine, trained, states, counter, zero_n, master_b)
        else:
            elems = sum(math.prod(p.local) for p in learn)
            opt_b = states * elems * master_b + (4 * len(learn) if counter else 0)
            opt_b = opt_b // zero_n if zero >= 1 else opt_b
        # the master copy of the weights (every trainable parameter, whole on each rank, ZeRO-1 included)
        opt_b += sized(mine, "master") if copy else 0
        # DDP keeps a bucket copy of the gradients for the all-reduce (not under FSDP2, ZeRO >= 2). The
        # planlang runtime keeps persistent buckets too (planlang.runtime.grad_sync), whose slices the
        # gradients are (DDP's gradient_as_bucket_view): the gradients are the buckets, counted once there
        summed = dp > 1 and zero < 2
        # the planlang runtime's persistent buckets: without a pipeline, and in a pipeline run as the lowered
        # program (pipeline x tensor parallelism: planlang.runtime.program_pipeline sums with GradSync)
        bucketed = grad_sync == "flat" and summed and (s is None or bool(tensor_axes(plan)))
        buffers = p_bytes if grad_sync == "ddp" and summed else (g_bytes if bucketed else 0)
        if bucketed:
            grads_b = 0
        # a pipeline sums its gradients after the last backward in one flat tensor per axis
        # (pipeline.average_gradients): for that moment every gradient is live twice
        flat_copy = grads_b if grad_sync == "flat" and summed and s is not None else 0
        # what is live beside the gradients after backward: the flat copy, then (ZeRO-2/3 step slices of
        # every tensor; ZeRO-1 whole tensors, ZeroRedundancyOptimizer) the optimizer step's temporaries
        opt_tmp = _optimizer_temporaries(plan, learn, states, zero_n if zero >= 1 else 1, whole=zero == 1,
                                         gradient_copy=flat_copy, itemsize=master_b)
        # MasterWeights gives the master copy its gradients in the master dtype for the step
        opt_tmp += sized(learn, "master") if copy else 0
        inflight = _in_flight(plan, s or 0)
        if s is None:
            frac = 1.0
            acts = sim.saved
            # beyond the saved activations at backward's peak: the gradients produced so far, temporaries
            transient = max(0, sim.backward_peak - sim.saved)
        else:
            total = sum(m.saved_bytes for m in prof.modules.values()) or 1
            frac = sum(m.saved_bytes for n, m in prof.modules.items() if stage_of.get(n) == s) / total
            # the stage's own tensors in the simulated step (created by its modules): it keeps the saved
            # activations of every microbatch in flight
            saved_s = sim.stage_saved.get(s, 0)
            # torch.distributed.pipelining allocates a receive buffer per microbatch at the first step and
            # keeps them: activations from the previous stage, gradients from the next one
            buffers += micro * (_boundary_bytes(facts, stage_of, s, dp * micro, "in")
                                + _boundary_bytes(facts, stage_of, s, dp * micro, "out", last=stages[-1]))
            acts = saved_s * inflight
            transient = max(0, sim.stage_backward_peak.get(s, 0) - saved_s)
            if micro > 1:
                # from the second microbatch's backward on, all of the stage's gradients are live (they
                # accumulate in .grad). The first backward (the plain simulated one) has `inflight`
                # microbatches saved; the second has min(inflight, m - 1): 1F1B runs a forward between
                # two backwards, GPipe (inflight = m) none
                # (the simulated gradients are those of the whole model: a weight tied across stages has
                # its gradient on one stage there, while every stage holding a copy has its own)
                again = max(0, sim.stage_backward_peak_accum.get(s, 0) - sim.stage_grads.get(s, 0) + grads_b
                            - saved_s)
                later = min(inflight, micro - 1)
                transient = max(transient, again - (inflight - later) * saved_s)
        backward_phase = acts + transient + gathered
        gloo = plan.mesh.device is not None and plan.mesh.device.backend == "gloo"
        per_block = _zero_blocks_peak(sim, facts, params, zero_n, zero, prec, gloo) if fsdp and s is None else None
        if per_block is not None:
            backward_phase = per_block
        elif fsdp:
            # FSDP2's all-gather lands in one flat buffer and is then copied out into each parameter's
            # own storage: for a moment the unit's parameters are live twice. ZeRO-3 (resharded after
            # forward) gathers again when backward starts, beside every saved activation
            backward_phase = max(backward_phase, 2 * gathered + (acts if zero == 3 else 0))
            if s is not None and micro > 1:
                # a pipeline stage is one FSDP2 unit that torch's schedule keeps from syncing until its
                # last microbatch: the gradients accumulate unsharded, and that backward ends with them
                # copied into the reduce-scatter's input beside the gathered parameters and what the
                # microbatch saved (measured: pp2 x dp2 x tp2 ZeRO-3, tests/runtime/plans)
                full = sized(learn, "params")
                backward_phase = max(backward_phase, gathered + 2 * full + saved_s)
        # what FSDP2 holds at the peak (gathered and prefetched parameters, its buffers) is transient too:
        # the report's bar and the row's classes add up to the peak
        transient = backward_phase - acts
        opt_phase = grads_b + opt_tmp
        peak = params_b + opt_b + buffers + max(backward_phase, opt_phase)
        work.append(StageWork(prof.total_fwd_flops * frac * micro, prof.total_bwd_flops * frac * micro))
        units.append(_zero_unit(plan, s, mine, learn))
        row = DeviceEstimate("all devices" if s is None else f"stage {s}", params_b, grads_b, opt_b, buffers,
                             acts, transient + opt_tmp, peak, 0.0, tuple(notes), step_temporaries=opt_tmp,
                             stages=() if s is None else (s,))
        row = _from_program(row, plan, program) if program is not None else row
        out.append(row)
        if s is not None:
            parts.append(_StagePart(row, sim.stage_saved.get(s, 0), transient, learn, flat_copy))
    if plan.pipeline is not None and plan.pipeline.schedule.kind == "interleaved":
        out = _per_rank(plan, parts, states, zero_n if zero >= 1 else 1, zero == 1)
    return _with_steps(plan, out, StepInputs(tuple(work), tuple(units)), traffic, graph, efficiency)


def _with_steps(plan: CompletePlan, rows: list[DeviceEstimate], inputs: "StepInputs", traffic, graph,
                efficiency: float) -> list[DeviceEstimate]:
    """`rows` with their step times (planlang.model.price.step_time) and each stage's busy time. The program is
    lowered here unless the caller passes its `traffic` (or why it could not lower it); without it the
    gradient sums are priced from the parameters, and the rows say so."""
    note = ""
    if traffic is None:
        try:
            traffic = lowered_traffic(plan, graph)
        except Exception as e:  # noqa: BLE001 - a plan the lowering refuses is still estimated; the note says how
            traffic = f"{type(e).__name__}: {e}"
    if isinstance(traffic, list) and len(traffic) != len(inputs.units):
        traffic = (f"the lowered program has {len(traffic)} stages where the plan's modules make "
                   f"{len(inputs.units)}")
    if isinstance(traffic, str):
        note = (f"step time without the program's collectives (the plan could not be lowered: {traffic}); "
                "gradient sums priced from the parameters")
        traffic = None
    staged = plan_traffic(plan, list(inputs.units), traffic)
    steps = step_times(plan, list(inputs.work), staged, efficiency)
    busy = stage_seconds(plan, list(inputs.work), staged, efficiency) if plan.pipeline is not None else []
    return [dataclasses.replace(r, step_time=st.total, step=st, stage_times=tuple(busy[s] for s in r.stages),
                                notes=r.notes + ((note,) if note else ())) for r, st in zip(rows, steps)]


@dataclass(frozen=True)
class _StagePart:
    """What one model stage contributes to its pipeline rank's row (`_per_rank`)."""

    row: DeviceEstimate
    saved: int  # what one microbatch saves on the stage
    backward_transient: int  # beyond its saved activations at its backward's peak (ZeRO's gathers included)
    learn: list
    flat_copy: int


def _per_rank(plan: CompletePlan, parts: list[_StagePart], states: int, shards: int,
              whole: bool) -> list[DeviceEstimate]:
    """One row per pipeline rank of an interleaved schedule: rank r holds model stages r, r + p, ...
    (planlang.plan.schedule), and a device's memory is that of all of them.

    Parameters, gradients, optimizer state and buffers add up. Activations are the rank's peak over its
    order of forwards and backwards, each forward keeping what one microbatch saves on that stage
    (`activation_peaks`): not the sum of each stage's own peak. One backward runs at a time, beside the
    gradients the rank's other stages hold from earlier microbatches (they accumulate in .grad). The
    optimizer steps over all of the rank's parameters at once."""
    pipe = plan.pipeline
    assert pipe is not None
    v = pipe.schedule.chunks
    p = len(parts) // v
    acts = activation_peaks("interleaved", p, pipe.microbatches, [x.saved for x in parts], v)
    out = []
    for r in range(p):
        mine = parts[r::p]
        rows = [x.row for x in mine]
        grads = sum(x.gradients for x in rows)
        kept = sum(x.parameters + x.optimizer + x.buffers for x in rows)
        transient = max(x.backward_transient + grads - x.row.gradients for x in mine)
        opt_tmp = _optimizer_temporaries(plan, [q for x in mine for q in x.learn], states, shards, whole=whole,
                                         gradient_copy=sum(x.flat_copy for x in mine))
        peak = kept + max(acts[r] + transient, grads + opt_tmp)
        notes = tuple(dict.fromkeys(n for x in rows for n in x.notes))
        stages = tuple(s for x in rows for s in x.stages)
        out.append(DeviceEstimate(f"rank {r} (stages {', '.join(map(str, stages))})",
                                  sum(x.parameters for x in rows), grads, sum(x.optimizer for x in rows),
                                  sum(x.buffers for x in rows), acts[r], transient + opt_tmp, peak, 0.0, notes,
                                  step_temporaries=opt_tmp, stages=stages))
    return out


def _zero_blocks_peak(sim, facts, params: dict[str, _Param], shards: int, zero: int,
                      prec: T.Precision | None = None, gloo: bool = False) -> int | None:
    """The most bytes live beside the kept parameter shards and optimizer state in a step of ZeRO-2/3 with
    one FSDP2 unit per repeated block (planlang.runtime.zero_blocks; the blocks are `facts.blocks`, the
    outermost nn.ModuleList entries), or None without a block holding parameters of its own (the whole
    model is then one unit). Each part of the simulated step (`StepMemory.segments`: a block's forward,
    the root code after it, the backward from a block's output on) at its own peak, plus what FSDP2 holds
    there (`B[i]`: block i's parameters, local pieces before FSDP2's shard; `R`: the root unit's). ZeRO-3:

        forward of block i     R + 2 B[i] + B[i+1]   its parameters gathered, its all-gather output (FSDP2
                                                     keeps it until the next all-gather), the next block's
                                                     prefetched
        root code after i      R + B[i] + B[i+1]     block i resharded; both all-gather outputs held
        backward of the head   R + B[n-1]            the last block's all-gather output
        backward of block i    R + B[i] + B[i-1]     gathered again, the block before it prefetched,
                               + G[i+1]              the reduce-scatter input of the block after it (kept
                                                     until the next reduce-scatter)
        its reduce-scatter     R + B[i-1] + G[i]     at the end of its backward (what the simulated step
                               (+ G[i]) + G[i]/n     holds then, `StepMemory.segment_starts`): block i
                                                     resharded and the input before freed first; its
                                                     gradients copied into the input, and while they are
                                                     freed the output is made (with gloo, whose
                                                     reduce-scatter all-reduces a copy of the input, the
                                                     copy too)

    ZeRO-2 (not resharded after forward) keeps every block gathered from its forward until its backward
    has run: the parameters of blocks 0..i take the place of the gathered block, without prefetch in
    backward.

    With precision fields (`prec`), FSDP2 gathers in `params` (B and R in that dtype), keeps the
    reduce-scatter input in `reduce` and the reduce-scattered gradients in `master`, while the simulated
    step holds gradients in `params`: G[i+1] is scaled by reduce/params and the done gradients by
    master/params; the reduce-scatter's input, its copy and its output (the G[i] of that row but the first,
    and G[i]/n) are in `reduce`.

    In the backward of block i, the simulated step still holds the whole gradients of the blocks after
    it; FSDP2 has reduce-scattered them to 1/shards (`G[j]`: block j's gradients). The simulation follows
    what is saved and freed op by op, so a peak inside a block's backward, with part of its activations
    and part of its gradients live, is where it falls. Against MemTracker through planlang.apply
    (bench/zero_blocks.py, GPT-2 in four shapes on dp 4): ZeRO-3 within 0.1 %, ZeRO-2 within 3 %; the
    zoo's four architectures in bf16, autocast and f32 within 4 % (bench/precision_memory.py). The
    runtime keeps a block in the root unit when the program interleaves it with other code or shares its
    parameters; this counts every block holding unshared parameters."""
    if not sim.segments:
        return None
    names = list(getattr(facts, "blocks", ()))

    def block_of(name: str) -> int | None:
        return next((i for i, b in enumerate(names) if name.startswith(b + ".")), None)

    shared = {n for group in facts.shared for n in group if len({block_of(m) for m in group}) > 1}
    B = [0] * len(names)
    R = 0
    mixed = prec is not None and prec.mixed
    rr = prec.bytes("reduce") / prec.bytes("params") if mixed else 1.0  # the reduce-scatter input's dtype
    mr = prec.bytes("master") / prec.bytes("params") if mixed else 1.0  # the sharded gradients' dtype
    for p in params.values():
        i = block_of(p.name)
        size = math.prod(p.local) * (prec.bytes("params") if mixed else p.itemsize)
        if i is None or p.name in shared:
            R += size
        else:
            B[i] += size
    if not any(B):
        return None
    G = list(sim.block_grads) + [0] * (len(names) - len(sim.block_grads))
    n = len(names)

    def at(i: int) -> int:
        return B[i] if 0 <= i < n else 0

    def reduce_scatter(i: int, gathered: int) -> int:
        """What FSDP2 holds beside the simulated step's tensors when block i's backward is done and its
        gradients are reduce-scattered (foreach_reduce): the block resharded (`gathered` parameters are
        still held), the previous reduce-scatter's input freed first (one input buffer at a time), the
        gradients copied into the reduce-scatter input (in `reduce`) and then freed, the output (and with
        gloo, whose reduce-scatter all-reduces a copy of its input, that copy); the blocks done are sharded."""
        done = sum(G[j] for j in range(i + 1, n))
        mine = int(G[i] * rr)
        base = R + gathered - G[i] - done + int(done * mr) // shards
        return base + mine + max(G[i], (mine if gloo else 0) + mine // shards)

    out = 0
    for (kind, i), live in sim.segments.items():
        if kind == "B" and i < n and ("B", i - 1) in sim.segment_starts:  # block i's backward done
            out = max(out, sim.segment_starts[("B", i - 1)] + reduce_scatter(i, sum(B[:i]) if zero == 2 else at(i - 1)))
        if zero == 2:  # parameters stay gathered from a block's forward until its backward has run
            kept = sum(B[: max(i, -1) + 1]) if kind != "B" else sum(B[: min(i, n - 1) + 1])
            if kind == "F":
                extra = R + kept + (at(i) + at(i + 1) if i >= 0 else 0)
            elif kind == "F+":
                extra = R + kept + at(i) + at(i + 1)
            elif i >= n:
                extra = R + kept + at(n - 1)
            else:
                done = sum(G[j] for j in range(i + 1, n))
                extra = R + kept + int((G[i + 1] if i + 1 < n else 0) * rr) - done + int(done * mr) // shards
            out = max(out, live + extra)
            continue
        if kind == "F":
            extra = R + (2 * at(i) + at(i + 1) if i >= 0 else 0)
        elif kind == "F+":
            extra = R + at(i) + at(i + 1)
        elif i >= n:  # the head's backward, before the last block's
            extra = R + at(n - 1)
        else:
            done = sum(G[j] for j in range(i + 1, n))
            extra = R + at(i) + at(i - 1) + int((G[i + 1] if i + 1 < n else 0) * rr) - done + int(done * mr) // shards
        out = max(out, live + extra)
    return out


def _from_program(row: DeviceEstimate, plan: CompletePlan, program) -> DeviceEstimate:
    """`row` with its activations and peak from rank 0's program run on meta, or with a note saying why
    they come from the simulation of the model's code. The peak is then parameters + optimizer + buffers
    + activations + transient, at `measured_phase`."""
    got = program(plan)
    if isinstance(got, str):
        return dataclasses.replace(row, notes=row.notes + (f"activations simulated from the model's code: {got}",))
    # the classes a step keeps stay the estimate's (ZeRO-1's optimizer state is the fullest rank's, not
    # rank 0's); the measured peak is never below them plus the activations the program measured
    kept = row.parameters + row.optimizer + row.buffers
    transient = max(0, got.peak - kept - got.activations)
    notes = tuple(n for n in row.notes if not n.startswith("local simulation failed"))
    return dataclasses.replace(row, activations=got.activations, transient=transient,
                               peak=max(got.peak, kept + got.activations), measured_phase=got.phase,
                               notes=notes + ("activations and peak: rank 0's lowered program, run on meta",))


def _zero1_state_bytes(mine: list[_Param], trained: set[str], states: int, counter: bool, ranks: int,
                       itemsize: int = 4) -> int:
    """Optimizer-state bytes of the fullest rank under ZeroRedundancyOptimizer's partition: whole
    parameters, largest first, each to the rank holding the fewest elements so far (a greedy balance;
    Rajbhandari et al. 2020 §5.1 P_os with tensor granularity). Only `trained` parameters (those that
    get a gradient) have state."""
    load = [0] * ranks
    state = [0] * ranks
    for p in sorted(mine, key=lambda p: -math.prod(p.local)):
        r = load.index(min(load))
        n = math.prod(p.local)
        load[r] += n
        if p.name in trained:
            state[r] += states * n * itemsize + (4 if counter else 0)
    return max(state)


def _boundary_bytes(facts, stage_of: dict[str, int], stage: int, divide: int, side: str, last: int = -1) -> int:
    """Bytes per microbatch crossing a stage boundary: the input of the stage's first module (side "in",
    not for stage 0) or the output of its last one (side "out", whose gradient comes back; not for the
    last stage). Activations in f32; shapes of the whole batch divided into microbatches."""
    mods = [m for m in facts.order if stage_of.get(m) == stage]
    if not mods or (side == "in" and stage == 0) or (side == "out" and stage == last):
        return 0
    call = facts.calls.get(mods[0] if side == "in" else mods[-1])
    shape = (call.inputs[0] if call and call.inputs else None) if side == "in" else (call.output if call else None)
    if shape is None:
        return 0
    return math.prod(shape) * 4 // max(1, divide)


def _optimizer_temporaries(plan: CompletePlan, mine: list[_Param], states: int, shards: int, whole: bool = False,
                           gradient_copy: int = 0, itemsize: int = 4) -> int:
    """Bytes the optimizer step allocates on top of its states. torch's Adam-family optimizers run the
    per-tensor implementation on CPU (two temporaries of one parameter's size at a time: sqrt of the
    second moment, then its scaled copy) and the multi-tensor (foreach) one on accelerators (one
    temporary per parameter, all alive together). `shards` ranks share the step: FSDP2 slices every
    tensor, ZeroRedundancyOptimizer (`whole`) gives each rank whole tensors, so the per-tensor path's
    temporaries are those of a whole parameter (a rank holds the largest) and the multi-tensor path's
    are about 1/shards of the sum.

    The result is what is live beside the gradients after backward, so it is at least `gradient_copy`:
    the flat copy the data-parallel gradient sum makes just before the step (the two come one after the
    other, so the larger counts)."""
    return max(gradient_copy, _step_temporaries(plan, mine, states, shards, whole, itemsize))


def _step_temporaries(plan: CompletePlan, mine: list[_Param], states: int, shards: int, whole: bool,
                      itemsize: int = 4) -> int:
    """`itemsize`: bytes per element of the state (the precision's master dtype)."""
    if not states or not mine:
        return 0
    dev = plan.mesh.device.name if plan.mesh and plan.mesh.device else ""
    if "cpu" in dev:
        return 2 * max(math.prod(p.local) * itemsize for p in mine) // (1 if whole else shards)
    return sum(math.prod(p.local) * itemsize for p in mine) // shards


def render_table(plan: CompletePlan, rows: list[DeviceEstimate]) -> str:
    budget = plan.budget.bytes if plan.budget else None
    w = max([12] + [len(r.device) for r in rows])  # "rank 0 (stages 0, 2)" under an interleaved schedule
    head = (f"{'device':{w}} {'params':>11} {'grads':>11} {'optimizer':>11} {'buffers':>11} {'activations':>12} "
            f"{'transient':>11} {'peak':>11} {'budget':>8} {'step':>10}")
    lines = [head, "-" * len(head)]
    for r in rows:
        fit = "-" if budget is None else ("ok" if r.peak <= budget else "OVER")
        lines.append(f"{r.device:{w}} {format_bytes(r.parameters):>11} {format_bytes(r.gradients):>11} "
                     f"{format_bytes(r.optimizer):>11} {format_bytes(r.buffers):>11} {format_bytes(r.activations):>12} "
                     f"{format_bytes(r.transient):>11} {format_bytes(r.peak):>11} {fit:>8} {r.step_time * 1e3:>8.2f}ms")
    lines += [f"step time, {r.device}: {r.step}" for r in rows if r.step is not None]
    lines += [f"note: {n}" for n in dict.fromkeys(n for r in rows for n in r.notes)]  # once, not per row
    if plan.precision.mixed:
        lines.append(f"precision: {precision_summary(plan)}")
    return "\n".join(lines) + "\n"


def precision_summary(plan: CompletePlan) -> str:
    """One line saying the plan's dtypes and how the estimate counts them (`planlang estimate`, the report)."""
    prec = plan.precision
    dev = plan.mesh.device if plan.mesh is not None else None
    peak = dev.flops_for(prec.compute) if dev is not None else None
    at = f"compute priced at flops.{prec.compute} = {peak / 1e12:g} TFLOPS" if peak else "compute not priced"
    fsdp = plan.optimizer is not None and plan.optimizer.zero_stage >= 2
    copy = ("FSDP2's shards are the master copy" if fsdp else f"the weights' master copy in {prec.master}"
            ) if prec.master_copy else "no master copy"
    scale = f", loss scale {prec.loss_scale}" if prec.loss_scale is not None else ""
    return f"{prec}{scale}; {copy}; {at}"
