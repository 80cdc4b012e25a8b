"""The canonical formatter: one layout for every plan, comments included (``planlang fmt``).

The output is a pure function of the syntax tree, the comments and which statements were separated by
blank lines, so formatting is idempotent and never changes meaning: ``parse(format_text(x)).module ==
parse(x).module`` (spans and literal text take no part in AST equality).

Layout
------
* One statement or block item per line; ``;`` never appears in the output.
* Blocks (``device``/``link`` fields, ``mesh`` axes, ``optimizer`` fields, ``pipeline`` stages,
  ``template`` and ``for`` bodies) are always expanded, one item per line, indented 4 spaces::

      link ib {
          bandwidth = 25 GB/s
          latency = 5 us
      }

  A block with no items (and no comments inside) prints as ``{}``; a stages hole prints as
  ``pipeline over pp schedule 1f1b microbatches 8 { ? }`` on one line.
* Tokens: a single space around ``=`` and around ``:`` (``shard h[0] : [_, tp]``,
  ``input tokens : int64[batch = 8]``), except in template parameters (``t(m: axis)``) and slices (``h[0:6]``);
  ``, `` between list items and no trailing comma; ``x`` spaced in ``mesh c of 8 x gpu``; specs as
  ``[(dp, tp), _] partial(tp)``; paths with no spaces (``h[*].mlp``, ``[0].weight``, ``**.bias``,
  ``output of h[0].attn``); units without spaces (``300 GB/s``). Numbers and strings keep their literal
  text (``1_024``, ``3e-4``, ``"a\\"b"``).
* Long lines: a ``model`` argument list or an ``input`` dim list whose one-line form would exceed
  100 columns is wrapped, one argument per line, indented 4 spaces, with a trailing comma::

      model gpt = "examples.gpt:build"(
          n_layer = 48,
          ...,
      )

  Nothing else is ever wrapped. The decision depends only on the tree, so it is idempotent.
* Line ends are "\\n" and the text has no byte-order mark, whatever the input had ("\\r\\n", "\\r", a BOM).
* Blank lines: runs of blank lines collapse to one; whether the user had a blank line between two
  statements, block items or full-line comments is preserved, at every block level. There is never a
  blank line at the start of the file, right after ``{`` or right before ``}``. The file ends with exactly
  one newline (an empty plan formats to the empty string). No line has trailing whitespace.
* Alignment (gofmt style): within a run of consecutive ``shard`` statements at the same block level
  (a blank line or any other statement ends the run; full-line comments do not), the target is padded
  so that the `` : `` separators line up. Trailing comments on consecutive lines of the same block are
  aligned to one column, two spaces after the longest line of the run; a line without a trailing
  comment, a blank line or a nested block ends the run.

Comments
--------
Every comment survives, in source order, with its text as written (trailing whitespace stripped):

* a comment on the line where a statement or block item ends (after it) stays on that line as a
  trailing comment (two spaces, or more when aligned);
* a comment after a block's ``{`` on the block's first line stays on the ``... {`` line;
* a full-line comment is printed, on its own line, before the next statement or block item at its level
  (its leading comments), or before the closing ``}`` (or at the end of the file) when nothing follows;
* a comment in the middle of a construct (inside wrapped arguments, a list, a template's parameters,
  brackets of a path, ...) becomes a leading comment of that statement or block item.

The formatter works from the tree alone: comment placement and blank lines are recovered from spans
(line numbers), so :func:`format_module` needs no source text.
"""
from __future__ import annotations

import bisect
import difflib
from collections import defaultdict
from typing import Iterable, Sequence

from . import ast as A
from .diagnostics import Diagnostic
from .parser import no_cycle_collection, parse

__all__ = ["FormatError", "format_module", "format_text", "format_check", "unified_diff", "MAX_WIDTH"]

INDENT = "    "
MAX_WIDTH = 100
COMMENT_GAP = 2


class FormatError(Exception):
    """Raised by :func:`format_text` when the text does not parse; carries the syntax diagnostics."""

    def __init__(self, diagnostics: Iterable[Diagnostic]):
        self.diagnostics: tuple[Diagnostic, ...] = tuple(diagnostics)
        first = str(self.diagnostics[0]) if self.diagnostics else "syntax error"
        more = len(self.diagnostics) - 1
        super().__init__(first + (f" (and {more} more)" if more > 0 else ""))


# --------------------------------------------------------------------------------------------- public API
def format_module(module: A.Module) -> str:
    """Canonical text for a parsed module, comments included."""
    with no_cycle_collection():  # a line object per line of a big plan, and no cycles
        return _Formatter(module).run()


def format_text(text: str, path: str = "<plan>") -> str:
    """Parse `text` and format it. Raises :class:`FormatError` if it has syntax errors."""
    result = parse(text, path)
    if result.diagnostics:
        raise FormatError(result.diagnostics)
    return format_module(result.module)


def format_check(text: str, path: str = "<plan>") -> tuple[bool, str]:
    """(is `text` already canonical?, the canonical text). Raises :class:`FormatError` like `format_text`."""
    formatted = format_text(text, path)
    return formatted == text, formatted


def unified_diff(old: str, new: str, path: str = "<plan>") -> str:
    """A unified diff from `old` to `new` (empty when equal), every line newline-terminated."""
    out: list[str] = []
    for line in difflib.unified_diff(
        old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        fromfile=f"{path} (original)",
        tofile=f"{path} (formatted)",
    ):
        if line.endswith("\n"):
            out.append(line)
        else:  # the last line of a file without a final newline
            out.append(line + "\n\\ No newline at end of file\n")
    return "".join(out)


# --------------------------------------------------------------------------------------------- printing
def string_text(s: A.Str) -> str:
    """The literal as written; a tree built without text gets a double-quoted, escaped literal."""
    if s.text:
        return s.text
    body = s.value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return '"' + body + '"'


def value_text(v: A.Value) -> str:
    if isinstance(v, A.Quantity):
        return f"{value_text(v.number)} {v.unit.text}"
    if isinstance(v, A.Str):
        return string_text(v)
    if isinstance(v, (A.Int, A.Float)):
        return str(v)
    if isinstance(v, A.Ref):
        return dotted_text(v.name)
    if isinstance(v, A.Hole):
        return "?"
    if isinstance(v, A.ListValue):
        return "[" + ", ".join(value_text(i) for i in v.items) + "]"
    raise TypeError(f"not a value: {v!r}")


def dotted_text(d: A.Dotted) -> str:
    return ".".join(p.text for p in d.parts)


def path_text(p: A.Path) -> str:
    return A.path_text(p)


def target_text(t) -> str:
    if isinstance(t, A.Activation):
        return f"{t.kind} of {path_text(t.path)}"
    return path_text(t)


def spec_text(s) -> str:
    if isinstance(s, A.Hole):
        return "?"
    return A.spec_text(s)  # `[e, ...]` and ` partial(a, ...)`, from the text the parser kept if it did


def _hole_or(x) -> str:
    if x is None:
        return ""
    if isinstance(x, A.Hole):
        return "?"
    if isinstance(x, A.Name):
        return x.text
    if isinstance(x, A.Dotted):
        return dotted_text(x)
    return str(x)  # Int


def _kwargs(args: Sequence[A.KwArg]) -> list[str]:
    return [f"{a.name.text} = {value_text(a.value)}" for a in args]


def _field_text(f: A.Field) -> str:
    s = f"{dotted_text(f.key)} = {value_text(f.value)}"
    if f.over is not None:
        s += f" over {_hole_or(f.over)}"
    return s


def _axis_text(a: A.AxisDecl) -> str:
    s = f"{a.name.text} = {_hole_or(a.size)}"
    if a.link is not None:
        s += f" over {dotted_text(a.link)}"
    return s


def _schedule_text(s) -> str:
    if isinstance(s, A.Hole):
        return "?"
    out = s.name.text
    if s.chunks is not None:
        out += f" chunks {_hole_or(s.chunks)}"
    return out


def _stage_text(s: A.StageDecl) -> str:
    out = "stage " + ", ".join(path_text(p) for p in s.paths)
    if s.degrees:
        out += " with " + ", ".join(f"{d.axis.text} = {_hole_or(d.size)}" for d in s.degrees)
    return out


def _header_text(node) -> str:
    """The part of a block statement before its `{`."""
    if isinstance(node, A.DeviceDecl):
        return f"device {node.name.text}"
    if isinstance(node, A.LinkDecl):
        return f"link {node.name.text}"
    if isinstance(node, A.MeshDecl):
        count = "" if node.count is None else f"{node.count} x "
        return f"mesh {node.name.text} of {count}{dotted_text(node.device)}"
    if isinstance(node, A.OptimizerDecl):
        s = f"optimizer {node.name.text}"
        if node.args is not None:
            s += "(" + ", ".join(_kwargs(node.args)) + ")"
        return s
    if isinstance(node, A.PipelineDecl):
        return (
            f"pipeline over {_hole_or(node.axis)} schedule {_schedule_text(node.schedule)}"
            f" microbatches {_hole_or(node.microbatches)}"
        )
    if isinstance(node, A.TemplateDecl):
        params = ", ".join(f"{p.name.text}: {p.kind.text}" for p in node.params)
        return f"template {node.name.text}({params})"
    if isinstance(node, A.ForStmt):
        return f"for {node.var.text} in {path_text(node.selection)}"
    raise TypeError(f"not a block statement: {node!r}")


def _wrappable(node) -> tuple[str, list[str], str] | None:
    """(opener, items, closer) for statements that may wrap one item per line."""
    if isinstance(node, A.ModelDecl) and node.args:
        return f"model {node.name.text} = {string_text(node.factory)}(", _kwargs(node.args), ")"
    if isinstance(node, A.InputDecl) and node.dims:
        dims = [f"{d.name.text} = {d.size}" for d in node.dims]
        return f"input {node.name.text} : {node.dtype.text}[", dims, "]"
    return None


def line_text(node, shard_width: int = 0) -> str:
    """The one-line form of a statement or block item (block statements: their empty-block form)."""
    if isinstance(node, A.Use):
        tgt = string_text(node.target) if isinstance(node.target, A.Str) else dotted_text(node.target)
        return f"use {tgt}" + ("" if node.alias is None else f" as {node.alias.text}")
    if isinstance(node, A.ModelDecl):
        s = f"model {node.name.text} = {string_text(node.factory)}"
        if node.args is not None:
            s += "(" + ", ".join(_kwargs(node.args)) + ")"
        return s
    if isinstance(node, A.InputDecl):
        dims = ", ".join(f"{d.name.text} = {d.size}" for d in node.dims)
        return f"input {node.name.text} : {node.dtype.text}[{dims}]"
    if isinstance(node, A.MeshAlias):
        return f"mesh {node.name.text} = {dotted_text(node.target)}"
    if isinstance(node, A.BudgetDecl):
        return f"budget {value_text(node.amount)}" + (" per device" if node.per_device else "")
    if isinstance(node, A.MicrobatchesDecl):
        return f"microbatches {_hole_or(node.count)}"
    if isinstance(node, A.OptimizerDecl) and node.fields is None:
        return _header_text(node)
    if isinstance(node, A.DataDecl):
        return f"data {node.input.text} : {spec_text(node.spec)}"
    if isinstance(node, A.ShardStmt):
        head = f"shard {target_text(node.target)}"
        return f"{head.ljust(shard_width)} : {spec_text(node.spec)}"
    if isinstance(node, A.PipelineDecl) and isinstance(node.stages, A.Hole):
        return _header_text(node) + " { ? }"
    if isinstance(node, A.CheckpointStmt):
        if isinstance(node.paths, A.Hole):
            s = "checkpoint ?"
        else:
            s = "checkpoint " + ", ".join(path_text(p) for p in node.paths)
        if node.every is not None:
            s += f" every {_hole_or(node.every)}"
        return s
    if isinstance(node, A.ApplyStmt):
        s = f"apply {dotted_text(node.template)}"
        if node.args is not None:
            s += "(" + ", ".join(value_text(v) for v in node.args) + ")"
        return s + f" to {path_text(node.target)}"
    if isinstance(node, A.Field):
        return _field_text(node)
    if isinstance(node, A.AxisDecl):
        return _axis_text(node)
    if isinstance(node, A.StageDecl):
        return _stage_text(node)
    if _block_of(node) is not None:
        return _header_text(node) + " {}"
    raise TypeError(f"cannot format {type(node).__name__}")


def _block_of(node):
    """(items, the last header node) for a statement with a `{ }` block of items, else None."""
    if isinstance(node, (A.DeviceDecl, A.LinkDecl)):
        return node.fields, node.name
    if isinstance(node, A.MeshDecl):
        return node.axes, node.device
    if isinstance(node, A.OptimizerDecl) and node.fields is not None:
        return node.fields, (node.args[-1] if node.args else node.name)
    if isinstance(node, A.PipelineDecl) and not isinstance(node.stages, A.Hole):
        return node.stages, node.microbatches
    if isinstance(node, A.TemplateDecl):
        return node.body, (node.params[-1] if node.params else node.name)
    if isinstance(node, A.ForStmt):
        return node.body, node.selection
    return None


def _offsets(node) -> tuple[int, int]:
    """(start, end) of a node's span, read without building a `Span` (see `ast.pack_span`)."""
    return A.span_offsets(A.raw_span(node))


def _lines(node) -> tuple[int, int]:
    """(line, end_line) of a node's span, read without building a `Span`."""
    return A.span_lines(A.raw_span(node))


class _Index:
    """The items of one block (or the module) by position, for finding a comment's place in O(log n).
    Items of a parsed block follow each other without overlapping, so their starts, ends and end lines
    all increase; `ordered` is False otherwise (a hand-built tree) and the callers then scan."""

    def __init__(self, items: Sequence):
        self.items = items
        spans = [_offsets(it) for it in items]
        self.starts = [a for a, _ in spans]
        self.ends = [b for _, b in spans]
        self.end_lines = [_lines(it)[1] for it in items]
        self.ordered = all(
            self.starts[k] <= self.ends[k] <= self.starts[k + 1] and self.end_lines[k] <= self.end_lines[k + 1]
            for k in range(len(items) - 1)
        ) and all(self._header_inside(it, a, b) for it, a, b in zip(items, self.starts, self.ends))

    @staticmethod
    def _header_inside(it, start: int, end: int) -> bool:
        blk = _block_of(it)
        return blk is None or start <= _offsets(blk[1])[1] <= end

    def holding(self, pos: int):
        """The item whose span holds `pos` (the first such in order), or None."""
        if not self.ordered:
            return next((it for it, a, b in zip(self.items, self.starts, self.ends) if a <= pos < b), None)
        k = bisect.bisect_right(self.starts, pos) - 1
        # an empty span at `pos` does not hold it, but one before it may not either: ordered ends say no
        return self.items[k] if k >= 0 and pos < self.ends[k] else None

    def last_ending_by(self, pos: int):
        """The last item (in order) whose span ends at or before `pos`, or None."""
        if not self.ordered:
            return next((it for it, b in zip(reversed(self.items), reversed(self.ends)) if b <= pos), None)
        k = bisect.bisect_right(self.ends, pos) - 1
        return self.items[k] if k >= 0 else None

    def first_starting_after(self, pos: int):
        """The first item (in order) whose span starts after `pos`, or None."""
        if not self.ordered:
            return next((it for it, a in zip(self.items, self.starts) if a > pos), None)
        k = bisect.bisect_right(self.starts, pos)
        return self.items[k] if k < len(self.items) else None


# --------------------------------------------------------------------------------------------- comments
class _Placement:
    """Where each comment goes, found from spans: leading / interior / trailing / header / dangling.

    Keyed by node identity: the parser makes a fresh object for every node, so this is exact for parsed
    modules (hand-built trees carry no comments, so sharing nodes there is harmless)."""

    def __init__(self, module: A.Module):
        self.leading: dict[int, list[A.Comment]] = defaultdict(list)
        self.interior: dict[int, list[A.Comment]] = defaultdict(list)
        self.trailing: dict[int, A.Comment] = {}
        self.header: dict[int, A.Comment] = {}
        self.dangling: dict[int, list[A.Comment]] = defaultdict(list)
        self._indexes: dict[int, _Index] = {}  # id(container) -> its items by position
        comments = [(c.span, c) for c in module.comments]
        comments.sort(key=lambda sc: (sc[0].start, sc[0].line, sc[0].col))
        for span, c in comments:
            self._place(c, span, module)

    def _index(self, cont, items) -> _Index:
        index = self._indexes.get(id(cont))
        if index is None:
            index = self._indexes[id(cont)] = _Index(items)
        return index

    def _place(self, c: A.Comment, span, module: A.Module) -> None:
        pos, line = span.start, span.line
        cont: A.Node = module
        items: Sequence[A.Node] = module.statements
        head_line: int | None = None
        while True:  # find the innermost block holding the comment
            index = self._index(cont, items)
            candidates: Sequence[A.Node]
            if index.ordered:  # the only item whose span can hold `pos`
                it = index.holding(pos)
                candidates = () if it is None else (it,)
            else:
                candidates = items
            for it in candidates:
                blk = _block_of(it)
                if blk is not None and _offsets(blk[1])[1] <= pos < _offsets(it)[1]:
                    cont, items, head_line = it, blk[0], _lines(blk[1])[1]
                    break
            else:
                break
        index = self._index(cont, items)
        it = index.holding(pos)
        if it is not None:
            self.interior[id(it)].append(c)
            return
        # the items ending on the comment's line before it: the last item ending before it, if on that line
        last = index.last_ending_by(pos)
        if not index.ordered or (last is not None and _lines(last)[1] > line):  # not a parsed tree: scan
            before = [it for it in items if _offsets(it)[1] <= pos and _lines(it)[1] == line]
            last = before[-1] if before else None
        elif last is not None and _lines(last)[1] != line:
            last = None
        if last is not None and id(last) not in self.trailing:
            self.trailing[id(last)] = c
            return
        if head_line is not None and line == head_line and id(cont) not in self.header and last is None:
            self.header[id(cont)] = c
            return
        it = index.first_starting_after(pos)
        if it is not None:
            self.leading[id(it)].append(c)
            return
        self.dangling[id(cont)].append(c)


# --------------------------------------------------------------------------------------------- layout
_BLANK = ("blank", None)


class _Formatter:
    def __init__(self, module: A.Module):
        self.module = module
        self.where = _Placement(module)
        self.out: list[str] = []  # finished lines
        # the run of lines with trailing comments not yet written, and its group: consecutive lines of one
        # block with trailing comments have them aligned, two spaces after the longest line
        self._run: list[tuple[str, str]] = []
        self._run_group = 0
        self._groups = 0

    def run(self) -> str:
        self._items(self.module, self.module.statements, 0)
        self._flush()
        out = self.out
        return "\n".join(out) + "\n" if out else ""

    # ------------------------------------------------------------------ output
    def _new_group(self) -> int:
        self._groups += 1
        return self._groups

    def _emit(self, level: int, code: str, group: int, comment: A.Comment | None = None) -> None:
        """Write a line (`code` "" for a blank one), lines with a trailing comment by runs."""
        text = (INDENT * level + code) if code else ""
        if comment is None:
            self._flush()
            self.out.append(text.rstrip())
            return
        if self._run and group != self._run_group:
            self._flush()
        self._run.append((text, _ctext(comment)))
        self._run_group = group

    def _flush(self) -> None:
        run = self._run
        if run:
            col = max(len(text) for text, _ in run) + COMMENT_GAP
            self.out += [text.ljust(col) + comment for text, comment in run]
            run.clear()

    # ------------------------------------------------------------------ blocks
    def _items(self, cont, items: Sequence, level: int) -> None:
        """Emit the items of one block (or the module) with their comments and blank lines."""
        where = self.where
        group = self._new_group()
        entries: list[tuple[str, object]] = []
        prev = 0
        first = True

        def gap(line: int) -> None:
            nonlocal prev, first
            if not first and line - prev > 1:
                entries.append(_BLANK)

        for it in items:
            for c in where.leading.get(id(it), ()):
                c_line = _lines(c)[0]
                gap(c_line)
                entries.append(("comment", c))
                prev, first = c_line, False
            it_line, it_end_line = _lines(it)
            gap(it_line)
            for c in where.interior.get(id(it), ()):
                entries.append(("comment", c))
            entries.append(("item", it))
            prev, first = it_end_line, False
        for c in where.dangling.get(id(cont), ()):
            c_line = _lines(c)[0]
            gap(c_line)
            entries.append(("comment", c))
            prev, first = c_line, False

        # gofmt-style alignment of `shard ... : spec` runs (widths by entry index)
        widths = [0] * len(entries)
        run: list[tuple[int, A.ShardStmt]] = []  # (entry index, its statement)

        def flush() -> None:
            w = max((len("shard " + target_text(stmt.target)) for _, stmt in run), default=0)
            for k, _ in run:
                widths[k] = w
            run.clear()

        for k, (kind, x) in enumerate(entries):
            if kind == "item" and isinstance(x, A.ShardStmt):
                run.append((k, x))
            elif kind in ("blank", "item"):
                flush()
        flush()

        for k, (kind, x) in enumerate(entries):
            if kind == "blank":
                self._emit(0, "", group)
            elif isinstance(x, A.Comment):  # kind "comment"
                self._emit(level, _ctext(x), group)
            else:
                self._item(x, level, group, widths[k])

    def _item(self, node, level: int, group: int, shard_width: int) -> None:
        where = self.where
        trailing = where.trailing.get(id(node))
        blk = _block_of(node)
        if blk is not None:
            items = blk[0]
            header = where.header.get(id(node))
            if not items and header is None and not where.dangling.get(id(node)):
                self._emit(level, _header_text(node) + " {}", group, trailing)
                return
            self._emit(level, _header_text(node) + " {", group, header)
            self._items(node, items, level + 1)
            self._emit(level, "}", group, trailing)
            return
        one = line_text(node, shard_width)
        wrap = _wrappable(node)
        if wrap is not None and len(INDENT * level + one) > MAX_WIDTH:
            opener, parts, closer = wrap
            self._emit(level, opener, group)
            inner = self._new_group()
            for p in parts:
                self._emit(level + 1, p + ",", inner)
            self._emit(level, closer, group, trailing)
            return
        self._emit(level, one, group, trailing)


def _ctext(c: A.Comment) -> str:
    return c.text.rstrip()
