"""textDocument/semanticTokens/full: what each word of a plan is.

The syntax tree says what names are (an axis, a module path, a template, ...); a small lexical scan
supplies what the tree does not keep (keywords, comments, strings, numbers, holes). Keywords are soft
(`output` may be a module), so a word is a keyword only where the tree has no name there. A text that
does not parse gets the lexical tokens only.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

from lsprotocol import types as L

from planlang.lang import ast as A
from planlang.lang.lexical import scan

from .analysis import Analysis
from .keywords import KEYWORDS
from .positions import UTF16, LineIndex, code_units, units_len
from .symbols import walk

TOKEN_TYPES = ["keyword", "namespace", "type", "function", "parameter", "variable", "property", "number",
               "string", "comment", "operator", "enumMember"]
TOKEN_MODIFIERS = ["declaration", "defaultLibrary"]
LEGEND = L.SemanticTokensLegend(TOKEN_TYPES, TOKEN_MODIFIERS)
DECLARATION = 1

@dataclass(frozen=True, order=True)
class Token:
    start: int  # character offsets
    end: int
    type: str
    modifiers: int = 0

    def __str__(self) -> str:
        return f"{self.start}-{self.end} {self.type}"


def tree_tokens(module: A.Module) -> list[Token]:
    """Tokens for the names the syntax tree classifies."""
    out: list[Token] = []

    def name(n, kind, mods=0):
        if n is not None and isinstance(n, A.Name) and n.span.line >= 1:
            out.append(Token(n.span.start, n.span.end, kind, mods))

    def dotted(d, last_kind):
        if not isinstance(d, A.Dotted):
            return
        for i, p in enumerate(d.parts):
            name(p, last_kind if i == len(d.parts) - 1 else "namespace")

    for node, chain in walk(module):
        loopvars = {n.var.text for n in chain if isinstance(n, A.ForStmt)}
        if isinstance(node, A.Use):
            if isinstance(node.target, A.Dotted):
                dotted(node.target, "namespace")
            name(node.alias, "namespace", DECLARATION)
        elif isinstance(node, A.ModelDecl):
            name(node.name, "type", DECLARATION)
        elif isinstance(node, A.InputDecl):
            name(node.name, "parameter", DECLARATION)
            name(node.dtype, "type")
        elif isinstance(node, A.DataDecl):
            name(node.input, "parameter")
        elif isinstance(node, (A.DeviceDecl, A.LinkDecl)):
            name(node.name, "type", DECLARATION)
        elif isinstance(node, A.Field):
            for p in node.key.parts:
                name(p, "property")
            name(node.over, "variable")
        elif isinstance(node, A.MeshDecl):
            name(node.name, "type", DECLARATION)
            dotted(node.device, "type")
        elif isinstance(node, A.MeshAlias):
            name(node.name, "type", DECLARATION)
            dotted(node.target, "type")
        elif isinstance(node, A.AxisDecl):
            name(node.name, "variable", DECLARATION)
            dotted(node.link, "type")
        elif isinstance(node, A.AxisEntry):
            name(node.axis, "variable")
        elif isinstance(node, A.AxisTuple):
            for a in node.axes:
                name(a, "variable")
        elif isinstance(node, A.Spec):
            for a in node.partial:
                name(a, "variable")
        elif isinstance(node, A.Degree):
            name(node.axis, "variable")
        elif isinstance(node, A.PipelineDecl):
            name(node.axis if isinstance(node.axis, A.Name) else None, "variable")
        elif isinstance(node, A.Schedule):
            name(node.name, "enumMember")
        elif isinstance(node, A.OptimizerDecl):
            name(node.name, "enumMember")
        elif isinstance(node, A.TemplateDecl):
            name(node.name, "function", DECLARATION)
        elif isinstance(node, A.Param):
            name(node.name, "parameter", DECLARATION)
            name(node.kind, "type")
        elif isinstance(node, A.ApplyStmt):
            dotted(node.template, "function")
            for arg in node.args or ():
                if isinstance(arg, A.Ref) and len(arg.name.parts) == 1:
                    name(arg.name.parts[0], "variable")
        elif isinstance(node, A.ForStmt):
            name(node.var, "parameter", DECLARATION)
        elif isinstance(node, A.CheckpointStmt) and isinstance(node.every, A.Name):
            name(node.every, "parameter")
        elif isinstance(node, A.Path):
            for i, seg in enumerate(node.segments):
                if seg.name and seg.span.line >= 1:
                    kind = "parameter" if i == 0 and seg.name in loopvars and not seg.selectors else "property"
                    out.append(Token(seg.span.start, seg.span.start + len(seg.name), kind))
        elif isinstance(node, A.Unit) and node.span.line >= 1:
            out.append(Token(node.span.start, node.span.end, "number"))
        elif isinstance(node, A.Hole) and node.span.line >= 1:
            out.append(Token(node.span.start, node.span.end, "operator"))
    return out


def lexical_tokens(text: str) -> list[Token]:
    """Keywords, comments, strings, numbers and holes, from the scanner the parser's recovery uses too
    (`planlang.lang.lexical.scan`)."""
    out = []
    for kind, start, end in scan(text):
        if kind == "word":
            if text[start:end] in KEYWORDS:
                out.append(Token(start, end, "keyword"))
        elif kind == "hole":
            out.append(Token(start, end, "operator"))
        elif kind != "bracket":
            out.append(Token(start, end, kind))
    return out


def tokens(analysis: Analysis) -> list[Token]:
    """Every classified token, in order, none overlapping: the tree's, then lexical ones in the gaps."""
    tree = sorted(set(tree_tokens(analysis.module))) if analysis.parses else []
    covered = [(t.start, t.end) for t in tree]
    out = list(tree)
    starts = [c[0] for c in covered]
    for t in lexical_tokens(analysis.text):
        i = bisect.bisect_right(starts, t.start) - 1
        if i >= 0 and covered[i][0] <= t.start < covered[i][1]:
            continue
        j = bisect.bisect_left(starts, t.start)
        if j < len(covered) and covered[j][0] < t.end:
            continue
        out.append(t)
    return sorted(out)


def encode(text: str, toks: list[Token], encoding: str = UTF16) -> list[int]:
    """The LSP integer encoding: per token (delta line, delta start, length, type, modifiers), with
    columns and lengths in the position encoding's code units. Tokens never span lines, nor cover a
    line end (a comment on a "\\r\\n" line stops before the "\\r"). `toks` are in order, so each column
    is counted on from the previous token's on the same line: linear in the text (counted from the
    line's start each time, a 36 KB line took minutes)."""
    data: list[int] = []
    prev_line = prev_col = 0
    index = LineIndex(text, encoding)
    line_starts, line_ends = index.starts, index.ends
    kinds = {t: i for i, t in enumerate(TOKEN_TYPES)}
    line, next_start = -1, 0  # the current line, and where the next one starts
    counted, col = 0, 0  # `col` code units on the line up to offset `counted` (the last token's end)
    for t in toks:
        if line < 0 or not line_starts[line] <= t.start < next_start:
            line = bisect.bisect_right(line_starts, t.start) - 1
            next_start = line_starts[line + 1] if line + 1 < len(line_starts) else len(text) + 1
            counted, col = line_starts[line], 0
        end = min(t.end, line_ends[line])
        if end <= t.start:
            continue
        start_col = col + units_len(text[counted:t.start], encoding)
        length = units_len(text[t.start:end], encoding)
        counted, col = end, start_col + length
        delta_col = start_col - prev_col if line == prev_line else start_col
        data += [line - prev_line, delta_col, length, kinds[t.type], t.modifiers]
        prev_line, prev_col = line, start_col
    return data


def semantic_tokens(analysis: Analysis, encoding: str = UTF16) -> L.SemanticTokens:
    return L.SemanticTokens(data=encode(analysis.text, tokens(analysis), encoding))


def decode(text: str, data: list[int], encoding: str = UTF16) -> list[tuple[int, int, str, str, int]]:
    """(line, column in code units, text, type, modifiers) for each encoded token: the inverse of
    `encode`, for tests and debugging. Like `encode`, each column is counted on from the token before on
    the same line (from the line's start each time, 700 tokens on a 20 KB line took 18 s)."""
    index = LineIndex(text, encoding)
    out, line, col = [], 0, 0
    at, at_units = 0, 0  # offset on the current line, and its column in code units
    for i in range(0, len(data), 5):
        dl, dc, length, typ, mods = data[i:i + 5]
        line += dl
        col = col + dc if dl == 0 else dc
        if dl != 0 or i == 0:
            at, at_units = index.starts[line] if line < len(index.starts) else len(text), 0
        start, at_units = _advance(text, at, at_units, col, encoding)
        end, _ = _advance(text, start, col, col + length, encoding)
        at = start
        out.append((line, col, text[start:end], TOKEN_TYPES[typ], mods))
    return out


def _advance(text: str, offset: int, units: int, want: int, encoding: str) -> tuple[int, int]:
    """From `offset` (at `units` code units on its line) to the offset at `want` units (not past a line end)."""
    while units < want and offset < len(text) and text[offset] not in "\r\n":
        units += code_units(text[offset], encoding)
        offset += 1
    return offset, units
