"""The collectives of a step that accumulates gradients over microbatches without a pipeline (a plan's
top-level `microbatches N`; planlang.runtime.apply `ParallelModel.step`).

The program is lowered for one microbatch (planlang.plan.microbatches.accumulation_microbatch). The step
runs it N times, each a forward and a backward: every collective of the program's forward, loss,
recomputation and backward is issued N times. The gradients accumulate in `.grad` with no sum between
microbatches and are summed once, after the last backward: the gradient sums (ParallelModel.sync_grads)
and ZeRO-2/3's reduce-scatters appear once. FSDP2 reshards every unit after each backward, so ZeRO-2/3
gather each unit again in every microbatch's forward, and ZeRO-3 each block again in every backward
(planlang.model.price.traffic.zero_transfers with `microbatches`); ZeRO-1 broadcasts once, after the step.
"""
from __future__ import annotations

from planlang.plan.complete import CompletePlan

from planlang.model.price.traffic import Traffic, ZeroUnit, gradient_sums, predict_step_traffic, zero_transfers


def step_traffic(plan: CompletePlan, prog, zero: list[ZeroUnit] | None = None) -> Traffic:
    """One step's collectives under `plan` from its lowered program `prog` (one microbatch's when the plan
    accumulates; `zero`: its ZeRO units, planlang.model.price.traffic.program_zero_units)."""
    m = plan.microbatches
    if m == 1 or plan.pipeline is not None:
        return predict_step_traffic(plan, prog, zero=zero)
    micro = predict_step_traffic(plan, prog, sums=False)
    return Traffic([t for _ in range(m) for t in micro.transfers] + gradient_sums(plan, prog)
                   + zero_transfers(plan, zero or [], m))
