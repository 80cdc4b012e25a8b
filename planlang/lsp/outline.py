"""textDocument/documentSymbol and textDocument/foldingRange: the plan's outline.

Symbols are hierarchical: the mesh with its axes, the pipeline with its stages, templates with their
parameters and bodies, `for` loops with theirs, devices and links with their fields, and one symbol for
each other top-level statement. Folding ranges are the statements that span lines (blocks, wrapped
argument lists) and runs of two or more whole-line comments.
"""
from __future__ import annotations

from lsprotocol import types as L

from planlang.lang import ast as A
from planlang.lang.source import Span

from .analysis import Analysis
from .positions import LineIndex

K = L.SymbolKind


def _named(node) -> str:
    return node.text if isinstance(node, A.Name) else str(node)


class Outline:
    """Builds the symbols of one analysis (ranges in the client's position encoding)."""

    def __init__(self, analysis: Analysis, encoding: str):
        self.analysis = analysis
        self.index = LineIndex(analysis.text, encoding)

    def symbol(self, name: str, kind: L.SymbolKind, node: A.Node, select: A.Node | Span | None = None,
               detail: str | None = None, children: list[L.DocumentSymbol] | None = None) -> L.DocumentSymbol:
        rng = self.index.range(node.span)
        sel_span = select if isinstance(select, Span) else select.span if select is not None else None
        sel = self.index.range(sel_span) if sel_span is not None and sel_span.line >= 1 else rng
        if not _within(sel, rng):
            sel = rng
        return L.DocumentSymbol(name=name or "?", kind=kind, range=rng, selection_range=sel, detail=detail or None,
                                children=children or None)

    def statements(self, statements) -> list[L.DocumentSymbol]:
        return [s for s in (self.statement(st) for st in statements if st.span.line >= 1) if s is not None]

    def statement(self, st) -> L.DocumentSymbol | None:
        if isinstance(st, A.MeshDecl):
            axes = [self.symbol(ax.name.text, K.Field, ax, ax.name,
                                f"{ax.size}" + (f" over {ax.link}" if ax.link is not None else ""))
                    for ax in st.axes if ax.span.line >= 1]
            count = f"{st.count} x " if st.count is not None else ""
            return self.symbol(f"mesh {st.name.text}", K.Namespace, st, st.name, f"{count}{st.device}", axes)
        if isinstance(st, A.MeshAlias):
            return self.symbol(f"mesh {st.name.text}", K.Namespace, st, st.name, f"= {st.target}")
        if isinstance(st, A.PipelineDecl):
            stages = []
            if isinstance(st.stages, tuple):
                for i, sd in enumerate(st.stages):
                    degrees = ", ".join(f"{d.axis.text} = {d.size}" for d in sd.degrees)
                    stages.append(self.symbol(f"stage {i}", K.Array, sd, None,
                                              ", ".join(str(p) for p in sd.paths) + (f" with {degrees}" if degrees else "")))
            return self.symbol(f"pipeline over {_named(st.axis)}", K.Object, st, None,
                               f"schedule {st.schedule}, microbatches {st.microbatches}", stages)
        if isinstance(st, A.TemplateDecl):
            params = [self.symbol(p.name.text, K.TypeParameter, p, p.name, p.kind.text) for p in st.params]
            sig = "(" + ", ".join(f"{p.name.text}: {p.kind.text}" for p in st.params) + ")"
            return self.symbol(st.name.text, K.Function, st, st.name, f"template{sig}",
                               params + self.statements(st.body))
        if isinstance(st, A.ForStmt):
            return self.symbol(f"for {st.var.text} in {st.selection}", K.Namespace, st, st.var, None,
                               self.statements(st.body))
        if isinstance(st, (A.DeviceDecl, A.LinkDecl)):
            fields = [self.symbol(str(f.key), K.Property, f, f.key, str(f.value)) for f in st.fields if f.span.line >= 1]
            kind = "device" if isinstance(st, A.DeviceDecl) else "link"
            return self.symbol(st.name.text, K.Struct if kind == "device" else K.Interface, st, st.name, kind, fields)
        if isinstance(st, A.Use):
            alias = f" as {st.alias.text}" if st.alias is not None else ""
            return self.symbol(f"use {st.target}{alias}", K.Module, st, st.target)
        if isinstance(st, A.ModelDecl):
            return self.symbol(f"model {st.name.text}", K.Class, st, st.name, st.factory.value)
        if isinstance(st, A.InputDecl):
            dims = ", ".join(f"{d.name.text} = {d.size}" for d in st.dims)
            return self.symbol(f"input {st.name.text}", K.Variable, st, st.name, f"{st.dtype.text}[{dims}]")
        if isinstance(st, A.BudgetDecl):
            return self.symbol("budget", K.Constant, st, None, f"{st.amount}" + (" per device" if st.per_device else ""))
        if isinstance(st, A.OptimizerDecl):
            fields = [self.symbol(str(f.key), K.Property, f, f.key,
                                  f"{f.value}" + (f" over {_named(f.over)}" if f.over is not None else ""))
                      for f in st.fields or () if f.span.line >= 1]
            return self.symbol(f"optimizer {st.name.text}", K.Object, st, st.name, None, fields)
        if isinstance(st, A.DataDecl):
            return self.symbol(f"data {st.input.text}", K.Variable, st, st.input, str(st.spec))
        if isinstance(st, A.ShardStmt):
            return self.symbol(f"shard {st.target}", K.Property, st, st.target, str(st.spec))
        if isinstance(st, A.MicrobatchesDecl):
            return self.symbol("microbatches", K.Number, st, None, str(st.count))
        if isinstance(st, A.CheckpointStmt):
            paths = ", ".join(str(p) for p in st.paths) if isinstance(st.paths, tuple) else "?"
            every = f"every {_named(st.every)}" if st.every is not None else None
            return self.symbol(f"checkpoint {paths}", K.Event, st, None, every)
        if isinstance(st, A.ApplyStmt):
            args = "(" + ", ".join(str(a) for a in st.args) + ")" if st.args is not None else ""
            return self.symbol(f"apply {st.template}{args}", K.Method, st, st.template, f"to {st.target}")
        return None


def _within(inner: L.Range, outer: L.Range) -> bool:
    def key(p: L.Position):
        return p.line, p.character

    return key(outer.start) <= key(inner.start) and key(inner.end) <= key(outer.end)


def document_symbols(analysis: Analysis | None, encoding: str) -> list[L.DocumentSymbol]:
    """The outline; empty for a text with no tree (`analysis` None)."""
    if analysis is None:
        return []
    return Outline(analysis, encoding).statements(analysis.module.statements)


# ------------------------------------------------------------------------------ folding
BLOCKS = (A.MeshDecl, A.PipelineDecl, A.TemplateDecl, A.ForStmt, A.DeviceDecl, A.LinkDecl, A.OptimizerDecl,
          A.ModelDecl, A.InputDecl, A.StageDecl, A.ShardStmt, A.ApplyStmt, A.CheckpointStmt)


def folding_ranges(analysis: Analysis | None, encoding: str) -> list[L.FoldingRange]:
    """Multi-line statements (0-based lines, the closing line kept visible for a `}` block), and runs of
    whole-line comments; `use` runs fold as imports."""
    if analysis is None:
        return []
    index = LineIndex(analysis.text, encoding)
    out: list[L.FoldingRange] = []

    def statements(sts):
        for st in sts:
            if not isinstance(st, BLOCKS) or st.span.line < 1:
                continue
            start, end = st.span.line - 1, st.span.end_line - 1
            if end > start:
                last = index.line(end).strip()
                out.append(L.FoldingRange(start, end - 1 if last.startswith(("}", ")", "]")) else end,
                                          kind=L.FoldingRangeKind.Region))
            if isinstance(st, (A.TemplateDecl, A.ForStmt)):
                statements(st.body)
            if isinstance(st, A.PipelineDecl) and isinstance(st.stages, tuple):
                statements(st.stages)

    statements(analysis.module.statements)
    out = [r for r in out if r.end_line > r.start_line]
    # runs of whole-line comments, and of `use` statements
    run: list[int] = []
    for c in analysis.module.comments:
        line = c.span.line - 1
        whole = not index.line(line)[:max(0, c.span.col - 1)].strip()
        if whole and run and line == run[-1] + 1:
            run.append(line)
            continue
        if len(run) > 1:
            out.append(L.FoldingRange(run[0], run[-1], kind=L.FoldingRangeKind.Comment))
        run = [line] if whole else []
    if len(run) > 1:
        out.append(L.FoldingRange(run[0], run[-1], kind=L.FoldingRangeKind.Comment))
    uses = [st.span.line - 1 for st in analysis.module.statements if isinstance(st, A.Use) and st.span.line >= 1]
    first = 0
    for i in range(1, len(uses) + 1):
        if i == len(uses) or uses[i] != uses[i - 1] + 1:
            if i - first > 1:
                out.append(L.FoldingRange(uses[first], uses[i - 1], kind=L.FoldingRangeKind.Imports))
            first = i
    return sorted(out, key=lambda r: (r.start_line, r.end_line))
