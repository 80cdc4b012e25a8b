"""Sharded parameters the lowered program moves every step (PL366): facts read off a `Program`.

The lowering uses a parameter in the layout the plan stores it in wherever the op reading it has a
strategy for that layout. Where none has (a gated MLP that cuts its fused `up.weight` in two; a weight
read by an op with no sharding rule), it converts the parameter (an all-gather back to whole, or an
all-to-all to another split) before the op, in every step's forward, and the gradient back in
backward. The plan then pays the collectives the split was meant to save and holds the whole weight
anyway; `check --model` says so instead of leaving it to `estimate`'s in-line collectives.
"""
from __future__ import annotations

from dataclasses import dataclass

from planlang.cost.layout import normalize
from planlang.plan.complete import CompletePlan
from planlang.plan.types import Spec

from planlang.model.program.lowering import Convert, Program, Run
from planlang.model.price.traffic import predict_step_traffic

# steps that slice a local copy or mark it partial: no bytes move in forward
_LOCAL = ("shard", "to_partial")


@dataclass(frozen=True)
class WeightGather:
    """Parameter `param` (global `shape`), stored as `stored`, converted to `to` by `steps` every step for
    the op `op` in `module` to read; `bytes`: what one rank sends for it in a step (forward and the
    gradient's way back, as planlang.model.price.traffic counts them)."""

    param: str
    shape: tuple[int, ...]
    stored: Spec
    to: Spec
    steps: tuple[str, ...]
    op: str
    module: str
    bytes: float
    opaque: bool = False  # the op has no sharding rule at all (every split input is gathered for it)

    @property
    def whole(self) -> bool:
        """Whether the conversion gathers the parameter back to whole (replicated) on every rank."""
        return not self.to.used_axes()


def _reader(prog: Program, out: str) -> Run | None:
    """The first op that reads converted value `out` (through further conversions)."""
    names = {out}
    for ins in prog.instructions:
        if isinstance(ins, Convert) and ins.value in names:
            names.add(ins.out)
        elif isinstance(ins, Run) and names & set(ins.args):
            return ins
    return None


def weight_gathers(prog: Program, plan: CompletePlan) -> list[WeightGather]:
    """Every conversion of a parameter the plan splits (over an axis of more than one device) that moves
    bytes in forward, in program order. A replicated parameter sliced or marked partial moves nothing
    and is not listed."""
    mesh = prog.mesh
    params = {v.name: v for v in prog.graph.params()}
    found: list[tuple[Convert, str]] = []
    for ins in prog.instructions:
        if not isinstance(ins, Convert) or ins.value not in params:
            continue
        stored = normalize(prog.param_specs[params[ins.value].ref], mesh)
        if not stored.used_axes() or all(st.kind in _LOCAL for st in ins.path.steps):
            continue
        found.append((ins, params[ins.value].ref))
    if not found:
        return []
    sent: dict[str, float] = {}
    for t in predict_step_traffic(plan, prog, sums=False).transfers:
        sent[t.what] = sent.get(t.what, 0.0) + t.bytes
    out = []
    for ins, ref in found:
        run = _reader(prog, ins.out)
        opaque = run is not None and run.node.op.kind == "opaque"
        op = "?" if run is None else str(run.node.op.attr("target", "opaque")) if opaque else run.node.op.kind
        out.append(WeightGather(ref, ins.shape, prog.param_specs[ref], ins.dst, tuple(str(s) for s in ins.path.steps),
                                op, "" if run is None else run.node.module, sent.get(ins.out, 0.0), opaque))
    return out
