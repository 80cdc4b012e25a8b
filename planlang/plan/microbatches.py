"""The plan one microbatch of a gradient-accumulating step runs (a top-level `microbatches N`).

Without a pipeline, a step of N microbatches runs the same program N times, each on 1/N of every input's
batch, and sums the gradients once after the last (planlang.runtime.apply `ParallelModel.step`). That
program is lowered for `accumulation_microbatch(plan)`: the plan whose inputs are one microbatch of the
batch (the batch dim divided by N, split over the data axes as the plan says), without the statement.
Its local shapes, collectives and memory are one microbatch's; the estimator, the traffic prediction and
the runtime all read it from here. (A pipeline's microbatch program is
planlang.model.program.pipeline_program.microbatch_plan's, which also takes the pipeline axis out.)
"""
from __future__ import annotations

import dataclasses

from .complete import CompletePlan
from .data import batch_dim


def accumulation_microbatch(plan: CompletePlan) -> CompletePlan:
    """`plan` for one of its accumulation microbatches (the plan itself without a top-level
    `microbatches` above 1). The checker has refused a batch that does not divide (PL305)."""
    acc = plan.accumulation
    if plan.pipeline is not None or acc is None or acc.microbatches == 1:
        return plan
    m = acc.microbatches
    inputs = []
    for inp in plan.inputs:
        b = batch_dim(inp)
        if not inp.dims:
            inputs.append(inp)
            continue
        name, size = inp.dims[b]
        if size % m:
            raise ValueError(f"input `{inp.name}`: batch {size} does not split into {m} microbatches (PL305)")
        inputs.append(dataclasses.replace(inp, dims=inp.dims[:b] + ((name, size // m),) + inp.dims[b + 1:]))
    return dataclasses.replace(plan, inputs=tuple(inputs), accumulation=None)
