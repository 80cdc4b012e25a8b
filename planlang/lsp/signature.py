"""textDocument/signatureHelp: a template's parameters while its `apply NAME(` arguments are typed.

Read from the text (the line being typed rarely parses): the `apply DOTTED(` whose parenthesis is still
open at the cursor, the argument under the cursor counted by the commas before it; the template is
looked up the way go-to-definition finds it (symbols.lookup), in the analyses standing in for the text.
"""
from __future__ import annotations

import re

from lsprotocol import types as L

from planlang.lang import ast as A
from planlang.lang.lexical import code_of

from .analysis import Analysis
from .symbols import lookup

APPLY = re.compile(r"\bapply\s+([A-Za-z_][A-Za-z0-9_]*(?:\s*\.\s*[A-Za-z_][A-Za-z0-9_]*)*)\s*\(")
MAX_LOOKBACK = 2000  # characters before the cursor an argument list may span (it may wrap lines)


def open_apply(text: str, offset: int) -> tuple[str, int] | None:
    """The template name of the `apply NAME(` whose `(` is open at `offset`, and the argument index."""
    start = max(0, offset - MAX_LOOKBACK)
    # comments blanked line by line, so a `(` or `,` in a comment does not count
    before = "\n".join(code_of(line) for line in text[start:offset].split("\n"))
    best = None
    for m in APPLY.finditer(before):
        best = m
    if best is None:
        return None
    args = before[best.end():]
    depth, commas = 0, 0
    for ch in args:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            if depth == 0:
                return None  # closed before the cursor
            depth -= 1
        elif ch == "," and depth == 0:
            commas += 1
    return re.sub(r"\s+", "", best.group(1)), commas


def signature_help(text: str, offset: int, refs: list[Analysis]) -> L.SignatureHelp | None:
    found = open_apply(text, offset)
    if found is None:
        return None
    name, active = found
    for ref in refs:
        place = lookup(ref, name.split("."))
        if place is None or not isinstance(place.node, A.TemplateDecl):
            continue
        t = place.node
        params = [f"{p.name.text}: {p.kind.text}" for p in t.params]
        label = f"template {t.name.text}(" + ", ".join(params) + ")"
        infos, pos = [], len(f"template {t.name.text}(")
        for p in params:
            infos.append(L.ParameterInformation(label=(pos, pos + len(p))))
            pos += len(p) + 2
        sig = L.SignatureInformation(label=label, parameters=infos,
                                     documentation=f"declared in {place.path}:{place.span.line}")
        return L.SignatureHelp(signatures=[sig], active_signature=0,
                               active_parameter=min(active, max(0, len(params) - 1)))
    return None
