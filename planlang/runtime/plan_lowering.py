"""Lowering a plan for `planlang.apply` (planlang.runtime.apply): passes 2–4 on rank 0, the program sent to
every rank, PL364's report, and the loss a model without one trains (its own `loss` field, else its
output's sum). `outputs`: the program also returns the model's output (`pm(...)`, graph_values.loss_step)."""
from __future__ import annotations

import os
import sys
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from planlang.model.capture.load import guess_targets, meta_inputs, plan_loss
from planlang.model.capture.opgraph import op_graph
from planlang.model.program.lowering import LoweringError, Program, lower, mark_checkpoints
from planlang.plan.complete import CompletePlan
from planlang.runtime.call_outputs import model_own_loss
from planlang.runtime.programs import PlanError


def lower_plan(model: nn.Module, plan: CompletePlan, loss_fn: Callable | None = None,
               targets: tuple[torch.Tensor, ...] | None = None, outputs: bool = False) -> Program:
    """Passes 2–4 (no process group needed): the program every rank runs. `outputs`: it also returns the
    model's output (prog.outputs, graph.output_tree: `pm(...)`'s program; `step`'s returns the loss alone)."""

    loss_fn = loss_fn or plan_loss(plan, model)  # the module's `loss`, else the model's `loss` method
    inputs = meta_inputs(plan.inputs)
    if loss_fn is None:
        loss_fn = sum_loss
        targets = ()
    if targets is None:
        targets = guess_targets(model, loss_fn, inputs)
        if targets is None:
            raise PlanError("could not find targets the loss accepts; pass `targets=` example tensors to apply()")
    try:
        graph = op_graph(model, inputs, loss_fn, tuple(targets), outputs=outputs)
        prog = lower(graph, plan)
        prog.checkpoint_groups = mark_checkpoints(prog, plan)
    except LoweringError as e:
        raise PlanError(str(e)) from e
    return prog


STRICT_ENV = "PLANLANG_STRICT"  # "1": an op that gathers the batch (PL364) stops the run
SHOWN_ENV = "PLANLANG_PL364_SHOWN"  # "1": the launcher's check already showed PL364; the workers stay quiet


def report_fallbacks(prog: Program, strict: bool) -> Program:
    """PL364 for every op the program runs on the whole batch: a warning on rank 0 (every rank lowered
    the same program), or with `strict` a PlanError on every rank; PL367 for every op run whole over
    other axes (a warning only: the batch stays split)."""
    whole = [f"warning[PL367]: {rep}" for rep in prog.replicated]
    if not prog.fallbacks:
        if whole and os.environ.get(SHOWN_ENV) != "1" and (not dist.is_initialized() or dist.get_rank() == 0):
            sys.stderr.write("\n".join(whole) + "\n")
        return prog
    lines = [f"warning[PL364]: {fb}" for fb in prog.fallbacks]
    if strict:
        raise PlanError("the plan's batch is gathered by ops without a per-sample rule (--strict):\n"
                        + "\n".join(lines) + "\n`planlang explain PL364` says what to do")
    if os.environ.get(SHOWN_ENV) != "1" and (not dist.is_initialized() or dist.get_rank() == 0):
        sys.stderr.write("\n".join(lines + whole) + "\n")
    return prog


def lower_once(model: nn.Module, plan: CompletePlan, loss_fn, targets, outputs: bool = False) -> Program:
    """`lower_plan` on rank 0, the program sent to every rank: lowering does not depend on the rank
    (codegen does), so the other ranks need not repeat the strategy search. A failure on rank 0 is
    raised there as it is and on the other ranks as a PlanError carrying its message."""
    box: list = [None]
    failure: Exception | None = None
    if dist.get_rank() == 0:
        try:
            box[0] = lower_plan(model, plan, loss_fn, targets, outputs)
        except Exception as e:  # noqa: BLE001 - the other ranks wait for the program; tell them why not
            failure, box[0] = e, ("failed", f"{type(e).__name__}: {e}")
    dist.broadcast_object_list(box, src=0)
    if failure is not None:
        raise failure
    if isinstance(box[0], tuple):
        raise PlanError(f"lowering the plan failed on rank 0: {box[0][1]}")
    return box[0]


def sum_loss(out):
    """The loss of a model without a loss function: the loss it computed itself (an HF model given
    `labels`: its output's scalar `loss`), else its output's sum (docs/byom.md's default, PL370)."""
    own = model_own_loss(out)
    return own if own is not None else out.sum()


def relowering(strict: bool) -> Callable:
    """Programs' lowering: `lower_once` (rank 0 lowers, every rank gets it) and its PL364 report."""
    def run(model: nn.Module, plan: CompletePlan, loss_fn, targets, outputs: bool = False) -> Program:
        return report_fallbacks(lower_once(model, plan, loss_fn, targets, outputs), strict)
    return run
