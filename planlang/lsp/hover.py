"""textDocument/hover: what a name means in this plan.

Axes show their size and link; module paths show, once the model has been probed (model checks on),
the tensor shape and the local shard shape under the statement's spec; a stage shows the estimator's
per-device memory for it; templates their signature and doc comment; diagnostic codes in a comment
(`# plan: ignore[PL303]`) the text of `planlang explain`.

A text that does not parse is answered from its recovered version (`Analysis.recovered`) where the
cursor's line was kept, else from the words around the cursor (`symbols.word_symbol`): keywords, codes,
units, schedules, and names the recovered text or the last version that parsed can look up.
"""
from __future__ import annotations

import math

from lsprotocol import types as L

from planlang.lang import ast as A
from planlang.lang.codes import explain
from planlang.plan import types as T
from planlang.plan.selection import Selection, to_plan_name
from planlang.plan.units import UNITS, format_bytes

from .analysis import Analysis, references, same_line
from .keywords import describe
from .model_checks import ModelInsight
from .positions import UTF16, LineIndex
from .symbols import Symbol, definition, loop_vars, lookup, module_at, symbol_at, template_of, word_symbol

SCHEDULE_TEXT = {
    "gpipe": "GPipe: all forwards, then all backwards; every stage holds the activations of all microbatches.",
    "1f1b": "1F1B: one forward, one backward in the steady state; stage i holds min(p - i, m) microbatches.",
    "interleaved": "Interleaved 1F1B: each device runs `chunks` model chunks; needs microbatches % stages == 0.",
    "looped_bfs": "Looped BFS (breadth-first): each device runs `chunks` model chunks, the forwards of all "
                  "microbatches chunk by chunk, then the backwards in reverse; GPipe's memory (every stage "
                  "holds all microbatches), interleaved's bubble when microbatches >= p.",
    "zero_bubble": "Zero bubble (ZB-H1, Qi et al. 2024): each device runs `chunks` model chunks (1 if not "
                   "given), placed as interleaved; a backward splits into the input gradient B and the "
                   "weight gradient W, run later to fill the bubbles, and a stage holds a microbatch's "
                   "activations until its W; needs microbatches % p == 0.",
    "zbv": "ZB-V (Qi et al. 2024, §6): `chunks 2`, exactly two model stages per device in a V (device r holds "
           "stages r and 2p - 1 - r, the last device the middle two); the backward splits into B and W as "
           "zero_bubble's; each device holds 1F1B's peak of activations, 2p chunk-microbatches; any "
           "number of microbatches.",
    "dualpipev": "DualPipeV (DeepSeek-V3's DualPipe folded into a V): `chunks 2`, two model stages per device "
                 "placed as zbv; in the steady state a forward of one stage and a whole backward of the "
                 "other run as one overlapped pair, the last backwards split into B and W; each device holds "
                 "2p + 1 chunk-microbatches at its peak; needs microbatches >= 2p.",
}
MODEL_HINT = "_Shapes and memory appear here when model checks are on (setting `planlang.modelChecks`)._"
MODEL_STALE = "_The model's source changed since it was probed: model checks are running again._"


def hover(analysis: Analysis, offset: int, insight: ModelInsight | None = None, encoding: str = UTF16,
          model_checks: bool = False, names: list[Analysis] | None = None) -> L.Hover | None:
    """The hover at `offset` of `analysis`'s text. `names`: analyses that stand in for its names when
    it does not parse (default: its recovered version)."""
    if not analysis.parses:
        rec = analysis.recovered
        if rec is not None and same_line(analysis.text, rec.text, offset):
            analysis = rec  # same offsets: the tree of the text less its broken lines
    sym = symbol_at(analysis, offset)
    text = hover_text(analysis, sym, insight, model_checks) if sym is not None else None
    if not text and not analysis.parses:
        refs = names if names is not None else references(analysis)
        for ref in refs:  # a line no tree covers: read the words
            sym = word_symbol(analysis.text, offset, [ref], analysis.source)
            text = hover_text(ref, sym, insight, model_checks) if sym is not None else None
            if text:
                break
        else:
            sym = word_symbol(analysis.text, offset, [], analysis.source)
            text = hover_text(analysis, sym, insight, model_checks) if sym is not None else None
    if not text or sym is None:  # a text comes with its symbol
        return None
    rng = LineIndex(analysis.text, encoding).range(sym.span) if sym.span.line >= 1 else None
    return L.Hover(L.MarkupContent(L.MarkupKind.Markdown, text), rng)


def hover_text(analysis: Analysis, sym: Symbol, insight: ModelInsight | None, model_checks: bool) -> str | None:
    plan = analysis.plan
    k = sym.kind
    if k == "code":
        text = explain(sym.name)
        if text is None:
            return f"`{sym.name}`: a model-aware code (see docs/diagnostics.md); `planlang explain {sym.name}`."
        head, _, body = text.partition("\n")
        return f"**{head.strip()}**\n\n{body.strip()}"
    if k == "keyword":
        return describe(sym.name)
    if k in ("axis", "axis-decl"):
        return _axis(plan, sym.name)
    if k == "param":
        t = template_of(sym.chain)
        p = next((p for p in t.params if p.name.text == sym.name), None) if t else None
        return None if t is None or p is None else \
            f"`{p.name.text}: {p.kind.text}` — parameter of template `{t.name.text}`"
    if k in ("template", "template-decl"):
        return _template(analysis, sym)
    if k in ("device", "link", "mesh"):
        return _hardware(analysis, sym)
    if k == "use":
        return _use(analysis, sym)
    if k == "loopvar":
        f = loop_vars(sym.chain).get(sym.name)
        return None if f is None else f"`{sym.name}` — loop variable: each module of `{f.selection}` in turn"
    if k == "input":
        i = plan.input(sym.name) if plan else None
        return None if i is None else f"input `{i}`"
    if k == "unit":
        entry = UNITS.get(sym.name)
        if entry is None:
            return None
        scale = f"{entry[1]:,.0f}" if entry[1] >= 1 and entry[1] == int(entry[1]) else f"{entry[1]:g}"
        return f"`{sym.name}`: a {entry[0].value} unit, 1 {sym.name} = {scale} {_base(entry[0].value)}"
    if k == "hole":
        what = next((h.what for h in (plan.holes() if plan else []) if h.span.start == sym.span.start), None)
        return f"`?` — a hole{f' ({what})' if what else ''}: `planlang solve` fills it in."
    if k == "schedule":
        return SCHEDULE_TEXT.get(sym.name)
    if k == "optimizer":
        return f"optimizer `{sym.name}`" + (f": {plan.optimizer}" if plan and plan.optimizer else "")
    if k == "factory":
        place = definition(analysis, sym)
        return f'model factory `{sym.name}`' + (f" — `{place.path}`" if place else " (source not found)")
    if k == "model":
        return f"model `{sym.name}` = `{plan.model}`" if plan and plan.model else None
    if k == "path":
        return _path(analysis, sym, insight, model_checks)
    if k == "stage":
        return _stage(analysis, sym, insight, model_checks)
    return None


def _base(kind: str) -> str:
    return {"memory": "bytes", "bandwidth": "bytes/s", "time": "s", "throughput": "FLOP/s"}.get(kind, "")


# ------------------------------------------------------------------------------ names
def _axis(plan: T.Plan | None, name: str) -> str | None:
    mesh = plan.mesh if plan else None
    if mesh is None:
        return f"axis `{name}`"
    ax = mesh.axis(name)
    if ax is None:
        return f"axis `{name}` (not declared by the plan's mesh)"
    link = f"link `{ax.link_ref}`" if ax.link_ref else "no link"
    if ax.link is not None:
        link += f" ({ax.link.bandwidth / 1e9:g} GB/s, {ax.link.latency * 1e6:g} us)"
    others = " × ".join(f"{a.name}({a.size})" for a in mesh.axes)
    return (f"**axis** `{name}` of mesh `{mesh.name}` — size **{ax.size}**, {link}\n\n"
            f"mesh: {others} = {mesh.size if mesh.size is not None else '?'} devices")


def _template(analysis: Analysis, sym: Symbol) -> str | None:
    module: A.Module | None
    if sym.kind == "template-decl":
        decl = sym.enclosing(A.TemplateDecl)
        if decl is None:  # a template-decl symbol is a name in one
            return None
        t, path, module = decl, analysis.path, analysis.module
    else:
        place = lookup(analysis, sym.name.split("."))
        if place is None or not isinstance(place.node, A.TemplateDecl):
            return f"template `{sym.name}` (not found)"
        t, path = place.node, place.path
        module = analysis.module if path == analysis.path else module_at(analysis, path)
    sig = ", ".join(f"{p.name.text}: {p.kind.text}" for p in t.params)
    doc = _doc_comment(module, t) if module is not None else ""
    n = len(t.body)
    return (f"```plan\ntemplate {t.name.text}({sig})\n```\n\n{n} statement{'s' if n != 1 else ''}"
            f" — {path}" + (f"\n\n{doc}" if doc else ""))


def _doc_comment(module: A.Module, node: A.Node) -> str:
    """The full-line comments right above a declaration."""
    by_line = {c.span.line: c.text for c in module.comments}
    lines, line = [], node.span.line - 1
    while line in by_line:
        lines.append(by_line[line].lstrip("#").strip())
        line -= 1
    return "\n".join(reversed(lines)).strip()


def _hardware(analysis: Analysis, sym: Symbol) -> str | None:
    plan = analysis.plan
    last = sym.name.split(".")[-1]
    if sym.kind == "device":
        dev = next((d for d in (plan.devices if plan else ()) if d.name == last), None)
        if dev is None:
            return f"device `{sym.name}`"
        flops = ", ".join(f"{k} {v / 1e12:g} TFLOPS" for k, v in dev.flops)
        return f"**device** `{sym.name}` — memory {format_bytes(dev.memory)}" + (f"; {flops}" if flops else "")
    if sym.kind == "link":
        link = next((x for x in (plan.links if plan else ()) if x.name == last), None)
        if link is None:
            return f"link `{sym.name}`"
        return f"**link** `{sym.name}` — {link.bandwidth / 1e9:g} GB/s one direction per device, " \
               f"latency {link.latency * 1e6:g} us"
    mesh = plan.mesh if plan else None
    if mesh is not None and (mesh.name == last or sym.enclosing(A.MeshAlias) is not None):
        return f"**mesh** `{mesh}` — {mesh.size if mesh.size is not None else '?'} × " \
               f"{mesh.device.name if mesh.device else '?'}"
    return f"mesh `{sym.name}`"


def _use(analysis: Analysis, sym: Symbol) -> str | None:
    place = definition(analysis, sym)
    if place is None:
        return f"module `{sym.name}` (not found)"
    mod = module_at(analysis, place.path)
    names: dict[str, list[str]] = {}
    for st in mod.statements if mod else ():
        if isinstance(st, (A.TemplateDecl, A.DeviceDecl, A.LinkDecl, A.MeshDecl, A.MeshAlias)):
            kind = {A.TemplateDecl: "templates", A.DeviceDecl: "devices", A.LinkDecl: "links"}.get(type(st), "meshes")
            names.setdefault(kind, []).append(st.name.text)
    body = "\n".join(f"- {k}: " + ", ".join(f"`{n}`" for n in v) for k, v in names.items())
    return f"**module** `{sym.name}` — {place.path}" + (f"\n\n{body}" if body else "")


# ------------------------------------------------------------------------------ paths and stages
def resolved_selection(path: A.Path, chain) -> Selection | None:
    """The selection a path stands for, with loop variables substituted; None inside a template
    (its paths are relative to wherever it is applied)."""
    if template_of(chain) is not None:
        return None
    sel = Selection.from_path(path)
    head = path.segments[0]
    fors = [n for n in chain if isinstance(n, A.ForStmt)]
    for i in range(len(fors) - 1, -1, -1):
        f = fors[i]
        if head.name == f.var.text and not head.selectors and f.selection is not path:
            outer = resolved_selection(f.selection, chain[:chain.index(f)])
            return None if outer is None else sel.replace_head(f.var.text, outer)
    return sel


def _shape(shape) -> str:
    return "[" + ", ".join(map(str, shape)) + "]" if shape is not None else "?"


def _path(analysis: Analysis, sym: Symbol, insight: ModelInsight | None, model_checks: bool) -> str:
    path = next(n for n in reversed(sym.chain) if isinstance(n, A.Path))
    stmt = sym.enclosing(A.ShardStmt, A.StageDecl, A.CheckpointStmt, A.ApplyStmt, A.ForStmt)
    act = sym.enclosing(A.Activation)
    head = f"**{act.kind} of** `{path}`" if act is not None else f"**module path** `{path}`"
    facts = insight.facts if insight else None
    plan = analysis.plan
    if facts is None:
        out = head + "\n\n" + (MODEL_HINT if not model_checks else
                               MODEL_STALE if insight is not None and insight.stale else "_Model not probed yet._")
    else:
        rules = [r for r in plan.shards if r.span == stmt.span] if plan and isinstance(stmt, A.ShardStmt) else []
        if plan is not None and rules:
            out = head + "\n\n" + "\n\n".join(_shard_rule(r, facts, plan.mesh) for r in rules[:3])
        else:
            sel = resolved_selection(path, sym.chain)
            out = head + "\n\n" + (_selection_info(sel, facts) if sel is not None else
                                   "_relative to the module the template is applied to_")
    stage = sym.enclosing(A.StageDecl)
    if stage is not None:
        out += "\n\n---\n\n" + _stage(analysis, Symbol("stage", "stage", stage.span, sym.chain), insight, model_checks)
    return out


def _shard_rule(rule: T.ShardRule, facts, mesh: T.Mesh | None) -> str:
    spec = rule.spec if isinstance(rule.spec, T.Spec) else None
    if rule.kind == "param":
        hits = rule.target.select(list(facts.params))
        shapes = [(to_plan_name(h), facts.params[h][0], facts.params[h][1]) for h in hits]
    else:
        hits = rule.target.select(facts.all_modules)
        shapes = []
        for h in hits:
            call = facts.calls.get(h)
            shape = None if call is None else (call.output if rule.kind == "output" else
                                               (call.inputs[0] if call.inputs else None))
            if shape is not None:
                shapes.append((f"{rule.kind} of {to_plan_name(h)}", shape, ""))
    if not shapes:
        return f"`{rule.target}` matches nothing in the model"
    lines = [f"`{rule}` — {len(shapes)} tensor{'s' if len(shapes) != 1 else ''}"]
    seen = set()
    for name, shape, dtype in shapes:
        if tuple(shape) in seen:
            continue
        seen.add(tuple(shape))
        line = f"- `{name}`: {dtype + ' ' if dtype else ''}{_shape(shape)}"
        if spec is not None and mesh is not None:
            local = spec.local_shape(tuple(shape), mesh)
            if local is not None and any(n % (spec.shard_factor(i, mesh) or 1) for i, n in enumerate(shape)):
                local = None  # an uneven split: the checker refuses it (PL361)
            if local is not None:
                line += f" → local {_shape(local)} per device under `{spec}`"
            elif spec.rank != len(shape):
                line += f" (the spec has {spec.rank} entries for {len(shape)} dims)"
            else:
                line += f" (not evenly divisible under `{spec}`)"
        lines.append(line)
        if len(seen) >= 4:
            break
    return "\n".join(lines)


def _selection_info(sel: Selection, facts) -> str:
    params = sel.select(list(facts.params))
    mods = sel.select(facts.all_modules)
    lines = []
    if mods:
        call = facts.calls.get(mods[0])
        types = sorted({facts.calls[m].type for m in mods if m in facts.calls})
        shown = ", ".join(f"`{to_plan_name(m)}`" for m in mods[:4]) + (" …" if len(mods) > 4 else "")
        n = sum(math.prod(s) for p, (s, _) in facts.params.items()
                if facts.canonical(p) == p and any(p.startswith(m + ".") for m in mods))
        lines.append(f"{len(mods)} module{'s' if len(mods) != 1 else ''}"
                     f"{' (' + ', '.join(types) + ')' if types else ''}: {shown}")
        lines.append(f"parameters: {n:,}")
        if call is not None:
            lines.append(f"`{to_plan_name(mods[0])}`: input {_shape(call.inputs[0] if call.inputs else None)}"
                         f" → output {_shape(call.output)}")
    for p in params[:4]:
        lines.append(f"- `{to_plan_name(p)}`: {facts.params[p][1]} {_shape(facts.params[p][0])}")
    return "\n\n".join(lines) if lines else f"`{sel}` matches nothing in the model"


def _stage(analysis: Analysis, sym: Symbol, insight: ModelInsight | None, model_checks: bool) -> str:
    pipe = sym.enclosing(A.PipelineDecl)
    st = sym.enclosing(A.StageDecl)
    if pipe is None or st is None or not isinstance(pipe.stages, tuple) or st not in pipe.stages:
        return "**stage**"
    idx = pipe.stages.index(st)
    n = len(pipe.stages)
    head = f"**stage {idx}** of {n}: " + ", ".join(f"`{p}`" for p in st.paths)
    est = insight.estimate_for(f"stage {idx}") if insight else None
    if est is None:
        if not model_checks:
            return head + "\n\n" + MODEL_HINT
        if insight is not None and insight.stale:
            return head + "\n\n" + MODEL_STALE
        return head + "\n\n_No estimate (model checks run after a pause; a plan with errors or holes is not " \
                      "estimated)._"
    rows = [("peak", est.peak), ("parameters", est.parameters), ("gradients", est.gradients),
            ("optimizer states", est.optimizer), ("buffers", est.buffers), ("activations", est.activations),
            ("transient", est.transient)]
    table = "\n".join(f"| {k} | {format_bytes(v)} |" for k, v in rows)
    return (f"{head}\n\nestimated per device (`planlang estimate`):\n\n| | |\n|---|---|\n{table}\n"
            f"| step time | {est.step_time * 1e3:.1f} ms |")
