"""The AST builder: one method per grammar rule (or alias), called by the reductions (`reductions.py`)
with the rule's children shaped as Lark's tree would have them and a `Reduced` holding the first and last
tokens of its text; each returns the typed node (`planlang.lang.ast`) with its span, packed.

Most paths and specs are written as they print: those are kept as their text (`A.Path`, `A.Spec` build
their nodes from it when first read, `spec_text.read_spec` for specs), which saves most of a big plan's
nodes. Number literals of more than MAX_DIGITS digits are PL107 (`ToAst.diags`).
"""
from __future__ import annotations

import re
from sys import intern
from typing import Any

from . import ast as A
from .diagnostics import Diagnostic, Severity
from .reductions import COL, ECOL, ELINE, END, LINE, START, VALUE, Reduced
from .source import SourceFile, Span
from .spec_text import is_canonical

MAX_DIGITS = 100  # digits of one number literal (PL107); int() refuses more than 4300


def _unescape(raw: str) -> str:
    body = raw[1:-1]
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            out.append({"n": "\n", "t": "\t"}.get(nxt, nxt))
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


class _Sel:
    """A selector (`[3]`, `[0:6]`, `[*]`) before it is built: its node class, arguments, and first and
    last tokens (not its `Reduced`, whose value it is: that would be a reference cycle)."""

    __slots__ = ("node", "args", "first", "last")

    def __init__(self, node, args: tuple, meta: Reduced):
        self.node, self.args, self.first, self.last = node, args, meta.first, meta.last


class _Seg:
    """A path segment before it is built: its name, `_Sel`s, and first and last tokens."""

    __slots__ = ("text", "sels", "first", "last")

    def __init__(self, text: str, sels: list, meta: Reduced):
        self.text, self.sels, self.first, self.last = text, sels, meta.first, meta.last


# A parsed path or spec is stored as its source text when that text is what `str()` of its node gives
# (ast.path_text / ast.spec_text): these find what would make it differ.
# path: a space, tab, form feed or carriage return; a line continuation; a number with a leading zero or
# an underscore (`h[01]`, `h[1_0]`): numbers stand after `[` or `:` in a path
CANONICAL_PATH = re.compile(r"[ \t\f\r\\]|[\[:](?:0[0-9_]|[0-9]*_)")
# spec: anything but what `spec_text.is_canonical` accepts


class _NotCanonicalSpec:
    """`CANONICAL_SPEC.search(text)`: None when the whole of `text` is a canonically written spec."""

    @staticmethod
    def search(text: str):
        return None if is_canonical(text) else True


CANONICAL_SPEC: Any = _NotCanonicalSpec()


class ToAst:
    """Grammar rule → AST node: the parser calls the method named after the rule (or its alias) with the
    rule's `Reduced` (its first and last tokens, for `_span`) and its children shaped as Lark's tree would
    have them (transformed children, tokens as they are). Every node gets the span of the text it came from."""

    def __init__(self, source: SourceFile, canonical_path: Any = CANONICAL_PATH,
                 canonical_spec: Any = CANONICAL_SPEC):
        self.src = source
        # what finds a path or spec not written as it prints (`.search(text)` None: kept as text)
        self.canonical_path, self.canonical_spec = canonical_path, canonical_spec
        self.fid = A.file_id(source.path)
        self._spans: dict[int, int] = {}
        self.diags: list[Diagnostic] = []  # PL107

    def _number(self, tok: tuple, convert):
        """`convert` of the literal's digits; PL107 (and 0) for a literal of more than MAX_DIGITS digits."""
        digits = tok[VALUE].replace("_", "")
        mantissa = digits.lower().partition("e")[0] if convert is float else digits
        if len(mantissa) > MAX_DIGITS and sum(c.isdigit() for c in mantissa) > MAX_DIGITS:
            self.diags.append(Diagnostic(
                "PL107", Severity.ERROR, f"a number with {sum(c.isdigit() for c in mantissa)} digits",
                A.unpack_span(self._tspan(tok)), help=f"a number literal has at most {MAX_DIGITS} digits",
            ))
            return convert(0)
        return convert(digits)

    def _int(self, tok: tuple) -> int:
        return self._number(tok, int)

    # helpers -----------------------------------------------------------------------
    def _span(self, meta: Reduced | _Sel | _Seg) -> A.SpanArg:
        """The span of a rule's text, packed (`ast.pack_span`)."""
        first, last = meta.first, meta.last
        if first is None:
            return Span(self.src.path, 0, 0, 0, 0)
        # nested rules often cover the same text (a name, its segment, its path): they share one span
        key = first[START] << 32 | last[END]
        span = self._spans.get(key)
        if span is None:
            if len(self._spans) > 64:
                self._spans.clear()
            span = self._spans[key] = A.pack_span(self.fid, first[LINE], first[COL], last[ELINE], last[ECOL],
                                                  first[START], last[END])
        return span

    def _tspan(self, tok: tuple) -> A.SpanArg:
        return A.pack_span(self.fid, tok[LINE], tok[COL], tok[ELINE], tok[ECOL], tok[START], tok[END])

    def _intnode(self, tok) -> A.Int:
        if isinstance(tok, A.Int):
            return tok
        return A.Int(self._int(tok), text=tok[VALUE], span=self._tspan(tok))

    def _coerce_every(self, x):
        if type(x) is tuple:  # an INT token
            return self._intnode(x)
        return x

    @staticmethod
    def _present(items):
        return tuple(i for i in items if i is not None)

    # names and values ---------------------------------------------------------------
    def name(self, meta, items):
        return A.Name(items[0][VALUE], span=self._span(meta))

    def dotted(self, meta, items):
        return A.Dotted(tuple(items), span=self._span(meta))

    def hole(self, meta, items):
        return A.Hole(span=self._span(meta))

    def int(self, meta, items):
        return self._intnode(items[0])

    def float(self, meta, items):
        tok = items[0]
        return A.Float(self._number(tok, float), text=tok[VALUE], span=self._tspan(tok))

    def string(self, meta, items):
        tok = items[0]
        return A.Str(_unescape(tok[VALUE]), text=tok[VALUE], span=self._tspan(tok))

    def unit(self, meta, items):
        text = items[0][VALUE] + ("" if items[1] is None else "/" + items[1][VALUE])
        return A.Unit(text, span=self._span(meta))

    def quantity(self, meta, items):
        return A.Quantity(items[0], items[1], span=self._span(meta))

    def ref(self, meta, items):
        return A.Ref(items[0], span=self._span(meta))

    def list(self, meta, items):
        return A.ListValue(self._present(items), span=self._span(meta))

    # paths ----------------------------------------------------------------------------
    # A path's selectors and segments are built only if the path needs them: most paths are written as
    # they print and are kept as their text (`A.Path`). Until then they are _Sel / _Seg marks.
    def index(self, meta, items):
        return _Sel(A.Index, (self._int(items[0]),), meta)

    def slice(self, meta, items):
        a, b = items
        return _Sel(A.Slice, (None if a is None else self._int(a), None if b is None else self._int(b)), meta)

    def star(self, meta, items):
        return _Sel(A.Star, (), meta)

    def segment(self, meta, items):
        head, *sels = items
        text = head.text if isinstance(head, A.Name) else head[VALUE]
        return _Seg(text, sels, meta)

    def path(self, meta, items):
        text = self._canonical(meta, self.canonical_path)
        if text is not None:
            return A.Path(text, span=self._span(meta))
        return A.Path(tuple([self._segment(seg) for seg in items]), span=self._span(meta))

    def rooted_path(self, meta, items):
        text = self._canonical(meta, self.canonical_path)
        if text is not None:
            return A.Path(text, span=self._span(meta))
        sels = tuple(self._selector(i) for i in items if isinstance(i, _Sel))
        segs = tuple(self._segment(i) for i in items if isinstance(i, _Seg))
        first_end = sels[-1].span
        root = A.Segment("", sels, span=sels[0].span.cover(first_end))
        return A.Path((root,) + segs, span=self._span(meta))

    def _selector(self, sel: "_Sel") -> A.Selector:
        return sel.node(*sel.args, span=self._span(sel))

    def _segment(self, seg: "_Seg") -> A.Segment:
        return A.Segment(seg.text, tuple([self._selector(s) for s in seg.sels]), span=self._span(seg))

    def _canonical(self, meta, not_canonical: Any) -> str | None:
        """The rule's source text (shared), if it is what printing its node gives (`not_canonical` finds
        nothing in it) and its span packs short (one line); else None."""
        span = self._span(meta)
        if span.__class__ is int and span & 1:
            text = self.src.text[meta.first[START]:meta.last[END]]
            if not_canonical.search(text) is None:
                return intern(text)
        return None

    def act_kind(self, meta, items):
        return items[0][VALUE]

    def activation(self, meta, items):
        return A.Activation(items[0], items[1], span=self._span(meta))

    # specs -----------------------------------------------------------------------------
    def axis_entry(self, meta, items):
        return A.AxisEntry(items[0], span=self._span(meta))

    def axis_tuple(self, meta, items):
        return A.AxisTuple(tuple(items), span=self._span(meta))

    def replicated(self, meta, items):
        return A.Replicated(span=self._span(meta))

    def partial(self, meta, items):
        return tuple(items)

    def spec(self, meta, items):
        text = self._canonical(meta, self.canonical_spec)
        if text is not None:
            return A.Spec(text, None, span=self._span(meta))
        *entries, partial = items
        return A.Spec(self._present(entries), partial or (), span=self._span(meta))

    # statements -------------------------------------------------------------------------
    def use_alias(self, meta, items):
        return items[0]

    def use_stmt(self, meta, items):
        target, alias = items
        if type(target) is tuple:  # a STRING token
            target = A.Str(_unescape(target[VALUE]), text=target[VALUE], span=self._tspan(target))
        return A.Use(target, alias, span=self._span(meta))

    def kwarg(self, meta, items):
        return A.KwArg(items[0], items[1], span=self._span(meta))

    def call_args(self, meta, items):
        return self._present(items)

    def model_decl(self, meta, items):
        name, factory, args = items
        fac = A.Str(_unescape(factory[VALUE]), text=factory[VALUE], span=self._tspan(factory))
        return A.ModelDecl(name, fac, args, span=self._span(meta))

    def dim_decl(self, meta, items):
        return A.DimDecl(items[0], self._intnode(items[1]), span=self._span(meta))

    def input_decl(self, meta, items):
        name, dtype, *dims = items
        return A.InputDecl(name, dtype, self._present(dims), span=self._span(meta))

    def field_over(self, meta, items):
        return items[0]

    def field(self, meta, items):
        return A.Field(items[0], items[1], items[2], span=self._span(meta))

    def device_decl(self, meta, items):
        return A.DeviceDecl(items[0], self._present(items[1:]), span=self._span(meta))

    def link_decl(self, meta, items):
        return A.LinkDecl(items[0], self._present(items[1:]), span=self._span(meta))

    def mesh_count(self, meta, items):
        return self._intnode(items[0])

    def axis_link(self, meta, items):
        return items[0]

    def axis_decl(self, meta, items):
        return A.AxisDecl(items[0], items[1], items[2], span=self._span(meta))

    def mesh_decl(self, meta, items):
        name, count, device, *axes = items
        return A.MeshDecl(name, count, device, self._present(axes), span=self._span(meta))

    def mesh_alias(self, meta, items):
        return A.MeshAlias(items[0], items[1], span=self._span(meta))

    def per_device(self, meta, items):
        return True

    def budget_decl(self, meta, items):
        return A.BudgetDecl(items[0], bool(items[1]), span=self._span(meta))

    def optimizer_block(self, meta, items):
        return self._present(items)

    def optimizer_decl(self, meta, items):
        name, args, block = items
        return A.OptimizerDecl(name, args, block, span=self._span(meta))

    def data_decl(self, meta, items):
        return A.DataDecl(items[0], items[1], span=self._span(meta))

    def shard_stmt(self, meta, items):
        return A.ShardStmt(items[0], items[1], span=self._span(meta))

    def schedule_chunks(self, meta, items):
        return items[0]

    def schedule(self, meta, items):
        if isinstance(items[0], A.Hole):
            return items[0]
        tok, chunks = items
        return A.Schedule(A.Name(tok[VALUE], span=self._tspan(tok)), chunks, span=self._span(meta))

    def degree(self, meta, items):
        return A.Degree(items[0], items[1], span=self._span(meta))

    def stage_with(self, meta, items):
        return tuple(items)

    def stage_decl(self, meta, items):
        *paths, degrees = items
        return A.StageDecl(tuple(paths), degrees or (), span=self._span(meta))

    def stages(self, meta, items):
        return self._present(items)

    def stages_hole(self, meta, items):
        return items[0]

    def pipeline_decl(self, meta, items):
        axis, schedule, micro, stages = items
        return A.PipelineDecl(axis, schedule, micro, stages, span=self._span(meta))

    def microbatches_decl(self, meta, items):
        return A.MicrobatchesDecl(items[0], span=self._span(meta))

    def checkpoint_every(self, meta, items):
        return self._coerce_every(items[0])

    def checkpoint_stmt(self, meta, items):
        *paths, every = items
        return A.CheckpointStmt(tuple(paths), every, span=self._span(meta))

    def checkpoint_hole(self, meta, items):
        return A.CheckpointStmt(items[0], None, span=self._span(meta))

    def param(self, meta, items):
        return A.Param(items[0], items[1], span=self._span(meta))

    def block(self, meta, items):
        return self._present(items)

    def template_decl(self, meta, items):
        name, *rest = items
        body = rest[-1]
        params = self._present(rest[:-1])
        return A.TemplateDecl(name, params, body, span=self._span(meta))

    def template_args(self, meta, items):
        return self._present(items)

    def apply_stmt(self, meta, items):
        return A.ApplyStmt(items[0], items[1], items[2], span=self._span(meta))

    def for_stmt(self, meta, items):
        return A.ForStmt(items[0], items[1], items[2], span=self._span(meta))

    def start(self, meta, items):
        return A.Module(self._present(items), span=self._span(meta))
