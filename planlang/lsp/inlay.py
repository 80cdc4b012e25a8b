"""textDocument/inlayHint: local shapes, and per-stage memory and step time.

Local shapes are the plan's own arithmetic, never a formula of the editor's:
  * `data INPUT : SPEC`: the input's declared shape under the spec (`Spec.local_shape`), model-free;
  * `shard PATH : SPEC` (and an `apply` whose template shards parameters): each parameter the statement
    decides, with its local shape as the estimator holds it (planlang.model.price.local_model.local_params:
    the last rule selecting a parameter gives its spec), when model checks are on and the model was probed;
  * a pipeline `stage`: its estimated peak memory per device and step time; `budget` without a pipeline:
    the devices' peak (planlang.model.price.estimate, from the model-aware run).
A split that is not even gets no hint (the checker reports it, PL305 / PL361).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from lsprotocol import types as L

from planlang.lang import ast as A
from planlang.lang.source import Span
from planlang.plan import types as T
from planlang.plan.complete import IncompletePlan, complete
from planlang.plan.units import format_bytes

from .analysis import Analysis
from .positions import LineIndex
from .symbols import walk

if TYPE_CHECKING:
    from .model_checks import ModelInsight

MAX_SHAPES = 2  # distinct local shapes named in one hint (the tooltip lists more)
MAX_TOOLTIP = 8


def shape_text(shape) -> str:
    return "[" + ", ".join(str(n) for n in shape) + "]"


def even(shape: tuple[int, ...], spec: T.Spec, mesh: T.Mesh) -> bool:
    return all(n % (spec.shard_factor(i, mesh) or 1) == 0 for i, n in enumerate(shape))


class Hints:
    def __init__(self, analysis: Analysis, encoding: str):
        self.analysis = analysis
        self.index = LineIndex(analysis.text, encoding)
        self.out: list[L.InlayHint] = []

    def add(self, span: Span, label: str, tooltip: str | None = None) -> None:
        self.out.append(L.InlayHint(position=self.index.position(span.end), label=label, kind=L.InlayHintKind.Type,
                                    padding_left=True,
                                    tooltip=L.MarkupContent(L.MarkupKind.Markdown, tooltip) if tooltip else None))


def data_hints(h: Hints, plan: T.Plan) -> None:
    mesh = plan.mesh
    if mesh is None:
        return
    decls = {st.input.text: st for st in h.analysis.module.statements if isinstance(st, A.DataDecl)}
    for d in plan.data:
        st, inp = decls.get(d.input), plan.input(d.input)
        if st is None or inp is None or not isinstance(d.spec, T.Spec) or d.spec.has_holes:
            continue
        local = d.spec.local_shape(inp.shape, mesh)
        if local is None or not even(inp.shape, d.spec, mesh):
            continue
        dims = ", ".join(f"{name} = {n}" for (name, _), n in zip(inp.dims, local))
        h.add(st.span, f"local {shape_text(local)}",
              f"`{d.input}`: {inp.dtype}{shape_text(inp.shape)} → {inp.dtype}[{dims}] per device under `{d.spec}`")


def param_hints(h: Hints, plan: T.Plan, facts) -> None:
    """Each shard statement's (and template application's) parameters with their local shapes."""
    found = _decided(plan, facts)
    if found is None:
        return
    rules, mesh, by_rule = found
    path = h.analysis.path
    by_stmt: dict[Span, list[int]] = {}  # a statement's span -> the rules it made
    by_apply: dict[Span, list[int]] = {}  # an apply's span -> the rules a template of another file made
    for i, r in enumerate(rules):
        by_stmt.setdefault(r.span, []).append(i)
        if r.span.file != path:
            for site in r.origin:
                by_apply.setdefault(site, []).append(i)
    for node, _chain in walk(h.analysis.module):
        if isinstance(node, A.ShardStmt):
            made = by_stmt.get(node.span, [])
        elif isinstance(node, A.ApplyStmt):
            made = by_apply.get(node.span, [])
        else:
            continue
        shown = [(p, rules[i]) for i in sorted(set(made)) for p in by_rule.get(i, ())]
        if not shown or any(not even(p.shape, r.spec, mesh) for p, r in shown):
            continue  # nothing decided here, or an uneven split (the checker's error says it)
        shapes: list[tuple[int, ...]] = []
        for p, _ in shown:
            if p.local not in shapes:
                shapes.append(p.local)
        more = ", …" if len(shapes) > MAX_SHAPES else ""
        head = "local " if len(shown) == 1 else f"{len(shown)} tensors, local "
        label = head + ", ".join(shape_text(s) for s in shapes[:MAX_SHAPES]) + more
        rows = [f"- `{p.name}`: {shape_text(p.shape)} → {shape_text(p.local)} under `{r.spec}`"
                for p, r in shown[:MAX_TOOLTIP]]
        if len(shown) > MAX_TOOLTIP:
            rows.append(f"- … {len(shown) - MAX_TOOLTIP} more")
        h.add(node.span, label, "per device:\n\n" + "\n".join(rows))


_LAST: list = []  # [(plan, facts), result]: hints are asked for again on every scroll; one model run


def _decided(plan: T.Plan, facts):
    """(the plan's parameter rules, its mesh, rule index -> the parameters it decides with their local
    shapes), or None for a plan with holes or no mesh. The local shapes are the estimator's
    (`local_params`); the rule deciding a parameter is the last one selecting it, as `spec_for` reads."""
    if _LAST and _LAST[0][0] is plan and _LAST[0][1] is facts:
        return _LAST[1]
    # lazy: the model layer (torch) is loaded already when there are facts
    from planlang.model.price.local_model import local_params, spec_for

    try:
        cp = complete(plan)
    except IncompletePlan:
        cp = None  # holes: the solver chooses; no local shape to show
    out = None
    if cp is not None and cp.mesh is not None:
        _, params = local_params(cp, facts)
        rules = [r for r in cp.shards if r.kind == "param"]
        by_rule: dict[int, list] = {}
        for p in params.values():
            i = next((i for i in range(len(rules) - 1, -1, -1) if rules[i].target.matches(p.name)), None)
            if i is not None and rules[i].spec == spec_for(p.name, cp):  # the spec its local shape is under
                by_rule.setdefault(i, []).append(p)
        out = (rules, cp.mesh, by_rule)
    _LAST[:] = [(plan, facts), out]
    return out


def estimate_hints(h: Hints, insight: ModelInsight) -> None:
    for node, _chain in walk(h.analysis.module):
        if isinstance(node, A.PipelineDecl) and isinstance(node.stages, tuple):
            for i, stage in enumerate(node.stages):
                est = insight.estimate_for(f"stage {i}")
                if est is not None:
                    h.add(stage.span, f"≈ {format_bytes(est.peak)} peak, {est.step_time * 1e3:.1f} ms/step",
                          f"stage {i}, estimated per device (`planlang estimate`)")
        elif isinstance(node, A.BudgetDecl) and len(insight.estimates) == 1:
            est = insight.estimates[0]
            if not est.device.startswith("stage"):
                h.add(node.span, f"≈ {format_bytes(est.peak)} peak, {est.step_time * 1e3:.1f} ms/step",
                      "estimated per device (`planlang estimate`)")


def inlay_hints(analysis: Analysis, rng: L.Range, encoding: str, insight: ModelInsight | None = None) -> list[L.InlayHint]:
    """The hints inside `rng`. `insight`: the model-aware run of this same text (None: model-free only)."""
    if not analysis.parses:
        return []
    h = Hints(analysis, encoding)
    plan = analysis.plan
    if plan is not None:
        data_hints(h, plan)
    if insight is not None and insight.facts is not None and insight.plan is not None:
        param_hints(h, insight.plan, insight.facts)
        estimate_hints(h, insight)
    lo, hi = (rng.start.line, rng.start.character), (rng.end.line, rng.end.character)
    hints = [x for x in h.out if lo <= (x.position.line, x.position.character) <= hi]
    return sorted(hints, key=lambda x: (x.position.line, x.position.character))
