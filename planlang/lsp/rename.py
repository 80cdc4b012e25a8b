"""References and rename: axes, templates, template parameters and loop variables.

Every use is found in the syntax tree, bound the way the resolver binds names (symbols.py): a name in
a spec, a `with` degree, `over`, `pipeline over` or an `apply` argument is a template parameter when
the enclosing template declares it, else a mesh axis; a path's first segment is a loop variable when
an enclosing `for` binds it (the innermost one). Comments and strings are never edited.

Rename edits the open document only, so it refuses a name declared in another file (a stdlib preset's
axis, a template of a used module): the declaration and the other users would not follow.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from planlang.lang import ast as A
from planlang.lang.source import Span

from .analysis import Analysis
from .keywords import KEYWORDS
from .symbols import (Place, Symbol, _classify_name, axis_decl, loop_vars, lookup, mesh_decl, symbol_at,
                      template_of, walk)

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RENAMEABLE = ("axis", "axis-decl", "param", "loopvar", "template", "template-decl")
WHAT = {"axis": "axis", "axis-decl": "axis", "param": "template parameter", "loopvar": "loop variable",
        "template": "template", "template-decl": "template"}


class RenameRefused(Exception):
    """Why a rename (or a prepareRename) cannot be done: shown to the user as the error message."""


@dataclass(frozen=True)
class Target:
    """What a name under the cursor stands for: its kind, its name and the node that binds it (the
    mesh's axis, the template, the `for` statement), with the declaration's place."""

    kind: str  # axis, param, loopvar, template
    name: str
    decl: Place | None
    binder: A.Node | None = None  # param: its template; loopvar: its `for`

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"


@dataclass(frozen=True)
class Occurrences:
    target: Target
    spans: tuple[Span, ...]  # every use in the document, in order, the declaration included when here

    def __str__(self) -> str:
        return f"{self.target}: {len(self.spans)} occurrences"


def target_of(analysis: Analysis, sym: Symbol) -> Target | None:
    """The thing a classified symbol names, or None when it is not one references and rename know."""
    if sym.kind in ("axis", "axis-decl"):
        return Target("axis", sym.name, axis_decl(analysis, sym.name))
    if sym.kind == "param":
        t = template_of(sym.chain)
        p = next((p for p in t.params if p.name.text == sym.name), None) if t is not None else None
        return None if p is None else Target("param", sym.name, Place(analysis.path, p.name.span, p), t)
    if sym.kind == "loopvar":
        loop = loop_vars(sym.chain).get(sym.name)
        return None if loop is None else Target("loopvar", sym.name, Place(analysis.path, loop.var.span, loop), loop)
    if sym.kind in ("template", "template-decl"):
        place = lookup(analysis, sym.name.split("."))
        if place is None or not isinstance(place.node, A.TemplateDecl):
            return None
        return Target("template", place.node.name.text, place)
    return None


def _name_uses(analysis: Analysis):
    """Every (span, symbol) of a name the tree binds: classified names and loop variables at the start
    of paths."""
    for node, chain in walk(analysis.module):
        full = chain + (node,)
        parent = chain[-1] if chain else None
        if isinstance(node, A.Name):
            grand = chain[-2] if len(chain) > 1 else None
            sym = _classify_name(node, parent, grand, full)
            if sym is not None:
                yield node.span, sym
        elif isinstance(node, A.Path):
            segs = node.segments
            if segs and segs[0].name and not segs[0].selectors and segs[0].name in loop_vars(full):
                s = segs[0].span
                span = analysis.source.span(s.start, s.start + len(segs[0].name))
                yield span, Symbol("loopvar", segs[0].name, span, full + (segs[0],))


def occurrences(analysis: Analysis, target: Target) -> Occurrences:
    """Every place of this document where `target` is named (declaration included when it is here)."""
    spans: list[Span] = []
    for span, sym in _name_uses(analysis):
        if target.kind == "axis" and sym.kind in ("axis", "axis-decl") and sym.name == target.name:
            if sym.kind == "axis-decl" and not _is_the_mesh(analysis, target, span):
                continue
            spans.append(span)
        elif target.kind == "param" and sym.kind == "param" and sym.name == target.name:
            if template_of(sym.chain) is target.binder:
                spans.append(span)
        elif target.kind == "loopvar" and sym.kind == "loopvar" and sym.name == target.name:
            if loop_vars(sym.chain).get(sym.name) is target.binder:
                spans.append(span)
        elif target.kind == "template" and sym.kind in ("template", "template-decl"):
            place = target.decl
            if sym.kind == "template-decl" and place is not None and place.path == analysis.path \
                    and span.start == place.span.start:
                spans.append(span)
            elif sym.kind == "template" and place is not None:
                found = lookup(analysis, sym.name.split("."))
                if found is not None and found.path == place.path and found.span.start == place.span.start:
                    last = sym.name.split(".")[-1]
                    spans.append(analysis.source.span(span.end - len(last), span.end))
    spans.sort(key=lambda s: s.start)
    return Occurrences(target, tuple(spans))


def _is_the_mesh(analysis: Analysis, target: Target, span: Span) -> bool:
    decl = target.decl
    return decl is not None and decl.path == analysis.path and decl.span.start == span.start


def find(analysis: Analysis, offset: int) -> tuple[Symbol, Target] | None:
    sym = symbol_at(analysis, offset)
    if sym is None:
        return None
    target = target_of(analysis, sym)
    return None if target is None else (sym, target)


# ------------------------------------------------------------------------------ rename
def prepare(analysis: Analysis, offset: int) -> tuple[Span, str]:
    """The span of the name to rename at `offset` and its text; RenameRefused with the reason."""
    if not analysis.parses:
        raise RenameRefused("the plan has syntax errors: fix them first (a rename must see every use)")
    sym = symbol_at(analysis, offset)
    if sym is None:
        raise RenameRefused("nothing to rename here: axes, templates, template parameters and loop "
                            "variables can be renamed")
    if sym.kind not in RENAMEABLE:
        what = "a keyword" if sym.kind == "keyword" else f"a {sym.kind.replace('-', ' ')}"
        raise RenameRefused(f"`{sym.name}` is {what}: only axes, templates, template parameters and loop "
                            "variables can be renamed")
    target = target_of(analysis, sym)
    if target is None or target.decl is None:
        raise RenameRefused(f"the {WHAT[sym.kind]} `{sym.name}` is not declared anywhere this plan can see")
    if Path(target.decl.path).resolve() != Path(analysis.path).resolve():
        raise RenameRefused(f"the {WHAT[sym.kind]} `{target.name}` is declared in {target.decl.path}, not in "
                            "this document: rename it there (its other users would not follow)")
    occ = occurrences(analysis, target)
    here = next((s for s in occ.spans if s.start <= offset <= s.end), None)
    if here is None:
        raise RenameRefused(f"`{sym.name}` cannot be renamed from here")
    return here, analysis.text[here.start:here.end]


def rename(analysis: Analysis, offset: int, new_name: str) -> list[Span]:
    """The spans to replace with `new_name`; RenameRefused when the rename cannot be done safely."""
    prepare(analysis, offset)
    _, target = find(analysis, offset) or (None, None)
    assert target is not None  # prepare found it
    if new_name == target.name:
        return []
    check_new_name(analysis, target, new_name)
    return list(occurrences(analysis, target).spans)


def check_new_name(analysis: Analysis, target: Target, new: str) -> None:
    what = WHAT[target.kind]
    if not IDENTIFIER.fullmatch(new):
        raise RenameRefused(f"`{new}` is not a name (letters, digits and `_`, not starting with a digit)")
    if new == "_" or new in KEYWORDS:
        raise RenameRefused(f"`{new}` is a keyword of the language" if new != "_" else
                            "`_` means replicated in a spec: it cannot name an axis")
    clash = _clash(analysis, target, new)
    if clash is not None:
        raise RenameRefused(f"cannot rename the {what} `{target.name}` to `{new}`: {clash}")


def _clash(analysis: Analysis, target: Target, new: str) -> str | None:
    """Why `new` would change what another name means (None when it would not)."""
    module = analysis.module
    mesh = mesh_decl(analysis)
    axes = {a.name.text for a in mesh.node.axes} if mesh is not None and isinstance(mesh.node, A.MeshDecl) else set()
    if target.kind == "axis":
        if new in axes:
            return f"the mesh already has an axis `{new}`"
        for node, _ in walk(module):
            if isinstance(node, A.TemplateDecl) and any(p.name.text == new for p in node.params):
                return f"template `{node.name.text}` has a parameter `{new}`, which would hide the axis in its body"
    elif target.kind == "param":
        t = target.binder
        assert isinstance(t, A.TemplateDecl)
        if any(p.name.text == new for p in t.params):
            return f"template `{t.name.text}` already has a parameter `{new}`"
        if new in axes:
            return f"the mesh has an axis `{new}`, which the parameter would hide in the template's body"
    elif target.kind == "template":
        if lookup(analysis, [new]) is not None:
            return f"`{new}` is already declared in this plan"
    elif target.kind == "loopvar":
        loop = target.binder
        assert isinstance(loop, A.ForStmt)
        for node, chain in walk(module):
            if node is loop:
                if new in loop_vars(chain):
                    return f"an enclosing `for` already binds `{new}`"
                break
        for st in loop.body:
            for node, _ in walk(st):
                if isinstance(node, A.ForStmt) and node.var.text == new:
                    return f"a `for` inside already binds `{new}`"
                if isinstance(node, A.Path) and node.segments and node.segments[0].name == new:
                    return f"`{new}` is a module path in the loop's body, which the variable would hide"
    return None


def read_text(analysis: Analysis, path: str) -> str:
    """The text of a file the analysis read (else the disk's)."""
    if Path(path).resolve() == Path(analysis.path).resolve():
        return analysis.text
    src = analysis.result.sources.get(path)
    if src is not None:
        return src.text
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""
