"""Writing a solved plan back, once, at the end of the search: each hole's `?` replaced by text the
language reads, in the user's file, then formatted (comments and every fixed choice kept as written).

A `Fill` carries both forms of one choice: `value`, what the search substitutes into the plan value it
prices (planlang.solve.substitute), and `text`, what is written for it here. `edits` are the changes a
set of fills makes to the file: two candidates with the same edits are the same plan (the search prices
it once)."""
from __future__ import annotations

from dataclasses import dataclass

from planlang.lang.fmt import format_text
from planlang.plan import types as T


class HoleOutsidePlan(ValueError):
    """A hole sits in a `use`d file or template the solver does not rewrite."""


@dataclass(frozen=True)
class Fill:
    hole: T.Hole
    text: str  # replaces the `?`; "" with `drop_line` removes the statement
    drop_line: str = ""  # a comment written instead of the hole's statement (e.g. no checkpointing)
    value: object = None  # what the hole holds in the plan value (an int, an axis, a Spec, stages, groups)


def edits(source: str, path: str, fills: list[Fill]) -> dict[tuple[int, int], Fill]:
    """Where each fill goes in `source`: the offsets of its `?` -> the fill (a `?` a template or loop
    expands into several holes is one edit)."""
    out: dict[tuple[int, int], Fill] = {}
    for f in fills:
        sp = f.hole.span
        q = source.rfind("?", sp.start, sp.end) if sp.file == path else -1  # a statement-wide span: its `?`
        if q < 0:
            raise HoleOutsidePlan(f"a hole at {sp} is not in {path}; write its value there or move the `?` "
                                  "into the plan file")
        out[(q, q + 1)] = f  # holes shared through a template expand once
    return out


def edit_key(source: str, path: str, fills: list[Fill]) -> tuple:
    """What the text written for these fills depends on (equal keys, equal texts)."""
    return tuple((at, f.text, f.drop_line) for at, f in sorted(edits(source, path, fills).items()))


def fill_holes(source: str, path: str, fills: list[Fill], header: list[str] | None = None) -> str:
    """`source` with every fill applied (right to left by offset), formatted, with `header` comment
    lines after the file's leading comment block."""
    text = source
    for (start, end), f in sorted(edits(source, path, fills).items(), reverse=True):
        if f.drop_line:
            line_start = text.rfind("\n", 0, start) + 1
            line_end = text.find("\n", end)
            line_end = len(text) if line_end < 0 else line_end
            line = text[line_start:line_end]
            indent = line[:len(line) - len(line.lstrip())]
            text = text[:line_start] + indent + f"# {f.drop_line}" + text[line_end:]
        else:
            text = text[:start] + f.text + text[end:]
    text = format_text(text, path)
    if header:
        lines = text.split("\n")
        k = 0
        while k < len(lines) and lines[k].startswith("#"):
            k += 1
        text = "\n".join(lines[:k] + [f"# {h}" if h else "#" for h in header] + lines[k:])
    return text
