"""The table `planlang estimate` prints: one line per device class of planlang.model.price.estimate's
rows (bytes by memory class, the peak against the budget, the step time), each row's step time by the
parts of its formula, the estimator's notes once, and the plan's precision when it is mixed.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from planlang.cost.comm import MATMUL_EFFICIENCY
from planlang.plan.complete import CompletePlan
from planlang.plan.units import format_bytes

if TYPE_CHECKING:  # the estimate's module imports torch; the table itself does not need it
    from planlang.model.price.estimate import DeviceEstimate


def render_table(plan: CompletePlan, rows: Sequence[DeviceEstimate]) -> str:
    """The table of `rows`, one per device class."""
    budget = plan.budget.bytes if plan.budget else None
    w = max([12] + [len(r.device) for r in rows])  # "rank 0 (stages 0, 2)" under an interleaved schedule
    head = (f"{'device':{w}} {'params':>11} {'grads':>11} {'optimizer':>11} {'buffers':>11} {'activations':>12} "
            f"{'transient':>11} {'peak':>11} {'budget':>8} {'step':>10}")
    lines = [head, "-" * len(head)]
    for r in rows:
        fit = "-" if budget is None else ("ok" if r.peak <= budget else "OVER")
        # gradients held in the runtime's buckets are gradients: shown as such (marked), not as buffers
        grads = format_bytes(r.gradients + r.grad_buckets) + ("*" if r.grad_buckets else " ")
        lines.append(f"{r.device:{w}} {format_bytes(r.parameters):>11} {grads:>12}"
                     f"{format_bytes(r.optimizer):>11} {format_bytes(r.buffers - r.grad_buckets):>11} "
                     f"{format_bytes(r.activations):>12} "
                     f"{format_bytes(r.transient):>11} {format_bytes(r.peak):>11} {fit:>8} {r.step_time * 1e3:>8.2f}ms")
    if any(r.grad_buckets for r in rows):
        lines.append("* grads: the storage of the persistent gradient buckets the gradients are slices of "
                     "(summed over the data axes bucket by bucket), held the whole step")
    lines += [f"step time, {r.device}: {r.step}" for r in rows if r.step is not None]
    lines += [f"note: {n}" for n in dict.fromkeys(n for r in rows for n in r.notes)]  # once, not per row
    if plan.precision.mixed:
        lines.append(f"precision: {precision_summary(plan)}")
    return "\n".join(lines) + "\n"


def precision_summary(plan: CompletePlan) -> str:
    """One line saying the plan's dtypes and how the estimate counts them (`planlang estimate`, the report)."""
    prec = plan.precision
    dev = plan.mesh.device if plan.mesh is not None else None
    peak = dev.flops_for(prec.compute) if dev is not None else None
    at = f"compute priced at flops.{prec.compute} = {peak / 1e12:g} TFLOPS" if peak else "compute not priced"
    if peak and dev is not None and dev.memory_bandwidth:
        at = (f"compute priced by a roofline: matmuls at {MATMUL_EFFICIENCY:.0%} of flops.{prec.compute} = "
              f"{peak / 1e12:g} TFLOPS, memory-bound ops at {dev.memory_bandwidth / 1e9:g} GB/s")
    fsdp = plan.optimizer is not None and plan.optimizer.zero_stage >= 2
    copy = ("FSDP2's shards are the master copy" if fsdp else f"the weights' master copy in {prec.master}"
            ) if prec.master_copy else "no master copy"
    scale = f", loss scale {prec.loss_scale}" if prec.loss_scale is not None else ""
    return f"{prec}{scale}; {copy}; {at}"
