"""A candidate as a plan value: the input's resolved plan with every hole replaced by the value the
search chose (`dataclasses.replace` on the parts that hold holes; every other part is the input's own
object). What `planlang solve` writes at the end is the same choices as text (planlang.solve.holes), and
that text resolves to this value (tests/solve/test_plan_values.py).

Holes are found where `Plan.holes()` finds them. A hole written once stands for several hole values when
a `for` loop or a template expands it (one per module), so values are looked up by where the `?` is
written (`classify.hole_key`); the spec entries a template parameter given `?` leaves open are looked up
by the hole value itself (`TemplateArguments.entries`: the template's text is shared by every `apply`).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from planlang.plan import types as T

from .classify import hole_key


@dataclass
class Values:
    """What fills each hole of one candidate."""

    at: dict[tuple[str, int], object] = field(default_factory=dict)  # hole_key -> value
    entries: dict[int, tuple[str, ...]] = field(default_factory=dict)  # id() of a template-argument entry -> axes
    checkpoints: tuple[T.CheckpointGroup, ...] | None = None  # `checkpoint ?`: the groups (() for none)

    def of(self, hole: T.Hole):
        """The value for `hole`; the hole itself when the candidate leaves it (the check then says so)."""
        found = self.entries.get(id(hole))
        if found is not None:
            return found
        return self.at.get(hole_key(hole), hole)


def substitute(plan: T.Plan, values: Values) -> T.Plan:
    """`plan` with each hole replaced by its value (the parts without holes shared, not copied)."""
    changes: dict = {}
    if plan.mesh is not None and plan.mesh.has_holes:
        changes["mesh"] = replace(plan.mesh, axes=tuple(
            replace(a, size=_value(a.size, values)) if T.is_hole(a.size) else a for a in plan.mesh.axes))
    opt = plan.optimizer
    if opt is not None and (T.is_hole(opt.zero_stage) or T.is_hole(opt.zero_axis)):
        changes["optimizer"] = replace(opt, zero_stage=_value(opt.zero_stage, values),
                                       zero_axis=_value(opt.zero_axis, values))
    if any(_has_holes(d.spec) for d in plan.data):
        changes["data"] = tuple(replace(d, spec=_spec(d.spec, values)) if _has_holes(d.spec) else d for d in plan.data)
    if any(_has_holes(r.spec) for r in plan.shards):
        changes["shards"] = tuple(replace(r, spec=_spec(r.spec, values)) if _has_holes(r.spec) else r
                                  for r in plan.shards)
    if plan.pipeline is not None:
        p = plan.pipeline
        schedule = _value(p.schedule, values)
        if isinstance(schedule, T.Schedule) and T.is_hole(schedule.chunks):
            schedule = replace(schedule, chunks=_value(schedule.chunks, values))
        stages = _value(p.stages, values)
        if not T.is_hole(stages):
            stages = tuple(replace(st, degrees=tuple((a, _value(v, values)) for a, v in st.degrees))
                           if any(T.is_hole(v) for _, v in st.degrees) else st for st in stages)
        changes["pipeline"] = replace(p, axis=_value(p.axis, values), schedule=schedule,
                                      microbatches=_value(p.microbatches, values), stages=stages)
    if plan.accumulation is not None and T.is_hole(plan.accumulation.microbatches):
        changes["accumulation"] = replace(plan.accumulation, microbatches=_value(plan.accumulation.microbatches, values))
    groups = plan.checkpoints
    if any(T.is_hole(g.every) for g in groups):
        groups = tuple(replace(g, every=_value(g.every, values)) if T.is_hole(g.every) else g for g in groups)
    if plan.checkpoint_hole is not None and values.checkpoints is not None:
        # the groups stand where `checkpoint ?` is written, among the plan's other checkpoint statements
        at = plan.checkpoint_hole.span
        k = sum(1 for g in groups if g.site.file == at.file and g.site.start < at.start)
        groups = groups[:k] + values.checkpoints + groups[k:]
        changes["checkpoint_hole"] = None
    if groups is not plan.checkpoints:
        changes["checkpoints"] = groups
    return replace(plan, **changes) if changes else plan


def _value(x, values: Values):
    return values.of(x) if T.is_hole(x) else x


def _has_holes(spec) -> bool:
    return T.is_hole(spec) or spec.has_holes


def _spec(spec, values: Values):
    if T.is_hole(spec):
        return values.of(spec)
    return replace(spec, dims=tuple(values.of(d) if T.is_hole(d) else d for d in spec.dims))
