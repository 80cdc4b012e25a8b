"""The holes of a resolved plan, sorted by what fills them (`classify`), and the `?` arguments of its
`apply` statements traced to the spec entries they leave open (`TemplateArguments`).

Read once per solve, from the input's resolution (its plan value, its parsed files and their sources):
nothing here parses or formats plan text.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from planlang.lang import ast as A
from planlang.plan import types as T


@dataclass
class Holes:
    axes: list[tuple[str, T.Hole]] = field(default_factory=list)
    zero: T.Hole | None = None
    zero_axis: T.Hole | None = None
    micro: T.Hole | None = None
    stages: T.Hole | None = None
    # whole-spec holes (`shard P : ?`) and specs with `?` entries (`[_, ?]`), one per statement written
    specs: list[tuple[T.ShardRule, T.Hole | T.Spec]] = field(default_factory=list)
    checkpoint: T.Hole | None = None
    # `data X : ?` and `data X : [?, _]`: the statement and its holes, (dim, hole), dim -1 for the whole spec
    data: list[tuple[T.DataSpec, list[tuple[int, T.Hole]]]] = field(default_factory=list)
    pp_axis: T.Hole | None = None
    schedule: T.Hole | None = None
    chunks: T.Hole | None = None
    degrees: list[tuple[int, str, T.Hole]] = field(default_factory=list)  # (stage, axis, hole)
    every: list[T.Hole] = field(default_factory=list)  # `every ?`, a template's int argument `?` among them
    arguments: list[T.Hole] = field(default_factory=list)  # `apply t(?)` in the plan file, not an `every`
    unsupported: list[T.Hole] = field(default_factory=list)


def hole_key(hole: T.Hole) -> tuple[str, int]:
    """Where a hole is written: one `?` may stand for several hole values (a loop or template expands
    it once per module), each with this key."""
    return (hole.span.file, hole.span.start)


def _apply_holes(module) -> list[A.Hole]:
    """The `?` arguments of every `apply` in a parsed plan file (at the top level, in `for` bodies and
    in template bodies)."""
    out: list[A.Hole] = []

    def walk(stmts) -> None:
        for st in stmts:
            if isinstance(st, A.ApplyStmt):
                out.extend(a for a in (st.args or ()) if isinstance(a, A.Hole))
            elif isinstance(st, (A.ForStmt, A.TemplateDecl)):
                walk(st.body)

    walk(module.statements if module is not None else ())
    return out


def classify(plan: T.Plan, sources: dict | None = None, module=None) -> Holes:
    """The plan's holes by what fills them. `sources` (path -> source file) tells a `?` written in a spec
    from an entry a template parameter given `?` left open; `module` (the plan file's parse) gives the
    `apply` arguments written `?`."""
    h = Holes()
    known: set[int] = set()

    def literal(hole: T.Hole) -> bool:  # the hole is a `?` as written (not a parameter bound to `?`)
        src = (sources or {}).get(hole.span.file)
        return src is None or src.text[hole.span.start:hole.span.end].strip() == "?"

    if plan.mesh:
        for a in plan.mesh.axes:
            if isinstance(a.size, T.Hole):
                h.axes.append((a.name, a.size))
                known.add(id(a.size))
    if plan.optimizer:
        if isinstance(plan.optimizer.zero_stage, T.Hole):
            h.zero = plan.optimizer.zero_stage
            known.add(id(h.zero))
        if isinstance(plan.optimizer.zero_axis, T.Hole):
            h.zero_axis = plan.optimizer.zero_axis
            known.add(id(h.zero_axis))
    for d in plan.data:
        if isinstance(d.spec, T.Hole):
            h.data.append((d, [(-1, d.spec)]))
            known.add(id(d.spec))
        elif d.spec.has_holes:
            h.data.append((d, [(i, x) for i, x in enumerate(d.spec.dims) if isinstance(x, T.Hole)]))
            known.update(id(x) for x in d.spec.dims if isinstance(x, T.Hole))
    p = plan.pipeline
    if p is not None:
        for name, x in (("pp_axis", p.axis), ("schedule", p.schedule), ("micro", p.microbatches), ("stages", p.stages)):
            if T.is_hole(x):
                setattr(h, name, x)
                known.add(id(x))
        if isinstance(p.schedule, T.Schedule) and isinstance(p.schedule.chunks, T.Hole):
            h.chunks = p.schedule.chunks
            known.add(id(h.chunks))
        if not isinstance(p.stages, T.Hole):
            for st in p.stages:
                for ax, v in st.degrees:
                    if isinstance(v, T.Hole):
                        h.degrees.append((st.index, ax, v))
                        known.add(id(v))
    acc = plan.accumulation  # `microbatches ?` without a pipeline: the same choice as a pipeline's
    if acc is not None and isinstance(acc.microbatches, T.Hole):
        h.micro = acc.microbatches
        known.add(id(acc.microbatches))
    every_seen: set[tuple[str, int]] = set()
    for g in plan.checkpoints:
        if isinstance(g.every, T.Hole):
            if hole_key(g.every) not in every_seen:
                every_seen.add(hole_key(g.every))
                h.every.append(g.every)
            known.add(id(g.every))
    h.arguments = [T.Hole("template argument", span=a.span) for a in _apply_holes(module)
                   if (a.span.file, a.span.start) not in every_seen]
    seen_spans = set()
    for r in plan.shards:
        spec = r.spec
        if isinstance(spec, T.Hole):
            entries = [spec]
        elif spec.has_holes:
            entries = [x for x in spec.dims if isinstance(x, T.Hole)]
        else:
            continue
        mine = [x for x in entries if literal(x)]
        if mine and (spec.span.start, spec.span.file) not in seen_spans:
            seen_spans.add((spec.span.start, spec.span.file))
            h.specs.append((r, spec))
        known.update(id(x) for x in mine)
        if h.arguments:  # entries a template parameter given `?` left open: the argument fills them
            known.update(id(x) for x in entries if not literal(x))
    if plan.checkpoint_hole is not None:
        h.checkpoint = plan.checkpoint_hole
        known.add(id(h.checkpoint))
    h.unsupported = [x for x in plan.holes() if id(x) not in known]
    return h


# ------------------------------------------------------------------------------ template arguments
def _entry_axes(entry) -> tuple[str, ...]:
    """The axis names of a parsed spec entry (`tp`, `(dp, t)`; none for `_` and `?`)."""
    if isinstance(entry, A.AxisEntry):
        return (entry.axis.text,)
    if isinstance(entry, A.AxisTuple):
        return tuple(a.text for a in entry.axes)
    return ()


@dataclass(frozen=True)
class ArgumentEntry:
    """A spec entry a template parameter bound to `?` left open: which `apply` argument fills it, and
    the entry's axes as written in the template (the parameter among them)."""

    argument: int
    written: tuple[str, ...]
    param: str

    def axes(self, axis: str) -> tuple[str, ...]:
        """The entry once the argument is `axis`."""
        return tuple(axis if a == self.param else a for a in self.written)


class TemplateArguments:
    """The `apply t(?)` arguments of the plan file, followed through the templates (and the templates
    they apply) to the spec entries each leaves open, by walking each shard rule's chain of `apply` sites
    (its `origin`) over the parsed files — the resolver's binding of parameters, replayed for `?`."""

    def __init__(self, plan: T.Plan, arguments: list[T.Hole], modules: dict, sources: dict | None = None) -> None:
        # `sources` is not read: the entries are found in the parsed files (`modules`)
        self.applies: dict[tuple[str, int], A.ApplyStmt] = {}
        self.templates: dict[str, list[A.TemplateDecl]] = {}
        self.specs: dict[tuple[str, int], A.Spec] = {}  # where a template's spec is written -> its parse
        self.owner: dict[tuple[str, int], A.ApplyStmt] = {}  # a `?` argument's key -> its `apply`
        for mod in modules.values():
            self._index(mod.statements if mod is not None else (), False)
        self.index = {hole_key(a): i for i, a in enumerate(arguments)}
        self.entries: dict[int, ArgumentEntry] = {}  # id() of an entry hole of the input plan -> its argument
        for r in plan.shards:
            if isinstance(r.spec, T.Spec) and r.spec.has_holes and r.origin:
                self._follow(r)

    def _index(self, stmts, in_template: bool) -> None:
        for st in stmts:
            if isinstance(st, A.ApplyStmt):
                self.applies[(st.span.file, st.span.start)] = st
                for a in st.args or ():
                    if isinstance(a, A.Hole):
                        self.owner[(a.span.file, a.span.start)] = st
            elif isinstance(st, A.TemplateDecl):
                self.templates.setdefault(st.name.text, []).append(st)
                self._index(st.body, True)
            elif isinstance(st, A.ForStmt):
                self._index(st.body, in_template)
            elif in_template and isinstance(st, A.ShardStmt) and isinstance(st.spec, A.Spec):
                self.specs[(st.spec.span.file, st.spec.span.start)] = st.spec

    def template(self, st: A.ApplyStmt) -> A.TemplateDecl | None:
        """The template an `apply` names (by its last name: `megatron.attention` -> `attention`), when
        that name is one template's."""
        found = self.templates.get(st.template.parts[-1].text, [])
        return found[0] if len(found) == 1 else None

    def takes_int(self, argument: T.Hole) -> bool:
        """Does the template parameter given this `?` take an int (else an axis)?"""
        st = self.owner.get(hole_key(argument))
        decl = self.template(st) if st is not None else None
        if st is None or decl is None:
            return False
        for p, a in zip(decl.params, st.args or ()):
            if isinstance(a, A.Hole) and (a.span.file, a.span.start) == hole_key(argument):
                return p.kind.text == "int"
        return False

    def _follow(self, rule: T.ShardRule) -> None:
        env: dict[str, int] = {}  # parameter -> the argument it is bound to, in the innermost template so far
        for site in rule.origin:
            st = self.applies.get((site.file, site.start))
            if st is None:
                continue  # a `for` site
            decl = self.template(st)
            if decl is None:
                return
            bound: dict[str, int] = {}
            for p, a in zip(decl.params, st.args or ()):
                if isinstance(a, A.Hole) and (a.span.file, a.span.start) in self.index:
                    bound[p.name.text] = self.index[(a.span.file, a.span.start)]
                elif isinstance(a, A.Ref) and len(a.name.parts) == 1 and a.name.parts[0].text in env:
                    bound[p.name.text] = env[a.name.parts[0].text]
            env = bound
        spec = rule.spec
        if not isinstance(spec, T.Spec):
            return
        parsed = self.specs.get((spec.span.file, spec.span.start))
        if parsed is None:
            return
        # each entry of the template's spec as parsed, by where it is written (the hole's span)
        written_at = {(e.span.file, e.span.start): _entry_axes(e) for e in parsed.entries}
        for x in spec.dims:
            if not isinstance(x, T.Hole) or hole_key(x) not in written_at:
                continue
            written = written_at[hole_key(x)]
            params = [a for a in written if a in env]
            if len(params) == 1:
                self.entries[id(x)] = ArgumentEntry(env[params[0]], written, params[0])
