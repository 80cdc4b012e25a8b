"""What a pipeline stage holds besides what its modules save: the microbatches in flight on it and the
activations crossing its boundaries (planlang.model.price.estimate's receive buffers)."""
from __future__ import annotations

import math

from planlang.plan.complete import CompletePlan
from planlang.plan.schedule import in_flight


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
