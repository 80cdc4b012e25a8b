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
                 `gradients` is 0 there) and a pipeline stage's receive buffers (planlang.runtime.
                 recv_buffers: the activations of its microbatches in flight, one gradient at a time;
                 under the interleaved schedule, which receives ahead, planlang.plan.schedule.interleaved_receives)
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
    after-backward phase  all gradients (none beyond the buckets where they are their slices) + the
                          optimizer step's temporaries

`transient` reports the backward transient plus that after-backward figure (planlang.report splits them).
Activations and transients come from a simulated step on the meta device (`simulate.py`) of the local
model: the batch each device sees, parameters replaced by their local shards (so Megatron-style
column/row splits shrink the activations they produce), checkpoint groups wrapped in
torch.utils.checkpoint. Step time: planlang.model.price.step_time (docs/step_time.md).

Where the parts live: the local model (shards, local inputs, checkpoints, precision) in `local_model`, its
simulated step and profile in `local_step`; ZeRO's and the optimizer step's figures in `zero_peaks`; the
caches shared between calls in `caches`; stages of their own degrees (`stage ... with dp = 4`) in
`stage_meshes`, each stage estimated as the plan of its sizes; this module assembles the rows. The table `planlang estimate` prints is planlang.report.estimate_table.

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

import dataclasses
import math
from dataclasses import dataclass

from planlang.plan import types as T
from planlang.plan.complete import CompletePlan
from planlang.plan.data import data_degree, tensor_axes
from planlang.plan.schedule import activation_peaks, backward_peaks, interleaved_receives
from planlang.plan.stage_meshes import heterogeneous
from planlang.plan.units import format_bytes

from planlang.model.capture.load import build_model, meta_inputs, model_loss
from planlang.model.capture.profile import Profile
from planlang.model.capture.source import imported_source, model_source
from planlang.model.capture.trace import probe_modules
from planlang.model.price.caches import MODEL_FACTS, caller_caches
from planlang.model.price.local_step import profile_local, simulate_local as _simulate_local  # (tests and bench spy on it here)
from planlang.model.price.pipeline_bytes import (boundary_bytes, held_before as _held_before, in_flight_on,
                                                 local_neighbours as _local_neighbours, weight_pending_bytes)
from planlang.model.price.stage_replay import recordings
from planlang.model.price.local_model import (LocalParam, LocalPieces, autocast_for, build_local_model,
                                              local_inputs, local_params, plan_checkpoint_groups, plan_model,
                                              sized, split_widths)
from planlang.model.price.step_time import (PipelineSchedule, StageWork, StepTime, lowered_traffic, plan_traffic,
                                            price_step, step_times)
from planlang.model.price.stage_meshes import bare_traffic, estimate_stages, stage_inputs, stage_traffic
from planlang.model.price.traffic import Traffic, Transfer, ZeroUnit, fsdp_numel
from planlang.model.price.zero_peaks import (STATE_ELEMENTS, STEP_COUNTER, optimizer_temporaries, zero1_state_bytes,
                                             zero_blocks_peak)

__all__ = ["GRAD_SYNC", "STATE_ELEMENTS", "DeviceEstimate", "StepInputs", "estimate_plan", "estimate_steps"]


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
    # a pipeline's schedule as the step time prices it (the same on every row; None without a pipeline or
    # without the device's throughput): the report draws it; as_dict leaves it out
    schedule: PipelineSchedule | None = None
    # of `buffers`, the gradient buckets the gradients are slices of (planlang.runtime.grad_sync; then
    # `gradients` is 0): the gradients' own storage, held the whole step. The table shows them as grads
    grad_buckets: int = 0

    def __str__(self) -> str:
        return f"{self.device}: peak {format_bytes(self.peak)}"

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("device", "parameters", "gradients", "optimizer", "buffers",
                                              "activations", "transient", "peak", "step_time",
                                              "measured_phase", "step_temporaries", "grad_buckets")} | {
            "stages": list(self.stages), "notes": list(self.notes),
            "step": None if self.step is None else dataclasses.asdict(self.step)}


GRAD_SYNC = ("flat", "ddp")


def _model_key(plan: T.Plan, source) -> tuple:
    return (source.files, str(plan.model), plan.path, tuple(str(i) for i in plan.inputs))


def _model_facts(plan: T.Plan, facts=None) -> tuple:
    """The probed model of `plan` and its key in caches.MODEL_FACTS (the model's source as read now).
    `facts`: the caller's, probed from that source; kept for the next call."""
    key = _model_key(plan, model_source(plan.model, plan.path))
    if facts is None:
        facts = MODEL_FACTS.get(key)
    if facts is None:
        facts = probe_modules(build_model(plan_model(plan), plan.path), meta_inputs(plan.inputs))
        key = _model_key(plan, imported_source(plan.model) or model_source(plan.model, plan.path))
    return MODEL_FACTS.put(key, facts), key


def _profile_key(plan: CompletePlan, facts, model_key: tuple, params: dict[str, LocalParam]) -> tuple:
    """What the profile of the local model depends on: local shapes, batch, checkpoint groups, dtypes."""
    micro = plan.microbatches  # a pipeline's, or gradient accumulation's: the local model runs one
    prec = plan.precision
    return (model_key, tuple((n, p.local) for n, p in params.items()), data_degree(plan) * micro,
            tuple(tuple(g) for g in plan_checkpoint_groups(plan, facts)),
            (prec.params, prec.compute) if prec.mixed else ())


def estimate_steps(plan: CompletePlan, efficiency: float = 0.5, *, facts=None,
                   cache: dict | None = None) -> "StepInputs | None":
    """What each row's step time comes from, exactly as `estimate_plan` prices it, from the local model's
    profile alone — no simulated step (an estimate's expensive half, memory's). The solver prices a
    candidate's step this way first and skips its memory when that step cannot win (planlang.solve.driver).
    The profile is kept in `cache` (or caches.PROFILES) for `estimate_plan`. None when the local model
    cannot be profiled (the estimate then falls back to the unsharded model)."""
    if plan.model is None:
        raise ValueError("the plan declares no model")
    facts, model_key = _model_facts(plan, facts)
    if heterogeneous(plan):  # each stage's inputs from the plan of its own sizes
        return stage_inputs(plan, lambda sp: estimate_steps(sp, efficiency, facts=facts, cache=cache), facts)
    micro, (stage_of, params) = plan.microbatches, local_params(plan, facts)
    profile_key = _profile_key(plan, facts, model_key, params)
    prof = caller_caches(cache)[1].get(profile_key)
    if prof is None:
        try:
            module, _ = build_local_model(plan, facts, params)
            local_in, loss = local_inputs(plan, data_degree(plan) * micro), model_loss(plan.model)
            with LocalPieces(split_widths(params)), autocast_for(plan.precision):
                prof = profile_local(plan, facts, module, local_in, loss)
        except Exception:  # noqa: BLE001 - estimate_plan falls back to the unsharded model; no step here
            return None
        caller_caches(cache)[1].put(profile_key, prof)
    stages = sorted(set(stage_of.values())) if stage_of else [None]
    work, units = [], []
    for s in stages:  # as estimate_plan's loop over stages
        mine = [p for p in params.values() if s is None or (s in p.stages and not _held_before(plan, s, p.stages))]
        work.append(stage_work(prof, stage_of, s, micro))
        units.append(_zero_unit(plan, s, mine, mine))
    return StepInputs(tuple(work), tuple(units))


@dataclass(frozen=True)
class StepInputs:
    """What planlang.model.price.step_time needs of a plan besides its lowered program's traffic: each model
    stage's work and the bytes of its parameters (a ZeroUnit). `steps(plan, lowered)` gives each row's
    step as `estimate_plan` does with that traffic; `lower_bound(plan)` a step no larger, without it."""

    work: tuple[StageWork, ...]
    units: tuple[ZeroUnit, ...]
    # stages of their own degrees (planlang.model.price.stage_meshes): per model stage, the plan of its
    # sizes it is priced under and the row conversions at its boundaries; () for every other plan
    plans: tuple[CompletePlan, ...] = ()
    convert: tuple[tuple[Transfer, ...], ...] = ()

    def steps(self, plan: CompletePlan, lowered: "list[Traffic] | dict | None",
              efficiency: float = 0.5) -> list[StepTime]:
        """`lowered`: the program's collectives per stage (a dict by stage sizes of each shape's, for
        stages of their own degrees: planlang.model.price.stage_meshes.stage_traffic)."""
        if self.plans:
            traffic, _ = stage_traffic(plan, self, lowered if isinstance(lowered, dict) else {})
            return step_times(plan, list(self.work), traffic, efficiency, self.plans)
        if not isinstance(lowered, list) or len(lowered) != len(self.units):  # as estimate_plan: priced without it
            lowered = None
        return step_times(plan, list(self.work), plan_traffic(plan, list(self.units), lowered), efficiency)

    def lower_bound(self, plan: CompletePlan, efficiency: float = 0.5) -> list[StepTime]:
        """Each row's step without the program's collectives: never above `steps` (every exposed part
        grows with the communication). Exact for a pipeline without tensor parallelism (no program)."""
        if self.plans:
            return self.steps(plan, bare_traffic(plan, len(self.units)), efficiency)
        if plan.pipeline is not None and not tensor_axes(plan):
            return self.steps(plan, None, efficiency)
        return self.steps(plan, [Traffic() for _ in self.units], efficiency)


def stage_work(prof: Profile, stage_of: dict[str, int], s: int | None, micro: int) -> StageWork:
    """What model stage `s` (None: the whole model) computes in one step of `micro` microbatches: the
    flops of the ops its own modules run (the profile attributes each op to the innermost module
    running it, recomputation included in backward), so identical stages are priced identically. Ops of
    no stage's modules (the root's code: GPT's embedding sum, the loss) count on the last stage, where
    the pipeline computes the loss."""
    if s is None:
        return StageWork(prof.total_fwd_flops * micro, prof.total_bwd_flops * micro,
                         prof.total_fwd_bytes * micro, prof.total_bwd_bytes * micro)
    last = max(stage_of.values())
    mods = [m for n, m in prof.modules.items() if stage_of.get(n, last) == s]
    return StageWork(sum(m.fwd_flops for m in mods) * micro, sum(m.bwd_flops for m in mods) * micro,
                     sum(m.fwd_bytes for m in mods) * micro, sum(m.bwd_bytes for m in mods) * micro)


def _zero_unit(plan: CompletePlan, s: int | None, mine: list, learn: list) -> ZeroUnit:
    """A stage's parameters as the step-time model prices their collectives: gathered in `params`,
    gradients summed in `reduce`, each padded as FSDP2 pads it under ZeRO-2/3 (traffic.fsdp_numel)."""
    prec = plan.precision
    shards = plan.dims.zero_shards if plan.dims.zero_stage >= 2 else 1

    def size(p, which: str) -> int:
        return fsdp_numel(p.local, shards) * (prec.bytes(which) if prec.mixed else p.itemsize)

    return ZeroUnit("model" if s is None else f"stage {s}", tuple(size(p, "params") for p in mine),
                    sum(size(p, "reduce") for p in learn))


def estimate_plan(plan: CompletePlan, efficiency: float = 0.5, *, grad_sync: str = "flat",
                  facts=None, program=None, cache: dict | None = None,
                  traffic: "list[Traffic] | str | dict | None" = None, graph=None,
                  steps: bool = True) -> list[DeviceEstimate]:
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
    caller has it). Without `steps` only memory is estimated (`planlang check --model`: the budget): the
    rows' step times are NaN and the model is not profiled.

    A plan whose stages run on degrees of their own (`stage ... with dp = 4`) is estimated stage by stage,
    each as the plan of its sizes (planlang.model.price.stage_meshes); its `traffic` is then a dict by stage
    sizes of what this takes for each such plan."""
    if grad_sync not in GRAD_SYNC:
        raise ValueError(f"grad_sync must be one of {', '.join(GRAD_SYNC)}, not {grad_sync!r}")
    if plan.model is None:
        raise ValueError("the plan declares no model")
    if heterogeneous(plan):
        facts = _model_facts(plan, facts)[0]
        return estimate_stages(plan, lambda sp: _rows(sp, grad_sync, facts, program, cache, steps), facts,
                               efficiency, traffic if isinstance(traffic, (dict, str)) else None, steps)
    rows, inputs = _rows(plan, grad_sync, facts, program, cache, steps)
    if inputs is None:
        return [dataclasses.replace(r, step_time=math.nan) for r in rows]
    if isinstance(traffic, dict):
        traffic = None
    return _with_steps(plan, rows, inputs, traffic, graph, efficiency)


def _rows(plan: CompletePlan, grad_sync: str, facts, program, cache: dict | None,
          steps: bool) -> "tuple[list[DeviceEstimate], StepInputs | None]":
    """`estimate_plan`'s rows before their step times (0), and what those come from (None without `steps`)."""
    mesh = plan.mesh
    facts, model_key = _model_facts(plan, facts)
    dp = data_degree(plan)
    # one microbatch is simulated (a pipeline's, or gradient accumulation's: `microbatches N` without a
    # pipeline runs N in sequence, one in flight, the gradients accumulating in .grad) and its work is
    # counted `micro` times; planlang.model.price.accumulation has the same step's collectives
    micro = plan.microbatches
    stage_of, params = local_params(plan, facts)
    opt = plan.optimizer
    zero = opt.zero_stage if opt else 0
    zero_n = plan.dims.zero_shards
    states = STATE_ELEMENTS.get(opt.name, 2) if opt else 0

    # one simulated step of the local model for one microbatch (the whole model; stages split below): by
    # local shapes, checkpoint groups and stages, not the optimizer or ZeRO (plans differing there share it)
    prec = plan.precision
    profile_key = _profile_key(plan, facts, model_key, params)
    sim_key = profile_key + (micro > 1, tuple(sorted(stage_of.items())))
    simulated, profiled = caller_caches(cache)
    cached = simulated.get(sim_key)
    if cached is None or (steps and cached[1] is None):
        cached = simulated.put(sim_key, _simulate_local(plan, facts, params, dp * micro, micro, stage_of,
                                                        profile_key, profiled, steps, recordings(cache)))
    sim, prof, trained, sim_notes = cached
    notes = list(sim_notes)

    # parameters the loss does not reach (BERT's pooler under an MLM loss) get no gradient in the
    # simulated backward; torch's optimizers keep no state for a parameter whose .grad is None
    if not trained:  # no backward was simulated: assume every parameter trains
        trained = set(params)
    stages = sorted(set(stage_of.values())) if stage_of else [None]
    counter = opt is not None and opt.name in STEP_COUNTER
    fsdp = zero >= 2 and zero_n > 1

    def bytes_in(ps, which: str) -> int:
        return sized(prec, ps, which)

    master_b = prec.bytes("master") if prec.mixed else 4  # optimizer state's bytes per element
    copy = prec.mixed and prec.master_copy and not fsdp  # planlang.runtime.precision.MasterWeights
    out = []
    parts: list[_StagePart] = []
    work, units = [], []
    for s in stages:
        # a parameter tied across stages has a copy on each (planlang.runtime.pipeline sums their gradients),
        # but on a rank holding two of those stages (a V's rank 0: the embedding and the head) one object,
        # counted on the first
        mine = [p for p in params.values() if s is None or (s in p.stages and not _held_before(plan, s, p.stages))]
        learn = [p for p in mine if p.name in trained]
        p_bytes = bytes_in(mine, "params")  # in the dtype the step runs them in
        g_bytes = bytes_in(learn, "params")
        # ZeRO-2/3 run as FSDP2 over the ZeRO axis: parameters rest as shards (both stages). A pipeline
        # stage is one unit, whose whole parameters are gathered while its forward and backward run (ZeRO-2
        # keeps them from forward to backward, ZeRO-3 gathers again); without a pipeline, planlang.apply
        # makes each repeated block a unit of its own (`_zero_blocks_peak`)
        # FSDP2 keeps its shards and their gradients in the master dtype and gathers in `params`
        params_b = bytes_in(mine, "master") // zero_n if fsdp else p_bytes
        gathered = p_bytes if fsdp else 0
        grads_b = (bytes_in(learn, "master") if fsdp else g_bytes) // zero_n if zero >= 2 else g_bytes
        if zero == 1 and zero_n > 1:
            opt_b = zero1_state_bytes(mine, trained, states, counter, zero_n, master_b)
        else:
            elems = sum(math.prod(p.local) for p in learn)
            opt_b = states * elems * master_b + (4 * len(learn) if counter else 0)
            opt_b = opt_b // zero_n if zero >= 1 else opt_b
        # the master copy of the weights (every trainable parameter, whole on each rank, ZeRO-1 included)
        opt_b += bytes_in(mine, "master") if copy else 0
        # DDP keeps a bucket copy of the gradients for the all-reduce (not under FSDP2, ZeRO >= 2). The
        # planlang runtime keeps persistent buckets too (planlang.runtime.grad_sync), whose slices the
        # gradients are (DDP's gradient_as_bucket_view): the gradients are the buckets, counted once there
        summed = dp > 1 and zero < 2
        # the planlang runtime's persistent buckets (planlang.runtime.grad_sync): with or without a pipeline
        bucketed = grad_sync == "flat" and summed
        buffers = p_bytes if grad_sync == "ddp" and summed else (g_bytes if bucketed else 0)
        grad_buckets = g_bytes if bucketed else 0
        if bucketed:
            grads_b = 0
        # what is live beside the gradients after backward: (ZeRO-2/3 step slices of every tensor; ZeRO-1
        # whole tensors, ZeroRedundancyOptimizer) the optimizer step's temporaries
        opt_tmp = optimizer_temporaries(plan, learn, states, zero_n if zero >= 1 else 1, whole=zero == 1,
                                         itemsize=master_b)
        # MasterWeights gives the master copy its gradients in the master dtype for the step
        opt_tmp += bytes_in(learn, "master") if copy else 0
        inflight = in_flight_on(plan, s or 0)
        if s is None:
            acts = sim.saved
            # beyond the saved activations at backward's peak: the gradients produced so far, temporaries
            transient = max(0, sim.backward_peak - sim.saved)
            if micro > 1:
                # gradient accumulation (planlang.model.price.accumulation): from the second microbatch's
                # backward on, the earlier ones' gradients are live beside it (the simulated second
                # backward); where they are slices of the persistent buckets, those are counted in
                # `buffers` (grads_b is 0 then): the simulation's gradients out, grads_b in
                transient = max(transient, sim.backward_peak_accum - sim.grads + grads_b - sim.saved)
        else:
            # the stage's own tensors in the simulated step (created by its modules): it keeps the saved
            # activations of every microbatch in flight
            saved_s = sim.stage_saved.get(s, 0)
            # receive buffers (planlang.runtime.recv_buffers.InFlightStage): the activation of each
            # microbatch in flight on the stage, from its receive to its backward, and the gradient from
            # the next stage of one microbatch at a time (tests/runtime/test_recv_buffers_gloo.py counts
            # them), in the dtype activations cross in: `params` when parameters are stored below f32
            # torch's interleaved schedule posts receives in lockstep with the neighbours' sends, ahead of
            # the stage's own order: `interleaved_receives` (measured, tests/runtime/test_recv_buffers_gloo.py)
            act_size = prec.bytes("params") if prec.mixed else 4
            pipe = plan.pipeline
            held_in, held_out = (interleaved_receives(len(pipe.stages), s, micro, pipe.schedule.chunks)
                                 if pipe is not None and pipe.schedule.kind == "interleaved" else (inflight, 1))
            # a V's last rank holds two adjacent stages: torch hands that activation and its gradient over
            # in place, with no receive buffer
            local_in, local_out = _local_neighbours(plan, s)
            held_in, held_out = (0 if local_in else held_in), (0 if local_out else held_out)
            buffers += (held_in * boundary_bytes(facts, stage_of, s, dp * micro, "in", itemsize=act_size)
                        + held_out * boundary_bytes(facts, stage_of, s, dp * micro, "out",
                                                     last=max(stage_of.values()), itemsize=act_size))
            acts = saved_s * inflight
            # a gradient goes into its bucket (counted in `buffers`) as backward produces it: beside the
            # bucket, one gradient of its own at a time (the largest, at most)
            own = max((bytes_in([q], "params") for q in learn), default=0) if bucketed else 0
            transient = max(0, sim.stage_backward_peak.get(s, 0) - saved_s
                            - (sim.stage_grads.get(s, 0) if bucketed else 0)) + own
            if micro > 1:
                # from the second microbatch's backward on, all of the stage's gradients are live (they
                # accumulate in .grad). The first backward (the plain simulated one) has `inflight`
                # microbatches saved; the second has min(inflight, m - 1): 1F1B runs a forward between
                # two backwards, GPipe (inflight = m) none
                # (the simulated gradients are those of the whole model: a weight tied across stages has
                # its gradient on one stage there, while every stage holding a copy has its own)
                # (a stage that sums in buckets, planlang.runtime.grad_sync, copies each gradient into its
                # bucket as the first backward produces it and holds a slice from then on: counted in
                # `buffers`, none of them beside it)
                live_grads = 0 if bucketed else grads_b
                again = max(0, sim.stage_backward_peak_accum.get(s, 0) - sim.stage_grads.get(s, 0) + live_grads
                            - saved_s)
                later = min(inflight, micro - 1)
                transient = max(transient, again - (inflight - later) * saved_s)
        backward_phase = acts + transient + gathered
        gloo = mesh is not None and mesh.device is not None and mesh.device.backend == "gloo"
        per_block = zero_blocks_peak(sim, facts, params, zero_n, zero, prec, gloo) if fsdp and s is None else None
        if per_block is not None:
            backward_phase = per_block
        elif fsdp:
            # FSDP2's all-gather lands in one flat buffer and is then copied out into each parameter's
            # own storage: for a moment the unit's parameters are live twice. ZeRO-3 (resharded after
            # forward) gathers again when backward starts, beside every saved activation
            backward_phase = max(backward_phase, 2 * gathered + (acts if zero == 3 else 0))
            if s is not None and micro > 1:
                # a pipeline stage is one FSDP2 unit that torch's schedule keeps from syncing until its
                # last microbatch: the gradients accumulate unsharded (in `params`), and that backward ends
                # with them copied into the reduce-scatter's input (in `reduce`) beside the gathered
                # parameters and what the microbatch saved; the gradients are then freed, and gloo's
                # reduce-scatter all-reduces a copy of its input (measured: pp2 x dp2 x tp2 ZeRO-3, and
                # pp2 x dp2 ZeRO-2 in f32 and bf16, bench/pipeline_memory.py)
                full, rs_in = bytes_in(learn, "params"), bytes_in(learn, "reduce")
                backward_phase = max(backward_phase,
                                     gathered + saved_s + max(full + rs_in, rs_in * (2 if gloo else 1)))
        if fsdp and s is None and micro > 1:
            # gradient accumulation under ZeRO-2/3 (planlang.model.price.accumulation): FSDP2 does not
            # reduce-scatter before the last microbatch (set_requires_gradient_sync(False)), so every
            # unit's unsharded gradients, in `params`, stay from the first microbatch's backward to the
            # last one's, beside its block-by-block peak (an upper bound by the reduce-scattered shards
            # that peak counts; not yet measured against MemTracker)
            backward_phase += bytes_in(learn, "params")
        # what FSDP2 holds at the peak (gathered and prefetched parameters, its buffers) is transient too:
        # the report's bar and the row's classes add up to the peak
        transient = backward_phase - acts
        opt_phase = grads_b + opt_tmp
        # a bucket whose dtype is not the plan's `reduce` is summed in a cast copy (planlang.runtime.grad_sync)
        # that lives from its launch to `finish`: after a pipeline stage's last backward, all of them at once
        wire = bytes_in(learn, "reduce") if bucketed and prec.bytes("reduce") != prec.bytes("params") else 0
        sum_phase = wire if s is not None else 0
        peak = params_b + opt_b + buffers + max(backward_phase, opt_phase, sum_phase)
        casts = max(0, sum_phase - max(backward_phase, opt_phase))  # (transient at the peak, when they make it)
        if steps:
            work.append(stage_work(prof, stage_of, s, micro))
        units.append(_zero_unit(plan, s, mine, learn))
        row = DeviceEstimate("all devices" if s is None else f"stage {s}", params_b, grads_b, opt_b, buffers,
                             acts, transient + opt_tmp + casts, peak, 0.0, tuple(notes), step_temporaries=opt_tmp,
                             stages=() if s is None else (s,), grad_buckets=grad_buckets)
        row = _from_program(row, plan, program) if program is not None else row
        out.append(row)
        if s is not None:
            split = plan.pipeline is not None and plan.pipeline.schedule.kind in T.SPLIT_BACKWARD
            pending = (weight_pending_bytes(facts, params, stage_of, s, dp * micro,
                                            itemsize=prec.bytes("params") if prec.mixed else 4,
                                            local_out=_local_neighbours(plan, s)[1]) if split else 0)
            parts.append(_StagePart(row, sim.stage_saved.get(s, 0), transient, learn, pending, wire,
                                    bytes_in(learn, "master") if copy else 0,
                                    # (a checkpoint recomputes its forward in W too: PL419)
                                    max(max((bytes_in([q], "params") for q in learn), default=0),
                                        transient if plan.checkpoints else 0)))
    if plan.pipeline is not None and plan.pipeline.schedule.kind in T.CHUNKED:
        out = _per_rank(plan, parts, states, zero_n if zero >= 1 else 1, zero == 1)
    return out, StepInputs(tuple(work), tuple(units)) if steps else None


def _with_steps(plan: CompletePlan, rows: list[DeviceEstimate], inputs: "StepInputs", traffic, graph,
                efficiency: float) -> list[DeviceEstimate]:
    """`rows` with their step times (planlang.model.price.step_time), each stage's busy time and the
    pipeline's schedule (the same on every row). The program is
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
    priced = price_step(plan, list(inputs.work), plan_traffic(plan, list(inputs.units), traffic), efficiency)
    sched = priced.schedule

    def busy(s: int) -> float:
        return sched.busy(s) if sched is not None else float("nan")

    return [dataclasses.replace(r, step_time=st.total, step=st, stage_times=tuple(busy(s) for s in r.stages),
                                schedule=sched, notes=r.notes + ((note,) if note else ()))
            for r, st in zip(rows, priced.rows)]


@dataclass(frozen=True)
class _StagePart:
    """What one model stage contributes to its pipeline rank's row (`_per_rank`)."""

    row: DeviceEstimate
    saved: int  # what one microbatch saves on the stage
    backward_transient: int  # beyond its saved activations at its backward's peak (ZeRO's gathers included)
    learn: list
    pending: int = 0  # what one microbatch's B leaves for its W under a split backward (weight_pending_bytes)
    wire: int = 0  # its gradient buckets cast to the `reduce` dtype for their sums (0: summed in place)
    master_grads: int = 0  # the master copy's gradients MasterWeights makes for the step (0: no copy)
    # what a split backward's W allocates: torch's `stage_backward_weight` takes the weight gradients of one
    # group of weights (those of one operation) at a time and adds them to `.grad`: the largest one's
    weight_grads: int = 0


def _per_rank(plan: CompletePlan, parts: list[_StagePart], states: int, shards: int,
              whole: bool) -> list[DeviceEstimate]:
    """One row per pipeline rank of a chunked schedule: rank r holds model stages r, r + p, ... (r and
    2p − 1 − r under a V: planlang.plan.placement.stages_on), and a device's memory is that of all of them.

    Parameters, gradients, optimizer state and buffers add up. Activations are the rank's peak over its
    order of forwards and backwards, each forward keeping what one microbatch saves on that stage
    (`activation_peaks`). One backward runs at a time, beside the other stages' gradients (`backward_peaks`
    says which, per schedule). The optimizer steps over all of the rank's parameters at once."""
    pipe = plan.pipeline
    assert pipe is not None
    v = T.stages_per_rank(pipe.schedule.kind, pipe.schedule.chunks)
    p = len(parts) // v
    pending = [x.pending for x in parts]
    acts = activation_peaks(pipe.schedule.kind, p, pipe.microbatches, [x.saved for x in parts], v, pending)
    at_backward = backward_peaks(pipe.schedule.kind, p, pipe.microbatches, [x.saved for x in parts],
                                 [x.backward_transient for x in parts], [x.row.gradients for x in parts], v,
                                 pending, [x.weight_grads for x in parts])
    out = []
    for r in range(p):
        mine = [parts[s] for s in T.stages_on(pipe.schedule.kind, p, v, r)]
        rows = [x.row for x in mine]
        grads = sum(x.gradients for x in rows)
        kept = sum(x.parameters + x.optimizer + x.buffers for x in rows)
        transient = at_backward[r] - acts[r]  # beyond the activation peak, at the rank's fullest backward
        opt_tmp = optimizer_temporaries(plan, [q for x in mine for q in x.learn], states, shards, whole=whole)
        opt_tmp += sum(x.master_grads for x in mine)  # (as each stage's row counts them)
        wires = sum(x.wire for x in mine)
        peak = kept + max(acts[r] + transient, grads + opt_tmp, wires)
        transient += max(0, wires - max(acts[r] + transient, grads + opt_tmp))  # (as in the rows of one stage)
        notes = tuple(dict.fromkeys(n for x in rows for n in x.notes))
        stages = tuple(s for x in rows for s in x.stages)
        out.append(DeviceEstimate(f"rank {r} (stages {', '.join(map(str, stages))})",
                                  sum(x.parameters for x in rows), grads, sum(x.optimizer for x in rows),
                                  sum(x.buffers for x in rows), acts[r], transient + opt_tmp, peak, 0.0, notes,
                                  step_temporaries=opt_tmp, stages=stages,
                                  grad_buckets=sum(x.grad_buckets for x in rows)))
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
