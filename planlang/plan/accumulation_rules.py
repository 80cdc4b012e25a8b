"""The checks of a top-level `microbatches N` (gradient accumulation without a pipeline).

Its batch arithmetic is data_specs' (rules.py, PL305: the batch dim divides by the data axes times the
microbatches, whichever statement says them); here what the statement itself may not say.
"""
from __future__ import annotations

from typing import Iterator

from planlang.lang.diagnostics import Diagnostic, Label
from planlang.lang.fixes import delete_statement
from planlang.lang.source import Span

from . import types as T
from .resolve import diag

Diags = Iterator[Diagnostic]


def step_microbatches(plan: T.Plan) -> tuple[int | None, Span | None]:
    """(microbatches each step runs in sequence, where the plan says it): the pipeline's, else the
    top-level statement's, else (None, None). None as the count too while it is a hole or below 1 (PL411
    reports that)."""
    src: T.Pipeline | T.Accumulation | None = plan.pipeline or plan.accumulation
    if src is None:
        return None, None
    m = src.microbatches
    return (m if isinstance(m, int) and m >= 1 else None), src.span


def accumulation_statement(ctx) -> Diags:
    """PL411 a top-level `microbatches` below 1; PL417 a top-level `microbatches` in a plan with a
    pipeline (whose own `microbatches` is the step's: one count, said once)."""
    plan = ctx.plan
    acc = plan.accumulation
    if acc is None:
        return
    if isinstance(acc.microbatches, int) and acc.microbatches < 1:
        yield diag("PL411", f"microbatches is {acc.microbatches}", acc.span,
                   help="use at least 1 microbatch (1: the whole per-rank batch at once)")
    if plan.pipeline is not None:
        yield diag("PL417", "a plan with a pipeline says its microbatches in the pipeline statement", acc.span,
                   labels=[Label(plan.pipeline.span, f"this pipeline runs {plan.pipeline.microbatches} "
                                                     "microbatches per step")],
                   help="remove this `microbatches` statement; to change how many the pipeline runs, change "
                        "its `microbatches`",
                   # safe: the pipeline's count is the one a plan with a pipeline runs
                   fix=delete_statement(ctx.sources.get(acc.span.file), acc.span, "remove this `microbatches`"))
