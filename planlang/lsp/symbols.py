"""What is at a position of a plan, and where the names it uses are declared.

Walks the syntax tree (every node has a span) to find the innermost node under the cursor and its
ancestors, classifies it (an axis, a template, a module path, ...), and looks names up the way the
resolver binds them: `alias.name` through `use` statements (stdlib/ first, then the plan's folder),
axes in the plan's mesh (following a preset `mesh c = meshes.x`), template parameters in their template.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Iterator, TypeVar

from planlang.lang import ast as A
from planlang.lang.lexical import inside
from planlang.lang.parser import parse
from planlang.lang.source import SourceFile, Span
from planlang.plan.resolve import STDLIB_DIR

from .analysis import Analysis
from .keywords import KEYWORDS
from planlang.plan.units import UNITS

DECLS = (A.TemplateDecl, A.DeviceDecl, A.LinkDecl, A.MeshDecl, A.MeshAlias)
MAX_ALIAS_HOPS = 16


# ------------------------------------------------------------------------------ walking the tree
def children(node: A.Node) -> Iterator[A.Node]:
    for f in fields(node):
        if f.name in ("span", "text", "comments"):
            continue
        v = getattr(node, f.name)
        if isinstance(v, A.Node):
            yield v
        elif isinstance(v, tuple):
            for x in v:
                if isinstance(x, A.Node):
                    yield x


def walk(node: A.Node, chain: tuple[A.Node, ...] = ()) -> Iterator[tuple[A.Node, tuple[A.Node, ...]]]:
    """Every node with its ancestors (outermost first), in source order."""
    yield node, chain
    for c in children(node):
        yield from walk(c, chain + (node,))


def has_span(node: A.Node) -> bool:
    return node.span.line >= 1


def contains(node: A.Node, offset: int) -> bool:
    return has_span(node) and node.span.start <= offset <= node.span.end


def chain_at(module: A.Module, offset: int) -> tuple[A.Node, ...]:
    """The nodes under `offset`, outermost (the module) first. At the boundary of two nodes (`a|,b`),
    the one that ends there wins: a cursor right after a word is on that word."""
    chain: list[A.Node] = [module]
    node: A.Node = module
    while True:
        nxt = next((c for c in children(node) if contains(c, offset)), None)
        if nxt is None:
            return tuple(chain)
        chain.append(nxt)
        node = nxt


def comment_at(module: A.Module, offset: int) -> A.Comment | None:
    return next((c for c in module.comments if c.span.start <= offset <= c.span.end), None)


WORD = re.compile(r"[A-Za-z0-9_]+")


def word_at(text: str, offset: int) -> tuple[str, int, int] | None:
    """The word (letters, digits, `_`) touching `offset`, with its start and end offsets."""
    for m in WORD.finditer(text, max(0, offset - 200), min(len(text), offset + 200)):
        if m.start() <= offset <= m.end():
            return m.group(0), m.start(), m.end()
    return None


# ------------------------------------------------------------------------------ what is under the cursor
_N = TypeVar("_N", bound=A.Node)


@dataclass(frozen=True)
class Symbol:
    """A classified thing under the cursor.

    kind: axis, axis-decl, param, template, template-decl, device, link, mesh, use, path, loopvar,
    input, dtype, model, factory, schedule, optimizer, unit, hole, keyword, code.
    name: its text as written (for a dotted name: up to the part under the cursor).
    """

    kind: str
    name: str
    span: Span
    chain: tuple[A.Node, ...] = ()

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"

    def enclosing(self, *types: type[_N]) -> _N | None:
        """The innermost node of the chain that is one of `types`."""
        return next((n for n in reversed(self.chain) if isinstance(n, types)), None)


def template_of(chain) -> A.TemplateDecl | None:
    return next((n for n in reversed(chain) if isinstance(n, A.TemplateDecl)), None)


def loop_vars(chain) -> dict[str, A.ForStmt]:
    """The loop variables in scope, innermost last."""
    return {n.var.text: n for n in chain if isinstance(n, A.ForStmt)}


def _axis_or_param(name: A.Name, chain) -> Symbol:
    t = template_of(chain)
    if t is not None and any(p.name.text == name.text for p in t.params):
        return Symbol("param", name.text, name.span, chain)
    return Symbol("axis", name.text, name.span, chain)


def symbol_at(analysis: Analysis, offset: int) -> Symbol | None:
    module = analysis.module
    c = comment_at(module, offset)
    if c is not None:
        w = word_at(analysis.text, offset)
        if w and re.fullmatch(r"PL\d{3}", w[0].upper()):
            return Symbol("code", w[0].upper(), analysis.source.span(w[1], w[2]))
        return None
    chain = chain_at(module, offset)
    node = chain[-1]
    parent = chain[-2] if len(chain) > 1 else None
    grand = chain[-3] if len(chain) > 2 else None
    if isinstance(node, A.Name):
        return _classify_name(node, parent, grand, chain)
    if isinstance(node, (A.Segment, A.Index, A.Slice, A.Star)):
        path = next(n for n in reversed(chain) if isinstance(n, A.Path))
        seg = next((n for n in reversed(chain) if isinstance(n, A.Segment)), None)
        lv = loop_vars(chain)
        if seg is path.segments[0] and seg.name in lv and not seg.selectors:
            return Symbol("loopvar", seg.name, seg.span, chain)
        return Symbol("path", str(path), path.span, chain)
    if isinstance(node, A.Str) and isinstance(parent, A.Use):
        return Symbol("use", node.value, node.span, chain)
    if isinstance(node, A.Str) and isinstance(parent, A.ModelDecl):
        return Symbol("factory", node.value, node.span, chain)
    if isinstance(node, A.Unit):
        return Symbol("unit", node.text, node.span, chain)
    if isinstance(node, A.Hole):
        return Symbol("hole", "?", node.span, chain)
    if isinstance(node, A.StageDecl):
        return Symbol("stage", "stage", node.span, chain)
    w = word_at(analysis.text, offset)
    if w and w[0] in KEYWORDS:
        return Symbol("keyword", w[0], analysis.source.span(w[1], w[2]), chain)
    return None


DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
DECL_KINDS = {A.TemplateDecl: "template", A.DeviceDecl: "device", A.LinkDecl: "link", A.MeshDecl: "mesh",
              A.MeshAlias: "mesh"}


def word_symbol(text: str, offset: int, refs: list[Analysis], source=None) -> Symbol | None:
    """A symbol read from the text alone, for a line no syntax tree covers (a file that has never
    parsed, a line being typed): a code in a comment, a name declared where `refs` (analyses standing
    in for this text) can look it up (`alias.name`, a used module's alias, an axis, an input), a
    schedule, a unit, a keyword. `source` makes the span (default: a SourceFile of `text`)."""

    source = source or SourceFile(refs[0].path if refs else "<plan>", text)
    start = text.rfind("\n", 0, offset) + 1
    end = text.find("\n", offset)
    line = text[start:len(text) if end < 0 else end]
    col = offset - start
    w = word_at(text, offset)
    if inside(text, offset, start) == "comment":
        if w and re.fullmatch(r"PL\d{3}", w[0].upper()):
            return Symbol("code", w[0].upper(), source.span(w[1], w[2]))
        return None
    m = next((m for m in DOTTED.finditer(line) if m.start() <= col <= m.end()), None)
    if m is None or w is None:
        return None
    # the dotted name up to the part under the cursor
    upto = m.group(0)[:w[2] - start - m.start()]
    parts = upto.split(".")
    name_span = source.span(start + m.start(), w[2])
    for ref in refs:
        if len(parts) > 1 or parts[0] in uses(ref.module, ref.path):
            place = lookup(ref, parts)
            if place is not None:
                kind = DECL_KINDS.get(type(place.node), "use")
                return Symbol(kind, upto, name_span)
    word = w[0]
    span = source.span(w[1], w[2])
    before = line[:w[1] - start]
    if re.search(r"\bschedule\s+$", before):
        return Symbol("schedule", word, span)
    if re.match(r"^\s*optimizer\s+$", before):
        return Symbol("optimizer", word, span)
    if re.search(r"\d\s*$", before) and word in UNITS:
        return Symbol("unit", word, span)
    if word in KEYWORDS:
        return Symbol("keyword", word, span)
    for ref in refs:
        plan = ref.plan
        if plan is not None and plan.mesh is not None and word in plan.mesh.names and len(parts) == 1:
            return Symbol("axis", word, span)
        if plan is not None and len(parts) == 1 and plan.input(word) is not None:
            return Symbol("input", word, span)
        if len(parts) == 1:
            place = lookup(ref, parts)
            if place is not None:
                return Symbol(DECL_KINDS.get(type(place.node), "use"), word, span)
    return None


def _classify_name(node: A.Name, parent, grand, chain) -> Symbol | None:
    n, text = node, node.text
    if isinstance(parent, (A.AxisEntry, A.AxisTuple, A.Spec, A.Degree)):
        return _axis_or_param(n, chain)
    if isinstance(parent, A.AxisDecl) and parent.name is n:
        return Symbol("axis-decl", text, n.span, chain)
    if isinstance(parent, A.PipelineDecl) or (isinstance(parent, A.Field) and parent.over is n):
        return _axis_or_param(n, chain)
    if isinstance(parent, A.TemplateDecl):
        return Symbol("template-decl", text, n.span, chain)
    if isinstance(parent, A.Param):
        return Symbol("param" if parent.name is n else "param-kind", text, n.span, chain)
    if isinstance(parent, A.ForStmt):
        return Symbol("loopvar", text, n.span, chain)
    if isinstance(parent, A.CheckpointStmt) and parent.every is n:  # `every n`: an int parameter
        t = template_of(chain)
        return Symbol("param", text, n.span, chain) if t and any(p.name.text == text for p in t.params) else None
    if isinstance(parent, A.InputDecl):
        return Symbol("input" if parent.name is n else "dtype", text, n.span, chain)
    if isinstance(parent, A.DataDecl):
        return Symbol("input", text, n.span, chain)
    if isinstance(parent, A.ModelDecl):
        return Symbol("model", text, n.span, chain)
    if isinstance(parent, A.Schedule):
        return Symbol("schedule", text, n.span, chain)
    if isinstance(parent, A.OptimizerDecl):
        return Symbol("optimizer", text, n.span, chain)
    if isinstance(parent, (A.MeshDecl, A.MeshAlias)) and parent.name is n:
        return Symbol("mesh", text, n.span, chain)
    if isinstance(parent, (A.DeviceDecl, A.LinkDecl)):
        return Symbol("device" if isinstance(parent, A.DeviceDecl) else "link", text, n.span, chain)
    if isinstance(parent, A.Use):  # the alias
        return Symbol("use", text, n.span, chain)
    if isinstance(parent, A.Dotted):
        idx = next(i for i, p in enumerate(parent.parts) if p is n)
        upto = ".".join(p.text for p in parent.parts[:idx + 1])
        span = parent.parts[0].span.cover(n.span)
        last = idx == len(parent.parts) - 1
        if isinstance(grand, A.Use):
            return Symbol("use", str(parent), parent.span, chain)
        if not last:
            return Symbol("use", upto, span, chain)  # an alias of a used module
        kind = {A.ApplyStmt: "template", A.MeshDecl: "device", A.AxisDecl: "link", A.MeshAlias: "mesh"}.get(type(grand))
        if kind is not None:
            return Symbol(kind, upto, span, chain)
        if isinstance(grand, A.Ref) and len(parent.parts) == 1 and isinstance(chain[-4] if len(chain) > 3 else None,
                                                                              A.ApplyStmt):
            return _axis_or_param(n, chain)
    return None


# ------------------------------------------------------------------------------ declarations
@dataclass(frozen=True)
class Place:
    """A declaration: the file it is in and the span to show (a name, or the file's start)."""

    path: str
    span: Span
    node: A.Node | None = None

    def __str__(self) -> str:
        return f"{self.path}:{self.span.line}:{self.span.col}"


def file_start(path: str) -> Place:
    return Place(path, Span(path, 1, 1, 1, 1, 0, 0))


def used_file(use: A.Use, from_path: str, stdlib: Path = STDLIB_DIR) -> str | None:
    """The file a `use` brings in: the resolver's search order (a string is relative to the plan's
    folder; a dotted name is looked up in stdlib/, then in the plan's folder)."""
    base = Path(from_path).parent
    if isinstance(use.target, A.Str):
        cand = base / use.target.value
        return str(cand) if cand.is_file() else None
    rel = Path(*[p.text for p in use.target.parts]).with_suffix(".plan")
    for root in (stdlib, base):
        cand = root / rel
        if cand.is_file():
            return str(cand)
    return None


def use_alias(use: A.Use) -> str:
    if use.alias is not None:
        return use.alias.text
    if isinstance(use.target, A.Str):
        stem = Path(use.target.value).stem
        return "".join(c if c.isalnum() or c == "_" else "_" for c in stem) or "module"
    return use.target.parts[-1].text


def module_at(analysis: Analysis, path: str) -> A.Module | None:
    """The parsed module of a used file: the one the check already parsed, else parse it now."""
    mod = analysis.module_of(path)
    if mod is not None:
        return mod
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return parse(text, path).module


def uses(module: A.Module, from_path: str) -> dict[str, tuple[A.Use, str | None]]:
    """alias -> (the use statement, the file it brings in or None)."""
    return {use_alias(s): (s, used_file(s, from_path)) for s in module.statements if isinstance(s, A.Use)}


def lookup(analysis: Analysis, parts: list[str], module: A.Module | None = None, from_path: str | None = None,
           hops: int = 0) -> Place | None:
    """Where `a.b.name` is declared: leading parts walk `use` aliases, the last names a declaration
    (template, device, link or mesh). A single leading part that is an alias gives the used file."""
    module = analysis.module if module is None else module
    from_path = analysis.path if from_path is None else from_path
    if not parts or hops > MAX_ALIAS_HOPS:
        return None
    if len(parts) == 1:
        for st in module.statements:
            if isinstance(st, DECLS) and st.name.text == parts[0]:
                return Place(from_path, st.name.span, st)
    found = uses(module, from_path).get(parts[0])
    if found is None or found[1] is None:
        return None
    if len(parts) == 1:
        return file_start(found[1])
    sub = module_at(analysis, found[1])
    return None if sub is None else lookup(analysis, parts[1:], sub, found[1], hops + 1)


def mesh_decl(analysis: Analysis) -> Place | None:
    """The plan's mesh declaration, following preset aliases (`mesh c = meshes.dgx_a100`)."""
    st = next((s for s in analysis.module.statements if isinstance(s, (A.MeshDecl, A.MeshAlias))), None)
    place = None if st is None else Place(analysis.path, st.name.span, st)
    for _ in range(MAX_ALIAS_HOPS):
        if place is None or not isinstance(place.node, A.MeshAlias):
            return place
        target = place.node.target
        mod = analysis.module if place.path == analysis.path else module_at(analysis, place.path)
        place = lookup(analysis, [p.text for p in target.parts], mod, place.path)
    return None


def axis_decl(analysis: Analysis, name: str) -> Place | None:
    mesh = mesh_decl(analysis)
    if mesh is None or not isinstance(mesh.node, A.MeshDecl):
        return None
    for ax in mesh.node.axes:
        if ax.name.text == name:
            return Place(mesh.path, ax.name.span, ax)
    return None


def definition(analysis: Analysis, sym: Symbol) -> Place | None:
    """Where the symbol under the cursor is declared."""
    if sym.kind in ("axis", "axis-decl"):
        return axis_decl(analysis, sym.name)
    if sym.kind == "param":
        t = template_of(sym.chain)
        p = next((p for p in t.params if p.name.text == sym.name), None) if t else None
        return None if p is None else Place(analysis.path, p.name.span, p)
    if sym.kind in ("template", "device", "link", "mesh", "use"):
        if sym.kind == "use":
            use = sym.enclosing(A.Use)
            if use is not None:
                f = used_file(use, analysis.path)
                return None if f is None else file_start(f)
        return lookup(analysis, sym.name.split("."))
    if sym.kind == "loopvar":
        loop = loop_vars(sym.chain).get(sym.name)
        return None if loop is None else Place(analysis.path, loop.var.span, loop)
    if sym.kind == "input":
        for st in analysis.module.statements:
            if isinstance(st, A.InputDecl) and st.name.text == sym.name:
                return Place(analysis.path, st.name.span, st)
    if sym.kind == "factory":
        return factory_source(sym.name, analysis.path)
    return None


def factory_source(factory: str, plan_path: str) -> Place | None:
    """The Python file (and `def` line) of a model factory "pkg.mod:callable", found without importing
    anything: the roots the model loader searches (the plan's folder and those above it, then the
    current directory)."""
    module, _, attr = factory.partition(":")
    if not module:
        return None
    rel = Path(*module.split("."))
    here = Path(plan_path).resolve().parent
    for root in [here, *here.parents, Path.cwd()]:
        for cand in (root / rel.with_suffix(".py"), root / rel / "__init__.py"):
            if cand.is_file():
                try:
                    text = cand.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError):
                    return file_start(str(cand))
                m = re.search(rf"^(?:def|class)\s+({re.escape(attr)})\b", text, re.M) if attr else None
                if m is None:
                    return file_start(str(cand))
                line = text.count("\n", 0, m.start(1)) + 1
                col = m.start(1) - (text.rfind("\n", 0, m.start(1)) + 1) + 1
                return Place(str(cand), Span(str(cand), line, col, line, col + len(attr), m.start(1), m.end(1)))
    return None
