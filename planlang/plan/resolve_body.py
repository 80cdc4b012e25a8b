"""A plan's statements resolved into the `Plan` value: the model, inputs, mesh, budget, optimizer,
`data`, `pipeline`, and the shard and checkpoint statements, with `for` loops and `apply`ed templates
expanded (typed parameters: arity and kind checked; recursion bounded). Every resolved rule keeps the
span of its statement and the chain of `apply`/`for` sites it came through (`origin`).
"""
from __future__ import annotations

from functools import cached_property
from typing import Callable, cast

from planlang.lang.frozen import value_type
from planlang.lang import ast as A
from planlang.lang.diagnostics import Label, did_you_mean
from planlang.lang.fixes import delete_statement, did_you_mean_fix
from planlang.lang.source import Span
from planlang.lang.spec_text import read_spec

from . import types as T
from .resolve_values import DTYPES, PARAM_KINDS, Namespace, ResolverBase, diag
from .selection import Selection
from .units import Kind

# a node's span as stored (`ast.raw_span`: packed or a `Span`), passed on as `span=` unchanged: the plan's
# types keep it and read it as the `Span` they are typed with (`ast.lazy_span_field`); a big plan has millions
_raw = cast(Callable[[object], Span], A.raw_span)
# a parsed spec stored as `dim_spans` / `partial_spans`, which read its entries' spans only when asked
# (plan/types.py `_entry_spans`)
_lazy_spans = cast(Callable[[A.Spec], tuple[Span, ...]], lambda spec: spec)
MAX_EXPANSION_DEPTH = 256  # template applications and `for` loops open at once (PL226): far beyond any
                           # real plan, and each level is one or two frames of the resolver's recursion, so
                           # a deeper (finite) chain is a coded error, not a RecursionError
# PL215's help when no schedule is close: "schedules: gpipe, 1f1b, interleaved chunks N, ..."
_SCHEDULES_HELP = "schedules: " + ", ".join(f"{k} chunks {2 if k in T.V_SHAPED else 'N'}" if k in T.CHUNKED else k
                                             for k in T.SCHEDULES)


@value_type
class _Ctx:
    """Expansion context for bodies of `for` and `template`."""

    ns: Namespace
    prefix: Selection | None = None
    loopvars: tuple[tuple[str, Selection], ...] = ()
    params: tuple[tuple[str, object], ...] = ()  # name -> str axis | int | T.Hole
    origin: tuple[Span, ...] = ()
    depth: int = 0  # templates being expanded
    scope: Selection | None = None  # the innermost `for` selection or pattern `apply` target
    active: tuple[tuple[int, str], ...] = ()  # (id(), name as applied) of each template being expanded,
                                              # outermost first
    nesting: int = 0  # templates being expanded and `for` loops open, together (MAX_EXPANSION_DEPTH)

    @cached_property
    def bound(self) -> dict[str, object]:
        """`params` as a dict (looked up for every axis name of every spec)."""
        return dict(self.params)


def _template_chain(names: list[str], ends: int = 3) -> str:
    """`a` -> `b` -> `c`, the middle of a long chain left out (a message, not a listing)."""
    shown = [f"`{n}`" for n in names]
    if len(shown) > 2 * ends + 1:
        shown = shown[:ends] + [f"... ({len(shown) - 2 * ends} more)"] + shown[-ends:]
    return " -> ".join(shown)


class PlanBuilder(ResolverBase):
    """The plan file's statements, resolved (planlang.plan.resolve.Resolver loads the files and counts
    the expansions, `_within_budget`)."""

    def _within_budget(self, st: A.ApplyStmt, tdecl: A.TemplateDecl, ctx: _Ctx) -> bool:
        raise NotImplementedError

    # ------------------------------------------------------------------ the plan
    def _build_plan(self, module: A.Module, ns: Namespace) -> T.Plan:
        first: dict[type, A.Node] = {}
        once = (A.ModelDecl, A.BudgetDecl, A.OptimizerDecl, A.PipelineDecl, A.MicrobatchesDecl)
        model = mesh = budget = optimizer = pipeline = accumulation = None
        inputs: list[T.Input] = []
        input_spans: dict[str, Span] = {}
        data: list[T.DataSpec] = []
        shards: list[T.ShardRule] = []
        checkpoints: list[T.CheckpointGroup] = []
        checkpoint_hole = None
        ctx = _Ctx(ns)
        # an input may be declared after the `data` statement that splits it (declarations are not ordered)
        declared_inputs = {st.name.text for st in module.statements if isinstance(st, A.InputDecl)}
        # A file with several meshes and no model is a library of presets (stdlib/meshes.plan):
        # every mesh is checked and none is the plan's mesh.
        meshes = [s for s in module.statements if isinstance(s, (A.MeshDecl, A.MeshAlias))]
        library = len(meshes) > 1 and not any(isinstance(s, A.ModelDecl) for s in module.statements)
        if library:
            seen_mesh: dict[str, Span] = {}
            for m in meshes:
                if m.name.text in seen_mesh:
                    self.diags.append(diag("PL209", f"mesh `{m.name.text}` is declared twice", m.name.span,
                                           labels=[Label(seen_mesh[m.name.text], "first declared here")]))
                seen_mesh.setdefault(m.name.text, m.name.span)
                self._mesh(m, ns)

        for st in module.statements:
            if library and isinstance(st, (A.MeshDecl, A.MeshAlias)):
                continue
            kind = A.MeshDecl if isinstance(st, (A.MeshDecl, A.MeshAlias)) else type(st)
            if kind in once + (A.MeshDecl,):
                if kind in first:
                    word = {A.ModelDecl: "model", A.BudgetDecl: "budget", A.OptimizerDecl: "optimizer",
                            A.PipelineDecl: "pipeline", A.MeshDecl: "mesh",
                            A.MicrobatchesDecl: "microbatches"}[kind]
                    self.diags.append(diag(
                        "PL210", f"a plan has one `{word}`; this is a second one", st.span,
                        labels=[Label(first[kind].span, "the first one, which is used")],
                        help=f"remove one of the `{word}` statements",
                        # unsafe: which of the two was meant is a guess (this one is not the one used)
                        fix=delete_statement(self.sources.get(st.span.file), st.span, f"remove this `{word}`",
                                             safe=False),
                    ))
                    continue
                first[kind] = st
            if isinstance(st, A.ModelDecl):
                kwargs = tuple((kw.name.text, self._literal(kw.value, "a model argument")) for kw in st.args or ())
                self._no_duplicate_keys([kw.name for kw in st.args or ()], "argument")
                if ":" not in st.factory.value:
                    self.diags.append(diag(
                        "PL221", f'model factory "{st.factory.value}" is not of the form "module:callable"',
                        st.factory.span, help='for example "examples.mlp.model:build"',
                    ))
                model = T.ModelRef(st.name.text, st.factory.value, kwargs, span=st.span)
            elif isinstance(st, A.InputDecl):
                if st.name.text in input_spans:
                    self.diags.append(diag("PL209", f"input `{st.name.text}` is declared twice", st.name.span,
                                           labels=[Label(input_spans[st.name.text], "first declared here")]))
                    continue
                input_spans[st.name.text] = st.name.span
                if st.dtype.text not in DTYPES:
                    self._unknown_dtype(st.dtype.text, st.dtype.span)
                self._no_duplicate_keys([d.name for d in st.dims], "dim")
                dims = tuple((d.name.text, d.size.value) for d in st.dims)
                inputs.append(T.Input(st.name.text, DTYPES.get(st.dtype.text, st.dtype.text), dims, span=st.span))
            elif isinstance(st, (A.MeshDecl, A.MeshAlias)):
                mesh = self._mesh(st, ns)
            elif isinstance(st, A.BudgetDecl):
                amount = self._quantity(st.amount, Kind.MEMORY, "the budget")
                if amount is not None:
                    budget = T.Budget(int(amount), span=st.span)
            elif isinstance(st, A.OptimizerDecl):
                optimizer = self._optimizer(st)
            elif isinstance(st, A.DataDecl):
                if st.input.text not in declared_inputs:
                    guess = did_you_mean(st.input.text, declared_inputs)
                    self.diags.append(diag(
                        "PL211", f"unknown input `{st.input.text}`", st.input.span,
                        help=f"did you mean `{guess}`?" if guess else "declare it: `input idx : i64[batch=32, seq=512]`",
                        fix=did_you_mean_fix(st.input.span, st.input.text, guess, declared_inputs),
                    ))
                    continue
                data.append(T.DataSpec(st.input.text, self._spec(st.spec, ctx, "data spec"), span=st.span))
            elif isinstance(st, A.PipelineDecl):
                pipeline = self._pipeline(st)
            elif isinstance(st, A.MicrobatchesDecl):
                count = st.count
                accumulation = T.Accumulation(
                    T.Hole("microbatches", span=count.span) if isinstance(count, A.Hole) else count.value,
                    span=st.span)
            elif isinstance(st, A.CheckpointStmt) and isinstance(st.paths, A.Hole):
                checkpoint_hole = T.Hole("checkpoint groups", span=st.span)
            elif isinstance(st, (A.ShardStmt, A.CheckpointStmt, A.ApplyStmt, A.ForStmt)):
                self._body(st, ctx, shards, checkpoints)
        return T.Plan(
            path=module.path, model=model, inputs=tuple(inputs), mesh=mesh, budget=budget, optimizer=optimizer,
            data=tuple(data), shards=tuple(shards), pipeline=pipeline, checkpoints=tuple(checkpoints),
            checkpoint_hole=checkpoint_hole, accumulation=accumulation, devices=tuple(self._all(ns, "devices")),
            links=tuple(self._all(ns, "links")),
        )
    def _pipeline(self, st: A.PipelineDecl) -> T.Pipeline:
        axis = T.Hole("pipeline axis", span=st.axis.span) if isinstance(st.axis, A.Hole) else st.axis.text
        if isinstance(st.schedule, A.Hole):
            schedule: T.Schedule | T.Hole = T.Hole("schedule", span=st.schedule.span)
        else:
            name = st.schedule.name.text
            if name not in T.SCHEDULES:
                guess = did_you_mean(name, T.SCHEDULES)
                self.diags.append(diag(
                    "PL215", f"unknown schedule `{name}`", st.schedule.name.span,
                    help=f"did you mean `{guess}`?" if guess else _SCHEDULES_HELP,
                    fix=did_you_mean_fix(st.schedule.name.span, name, guess, T.SCHEDULES),
                ))
            ch = st.schedule.chunks
            chunks = 1 if ch is None else (T.Hole("chunks", span=ch.span) if isinstance(ch, A.Hole) else ch.value)
            schedule = T.Schedule(name, chunks, span=st.schedule.span)
        micro = (T.Hole("microbatches", span=st.microbatches.span) if isinstance(st.microbatches, A.Hole)
                 else st.microbatches.value)
        if isinstance(st.stages, A.Hole):
            stages: tuple[T.Stage, ...] | T.Hole = T.Hole("stages", span=st.stages.span)
        else:
            out = []
            for i, sd in enumerate(st.stages):
                self._no_duplicate_keys([d.axis for d in sd.degrees], "axis")
                degrees = tuple(
                    (d.axis.text, T.Hole("stage degree", span=d.size.span) if isinstance(d.size, A.Hole) else d.size.value)
                    for d in sd.degrees
                )
                out.append(T.Stage(i, tuple(Selection.from_path(p) for p in sd.paths), degrees, span=_raw(sd)))
            stages = tuple(out)
        return T.Pipeline(axis, schedule, micro, stages, span=st.span)

    # ------------------------------------------------------------------ specs and bodies
    def _axis_name(self, name: A.Name, ctx: _Ctx) -> str | T.Hole:
        bound = ctx.bound.get(name.text)
        if bound is None:
            return name.text
        if isinstance(bound, (str, T.Hole)):
            return bound
        self.diags.append(diag("PL207", f"`{name.text}` is an int parameter, used here as an axis", name.span))
        return T.Hole("spec entry", span=name.span)  # reported once; not also an unknown axis

    def _spec(self, spec, ctx: _Ctx, what: str) -> T.Spec | T.Hole:
        # spans are passed on as the parser stored them (A.raw_span): a big plan has millions
        if isinstance(spec, A.Hole):
            return T.Hole(what, span=_raw(spec))
        # in a template, the same spec node with the same arguments resolves to the same Spec (holes
        # aside: a hole argument carries the span of its `apply`); not when resolving it reported something
        key = (None if not ctx.depth or any(isinstance(v, T.Hole) for _, v in ctx.params)
               else (id(spec), ctx.params))
        if key is not None and key in self._specs:
            return self._specs[key]
        reported = len(self.diags)
        out = self._spec_of(spec, ctx)
        if key is not None and len(self.diags) == reported:
            self._specs[key] = out
        return out

    def _spec_of(self, spec: A.Spec, ctx: _Ctx) -> T.Spec:
        text = A.spec_compact(spec)
        if text is not None:  # a parsed spec kept as text: resolved without building its nodes if it can be
            shape = self._spec_shapes.get(text)
            if shape is None:
                shape = self._spec_shapes[text] = _spec_shape(text)
            out = self._spec_from_shape(shape, spec, ctx)
            if out is not None:
                return out
        dims: list[tuple[str, ...] | T.Hole] = []
        for e in spec.entries:
            if isinstance(e, A.Replicated):
                dims.append(())
            elif isinstance(e, A.Hole):
                dims.append(T.Hole("spec entry", span=_raw(e)))
            elif isinstance(e, A.AxisEntry):
                v = self._axis_name(e.axis, ctx)
                dims.append(T.Hole("spec entry", span=_raw(e)) if isinstance(v, T.Hole) else (v,))
            else:
                vs = [self._axis_name(a, ctx) for a in e.axes]
                names = tuple(v for v in vs if isinstance(v, str))
                dims.append(names if len(names) == len(vs) else T.Hole("spec entry", span=_raw(e)))
        partial = []
        for p in spec.partial:
            v = self._axis_name(p, ctx)
            if isinstance(v, str):
                partial.append(v)
            elif ctx.bound.get(p.text) is not None and isinstance(ctx.bound[p.text], T.Hole):
                self.diags.append(diag("PL221", f"`partial({p.text})` needs an axis, but `{p.text}` is a hole here",
                                       p.span, help="pass an axis name to the template; partial sums are not solved"))
        dims_t, partial_t = tuple(dims), tuple(partial)
        if not any(isinstance(d, T.Hole) for d in dims_t):
            dims_t = self._dims.setdefault(dims_t, dims_t)
        partial_t = self._dims.setdefault(partial_t, partial_t)
        return T.Spec(dims_t, partial_t, span=_raw(spec),
                      dim_spans=tuple([_raw(e) for e in spec.entries]),
                      partial_spans=tuple([_raw(p) for p in spec.partial]))

    def _spec_from_shape(self, shape, spec: A.Spec, ctx: _Ctx) -> T.Spec | None:
        """`_spec_of` for a spec of that shape when it reports nothing and has no hole: every axis name
        free or bound to an axis by the template (None otherwise: the caller builds the nodes)."""
        entries, partial, names = shape
        bound = ctx.bound
        if entries is None or any(not isinstance(bound.get(n, ""), str) for n in names):
            return None
        axis = {k: v for k, v in bound.items() if isinstance(v, str)}  # the parameters bound to an axis
        dims = tuple(axes if not axes else tuple(axis.get(a, a) for a in axes) for axes in entries)
        dims = self._dims.setdefault(dims, dims)
        partial_t = tuple(axis.get(a, a) for a in partial)
        partial_t = self._dims.setdefault(partial_t, partial_t)
        # the entries' spans stay with the parsed spec until a diagnostic asks for them
        lazy = _lazy_spans(spec)
        return T.Spec(dims, partial_t, span=_raw(spec), dim_spans=lazy, partial_spans=lazy)

    def _selection(self, path: A.Path, ctx: _Ctx) -> Selection:
        sel = Selection.from_path(path, self._segments)
        head = sel.segments[0]  # the path's first segment (its name, whether it has selectors)
        for var, value in reversed(ctx.loopvars):
            if head.name == var:
                if head.sels:
                    self.diags.append(diag(
                        "PL220", f"loop variable `{var}` cannot take selectors", path.segments[0].span,
                        help=f"`{var}` is one module of the loop; select inside it with `{var}.child`",
                    ))
                replaced = sel.replace_head(var, value)
                if replaced is not None:
                    return replaced
        return sel.prefixed(ctx.prefix) if ctx.prefix is not None else sel

    def _body(self, st, ctx: _Ctx, shards: list, checkpoints: list) -> None:
        if isinstance(st, A.ShardStmt):
            if isinstance(st.target, A.Activation):
                target, kind = self._selection(st.target.path, ctx), st.target.kind
            else:
                target, kind = self._selection(st.target, ctx), "param"
            spec = self._spec(st.spec, ctx, "spec")
            shards.append(T.ShardRule(target, spec, kind, span=_raw(st), origin=ctx.origin))
        elif isinstance(st, A.CheckpointStmt):
            if isinstance(st.paths, A.Hole):
                self.diags.append(diag("PL221", "`checkpoint ?` can only stand at the top level of a plan", st.span))
                return
            every = st.every
            if isinstance(every, A.Name):
                bound = ctx.bound.get(every.text)
                if isinstance(bound, (int, T.Hole)) and not isinstance(bound, bool):
                    every_v: int | T.Hole | None = bound
                else:
                    self.diags.append(diag("PL221", f"`every` needs a whole number or an int parameter, not `{every.text}`",
                                           every.span))
                    every_v = None
            elif isinstance(every, A.Hole):
                every_v = T.Hole("checkpoint every", span=_raw(every))
            else:
                every_v = every.value if every is not None else None
            mods = tuple(self._selection(p, ctx) for p in st.paths)
            checkpoints.append(T.CheckpointGroup(mods, every_v, per=ctx.scope, span=_raw(st), origin=ctx.origin))
        elif isinstance(st, A.ForStmt):
            if ctx.nesting >= MAX_EXPANSION_DEPTH:
                self._too_deep(st.span, ctx, f"`for {st.var.text}`")
                return
            sel = self._selection(st.selection, ctx)
            inner = _Ctx(ctx.ns, ctx.prefix, ctx.loopvars + ((st.var.text, sel),), ctx.params,
                         ctx.origin + (st.span,), ctx.depth, scope=sel, active=ctx.active,
                         nesting=ctx.nesting + 1)
            for b in st.body:
                self._body(b, inner, shards, checkpoints)
        elif isinstance(st, A.ApplyStmt):
            self._apply(st, ctx, shards, checkpoints)

    def _apply(self, st: A.ApplyStmt, ctx: _Ctx, shards: list, checkpoints: list) -> None:
        found = self._lookup(ctx.ns, st.template, "templates", "template")
        if found is None:
            return
        tdecl, tns = found
        # no template may apply itself, directly or through others (there are no conditions: it would
        # never end); caught at its first recursive `apply`, not after 2^32 expansions of a template
        # that applies itself twice. Only that is PL219: a deep chain of different templates ends.
        if any(active == id(tdecl) for active, _ in ctx.active):
            chain = _template_chain([name for _, name in ctx.active] + [str(st.template)])
            self.diags.append(diag("PL219", f"template `{st.template}` expands without end: {chain}", st.span,
                                   help="a template applies itself directly or through other templates"))
            return
        if ctx.nesting >= MAX_EXPANSION_DEPTH:
            self._too_deep(st.span, ctx, f"`{st.template}`")
            return
        args = st.args or ()
        if len(args) != len(tdecl.params):
            sig = ", ".join(f"{p.name.text}: {p.kind.text}" for p in tdecl.params)
            self.diags.append(diag(
                "PL206", f"template `{st.template}` takes {len(tdecl.params)} argument"
                f"{'s' if len(tdecl.params) != 1 else ''}, {len(args)} given", st.template.span,
                labels=[Label(tdecl.name.span, f"declared as `{tdecl.name.text}({sig})`")],
            ))
            return
        params: list[tuple[str, object]] = []
        outer = ctx.bound
        for p, a in zip(tdecl.params, args):
            value = self._argument(p, a, outer)
            if value is None:
                return
            params.append((p.name.text, value))
        if not self._within_budget(st, tdecl, ctx):
            return
        target = self._selection(st.target, ctx)
        scope = target if target.is_pattern else ctx.scope
        inner = _Ctx(tns, target, (), tuple(params), ctx.origin + (st.span,), ctx.depth + 1, scope=scope,
                     active=ctx.active + ((id(tdecl), str(st.template)),), nesting=ctx.nesting + 1)
        for b in tdecl.body:
            self._body(b, inner, shards, checkpoints)

    def _too_deep(self, where: Span, ctx: _Ctx, last: str) -> None:
        """PL226: a finite expansion nested deeper than MAX_EXPANSION_DEPTH, at the level (`last`: the
        template applied or the `for` opened there) that would pass it, naming the templates around it."""
        top = ctx.origin[0] if ctx.origin else where
        chain = " -> ".join(filter(None, (_template_chain([name for _, name in ctx.active]), last)))
        self.diags.append(diag(
            "PL226", f"templates and `for` loops nest more than {MAX_EXPANSION_DEPTH} levels deep: "
            f"{chain} would be level {ctx.nesting + 1}", where,
            labels=[Label(top, "level 1")] if top != where else [],
            help="flatten the chain: apply the inner templates side by side, not each inside the last"))

    def _argument(self, p: A.Param, a: A.Value, outer: dict) -> object:
        kind = p.kind.text
        if isinstance(a, A.Hole):
            return T.Hole(f"template argument {p.name.text}", span=a.span)
        if kind == "axis" and isinstance(a, A.Ref) and len(a.name.parts) == 1:
            name = a.name.parts[0].text
            bound = outer.get(name)
            return bound if isinstance(bound, (str, T.Hole)) else name
        if kind == "int":
            if isinstance(a, A.Int):
                return a.value
            if isinstance(a, A.Ref) and len(a.name.parts) == 1 and isinstance(outer.get(a.name.parts[0].text), int):
                return outer[a.name.parts[0].text]
        if kind not in PARAM_KINDS:
            return None  # already reported at the template
        want = "an axis name" if kind == "axis" else "a whole number"
        self.diags.append(diag(
            "PL207", f"parameter `{p.name.text}` takes {want}, not `{a}`", a.span,
            labels=[Label(p.span, f"declared `{p.name.text}: {kind}`")],
        ))
        return None



def _spec_shape(text: str) -> tuple:
    """(entries, partial, names) of a spec written `text` (as `ast.spec_text` prints it; read by the one
    spec reader, planlang.lang.spec_text): entries as tuples of axis names (() for `_`), or None when one
    is a hole `?`; every name it uses."""
    read = read_spec(text)
    return read.axes(), read.partial, read.names()
