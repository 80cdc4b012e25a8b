"""Where a rule's diagnostic points: the statement a spec or a reference was written in, through the
template applications and loops that produced it (`site_and_labels`), and the spans of a spec's entries."""
from __future__ import annotations

from planlang.lang import ast as A
from planlang.lang.diagnostics import Label
from planlang.lang.source import Span

from . import types as T


def site_and_labels(span: Span, origin: tuple[Span, ...]) -> tuple[Span, list[Label]]:
    """Point at the user's line: the outermost apply/for site, with a label at the template line."""
    if not origin:
        return span, []
    site = T.user_site(span, origin)
    if site == span:  # the statement is in the user's file (a `for` body, a local template)
        return span, [Label(origin[-1], "expanded from here")]
    return site, [Label(span, "from this line of the template")]


def spec_sites(plan: T.Plan):
    """(spec, statement, origin, kind) for every spec in the plan: a `DataSpec` or a `ShardRule`.
    A plan has a spec per line of a big file: the statement's span (`.span`) and `statement_kind` are only
    worked out for a diagnostic."""
    for d in plan.data:
        if isinstance(d.spec, T.Spec):
            yield d.spec, d, (), "data"
    for r in plan.shards:
        if isinstance(r.spec, T.Spec):
            yield r.spec, r, r.origin, r.kind


def statement_kind(statement) -> str:
    """How a diagnostic names the spec of a `DataSpec` or `ShardRule`."""
    if isinstance(statement, T.DataSpec):
        return f"data spec of `{statement.input}`"
    return f"spec of `{statement.target}`"


def entry_span(spec: T.Spec, i: int) -> Span:
    return spec.dim_spans[i] if i < len(spec.dim_spans) else spec.span


def partial_span(spec: T.Spec, j: int) -> Span:
    return spec.partial_spans[j] if j < len(spec.partial_spans) else spec.span


def axis_refs(plan: T.Plan):
    """Every axis the plan names, in order, as (axis, owner, which, origin): the name stands in entry
    `which` of the spec `owner`, in its partial(...) list at `-1 - which` when negative, or `which` is
    None and the span is the owner's. A big plan names an axis per spec entry: spans are only worked
    out (`ref_span`) for a diagnostic."""
    for spec, _, origin, _ in spec_sites(plan):
        for i, d in enumerate(spec.dims):
            if isinstance(d, tuple):
                for ax in d:
                    yield ax, spec, i, origin
        for j, ax in enumerate(spec.partial):
            yield ax, spec, -1 - j, origin
    p = plan.pipeline
    if p is not None:
        if isinstance(p.axis, str):
            yield p.axis, p, None, ()
        if isinstance(p.stages, tuple):
            for st in p.stages:
                for ax, _ in st.degrees:
                    yield ax, st, None, ()
    if plan.optimizer is not None and isinstance(plan.optimizer.zero_axis, str):
        yield plan.optimizer.zero_axis, plan.optimizer, None, ()


def ref_span(owner, which: int | None) -> Span:
    if which is None:
        return owner.span
    return entry_span(owner, which) if which >= 0 else partial_span(owner, -1 - which)


def writes_any(ctx, *kinds: type) -> bool:
    """Whether the plan's own file has a statement of one of `kinds` (one that failed to resolve
    leaves no value in the plan, and its error already said why: 'no mesh' or 'no budget' would be a
    second diagnostic for the same mistake)."""
    module = ctx.modules.get(ctx.plan.path)
    return module is not None and any(isinstance(s, kinds) for s in module.statements)
