"""The estimate of a plan whose pipeline stages run on degrees of their own (`stage h[0:2] with dp = 4,
tp = 1`, planlang.plan.stage_meshes): every figure of stage s is the one the plan it runs as gives it,
`stage_plan(plan, s)` (the plan the runtime lowers stage s's program from), never the mesh's sizes.

- Memory: stage s's row is the row planlang.model.price.estimate gives stage s of `stage_plan(plan, s)`:
  the same schedule, microbatches and microbatches in flight; its local shapes, batch, program and ZeRO
  shards those of its sizes. Each distinct shape's plan (`stage_shapes`) is estimated once.
- Step time: each stage's compute (from its shape's local model) and collectives (its shape's lowered
  program, its parameters' sums and ZeRO's, over its own axes) are priced on its own sizes
  (step_time.price_step's `stage_plans`); the schedule simulation combines the stages' times as for any
  pipeline. A boundary between stages of different sizes adds the runtime's row conversion
  (planlang.runtime.stage_rows): the receiving stage all-gathers its replica's rows of the boundary
  activation over its axes other than the pipeline's and the data axes, each forward (phase "forward");
  the sending stage all-gathers the gradient of its output over its own such axes, each backward (phase
  "backward"); the other directions only slice. Every boundary value is priced as the activation the
  stage's first module takes (a value held whole, as GPT-2's position embeddings, passes as it is and is
  counted as rows here: an upper bound).

What is left: a stage's receive buffers are its plan's (the replica's rows of a microbatch), while a device
at a converting boundary receives its share only (fewer bytes by the share count) and the gathered
activation is transient beside them; neither is modelled.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

from planlang.cost.comm import Collective
from planlang.plan.complete import CompletePlan
from planlang.plan.selection import stage_targets
from planlang.plan.stage_meshes import describe, shape_plans, share_axes, stage_plan, stage_shapes

from planlang.model.price.local_model import stage_of_modules
from planlang.model.price.pipeline_bytes import boundary_bytes
from planlang.model.price.step_time import StageTraffic, lowered_traffic, plan_traffic, price_step
from planlang.model.price.traffic import Traffic, Transfer, transfer

Sizes = tuple[tuple[str, int], ...]


def estimate_stages(plan: CompletePlan, rows_of: Callable[[CompletePlan], tuple[list, Any]], facts,
                    efficiency: float, traffic: "dict | str | None", steps: bool) -> list:
    """The rows of `plan` (one per stage: one stage per pipeline rank, planlang.plan.stage_rules PL418):
    stage s's from `rows_of(stage_plan(plan, s))` (estimate._rows: the rows before their step times and
    the StepInputs, None without `steps`), then priced as one schedule. `traffic`: by stage sizes, what
    estimate_plan takes as `traffic` for that shape's plan (a shape left out is lowered here), or why no
    program could be lowered (a str, for every shape)."""
    shapes = stage_shapes(plan)
    plans = shape_plans(plan)
    got = {sizes: rows_of(sp) for sizes, sp in plans.items()}  # each distinct shape once
    said = "; ".join(f"stage {s}: {describe(plan, sh)}" for s, sh in enumerate(shapes))
    note = f"stages of their own degrees, each estimated as the plan of its sizes ({said})"
    rows = [dataclasses.replace(got[sh][0][s], notes=got[sh][0][s].notes + (note,)) for s, sh in enumerate(shapes)]
    if not steps:
        return [dataclasses.replace(r, step_time=math.nan) for r in rows]
    inputs = combine(plan, {sizes: g[1] for sizes, g in got.items()}, facts)
    lowered = traffic if isinstance(traffic, dict) else {sizes: traffic for sizes in plans} if traffic else {}
    per_stage, why = stage_traffic(plan, inputs, lowered, lower=True)
    priced = price_step(plan, list(inputs.work), per_stage, efficiency, inputs.plans)
    sched = priced.schedule
    more = (f"step time without the program's collectives of {why}; gradient sums priced from the parameters",) \
        if why else ()
    return [dataclasses.replace(r, step_time=st.total, step=st, schedule=sched, notes=r.notes + more,
                                stage_times=tuple(sched.busy(s) if sched is not None else math.nan for s in r.stages))
            for r, st in zip(rows, priced.rows)]


def stage_inputs(plan: CompletePlan, inputs_of: Callable[[CompletePlan], Any], facts) -> Any:
    """estimate.StepInputs of `plan`: each stage's work and parameters from `inputs_of` of its shape's plan
    (estimate.estimate_steps), or None when one of them is None."""
    got = {sizes: inputs_of(sp) for sizes, sp in shape_plans(plan).items()}
    if any(g is None for g in got.values()):
        return None
    return combine(plan, got, facts)


def combine(plan: CompletePlan, by_shape: dict[Sizes, Any], facts) -> Any:
    """One StepInputs of `plan` from each shape's (`by_shape`, by stage sizes): stage s's work and unit
    from its shape's, with its plan and the row conversions at its boundaries (`conversions`)."""
    shapes = stage_shapes(plan)
    first = next(iter(by_shape.values()))
    return dataclasses.replace(first, work=tuple(by_shape[sh].work[s] for s, sh in enumerate(shapes)),
                               units=tuple(by_shape[sh].units[s] for s, sh in enumerate(shapes)),
                               plans=tuple(stage_plan(plan, s) for s in range(len(shapes))),
                               convert=conversions(plan, facts))


def bare_traffic(plan: CompletePlan, stages: int) -> dict[Sizes, list[Traffic] | None]:
    """By stage sizes, a program without collectives for each shape that lowers one (tensor parallelism),
    none for the others: the step's lower bound (estimate.StepInputs.lower_bound)."""
    return {sizes: [Traffic() for _ in range(stages)] if sp.dims.tensor else None
            for sizes, sp in shape_plans(plan).items()}


def stage_traffic(plan: CompletePlan, inputs: Any, lowered: dict, lower: bool = False) -> tuple[list[Traffic], str]:
    """Each stage's collectives, on its own sizes: its shape's lowered program's (`lowered`, by stage
    sizes: a list per stage, None for a shape without a program, a str why it could not be lowered; a
    shape left out is lowered here when `lower`, else priced without its program), those of its
    parameters (step_time.plan_traffic of its shape's plan) and the row conversions at its boundaries
    (`inputs.convert`). Also which shapes' programs could not be lowered, and why ("" when all were)."""
    shapes = stage_shapes(plan)
    per_shape: dict[Sizes, list[Traffic]] = {}
    why = []
    for sizes, sp in shape_plans(plan).items():
        low = lowered.get(sizes) if sizes in lowered or not lower else _lower(sp)
        if isinstance(low, list) and len(low) != len(shapes):
            low = f"the lowered program has {len(low)} stages where the plan's modules make {len(shapes)}"
        if isinstance(low, str):
            why.append(f"stages on {describe(plan, sizes)} (the plan could not be lowered: {low})")
        per_shape[sizes] = plan_traffic(sp, list(inputs.units), low if isinstance(low, list) else None)
    out: list[Traffic] = []
    for s, sizes in enumerate(shapes):
        t, extra = per_shape[sizes][s], list(inputs.convert[s]) if inputs.convert else []
        if extra:
            t = StageTraffic(t.transfers + extra, t.lowered, t.extra + extra) if isinstance(t, StageTraffic) \
                else Traffic(t.transfers + extra)
        out.append(t)
    return out, "; ".join(why)


def _lower(sp: CompletePlan) -> list[Traffic] | str | None:
    try:
        return lowered_traffic(sp)
    except Exception as e:  # noqa: BLE001 - the stage is priced without its program; its rows say why
        return f"{type(e).__name__}: {e}"


def conversions(plan: CompletePlan, facts) -> tuple[tuple[Transfer, ...], ...]:
    """Per stage, the row conversions at its boundaries with a stage of other sizes, one per microbatch
    (see the module docstring): a receiving stage's all-gather of the activation it takes (phase
    "forward"), a sending stage's all-gather of its output's gradient (phase "backward"), each over the
    stage's axes of more than one device other than the pipeline's and the data axes."""
    p = plan.pipeline
    assert p is not None
    shapes = stage_shapes(plan)
    plans = [stage_plan(plan, s) for s in range(len(shapes))]
    stage_of = stage_of_modules(plan, stage_targets(facts.all_modules, facts.params))
    m, last = p.microbatches, len(shapes) - 1
    prec = plan.precision
    itemsize = prec.bytes("params") if prec.mixed else 4  # as the estimate's receive buffers
    out: list[list[Transfer]] = [[] for _ in shapes]
    for s in range(last):
        if shapes[s] == shapes[s + 1]:
            continue
        for k, side in ((s + 1, "in"), (s, "out")):
            sp = plans[k]
            assert sp.mesh is not None
            axes = share_axes(sp)
            nbytes = boundary_bytes(facts, stage_of, k, sp.dims.data_degree * m, side, last=last, itemsize=itemsize)
            if not axes or not nbytes:
                continue
            t = transfer(Collective.ALL_GATHER, axes, nbytes, sp.mesh, "forward" if side == "in" else "backward",
                         f"stage {k}'s rows at its boundary with stage {s if side == 'in' else s + 1}")
            out[k] += [t] * m
    return tuple(tuple(x) for x in out)
