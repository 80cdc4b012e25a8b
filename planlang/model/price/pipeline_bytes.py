"""What a pipeline stage holds besides what its modules save: the microbatches in flight on it and the
activations crossing its boundaries (planlang.model.price.estimate's receive buffers); which of its
neighbours and tied parameters share its rank (`held_before`, `local_neighbours`)."""
from __future__ import annotations

import math

from planlang.plan import types as T
from planlang.plan.complete import CompletePlan
from planlang.plan.schedule import in_flight
from planlang.model.price.local_model import LocalParam


def in_flight_on(plan: CompletePlan, stage: int) -> int:
    """Microbatches whose activations stage `stage` holds at once (plan.schedule; 1 without a pipeline)."""
    p = plan.pipeline
    if p is None:
        return 1
    pp = len(p.stages)
    return in_flight(p.schedule.kind, pp, min(stage, pp - 1), p.microbatches, chunks=p.schedule.chunks)


def boundary_bytes(facts, stage_of: dict[str, int], stage: int, divide: int, side: str, last: int = -1,
                   itemsize: int = 4) -> int:
    """Bytes per microbatch crossing a stage boundary: the input of the stage's first module (side "in",
    not for stage 0) or the output of its last one (side "out", whose gradient comes back; not for the
    last stage). `itemsize` bytes per element; shapes of the whole batch divided into microbatches."""
    mods = [m for m in facts.order if stage_of.get(m) == stage]
    if not mods or (side == "in" and stage == 0) or (side == "out" and stage == last):
        return 0
    call = facts.calls.get(mods[0] if side == "in" else mods[-1])
    shape = (call.inputs[0] if call and call.inputs else None) if side == "in" else (call.output if call else None)
    if shape is None:
        return 0
    return math.prod(shape) * itemsize // max(1, divide)


def weight_pending_bytes(facts, params: dict[str, LocalParam], stage_of: dict[str, int], stage: int, divide: int,
                         itemsize: int = 4, local_out: bool = False) -> int:
    """Bytes per microbatch a split backward's B leaves on stage `stage` for its W (the zero_bubble
    schedule, torch's `stage_backward_input`): the gradient at the output of every module that uses a
    weight of its own (torch keeps them in `param_groups` for the weight gradient), the stage input's
    gradient (its `.grad` until W) and the receive buffer of the output's gradient (released at W). Model
    stage 0 has no input gradient: torch runs its whole backward in W and leaves nothing. `params`: the
    local parameters by canonical name (planlang.model.price.local_model.LocalParam): a module's output
    is the local share a tensor-parallel weight gives it (its first dim, where the output ends in it).
    `local_out`: the next stage is on the same rank (a V's turn), whose input gradient is this stage's
    output gradient, not a buffer of its own."""
    if stage == 0:
        return 0
    owners: dict[str, LocalParam] = {}
    for name in facts.params:
        module = name.rpartition(".")[0]
        local = params.get(facts.canonical(name))
        if stage_of.get(module) == stage and local is not None and local.shape:
            owners.setdefault(module, local)
    total = 0
    for module, local in owners.items():
        call = facts.calls.get(module)
        out = call.output if call is not None else None
        if not out:
            continue
        share = local.local[0] / local.shape[0] if out[-1] == local.shape[0] and local.shape[0] else 1.0
        total += int(math.prod(out) * itemsize * share) // max(1, divide)
    last = max(stage_of.values())
    out = 0 if local_out else boundary_bytes(facts, stage_of, stage, divide, "out", last=last, itemsize=itemsize)
    return total + boundary_bytes(facts, stage_of, stage, divide, "in", itemsize=itemsize) + out


def held_before(plan: CompletePlan, stage: int, holders) -> bool:
    """Whether an earlier stage on `stage`'s pipeline rank also holds a parameter the stages `holders`
    read: the runtime ties those copies into one object (planlang.runtime.pipeline.retie)."""
    pipe = plan.pipeline
    if pipe is None or pipe.schedule.kind not in T.CHUNKED or len(holders) < 2:
        return False
    ranks = T.stage_ranks(pipe.schedule.kind, plan.dims.pipeline_size, pipe.schedule.chunks)
    return any(t < stage and 0 <= t < len(ranks) and ranks[t] == ranks[stage] for t in holders)


def local_neighbours(plan: CompletePlan, stage: int) -> tuple[bool, bool]:
    """Whether model stage `stage`'s previous and next stages are on its own pipeline rank (a V's last
    rank: planlang.plan.placement.stage_ranks)."""
    pipe = plan.pipeline
    if pipe is None:
        return False, False
    ranks = T.stage_ranks(pipe.schedule.kind, plan.dims.pipeline_size, pipe.schedule.chunks)
    if not 0 <= stage < len(ranks):
        return False, False
    return (stage > 0 and ranks[stage - 1] == ranks[stage],
            stage + 1 < len(ranks) and ranks[stage + 1] == ranks[stage])
