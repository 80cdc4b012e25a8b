"""Pipeline stages for a plan: its model and mesh turned into the partition kernels' inputs, and their
answers turned into `stage` lines the plan language expresses.

Each entry point takes a resolved `Plan` (model, inputs, mesh, pipeline axis, microbatches, schedule)
and returns one `StageChoice` per stage — the selection strings of the stage's modules (`wte`, `h[0:6]`),
per-stage degrees where the kernel chooses them, and a note with the figure it optimised:

* `balanced_stages`  min–max contiguous partition of a per-layer cost (flops by default);
* `memory_stages`    CAPTURE's search: stages with dp or tp degrees minimising predicted peak memory;
* `capture_partition` CAPTURE's layer groups on the mesh's own degrees (least predicted peak);
* `alpa_partition`   Alpa's DP on the one sub-mesh shape every stage has: the fastest cut that fits;
* `throughput_stages_for_plan`  Alpa-style DP minimising Σ t_i + (m − 1) · max t_i within the budget
  over sub-meshes of their own sizes (per-stage device counts, not run: PL418);
* `tree_stages`      SageMaker's tree partition over the module hierarchy.

`solve_stages(plan, method)` picks one by name.

`to_stages` gives planlang.plan.types.Stage values; `str(choice)` is the plan line.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from planlang.plan import types as T
from planlang.plan.data import batch_dim
from planlang.plan.selection import Selection

from .capture import MemoryModel, capture_search, default_configs
from .partition import PartitionError, min_max_partition
from .pipeline_layers import LayerSequence, layer_sequence, model_tree, stage_selections, tree_selections
from .throughput_stages import Submesh, throughput_stages
from .tree_partition import tree_partition
from planlang.cost.comm import Collective, DEFAULT_LINK, Group, collective_time, compute_time, work_time
from planlang.model.price.estimate import STATE_ELEMENTS
from planlang.model.capture.load import build_model, meta_inputs, model_loss
from planlang.model.capture.profile import Profile, profile_model
from planlang.model.capture.trace import ModuleFacts, probe_modules


@dataclass(frozen=True)
class StageChoice:
    """One stage: selection strings in execution order, optional per-axis degrees, a note."""

    modules: tuple[str, ...]
    degrees: tuple[tuple[str, int], ...] = ()
    note: str = ""

    def __str__(self) -> str:
        s = "stage " + ", ".join(self.modules)
        return s + (" with " + ", ".join(f"{a} = {n}" for a, n in self.degrees) if self.degrees else "")

    def to_stage(self, index: int) -> T.Stage:
        return T.Stage(index, tuple(Selection.parse(m) for m in self.modules), self.degrees)


def to_stages(choices: Sequence[StageChoice]) -> tuple[T.Stage, ...]:
    return tuple(c.to_stage(i) for i, c in enumerate(choices))


# ------------------------------------------------------------------------------ reading the plan
def _pipeline(plan: T.Plan) -> T.Pipeline:
    if plan.pipeline is None:
        raise PartitionError("the plan has no `pipeline`; add `pipeline over AXIS schedule 1f1b microbatches M { ? }`")
    return plan.pipeline


def stage_count(plan: T.Plan) -> int:
    """Stages the plan needs: the pipeline axis size (times chunks for a chunked schedule), PL401's rule."""
    p = _pipeline(plan)
    size = plan.mesh.axis_size(p.axis) if plan.mesh and isinstance(p.axis, str) else None
    if size is None:
        raise PartitionError("the pipeline axis size is unknown (a hole or no mesh); give it, or pass `stages=`")
    chunks = p.schedule.chunks if isinstance(p.schedule, T.Schedule) and p.schedule.kind in T.CHUNKED else 1
    if not isinstance(chunks, int):
        raise PartitionError("`chunks` is a hole; give it, or pass `stages=`")
    return size * chunks


def _microbatches(plan: T.Plan) -> int:
    m = _pipeline(plan).microbatches
    if not isinstance(m, int) or m < 1:
        raise PartitionError("microbatches is not a number yet; give it, or solve it before the stages")
    return m


def _schedule(plan: T.Plan) -> str:
    """The schedule for the memory-aware searches (a hole counts as 1f1b)."""
    s = _pipeline(plan).schedule
    kind = s.kind if isinstance(s, T.Schedule) else "1f1b"
    if kind in T.CHUNKED:
        raise PartitionError(f"with `{kind}`, stages i and i + p share a device, but the memory-aware "
                             "searches give each stage its own devices; use 1f1b or gpipe here, or "
                             "balanced_stages / tree_stages")
    return kind


def _microbatch_inputs(plan: T.Plan, divide: int):
    """Meta inputs of one microbatch: the batch dim (named `batch`, else the first) divided by `divide`."""

    inputs = []
    for inp in plan.inputs:
        dims = list(inp.dims)
        if dims:
            i = batch_dim(inp)
            if dims[i][1] % divide:
                raise PartitionError(f"input `{inp.name}`: batch {dims[i][1]} does not divide into {divide} "
                                     "microbatches; change the batch or the microbatch count")
            dims[i] = (dims[i][0], dims[i][1] // divide)
        inputs.append(T.Input(inp.name, inp.dtype, tuple(dims)))
    return meta_inputs(tuple(inputs))


@dataclass
class ModelParts:
    """The plan's model on meta with its probe and profile; `layers` is its layer sequence, or None for
    a model that is not a chain of modules (then only the tree partition applies)."""

    module: torch.nn.Module
    facts: ModuleFacts
    profile: Profile
    layers: LayerSequence | None
    chain_error: str = ""
    divide: int = 0  # the profile's batch is the plan's / divide (0: one microbatch's)


def plan_layers(plan: T.Plan, stages: int = 0, divide: int | None = None) -> ModelParts:
    """Build the plan's model on meta, profile one microbatch (batch / microbatches, or / `divide`) and
    list its layers for a cut into `stages` (`pipeline_layers.layer_sequence`)."""

    if plan.model is None:
        raise PartitionError("the plan declares no model; add `model NAME = \"package.module:factory\"(...)`")
    module = build_model(plan.model, plan.path)
    divide = divide if divide is not None else _microbatches(plan)
    inputs = _microbatch_inputs(plan, divide)
    facts = probe_modules(module, inputs)
    prof = profile_model(module, inputs, model_loss(plan.model))
    try:
        return ModelParts(module, facts, prof, layer_sequence(module, inputs, facts=facts, profile=prof, stages=stages),
                          divide=divide)
    except PartitionError as err:
        return ModelParts(module, facts, prof, None, str(err), divide)


def _layers(parts: ModelParts, stages: int) -> LayerSequence:
    """The parts' layers, split further (from the same profile) when there are fewer than `stages`."""
    if parts.layers is None:
        raise PartitionError(parts.chain_error)
    if len(parts.layers.layers) >= stages:
        return parts.layers
    return layer_sequence(parts.module, {}, facts=parts.facts, profile=parts.profile, stages=stages)


def _other_axes(plan: T.Plan) -> tuple[list[str], str | None, str | None]:
    """Non-pipeline axes; the data axis (splits an input's batch dim) and a tensor axis (another one)."""
    mesh, p = plan.mesh, _pipeline(plan)
    if mesh is None:
        raise PartitionError("the plan has no mesh")
    others = [a for a in mesh.names if a != p.axis]
    data = None
    for d in plan.data:
        if isinstance(d.spec, T.Spec) and d.spec.dims and not T.is_hole(d.spec.dims[0]):
            data = next((a for a in d.spec.dims[0] if a in others), data)  # type: ignore[union-attr]
    tensor = next((a for a in others if a != data), None)
    return others, data, tensor


def _degrees(others: list[str], assign: dict[str, int]) -> tuple[tuple[str, int], ...]:
    return tuple((a, assign.get(a, 1)) for a in others)


# ------------------------------------------------------------------------------ entry points
def balanced_stages(plan: T.Plan, stages: int | None = None, cost: str = "flops",
                    parts: ModelParts | None = None) -> list[StageChoice]:
    """Stages balancing a per-layer cost ("flops", "params" or "activations") by the min–max DP.
    Every entry point takes `parts` (from `plan_layers(plan)`) to reuse one profile across calls."""
    k = stages if stages is not None else stage_count(plan)
    parts = parts or plan_layers(plan, stages=k)
    layers = _layers(parts, k)
    part = min_max_partition(layers.costs(cost), k)
    unit = {"flops": (1e9, "GFLOP"), "params": (2**20, "MiB params"), "activations": (2**20, "MiB saved")}[cost]
    return [StageChoice(tuple(sel), (), f"{c / unit[0]:.3g} {unit[1]}")
            for sel, c in zip(stage_selections(layers, part.bounds), part.costs)]


def _optimizer_model(plan: T.Plan) -> MemoryModel:
    states = STATE_ELEMENTS.get(plan.optimizer.name, 2) if plan.optimizer else 0
    return MemoryModel(grad=1.0, optimizer=float(states))  # f32 parameters: a state element per element


def _microbatch_samples(plan: T.Plan) -> int | None:
    """Samples in one microbatch: the first input's batch dim (named `batch`, else the first) / microbatches."""
    for inp in plan.inputs:
        if inp.dims:
            size = dict(inp.dims).get("batch", inp.dims[0][1])
            return size // _microbatches(plan)
    return None


def memory_stages(plan: T.Plan, stages: int | None = None, node_size: int | None = None,
                  placement: str = "in_order", extra_in_flight: int = 0,
                  parts: ModelParts | None = None) -> list[StageChoice]:
    """CAPTURE's plan: stages with data- or tensor-parallel degrees minimising predicted peak memory.
    Degrees go to the plan's data axis (dp) or its other non-pipeline axis (tp); a dp degree must divide
    the samples of a microbatch. `node_size` defaults to the devices of one pipeline slice (the mesh's
    device count / the stage count). `extra_in_flight=1` counts 1F1B's peak as planlang.model.price.estimate
    does (min(p − i + 1, m)); the default is the steady-state rule min(p − i, m)."""
    mesh = plan.mesh
    if mesh is None or mesh.size is None:
        raise PartitionError("the mesh's device count is unknown; declare `of N x device` or give every axis a size")
    G = mesh.size
    k_stages = stages if stages is not None else stage_count(plan)
    if node_size is None:
        node_size = G // k_stages if G % k_stages == 0 else G
    others, data, tensor = _other_axes(plan)
    samples = _microbatch_samples(plan)
    pars = [p for p, ax in (("dp", data), ("tp", tensor)) if ax is not None]
    configs = [(p, d) for p, d in default_configs(node_size, pars)
               if p != "dp" or samples is None or samples % d == 0]
    parts = parts or plan_layers(plan, stages=k_stages)
    L = _layers(parts, k_stages)
    result = capture_search(L.costs("params"), L.costs("activations"), G, node_size, _microbatches(plan),
                            schedule=_schedule(plan), memory=_optimizer_model(plan), configs=configs,
                            stages=k_stages, placement=placement, extra_in_flight=extra_in_flight)
    bounds = [s.start for s in result.stages] + [len(L.layers)]
    out = []
    for sel, st in zip(stage_selections(L, bounds), result.stages):
        axis = {"dp": data, "tp": tensor}.get(st.parallelism)
        degrees = _degrees(others, {axis: st.degree} if axis else {})
        out.append(StageChoice(tuple(sel), degrees, f"predicted peak {st.memory / 2**30:.3g} GiB"))
    return out


@dataclass(frozen=True)
class UniformStages:
    """What the partitions of stages on the mesh's own degrees read (every stage on its pipeline slice of
    dp x tp devices), per layer, per device and per microbatch: `times` the step-time model's forward +
    backward seconds (planlang.cost.comm.work_time of the layer's flops and memory-bound bytes at the
    plan's compute dtype, / (dp·tp)), `static` its parameters, gradients and optimizer states (/ tp; the
    ZeRO stage's share / dp), `act` its saved activations (/ (dp·tp)); `budget` the plan's (else the
    device memory), bytes per device."""

    layers: LayerSequence
    times: tuple[float, ...]
    static: tuple[float, ...]
    act: tuple[float, ...]
    microbatches: int
    schedule: str
    dp: int
    tp: int
    budget: float | None

    @property
    def devices(self) -> int:
        """Devices of one stage: dp x tp."""
        return self.dp * self.tp


def uniform_stages(plan: T.Plan, stages: int, parts: ModelParts | None = None, microbatches: int | None = None,
                   degrees: tuple[int, int] | None = None, schedule: str | None = None, zero: int = 0,
                   efficiency: float = 0.5) -> UniformStages:
    """The inputs of `capture_partition` and `alpa_partition` for `stages` stages (UniformStages). The
    solver passes its candidate's microbatches, (dp, tp) degrees, schedule and ZeRO stage (the plan's
    may be holes); else the plan's: microbatches still a hole count as the stage count (1F1B's in-flight
    counts min(p − i, m) are those of any m >= p), a mesh size still a hole as 1."""
    m = microbatches or _pipeline(plan).microbatches
    m = m if isinstance(m, int) and m >= 1 else stages
    parts = parts or plan_layers(plan, stages=stages)
    L = _layers(parts, stages)
    mesh = plan.mesh
    if degrees is None:
        _, data, tensor = _other_axes(plan)
        degrees = ((mesh.axis_size(data) or 1) if mesh is not None and data else 1,
                   (mesh.axis_size(tensor) or 1) if mesh is not None and tensor else 1)
    dp, tp = degrees
    kind = schedule or _schedule(plan)
    if kind not in ("gpipe", "1f1b"):
        raise PartitionError(f"`{kind}`: the capture and alpa partitions model the microbatches in flight "
                             "of gpipe and 1f1b only (one stage per rank); use the flops, activations or tree one")
    per = (parts.divide or m) / m / (dp * tp)  # the profiled batch -> one microbatch on one device
    # each layer's own ops, and those of no layer (the root's: the embedding sum, the loss) on the last
    # stage, as the estimate counts a stage's work (planlang.model.price.estimate)
    prof = parts.profile
    work = [[float(g.fwd_flops + g.bwd_flops), float(g.fwd_bytes + g.bwd_bytes)]
            for g in (prof.subtree(x.name) for x in L.layers)]
    work[-1][0] += prof.total_fwd_flops + prof.total_bwd_flops - sum(w[0] for w in work)
    work[-1][1] += prof.total_fwd_bytes + prof.total_bwd_bytes - sum(w[1] for w in work)
    if mesh is not None and mesh.device is not None and mesh.device.flops:
        dtype = plan.precision.compute if isinstance(plan.precision.compute, str) else "f32"
        times = [work_time(f * per, b * per, mesh, dtype, efficiency) for f, b in work]
    else:  # no device throughput: the flops stand for the time (the same cut: one scale for every layer)
        times = [f * per for f, _ in work]
    mm = _optimizer_model(plan)
    share = [1 / dp if zero >= z else 1.0 for z in (3, 2, 1)]  # parameters, gradients, optimizer states
    static = [x.param_bytes / tp * (share[0] + mm.grad * share[1] + mm.optimizer * share[2]) for x in L.layers]
    budget = plan.budget.bytes if plan.budget is not None else (
        mesh.device.memory if mesh is not None and mesh.device is not None else None)
    return UniformStages(L, tuple(times), tuple(static), tuple(a * per for a in L.costs("activations")), m, kind,
                         dp, tp, float(budget) if budget else None)


def capture_partition(plan: T.Plan, stages: int | None = None, parts: ModelParts | None = None,
                      **candidate) -> list[StageChoice]:
    """CAPTURE's memory-centric search (capture §III-C, Algorithm 4) for the layer groups alone: every
    stage on its pipeline slice with the mesh's own degrees (`stage ... with` degree holes are the
    solver's, space._degree_options), the groups that minimise the predicted peak over the stages, each holding its schedule's
    microbatches in flight (§III-B3's predictor: states W·(1 + grad + optimizer) / tp and activations
    / (dp·tp) per device, `uniform_stages`; `candidate`: its microbatches, degrees, schedule)."""
    k = stages if stages is not None else stage_count(plan)
    u = uniform_stages(plan, k, parts, **candidate)
    params = [x.param_bytes / u.tp for x in u.layers.layers]
    result = capture_search(params, list(u.act), k, 1, u.microbatches, schedule=u.schedule,
                            memory=_optimizer_model(plan), configs=(("none", 1),), stages=k)
    bounds = [s.start for s in result.stages] + [len(u.layers.layers)]
    return [StageChoice(tuple(sel), (), f"predicted peak {st.memory / 2**30:.3g} GiB")
            for sel, st in zip(stage_selections(u.layers, bounds), result.stages)]


def alpa_partition(plan: T.Plan, stages: int | None = None, parts: ModelParts | None = None,
                   budget: float | None = None, **candidate) -> list[StageChoice]:
    """Alpa's inter-operator DP (alpa §5.2, eq. 2; planlang.solve.throughput_stages) with one sub-mesh
    shape, the one every stage has until stages get their own degrees (PL418): dp x tp devices, the
    pipeline's p stages using all p·dp·tp. The cut minimises Σ t_i + (B − 1)·max t_i, t_i the stage's
    forward + backward per microbatch by the step-time model's compute (`uniform_stages`), among the cuts
    whose every stage fits the budget (states + its schedule's in-flight microbatches' activations,
    1F1B's min(p − i, B)). With one sub-mesh shape Σ t_i is the same for every cut, so this is the
    fastest bottleneck among the cuts that fit. When none fits by this predictor, the fastest cut, noted.
    `budget` replaces the plan's; `candidate` as for `uniform_stages`."""
    k = stages if stages is not None else stage_count(plan)
    u = uniform_stages(plan, k, parts, **candidate)
    col = [[[x] for x in v] for v in (u.times, u.static, u.act)]
    limit = budget if budget is not None else u.budget
    over = ""
    try:
        result = throughput_stages(col[0], [u.devices], k * u.devices, u.microbatches, col[1], col[2], limit,
                                   schedule=u.schedule, stages=k)
    except PartitionError:
        if limit is None:
            raise
        result = throughput_stages(col[0], [u.devices], k * u.devices, u.microbatches, col[1], col[2], None,
                                   schedule=u.schedule, stages=k)
        over = " (no cut fits the budget: the fastest)"
    bounds = [s.start for s in result.stages] + [len(u.layers.layers)]
    return [StageChoice(tuple(sel), (), f"{st.time * 1e3:.3g} ms per microbatch, predicted {st.memory / 2**30:.3g} "
                        f"GiB{over}") for sel, st in zip(stage_selections(u.layers, bounds), result.stages)]


def throughput_stages_for_plan(plan: T.Plan, stages: int | None = None,
                               layer_time: Callable[[int, int, int], float] | None = None,
                               efficiency: float = 0.5, budget: float | None = None,
                               extra_in_flight: int = 0, parts: ModelParts | None = None) -> list[StageChoice]:
    """Alpa-style stages and sub-meshes minimising Σ t_i + (m − 1) · max t_i, each stage within the
    memory budget (plan budget, else the device memory) under the schedule's in-flight rule.

    Sub-mesh sizes are Alpa's: 1, 2, 4, ... up to a node (the devices of one pipeline slice), then whole
    nodes. A sub-mesh of d devices runs data parallel over as many devices as divide the microbatch's
    samples (dd = gcd(d, samples)) and tensor parallel over the rest (tt = d / dd; sizes that would need
    a tensor axis the mesh lacks are left out); the stage line gets those degrees. `layer_time(l, dd, tt)`
    gives layer l's latency for one microbatch; the default is a rough alpha-beta model — flops / d at
    `efficiency` of the device's peak, the gradient all-reduce over dd spread over the microbatches, and
    two all-reduces of the layer's output over tt (forward and backward) — meant to be replaced by the
    intra-op solver's latencies (Alpa's t_intra). Memory per device: states / tt (+ DDP buckets when
    dd > 1) and saved activations / d, times the microbatches in flight (`extra_in_flight` as in
    `memory_stages`). The stage count is `stages`, else the plan's."""

    mesh = plan.mesh
    if mesh is None or mesh.size is None:
        raise PartitionError("the mesh's device count is unknown; declare `of N x device` or give every axis a size")
    G, m = mesh.size, _microbatches(plan)
    k = stages if stages is not None else stage_count(plan)
    node = G // k if G % k == 0 else G
    sizes = [2**j for j in range(int(math.log2(node)) + 1) if 2**j < node] + [h * node for h in range(1, G // node + 1)]
    others, data, tensor = _other_axes(plan)
    samples = _microbatch_samples(plan) or 1
    meshes, degrees = [], []
    for size in sizes:
        dd = math.gcd(size, samples) if data else 1
        tt = size // dd
        if tt > 1 and tensor is None:
            continue
        meshes.append(Submesh(1, size) if size <= node else Submesh(size // node, node))
        degrees.append((dd, tt))
    parts = parts or plan_layers(plan, stages=k)
    layers = _layers(parts, k)
    L = layers.layers

    def link(axes):
        links = [mesh.axis(a).link or DEFAULT_LINK for a in axes if mesh.axis(a) is not None]
        return min(links, key=lambda x: x.bandwidth) if links else DEFAULT_LINK

    def default_time(l: int, dd: int, tt: int) -> float:
        lk = link(others if dd * tt <= node else list(mesh.names))
        t = compute_time(L[l].flops / (dd * tt), mesh, "f32", efficiency)
        t += collective_time(Collective.ALL_REDUCE, Group((), dd, lk.bandwidth, lk.latency), L[l].param_bytes / tt) / m
        t += 2 * collective_time(Collective.ALL_REDUCE, Group((), tt, lk.bandwidth, lk.latency), L[l].out_bytes / dd)
        return t

    fn = layer_time or default_time
    mm = _optimizer_model(plan)
    times = [[fn(l, dd, tt) for dd, tt in degrees] for l in range(len(L))]
    static = [[x.param_bytes * (1 + mm.grad + mm.optimizer + (mm.ddp_buffer if dd > 1 else 0)) / tt
               for dd, tt in degrees] for x in L]
    act = [[x.act_bytes / (dd * tt) for dd, tt in degrees] for x in L]
    limit = budget if budget is not None else (plan.budget.bytes if plan.budget else
                                               (mesh.device.memory if mesh.device else None))
    result = throughput_stages(times, meshes, G, m, static, act, limit, schedule=_schedule(plan),
                               extra_in_flight=extra_in_flight, stages=k)
    bounds = [s.start for s in result.stages] + [len(L)]
    out = []
    for sel, st in zip(stage_selections(layers, bounds), result.stages):
        dd, tt = degrees[st.group]
        out.append(StageChoice(tuple(sel), _degrees(others, {a: v for a, v in ((data, dd), (tensor, tt)) if a}),
                               f"{st.time * 1e3:.3g} ms per microbatch on {st.mesh.size} device(s)"))
    return out


def tree_stages(plan: T.Plan, stages: int | None = None, alpha: float = 0.5,
                parts: ModelParts | None = None) -> list[StageChoice]:
    """SageMaker's tree partition of the module hierarchy into stages (order-preserving)."""
    k = stages if stages is not None else stage_count(plan)
    parts = parts or plan_layers(plan)
    tree = model_tree(parts.module, parts.facts, parts.profile, alpha)
    result = tree_partition(tree, k)
    sels = tree_selections(result, parts.module, k, parts.facts)
    empty = [i for i, s in enumerate(sels) if not s]
    if empty:
        raise PartitionError(f"the tree partition left stage(s) {empty} without modules; use fewer stages or "
                             "the flat partition")
    return [StageChoice(tuple(s), (), f"load {load:.3g}") for s, load in zip(sels, result.loads)]


def stage_partition(plan: T.Plan, method: str, stages: int, parts: ModelParts | None = None,
                    microbatches: int | None = None, degrees: tuple[int, int] | None = None,
                    schedule: str | None = None, zero: int = 0) -> list[StageChoice]:
    """The stages `planlang solve` fills a `stages ?` hole with by `method` (planlang.solve.space.
    STAGE_METHODS): flops or activations (min–max over that per-layer cost), tree (SageMaker), capture
    (CAPTURE's least predicted peak) or alpa (Alpa's DP: the fastest cut that fits); the last two read the
    candidate's microbatches, (dp, tp) degrees, schedule and (alpa) ZeRO stage (`uniform_stages`)."""
    if method == "tree":
        return tree_stages(plan, stages, parts=parts)
    if method in ("flops", "activations"):
        return balanced_stages(plan, stages, cost=method, parts=parts)
    candidate: dict = {"microbatches": microbatches, "degrees": degrees, "schedule": schedule}
    if method == "capture":
        return capture_partition(plan, stages, parts, **candidate)
    if method == "alpa":
        return alpa_partition(plan, stages, parts, zero=zero, **candidate)
    raise PartitionError(f"stage method {method!r}: use flops, activations, tree, capture or alpa")


METHODS: dict[str, Callable[..., list[StageChoice]]] = {
    "balanced": balanced_stages, "memory": memory_stages, "capture": capture_partition, "alpa": alpa_partition,
    "throughput": throughput_stages_for_plan, "tree": tree_stages}


def solve_stages(plan: T.Plan, method: str = "balanced", **options) -> list[StageChoice]:
    """The plan's stages by `method`: balanced (min–max flops), memory (CAPTURE, with per-stage degrees),
    capture (CAPTURE's layer groups on the mesh's degrees), alpa (Alpa's DP on the mesh's degrees),
    throughput (Alpa-style DP, per-stage sub-meshes) or tree (SageMaker). `options` go to that entry point (`stages=`, `parts=`, ...)."""
    fn = METHODS.get(method)
    if fn is None:
        raise PartitionError(f"stage method {method!r}: use one of {', '.join(METHODS)}")
    return fn(plan, **options)
