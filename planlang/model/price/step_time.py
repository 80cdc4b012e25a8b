"""One training step's time under a plan: the one model `planlang estimate`, `planlang solve` and the
report share (docs/step_time.md).

Per row (the whole mesh without a pipeline; one pipeline rank with one), from planlang.cost's prices:

    F, B   forward and backward compute (backward includes the recomputation of checkpoint groups), over
           every microbatch: flops / (flops.<compute dtype> x efficiency), or, on a device that declares
           its memory bandwidth, the roofline of planlang.cost.comm.work_time (flop-counted ops at
           MATMUL_EFFICIENCY of peak + the memory-bound ops' bytes / bandwidth)
    T      the lowered program's collectives of forward, loss, recomputation and backward
           (planlang.model.price.traffic): a collective's output is the next op's input, so they lie on the
           critical path and none overlaps compute
    O_f    ZeRO-2/3's forward all-gathers: FSDP2 prefetches the next unit's while this one computes, so all
           but the first hide behind forward compute          exposed  max(first, O_f - F)
    O_b    communication that runs during backward: the gradient sums, launched bucket by bucket as
           backward produces them (planlang.runtime.grad_sync; Li et al., PyTorch Distributed, VLDB 2020,
           §3.2.3), and ZeRO-2/3's re-gathers and reduce-scatters; all but the last one hide behind
           backward compute                                    exposed  max(last, O_b - B)
    A      what runs after backward: ZeRO-1's parameter broadcasts after the optimizer step

    step = F + B + T + exposed(O_f) + exposed(O_b) + A                              (no pipeline)

Gradient accumulation without a pipeline (`microbatches N`, planlang.model.price.accumulation): F, B and T
are N microbatches'; the gradient sums and reduce-scatters of O_b run in the last microbatch's backward
and hide behind B / N only, ZeRO-3's re-gathers behind the rest of B.

With a pipeline of p ranks and m microbatches each model stage s runs m forwards of
f_s = (F_s + T_f,s) / m and m backwards of b_s = (B_s + T_b,s) / m (T_f: forward and loss collectives;
T_b: recomputation and backward; ZeRO-3 re-gathers the stage's unit for each one), and the schedule's event
simulation (planlang.cost.schedule: every schedule's own order; the bubble of Narayanan et al. 2021, §2.2)
gives the makespan M (`price_step` returns that schedule with the rows; the report draws it). A rank's
gradient sums O_r (DDP-style buckets, planlang.runtime.grad_sync) start during the last backward b_r of
its first model stage, the last one it runs (its other stages' buckets at its start, the first stage's as
their gradients arrive), so they hide behind it but for the last bucket; a rank that ends its last
backward at E_r < M hides the rest in the wait for the others:

    step of rank r = max(M, E_r + max(last bucket, O_r - b_r)) + A_r      bubble of rank r = M - its work

A split backward (zero_bubble, zbv, dualpipev): a rank's last operation may be a weight gradient W of its
last stage to run, a WEIGHT_SHARE of that stage's b (on the model's first stage all of b_0: torch runs its
whole backward there). Its other stages' sums hide behind W but for their last bucket; that stage's own
start behind it on model stage 0 only (elsewhere torch assigns the weight gradients itself, no hook
fires, and they start after it). A whole backward last (dualpipev's BW) hides them as above.

Sends between stages are not priced (as in the schedule simulation).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from planlang.cost.buckets import cut_buckets, launch_order
from planlang.cost.comm import Collective, Group, collective_time, group, work_time
from planlang.cost.schedule import WEIGHT_SHARE, SimulatedSchedule, simulate
from planlang.plan.complete import CompleteMesh, CompletePlan

from planlang.model.capture.load import build_model
from planlang.model.program.lowering import lower, mark_checkpoints
from planlang.model.program.pipeline_program import microbatch_plan
from planlang.plan.microbatches import accumulation_microbatch
from planlang.plan.placement import stages_on
from planlang.plan.types import stages_per_rank
from planlang.model.price.accumulation import step_traffic
from planlang.model.price.traffic import (Traffic, Transfer, ZeroUnit, graph_of, predict_step_traffic, program_zero_units,
                      stage_traffic, transfer, zero_transfers)

FORWARD_PHASES = ("forward", "loss")
BACKWARD_PHASES = ("recompute", "backward")


@dataclass(frozen=True)
class StageWork:
    """What one model stage (the whole model without a pipeline) computes in one step."""

    forward_flops: float
    backward_flops: float
    forward_bytes: float = 0.0  # moved by memory-bound ops (planlang.cost.comm.work_time)
    backward_bytes: float = 0.0


@dataclass(frozen=True)
class StepTime:
    """One row's step, by the parts of the formula (seconds)."""

    compute: float  # F + B
    tensor: float  # T
    overlapped: float  # communication hidden behind compute
    exposed: float  # the rest of the gradient sums and ZeRO's collectives
    bubble: float  # idle time in the pipeline schedule
    total: float

    def __str__(self) -> str:
        ms = lambda x: f"{x * 1e3:.3g} ms"  # noqa: E731
        return (f"{ms(self.total)} = compute {ms(self.compute)} + in-line collectives {ms(self.tensor)} + "
                f"exposed sums {ms(self.exposed)} + bubble {ms(self.bubble)} ({ms(self.overlapped)} overlapped)")


def _mesh(plan: CompletePlan) -> CompleteMesh:
    if plan.mesh is None:
        raise ValueError("the plan declares no mesh")
    return plan.mesh


def _seconds(plan: CompletePlan, ts: list[Transfer]) -> float:
    mesh = _mesh(plan)
    groups: dict[tuple[str, ...], Group] = {}  # a step's transfers use a few axes groups: each looked up once
    total = 0.0
    for t in ts:
        g = groups.get(t.axes)
        if g is None:
            g = groups[t.axes] = group(mesh, t.axes)
        total += collective_time(t.kind, g, t.full_bytes)
    return total


@dataclass(frozen=True)
class _Phases:
    """What price_step reads of one stage's collectives, in one pass over them: the seconds of the in-line
    ones (T_f: forward and loss; T_b: recomputation and backward) and of ZeRO-1's broadcasts after the step
    (A), each summed in the transfers' order, and the transfers that overlap compute (ZeRO's forward
    gathers; the gradient sums and ZeRO's backward collectives), in order."""

    forward: float
    backward: float
    after: float
    gathers: tuple[Transfer, ...]
    sums: tuple[Transfer, ...]


_EMPTY = _Phases(0.0, 0.0, 0.0, (), ())


def _phases(mesh: CompleteMesh, ts: list[Transfer], start: _Phases = _EMPTY) -> _Phases:
    """`start` followed by transfers `ts`, by phase. Each sum continues `start`'s in `ts`' order: the same
    floats as summing the whole list's phase at once. A pipeline stage's traffic repeats one microbatch's
    transfers m times (traffic.stage_traffic: the same objects), so each is priced once per call."""
    groups: dict[tuple[str, ...], Group] = {}
    priced: dict[int, float] = {}  # id of a transfer of `ts` (alive throughout) -> its seconds

    def seconds(t: Transfer) -> float:
        x = priced.get(id(t))
        if x is None:
            g = groups.get(t.axes)
            if g is None:
                g = groups[t.axes] = group(mesh, t.axes)
            x = priced[id(t)] = collective_time(t.kind, g, t.full_bytes)
        return x

    def split(part: list[Transfer]) -> tuple[list[float], list[float], list[float], list[Transfer], list[Transfer]]:
        fwd: list[float] = []
        bwd: list[float] = []
        after: list[float] = []
        gathers: list[Transfer] = []
        sums: list[Transfer] = []
        for t in part:
            ph = t.phase
            if ph in FORWARD_PHASES:
                fwd.append(seconds(t))
            elif ph in BACKWARD_PHASES:
                bwd.append(seconds(t))
            elif ph == "zero_forward":
                gathers.append(t)
            elif ph == "grad_sync" or ph == "zero_backward":
                sums.append(t)
            elif ph == "zero_step":
                after.append(seconds(t))
        return fwd, bwd, after, gathers, sums

    k, r = _period(ts)  # ts[:k] r times, then the rest
    f, b, a, g, s = split(ts[:k])
    f2, b2, a2, g2, s2 = split(ts[k * r:])
    return _Phases(_fold(_fold(start.forward, f, r), f2, 1), _fold(_fold(start.backward, b, r), b2, 1),
                   _fold(_fold(start.after, a, r), a2, 1), start.gathers + tuple(g * r + g2),
                   start.sums + tuple(s * r + s2))


def _period(ts: list[Transfer]) -> tuple[int, int]:
    """(k, r): `ts` begins with its first k transfers r times over (r = 1: no repetition found). A pipeline
    stage's traffic lists one microbatch's transfers m times, the same objects (traffic.stage_traffic)."""
    n = len(ts)
    if n < 2:
        return n, 1
    first = ts[0]
    k = next((i for i in range(1, n) if ts[i] is first), n)
    pattern, r = ts[:k], 1
    while (r + 1) * k <= n and ts[r * k:(r + 1) * k] == pattern:
        r += 1
    return k, r


def _fold(total: float, xs: list[float], times: int) -> float:
    """`total` plus `xs` repeated `times` times, added one by one in order: the same float as the loop
    `for x in xs * times: total += x` (numpy's accumulate adds in order, no pairwise summation)."""
    if not xs:
        return total
    if times == 1 and len(xs) < 64:
        for x in xs:
            total += x
        return total
    return float(np.add.accumulate(np.concatenate(([total], np.tile(np.asarray(xs, dtype=np.float64), times))))[-1])


@dataclass
class StageTraffic(Traffic):
    """A pipeline stage's collectives as plan_traffic gives them: its lowered program's (`lowered`, which
    a solve prices again and again: its phases are kept, `_lowered_phases`) followed by `extra`, those of
    its parameters; `transfers` holds both."""

    lowered: Traffic = field(default_factory=Traffic)
    extra: list[Transfer] = field(default_factory=list)


# a lowered program's stage traffic (by identity, kept alive here while cached, and its length: a Traffic
# is a list one can still add to) and the mesh it is priced on -> its phases. A 1T pipeline of 64 stages
# and 512 microbatches lists ~400k transfers; a solve prices a candidate's step three times (its step
# alone, then in its estimate) and candidates that differ only in their schedule share one program
_LOWERED: dict[tuple, tuple[Traffic, _Phases]] = {}
_LOWERED_SIZE = 8192
_LOWERED_LOCK = threading.Lock()


def _lowered_phases(mesh: CompleteMesh, t: Traffic) -> _Phases:
    try:
        key = (id(t), len(t.transfers), mesh)
        hash(key)
    except TypeError:  # a mesh value that does not hash
        return _phases(mesh, t.transfers)
    with _LOWERED_LOCK:
        got = _LOWERED.get(key)
    if got is not None and got[0] is t:
        return got[1]
    out = _phases(mesh, t.transfers)
    with _LOWERED_LOCK:
        if len(_LOWERED) >= _LOWERED_SIZE:
            _LOWERED.clear()
        _LOWERED[key] = (t, out)
    return out


def _traffic_phases(mesh: CompleteMesh, t: Traffic) -> _Phases:
    if isinstance(t, StageTraffic):
        return _phases(mesh, t.extra, _lowered_phases(mesh, t.lowered))
    return _phases(mesh, t.transfers)


def _hidden(plan: CompletePlan, ts: list[Transfer], window: float, exposed_one: int) -> tuple[float, float]:
    """(exposed, overlapped) seconds of `ts` run beside `window` seconds of compute, the one at index
    `exposed_one` (the first gather, the last sum) never hidden."""
    if not ts:
        return 0.0, 0.0
    total = _seconds(plan, ts)
    exposed = max(_seconds(plan, [ts[exposed_one]]), total - window)
    return exposed, total - exposed


@dataclass(frozen=True)
class PipelineSchedule:
    """A pipeline step as this model prices it: each model stage's forward and backward of one microbatch
    (f_s and b_s above: compute, in-line collectives, ZeRO-3's gathers of the stage's unit), seconds, and
    the schedule simulated from them (planlang.cost.schedule), whose makespan is M."""

    forward: tuple[float, ...]
    backward: tuple[float, ...]
    simulated: SimulatedSchedule

    def __str__(self) -> str:
        return f"{self.simulated}"

    def busy(self, stage: int) -> float:
        """Stage `stage`'s forwards and backwards over every microbatch, seconds."""
        return self.simulated.microbatches * (self.forward[stage] + self.backward[stage])


@dataclass(frozen=True)
class PricedStep:
    """Each row's step (one per pipeline rank, or one for the whole mesh) and, with a pipeline, the
    schedule they are read from (None without one, or without the device's throughput)."""

    rows: tuple[StepTime, ...]
    schedule: PipelineSchedule | None


def price_step(plan: CompletePlan, work: list[StageWork], traffic: list[Traffic],
               efficiency: float = 0.5, stage_plans: Sequence[CompletePlan] | None = None) -> PricedStep:
    """Each row's step (see the module docstring) and the pipeline's schedule: `work` and `traffic` per
    model stage (one entry without a pipeline); rows per pipeline rank (rank r holds stages r, r + p, ...
    under interleaving). `stage_plans`: per model stage, the plan whose mesh prices its collectives (stages
    of their own degrees: planlang.plan.stage_meshes.stage_plan, one stage per rank); `plan` for every
    stage without it."""
    mesh = plan.mesh
    if mesh is None or mesh.device is None or not mesh.device.flops:
        nan = float("nan")
        return PricedStep((StepTime(nan, nan, nan, nan, nan, nan),) * _ranks(plan, len(work)), None)
    plans = list(stage_plans) if stage_plans is not None else [plan] * len(work)
    F, B, Tf, Tb, gathers, sums, after = _parts(plans, work, traffic, efficiency)
    if plan.pipeline is None:
        ef, of = _hidden(plan, gathers[0], F[0], 0)
        eb, ob = _hidden(plan, sums[0], B[0], -1)
        m = plan.microbatches
        if m > 1:
            # gradient accumulation (planlang.model.price.accumulation): the sums and reduce-scatters run
            # in the last microbatch's backward (no_sync before it), so only B / m hides them; ZeRO-3's
            # re-gathers run in every backward, beside the rest of it
            again = [t for t in sums[0] if t.phase == "zero_backward" and t.kind == Collective.ALL_GATHER]
            once = [t for t in sums[0] if t not in again]
            eb, ob = _hidden(plan, once, B[0] / m, -1)
            eb2, ob2 = _hidden(plan, again, B[0] - B[0] / m, 0)
            eb, ob = eb + eb2, ob + ob2
        compute, tensor = F[0] + B[0], Tf[0] + Tb[0]
        return PricedStep((StepTime(compute, tensor, of + ob, ef + eb + after[0], 0.0,
                                    compute + tensor + ef + eb + after[0]),), None)
    m = plan.pipeline.microbatches
    kind = plan.pipeline.schedule.kind
    chunks = stages_per_rank(kind, plan.pipeline.schedule.chunks)
    fwd, bwd, regather = _microbatch_times(plans, m, F, B, Tf, Tb, gathers, sums)
    sim = simulate(kind, fwd, bwd, m, chunks)
    p = len(work) // chunks
    rows = []
    for r in range(p):
        mine = stages_on(kind, p, chunks, r)
        rp = plans[mine[0]]  # a rank's stages share its sizes (stages of their own degrees: one per rank)
        busy = sum(m * (fwd[s] + bwd[s]) for s in mine)
        # the rank's sums start during its last operation, the last backward of one of its stages (its first
        # stage's but under dualpipev: the runtime's InFlightStage.grad_sync), its other stages' at its start,
        # that stage's bucket by bucket; what that backward cannot hide follows it (its last bucket at least)
        final = sim.last_step(r)
        others = [t for s in mine if s != final.stage for t in sums[s] if t not in regather[s]]
        ts = others + [t for t in sums[final.stage] if t not in regather[final.stage]]
        if final.kind == "W" and final.stage > 0:  # (see the module docstring)
            hidden_not = (_hidden(rp, others, bwd[final.stage] * WEIGHT_SHARE, len(others) - 1)[0]
                          + _seconds(rp, ts[len(others):]))
        else:
            hidden_not, _ = _hidden(rp, ts, bwd[final.stage], len(ts) - 1)
        finish = max(sim.makespan, sim.rank_end(r) + hidden_not) + sum(after[s] for s in mine)
        comm = _seconds(rp, ts) + sum(after[s] for s in mine)
        compute = sum(F[s] + B[s] for s in mine)
        tensor = busy - compute
        # idle time of the rank; a one-rank pipeline has none (its makespan is its own work, summed in
        # another order: float noise of either sign), nor does a rank whose idle time is below that noise
        bubble = 0.0 if p == 1 else sim.makespan - busy
        bubble = bubble if bubble > 1e-9 * sim.makespan else 0.0
        exposed = finish - sim.makespan
        rows.append(StepTime(compute, tensor, max(0.0, comm - exposed), exposed, bubble, finish))
    return PricedStep(tuple(rows), PipelineSchedule(tuple(fwd), tuple(bwd), sim))


def step_times(plan: CompletePlan, work: list[StageWork], traffic: list[Traffic],
               efficiency: float = 0.5, stage_plans: Sequence[CompletePlan] | None = None) -> list[StepTime]:
    """Each row's step (`price_step` without the schedule)."""
    return list(price_step(plan, work, traffic, efficiency, stage_plans).rows)


def _microbatch_times(plans: list[CompletePlan], m: int, F, B, Tf, Tb, gathers, sums):
    """Per model stage, one microbatch's forward and backward seconds (ZeRO-3's gathers of the stage's
    unit, one per microbatch in each, inside them) and those re-gathers of the backward; stage s's
    collectives priced on `plans[s]`'s mesh."""
    regather = [[t for t in sums[s] if t.phase == "zero_backward" and t.kind == Collective.ALL_GATHER]
                for s in range(len(F))]
    fwd = [(F[s] + Tf[s] + _seconds(plans[s], gathers[s])) / m for s in range(len(F))]
    bwd = [(B[s] + Tb[s] + _seconds(plans[s], regather[s])) / m for s in range(len(F))]
    return fwd, bwd, regather


def _parts(plans: list[CompletePlan], work: list[StageWork], traffic: list[Traffic], efficiency: float):
    """Per model stage (the whole model without a pipeline): compute, in-line collectives by phase and the
    transfers that overlap, stage s priced on `plans[s]`'s mesh (the same device everywhere)."""
    dtype = plans[0].precision.compute
    meshes = [_mesh(pl) for pl in plans]
    F = [work_time(w.forward_flops, w.forward_bytes, meshes[s], dtype, efficiency) for s, w in enumerate(work)]
    B = [work_time(w.backward_flops, w.backward_bytes, meshes[s], dtype, efficiency) for s, w in enumerate(work)]
    phases = [_traffic_phases(meshes[s], t) for s, t in enumerate(traffic)]
    return (F, B, [x.forward for x in phases], [x.backward for x in phases], [list(x.gathers) for x in phases],
            [list(x.sums) for x in phases], [x.after for x in phases])


def _ranks(plan: CompletePlan, stages: int) -> int:
    if plan.pipeline is None:
        return 1
    kind = plan.pipeline.schedule.kind
    return stages // stages_per_rank(kind, plan.pipeline.schedule.chunks)


def lowered_traffic(plan: CompletePlan, graph=None, model=None) -> list[Traffic] | None:
    """Per model stage, the collectives of the plan's lowered program (planlang.model.price.traffic): forward,
    loss, recomputation, backward and the gradient sums, with ZeRO's collectives without a pipeline (its
    FSDP2 units are the program's blocks); None for a pipeline that runs the model's own modules (no
    program: `parameter_transfers` gives its sums). `graph`: the op graph of a plan without a pipeline,
    when the caller has it (a pipeline's is traced for one microbatch). Raises what the lowering raises."""
    if plan.pipeline is not None:
        if not plan.dims.tensor:
            return None
        micro = microbatch_plan(plan)
        prog = lower(graph_of(micro), micro)
        prog.checkpoint_groups = mark_checkpoints(prog, micro)
        return stage_traffic(plan, prog)
    micro = accumulation_microbatch(plan)  # one microbatch's program when the plan accumulates
    prog = lower(graph if graph is not None and micro is plan else graph_of(micro), micro)
    prog.checkpoint_groups = mark_checkpoints(prog, micro)
    zero = plan.optimizer is not None and plan.optimizer.zero_stage > 0
    if zero and model is None:
        if plan.model is None:
            raise ValueError("the plan declares no model")
        model = build_model(plan.model, plan.path)
    units = program_zero_units(model, prog, plan) if zero else []
    return [step_traffic(plan, prog, units)]


def parameter_transfers(plan: CompletePlan, unit: ZeroUnit, sums: bool) -> list[Transfer]:
    """One model stage's collectives that follow from its parameters alone (`unit`: their bytes): ZeRO's
    (a pipeline stage is one FSDP2 unit) and, when `sums`, its gradient sums over the data axes FSDP2
    does not sum, one all-reduce per axis of each bucket as the runtime cuts them (planlang.cost.buckets,
    in the order they start: a pipeline without tensor parallelism, a plan whose program could not be
    lowered). A parameter's summed bytes are its share of the unit's (`reduced` over `gathered`)."""
    out = []
    axes = tuple(a for a in plan.dims.batch if a not in set(plan.dims.fsdp)) if sums else ()
    if axes and unit.params:
        share = unit.reduced / max(1, unit.gathered)
        rows = [(str(i), int(b * share), axes) for i, b in enumerate(unit.params)]
        out += [transfer(Collective.ALL_REDUCE, (a,), bucket.nbytes, _mesh(plan), "grad_sync", unit.name)
                for bucket in launch_order(cut_buckets(rows)) for a in axes]
    return out + zero_transfers(plan, [unit], plan.microbatches)


def plan_traffic(plan: CompletePlan, units: list[ZeroUnit], lowered: list[Traffic] | None) -> list[Traffic]:
    """Each model stage's collectives: the lowered program's (`lowered`, None where there is none or it
    failed) and those of its parameters (`units`, one per stage)."""
    if lowered is None:
        return [Traffic(parameter_transfers(plan, u, sums=True)) for u in units]
    if plan.pipeline is None:  # the lowered program's, each kept by identity (`_lowered_phases`)
        return [StageTraffic(t.transfers, t, []) for t in lowered]
    out: list[Traffic] = []
    for t, u in zip(lowered, units):
        extra = parameter_transfers(plan, u, sums=False)
        out.append(StageTraffic(t.transfers + extra, t, extra))
    return out
