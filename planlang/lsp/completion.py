"""textDocument/completion from the text before the cursor (which rarely parses while typing).

The context is read from the current line and the blocks open above it: a statement keyword at the
start of a line, stdlib modules after `use`, templates after `apply`, axes inside a spec, `partial(`,
`over` (outside a mesh) and template arguments, links after `over` in a mesh, module paths after
`shard` / `stage` / `checkpoint` / `for x in` / `to` (the model's names when it has been probed, else the
paths already written in the file), inputs after `data`, units after a quantity's number, the keyword
that comes next in a statement (`mesh m of`, `pipeline over pp schedule`, ...), `2` after `chunks` of a V
schedule (zbv, dualpipev: two stages per rank), codes inside
`# plan: ignore[`. Names come from the current analysis when the text parses, else from its recovered
version (the text less its broken lines, `Analysis.recovered`) and the last version that parsed, so a
file that has never parsed (a new plan being typed) completes too.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Protocol, TypeVar

from lsprotocol import types as L

from planlang.lang import ast as A
from planlang.lang.codes import CODES
from planlang.lang.lexical import brackets, inside, suppression_open
from planlang.plan.resolve import DTYPES, Resolver
from planlang.plan.selection import to_plan_name
from planlang.plan.types import CHUNKED, MIN_CHUNKS, OPTIMIZERS, PRECISION_DTYPES, V_SHAPED
from planlang.plan.units import UNITS, Kind

from .analysis import Analysis, references
from .keywords import KEYWORDS, SCHEDULES, STATEMENT_KEYWORDS
from .model_checks import ModelInsight
from .positions import UTF16, LineIndex
from .symbols import contains, mesh_decl, module_at, uses, walk

K = L.CompletionItemKind
PATH_CHARS = r"[\w.\[\]:*]*"
MAX_ITEMS = 2000

# what a quantity's unit measures, by the field or statement it is the value of
UNIT_KINDS = (
    (re.compile(r"^\s*budget\s+[\d.]+\s*\w*$"), Kind.MEMORY),
    (re.compile(r"^\s*memory\s*=\s*[\d.]+\s*\w*$"), Kind.MEMORY),
    (re.compile(r"^\s*bandwidth\s*=\s*[\d.]+\s*\w*$"), Kind.BANDWIDTH),
    (re.compile(r"^\s*latency\s*=\s*[\d.]+\s*\w*$"), Kind.TIME),
    (re.compile(r"^\s*flops(\.\w+)?\s*=\s*[\d.]+\s*\w*$"), Kind.THROUGHPUT),
)
_CHUNKED = "(" + "|".join(CHUNKED) + ")"  # the schedules that take `chunks N`
_NEEDS_CHUNKS = "(" + "|".join(k for k in CHUNKED if MIN_CHUNKS[k] > 1) + ")"  # ... and need it
_MAY_CHUNK = "(" + "|".join(k for k in CHUNKED if MIN_CHUNKS[k] == 1) + ")"  # ... or go without (one chunk)
_V_SHAPED = "(" + "|".join(V_SHAPED) + ")"  # ... and take exactly `chunks 2` (two stages per rank, PL404)
COMMON_UNITS = ("GiB", "MiB", "GB", "GB/s", "GiB/s", "Gb/s", "us", "ms", "ns", "TFLOPS", "GFLOPS")

# the keyword that comes next once the text before the cursor is a complete prefix of a statement
NEXT_KEYWORDS = (
    (re.compile(r"^\s*use\s+(\w+(\.\w+)*|\"[^\"]*\")\s+\w*$"), ("as",)),
    (re.compile(r"^\s*mesh\s+\w+\s+\w*$"), ("of",)),
    (re.compile(r"^\s*mesh\s+\w+\s+of\s+\d+\s+\w*$"), ("x",)),
    (re.compile(r"^\s*budget\s+[\d.]+\s*[A-Za-z]+\s+\w*$"), ("per device",)),
    (re.compile(r"^\s*budget\s+[\d.]+\s*[A-Za-z]+\s+per\s+\w*$"), ("device",)),
    (re.compile(r"^\s*pipeline\s+\w*$"), ("over",)),
    (re.compile(r"^\s*pipeline\s+over\s+[\w?]+\s+\w*$"), ("schedule",)),
    (re.compile(r"^\s*pipeline\s+over\s+[\w?]+\s+schedule\s+(gpipe|1f1b|\?)\s+\w*$"), ("microbatches",)),
    (re.compile(r"^\s*pipeline\s+over\s+[\w?]+\s+schedule\s+" + _NEEDS_CHUNKS + r"\s+\w*$"), ("chunks",)),
    (re.compile(r"^\s*pipeline\s+over\s+[\w?]+\s+schedule\s+" + _MAY_CHUNK + r"\s+\w*$"),
     ("chunks", "microbatches")),
    (re.compile(r"^\s*pipeline\s+over\s+[\w?]+\s+schedule\s+" + _CHUNKED + r"\s+chunks\s+[\d?]+\s+\w*$"),
     ("microbatches",)),
    (re.compile(r"^\s*for\s+\w+\s+\w*$"), ("in",)),
    (re.compile(r"^\s*shard\s+(output|input)\s+\w*$"), ("of",)),
    (re.compile(r"^\s*checkpoint\s+[\w.\[\]:*]+(\s*,\s*[\w.\[\]:*]+)*\s+\w*$"), ("every",)),
    (re.compile(r"^\s*stage\s+[\w.\[\]:*]+(\s*,\s*[\w.\[\]:*]+)*\s+\w*$"), ("with",)),
    (re.compile(r"^\s*apply\s+[\w.]+\s*(\([^)]*\))?\s+\w*$"), ("to",)),
)


# ------------------------------------------------------------------------------ context from text
def open_blocks(text: str, offset: int) -> list[str]:
    """The header lines of the blocks open at `offset`, outermost first (comments and strings skipped)."""
    stack: list[int] = []
    for ch, at in brackets(text, 0, offset):
        if ch == "{":
            stack.append(at)
        elif ch == "}" and stack:
            stack.pop()
    out = []
    for pos in stack:
        start = text.rfind("\n", 0, pos) + 1
        out.append(text[start:pos].strip())
    return out


# ------------------------------------------------------------------------------ candidates
def axis_names(ref: Analysis | list[Analysis], text: str | None = None) -> list[str]:
    """The plan's mesh axes: from the first reference analysis that has a mesh; but from `text` (the
    current text) when it has a mesh block and does not parse, since it may declare an axis on a line
    the references lack (the line being typed)."""
    refs = ref if isinstance(ref, list) else [ref]
    current = text if text is not None else refs[0].text
    if not (refs[0].parses and refs[0].text == current):
        found = _text_axes(current)
        if found:
            return found
    for r in refs:
        if r.plan is not None and r.plan.mesh is not None:
            return list(r.plan.mesh.names)
        place = mesh_decl(r)
        if place is not None and isinstance(place.node, A.MeshDecl):
            return [a.name.text for a in place.node.axes]
    return []


def _text_axes(text: str) -> list[str]:
    """The axes of the first mesh block, read from the text (an unclosed block too: to its end)."""
    m = re.search(r"^\s*mesh\s+\w+\s+of\b[^{\n]*\{([^}]*)(\}|$)", text, re.M)
    return list(dict.fromkeys(re.findall(r"^\s*(\w+)\s*=", m.group(1).replace(";", "\n"), re.M))) if m else []


def input_names(refs: list[Analysis], text: str) -> list[str]:
    """The inputs the plan declares (from the text too: the line being typed may be the only one)."""
    out = [st.name.text for r in refs for st in r.module.statements if isinstance(st, A.InputDecl)]
    out += re.findall(r"^\s*input\s+(\w+)\s*:", text, re.M)
    return list(dict.fromkeys(out))


def template_params(headers: list[str]) -> list[str]:
    out = []
    for h in headers:
        m = re.match(r"template\s+\w+\s*\((.*)\)", h)
        if m:
            out += [p.split(":")[0].strip() for p in m.group(1).split(",") if ":" in p and "axis" in p.split(":")[1]]
    return out


class _Declaration(Protocol):
    """A declaration `declarations` lists: it has a name (templates, devices, links, meshes)."""

    @property
    def name(self) -> A.Name: ...


_D = TypeVar("_D", bound=_Declaration)


def declarations(ref: Analysis | list[Analysis], kind: type[_D] | tuple[type[_D], ...]) -> list[tuple[str, str]]:
    """(name as the plan writes it, detail) for declarations of one kind: local, then `alias.name`
    (of every reference analysis, the first's first)."""
    out: dict[str, str] = {}
    for r in ref if isinstance(ref, list) else [ref]:
        for st in r.module.statements:
            if isinstance(st, kind):
                out.setdefault(st.name.text, _decl_detail(st))
        for alias, (_, path) in uses(r.module, r.path).items():
            mod = module_at(r, path) if path else None
            for st in mod.statements if mod else ():
                if isinstance(st, kind):
                    out.setdefault(f"{alias}.{st.name.text}", _decl_detail(st))
    return list(out.items())


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


def module_paths(ref: Analysis | list[Analysis], insight: ModelInsight | None, loopvars: list[str],
                 typing_at: int | None = None) -> list[tuple[str, str]]:
    """(path, detail): the model's modules and parameters (with `[*]` forms of indexed containers) when
    it has been probed, else every path written in the plan (in the reference analyses) and its prefixes
    (except the one being typed, at `typing_at` of the first); loop variables first."""
    out: dict[str, str] = {v: "loop variable" for v in loopvars}
    facts = insight.facts if insight else None
    if facts is not None:
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
        for i, r in enumerate(ref if isinstance(ref, list) else [ref]):
            for node, _ in walk(r.module):
                if isinstance(node, A.Path) and not (i == 0 and typing_at is not None and contains(node, typing_at)):
                    parts = str(node).split(".")
                    for k in range(1, len(parts) + 1):
                        out.setdefault(".".join(parts[:k]), "in this plan")
    return list(out.items())[:MAX_ITEMS]


# ------------------------------------------------------------------------------ the feature
def completion(analysis: Analysis, offset: int, good: Analysis | None = None, insight: ModelInsight | None = None,
               encoding: str = UTF16) -> L.CompletionList:
    refs = references(analysis, good)
    same_offsets = refs[0] is analysis or refs[0] is analysis.recovered
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

    where = inside(text, offset, line_start)
    if where == "comment":
        if suppression_open(prefix):
            add([(c, CODES[c].title) for c in sorted(CODES)], K.Constant)
        return L.CompletionList(False, items)
    if where == "string":
        return L.CompletionList(False, items)

    axes = axis_names(refs, text) + template_params(headers)  # inside a template: its axis parameters too
    unit_kind = next((k for pattern, k in UNIT_KINDS if pattern.match(prefix)), None)
    next_words = next((w for pattern, w in NEXT_KEYWORDS if pattern.match(prefix)), None)
    if re.match(r"^\s*use\s+[\w.]*$", prefix):
        add(stdlib_modules(analysis.path), K.Module, r"[\w.]*", "plan module")
    elif re.search(r"\bapply\s+[\w.]*$", prefix):
        add(declarations(refs, A.TemplateDecl), K.Function, r"[\w.]*")
    elif re.search(r"\bschedule\s+\w*$", prefix):
        add(SCHEDULES, K.EnumMember, detail="pipeline schedule")
    elif re.search(r"\bschedule\s+" + _V_SHAPED + r"\s+chunks\s+\d*$", prefix):
        add(["2"], K.Constant, r"\d*", "two stages per rank: a V schedule takes exactly `chunks 2`")
    elif re.match(r"^\s*optimizer\s+\w*$", prefix):
        add(OPTIMIZERS, K.EnumMember, detail="optimizer")
    elif re.match(r"^\s*input\s+\w+\s*:\s*\w*$", prefix):
        add(sorted(DTYPES), K.TypeParameter, detail="dtype")
    elif block == "optimizer" and re.match(r"^\s*(precision|params|compute|reduce|master)\s*=\s*\w*$", prefix):
        add(PRECISION_DTYPES, K.TypeParameter, detail="dtype")
    elif block == "optimizer" and re.match(r"^\s*loss_scale\s*=\s*\w*$", prefix):
        add(["dynamic"], K.EnumMember, detail="loss scale")
    elif re.match(r"^\s*mesh\s+\w+\s+of\s+(\d+\s+x\s+)?[\w.]*$", prefix):
        add(declarations(refs, A.DeviceDecl), K.Class, r"[\w.]*")
    elif re.match(r"^\s*mesh\s+\w+\s*=\s*[\w.]*$", prefix):
        add(declarations(refs, (A.MeshDecl, A.MeshAlias)), K.Class, r"[\w.]*")
    elif re.search(r"\bover\s+[\w.]*$", prefix):
        if block == "mesh":
            add(declarations(refs, A.LinkDecl), K.Class, r"[\w.]*")
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
        add(module_paths(refs, insight, loopvars, offset if same_offsets else None), K.Field, PATH_CHARS)
        if re.match(r"^\s*shard\s+\w*$", prefix):
            add(["output of", "input of"], K.Keyword, detail="an activation")
    elif re.match(r"^\s*data\s+\w*$", prefix):
        add(input_names(refs, text), K.Variable, detail="input")
    elif unit_kind is not None and re.search(r"\d\s+\w*$|\d[A-Za-z]+$", prefix):
        units = [u for u in COMMON_UNITS if UNITS[u][0] is unit_kind]
        units += sorted(u for u, (k, _) in UNITS.items() if k is unit_kind and u not in units)
        add(units, K.Unit, r"[\w/]*", f"{unit_kind.value} unit")
    elif next_words is not None:
        add(next_words, K.Keyword)
    elif re.match(r"^\s*\w*$", prefix):
        words = STATEMENT_KEYWORDS.get(block, STATEMENT_KEYWORDS[""])
        add(words, K.Keyword if words and words[0] in KEYWORDS else K.Property)
    return L.CompletionList(False, items)
