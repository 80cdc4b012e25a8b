"""`planlang.apply` of a pipeline whose stages run on their own degrees (`stage ... with dp = 4, tp = 1`;
planlang.plan.stage_meshes): each rank lowers, places and runs its stage as the plan of the stage's sizes
says, on the DeviceMesh of those sizes, and its stage boundaries move rows (planlang.runtime.stage_rows).

Every rank takes part in what is collective over the world, in the same order: the DeviceMesh of each
distinct stage shape, and the program of each (rank 0 lowers it, every rank receives it: `lower_once`),
so that every rank checks every boundary and tied parameter alike and raises the same PlanError.
"""
from __future__ import annotations

import torch
from torch import nn

from planlang.cost.layout import local_shape
from planlang.model.program.lowering import LoweringError, Program
from planlang.model.program.pipeline_program import ProgramCut, cut_program, microbatch_plan
from planlang.plan.complete import CompletePlan, plan_mesh
from planlang.plan.stage_meshes import shape_plans, shares, stage_plan, stage_shapes
from planlang.plan.placement import stage_ranks

from .pipeline import PipelineError
from .placement import shard_parameters
from .plan_lowering import lower_once, report_fallbacks
from .precision import cast_buffers, storage_dtype
from .program_pipeline import ProgramPipelinedModel, build_program_pipeline
from .programs import PlanError
from .stage_rows import boundary_rows, stage_groups, with_axes


def apply_heterogeneous(model: nn.Module, plan: CompletePlan, loss_fn, targets, device: torch.device, recorder,
                        strict: bool) -> ProgramPipelinedModel:
    """This rank's stage of `plan` (a validated heterogeneous pipeline plan), as a ProgramPipelinedModel
    over the stage's own plan and mesh. The stages run the plan's batch and the model's mode only."""
    p = plan.pipeline
    assert p is not None
    mine, meshes = stage_groups(plan, device.type)
    plans = [stage_plan(plan, s) for s in range(len(p.stages))]
    m = p.microbatches
    if targets is not None:  # examples for the global batch: one microbatch's
        targets = tuple(t[: max(1, t.shape[0] // m)] if t.dim() else t for t in targets)
    try:  # one program per distinct shape, in stage order on every rank
        lowered = {sizes: report_fallbacks(lower_once(model, microbatch_plan(sp), loss_fn, targets), strict)
                   for sizes, sp in shape_plans(plan).items()}
        progs = [lowered[sizes] for sizes in stage_shapes(plan)]
        cuts = [cut_program(prog, pl) for prog, pl in zip(progs, plans)]
        rows = boundary_rows(plans, progs, cuts)
        _same_tied_pieces(plans, progs, cuts)
    except (PipelineError, LoweringError) as e:
        raise PlanError(str(e)) from e
    own, prog = plans[mine], progs[mine]
    groups = meshes[plan_mesh(own).shape]
    prec = own.precision
    layouts = shard_parameters(model, prog, groups.coords, device,
                               storage_dtype(prec, bool(own.dims.fsdp)) if prec.mixed else None)
    cast_buffers(model, prec)
    try:
        pm = build_program_pipeline(model, own, prog, layouts, groups, device, recorder,
                                    rows=with_axes(rows[mine], own, groups))
    except (PipelineError, LoweringError) as e:
        raise PlanError(str(e)) from e
    pm.shares = (shares(plans[0]), shares(plans[-1]))
    pm.own_degrees, pm.needs_target = True, bool(cuts[-1].targets)
    pm.runner.user_loss = loss_fn  # its parameters name the targets of `pm(...)` (call_outputs.bind_call)
    return pm


def _same_tied_pieces(plans: list[CompletePlan], progs: list[Program], cuts: list[ProgramCut]) -> None:
    """A parameter read by stages on different pipeline ranks (GPT-2's `wte`, also the head's weight) has
    its gradients summed over the pipeline axis, piece by piece: each stage must hold the same piece of it."""
    p = plans[0].pipeline
    assert p is not None
    ranks = stage_ranks(p.schedule.kind, plans[0].dims.pipeline_size, 1)
    holders: dict[str, set[int]] = {}
    for s, cut in enumerate(cuts):
        for f in cut.stages[s].params:
            holders.setdefault(f, set()).add(s)
    for f, stages in holders.items():
        if len({ranks[s] for s in stages}) < 2:
            continue
        # every pipeline rank joins the sum (those without a copy with zeros of their own piece's shape), and
        # ZeRO-2/3 sums FSDP2's shard of it: each stage's piece, sharded over its own ZeRO axis, must agree
        where = []
        for s, (pl, prog) in enumerate(zip(plans, progs)):
            shape = next(tuple(v.shape) for v in prog.graph.values.values() if v.kind == "param" and v.ref == f)
            spec = prog.param_specs[f]
            fsdp = pl.dims.fsdp[0] if pl.dims.fsdp else None
            shards = pl.dims.size(fsdp) if fsdp else 1
            where.append((s, (local_shape(shape, spec, prog.mesh), shards), str(spec) + (
                f" sharded over {fsdp}({shards}) by ZeRO-{pl.dims.zero_stage}" if fsdp else "")))
        if len({piece for _, piece, _ in where}) > 1:
            desc = ", ".join(f"{sp} in stage {s}" for s, _, sp in where)
            raise PipelineError(f"`{f}` is read by stages of different degrees that hold different pieces of it "
                                f"({desc}); its gradient is summed over the pipeline axis piece by piece",
                                f"shard `{f}` alike in every stage (replicate it, or split it over an axis every "
                                "stage gives the same size; with ZeRO-2/3 give the ZeRO axis one size in every "
                                "stage, or use ZeRO-1)")
