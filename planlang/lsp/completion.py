"""textDocument/completion from the text before the cursor (which rarely parses while typing).

The context is read from the current line and the blocks open above it: a statement keyword at the
start of a line, stdlib modules after `use`, templates after `apply`, axes inside a spec, `partial(`,
`over` (outside a mesh) and template arguments, links after `over` in a mesh, module paths after
`shard` / `stage` / `checkpoint` / `for x in` / `to` (the model's names when it has been probed, else the
paths already written in the file), codes inside `# plan: ignore[`. Names come from the current analysis
when the text parses, else from the last version that did.
"""
from __future__ import annotations

import re
from pathlib import Path

from lsprotocol import types as L

from planlang.lang import ast as A
from planlang.lang.codes import CODES
from planlang.plan.resolve import DTYPES, Resolver
from planlang.plan.types import OPTIMIZERS

from .analysis import Analysis
from .keywords import KEYWORDS, SCHEDULES, STATEMENT_KEYWORDS
from .model_checks import ModelInsight
from .positions import UTF16, LineIndex
from .symbols import contains, mesh_decl, module_at, uses, walk

K = L.CompletionItemKind
PATH_CHARS = r"[\w.\[\]:*]*"
MAX_ITEMS = 2000


# ------------------------------------------------------------------------------ context from text
def open_blocks(text: str, offset: int) -> list[str]:
    """The header lines of the blocks open at `offset`, outermost first (comments and strings skipped)."""
    stack: list[int] = []
    in_str = in_comment = False
    for i in range(offset):
        ch = text[i]
        if in_comment:
            in_comment = ch != "\n"
        elif in_str:
            if ch == '"' and text[i - 1] != "\\":
                in_str = False
            elif ch == "\n":
                in_str = False
        elif ch == "#":
            in_comment = True
        elif ch == '"':
            in_str = True
        elif ch == "{":
            stack.append(i)
        elif ch == "}" and stack:
            stack.pop()
    out = []
    for pos in stack:
        start = text.rfind("\n", 0, pos) + 1
        out.append(text[start:pos].strip())
    return out


def _in_comment_or_string(prefix: str) -> str | None:
    in_str = False
    for i, ch in enumerate(prefix):
        if in_str:
            if ch == '"' and prefix[i - 1] != "\\":
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch == "#":
            return "comment"
    return "string" if in_str else None


# ------------------------------------------------------------------------------ candidates
def axis_names(ref: Analysis) -> list[str]:
    if ref.plan is not None and ref.plan.mesh is not None:
        return list(ref.plan.mesh.names)
    place = mesh_decl(ref)
    if place is not None and isinstance(place.node, A.MeshDecl):
        return [a.name.text for a in place.node.axes]
    # no version has parsed yet: the axes of the first mesh block, read from the text
    m = re.search(r"^\s*mesh\s+\w+\s+of\b[^{\n]*\{([^}]*)\}", ref.text, re.M)
    return re.findall(r"^\s*(\w+)\s*=", m.group(1).replace(";", "\n"), re.M) if m else []


def template_params(headers: list[str]) -> list[str]:
    out = []
    for h in headers:
        m = re.match(r"template\s+\w+\s*\((.*)\)", h)
        if m:
            out += [p.split(":")[0].strip() for p in m.group(1).split(",") if ":" in p and "axis" in p.split(":")[1]]
    return out


def declarations(ref: Analysis, kind: type) -> list[tuple[str, str]]:
    """(name as the plan writes it, detail) for declarations of one kind: local, then `alias.name`."""
    out = [(st.name.text, _decl_detail(st)) for st in ref.module.statements if isinstance(st, kind)]
    for alias, (_, path) in uses(ref.module, ref.path).items():
        mod = module_at(ref, path) if path else None
        for st in mod.statements if mod else ():
            if isinstance(st, kind):
                out.append((f"{alias}.{st.name.text}", _decl_detail(st)))
    return out


def _decl_detail(st) -> str:
    if isinstance(st, A.TemplateDecl):
        return f"template {st.name.text}(" + ", ".join(f"{p.name.text}: {p.kind.text}" for p in st.params) + ")"
    return type(st).__name__.replace("Decl", "").replace("Alias", "").lower()


def stdlib_modules(plan_path: str) -> list[str]:
    """What `use` can name: stdlib modules, then the .plan files next to the plan."""
    out = Resolver().stdlib_modules()
    here = Path(plan_path).parent
    if here.is_dir():  # the plan's folder, three levels deep at most (`use a.b.c`)
        found = [p for pattern in ("*.plan", "*/*.plan", "*/*/*.plan") for p in here.glob(pattern)]
        for p in sorted(found):
            if p.resolve() != Path(plan_path).resolve():
                out.append(".".join(p.relative_to(here).with_suffix("").parts))
    return list(dict.fromkeys(out))


def module_paths(ref: Analysis, insight: ModelInsight | None, loopvars: list[str],
                 typing_at: int | None = None) -> list[tuple[str, str]]:
    """(path, detail): the model's modules and parameters (with `[*]` forms of indexed containers) when
    it has been probed, else every path written in the plan and its prefixes (except the one being typed,
    at `typing_at`); loop variables first."""
    out: dict[str, str] = {v: "loop variable" for v in loopvars}
    facts = insight.facts if insight else None
    if facts is not None:
        from planlang.model.checks import to_plan_name  # the model layer is loaded when facts exist

        for name in facts.all_modules:
            call = facts.calls.get(name)
            out.setdefault(to_plan_name(name), call.type if call else "module")
        for name, (shape, dtype) in facts.params.items():
            out.setdefault(to_plan_name(name), f"{dtype} {list(shape)}")
        for name in list(out):
            star = re.sub(r"\[\d+\]", "[*]", name)
            if star != name:
                out.setdefault(star, "every index")
    else:
        for node, _ in walk(ref.module):
            if isinstance(node, A.Path) and not (typing_at is not None and contains(node, typing_at)):
                parts = str(node).split(".")
                for k in range(1, len(parts) + 1):
                    out.setdefault(".".join(parts[:k]), "in this plan")
    return list(out.items())[:MAX_ITEMS]


# ------------------------------------------------------------------------------ the feature
def completion(analysis: Analysis, offset: int, good: Analysis | None = None, insight: ModelInsight | None = None,
               encoding: str = UTF16) -> L.CompletionList:
    ref = analysis if analysis.parses or good is None else good
    text = analysis.text
    line_start = text.rfind("\n", 0, offset) + 1
    prefix = text[line_start:offset]
    index = LineIndex(text, encoding)
    headers = open_blocks(text, offset)
    block = headers[-1].split()[0] if headers and headers[-1].split() else ""
    loopvars = [m.group(1) for h in headers if (m := re.match(r"for\s+(\w+)\s+in\b", h))]
    items: list[L.CompletionItem] = []

    def add(names, kind, pattern=r"\w*", detail=None):
        m = re.search(pattern + r"$", prefix)
        start = offset - (len(m.group(0)) if m else 0)
        rng = index.offset_range(start, offset)
        for entry in names:
            label, det = (entry, detail) if isinstance(entry, str) else entry
            items.append(L.CompletionItem(label, kind=kind, detail=det, text_edit=L.TextEdit(rng, label),
                                          filter_text=label))

    where = _in_comment_or_string(prefix)
    if where == "comment":
        if re.search(r"#\s*plan:\s*ignore(-file)?\[[\w,\s]*$", prefix):
            add([(c, CODES[c].title) for c in sorted(CODES)], K.Constant)
        return L.CompletionList(False, items)
    if where == "string":
        return L.CompletionList(False, items)

    axes = axis_names(ref) + template_params(headers)  # inside a template: its axis parameters too
    if re.match(r"^\s*use\s+[\w.]*$", prefix):
        add(stdlib_modules(analysis.path), K.Module, r"[\w.]*", "plan module")
    elif re.search(r"\bapply\s+[\w.]*$", prefix):
        add(declarations(ref, A.TemplateDecl), K.Function, r"[\w.]*")
    elif re.search(r"\bschedule\s+\w*$", prefix):
        add(SCHEDULES, K.EnumMember, detail="pipeline schedule")
    elif re.match(r"^\s*optimizer\s+\w*$", prefix):
        add(OPTIMIZERS, K.EnumMember, detail="optimizer")
    elif re.match(r"^\s*input\s+\w+\s*:\s*\w*$", prefix):
        add(sorted(DTYPES), K.TypeParameter, detail="dtype")
    elif re.match(r"^\s*mesh\s+\w+\s+of\s+(\d+\s+x\s+)?[\w.]*$", prefix):
        add(declarations(ref, A.DeviceDecl), K.Class, r"[\w.]*")
    elif re.match(r"^\s*mesh\s+\w+\s*=\s*[\w.]*$", prefix):
        add(declarations(ref, (A.MeshDecl, A.MeshAlias)), K.Class, r"[\w.]*")
    elif re.search(r"\bover\s+[\w.]*$", prefix):
        if block == "mesh":
            add(declarations(ref, A.LinkDecl), K.Class, r"[\w.]*")
        else:
            add(axes, K.Variable, detail="mesh axis")
    elif (re.match(r"^\s*(shard|data)\b[^:]*:\s*\[[^\]]*$", prefix) or re.search(r"\bpartial\s*\([^)]*$", prefix)
          or re.search(r"\bapply\s+[\w.]+\s*\([^)]*$", prefix)):
        in_spec = not re.search(r"\b(partial|apply\s+[\w.]+)\s*\([^)]*$", prefix)
        add(axes + (["_", "?"] if in_spec else []), K.Variable, r"\w*", "mesh axis")
    elif re.search(r"^\s*stage\b.*\bwith\b[^=]*$", prefix) or re.search(r"\bwith\b.*,\s*\w*$", prefix):
        add(axes, K.Variable, detail="mesh axis")
    elif (re.match(rf"^\s*shard\s+(?:(?:output|input)\s+of\s+)?{PATH_CHARS}$", prefix)
          or re.match(rf"^\s*(stage|checkpoint)\s+(?:{PATH_CHARS}\s*,\s*)*{PATH_CHARS}$", prefix)
          or re.match(rf"^\s*for\s+\w+\s+in\s+{PATH_CHARS}$", prefix)
          or re.search(rf"\bapply\b.*\bto\s+{PATH_CHARS}$", prefix)):
        add(module_paths(ref, insight, loopvars, offset if ref is analysis else None), K.Field, PATH_CHARS)
        if re.match(r"^\s*shard\s+\w*$", prefix):
            add(["output of", "input of"], K.Keyword, detail="an activation")
    elif re.match(r"^\s*\w*$", prefix):
        words = STATEMENT_KEYWORDS.get(block, STATEMENT_KEYWORDS[""])
        add(words, K.Keyword if words and words[0] in KEYWORDS else K.Property)
    return L.CompletionList(False, items)
