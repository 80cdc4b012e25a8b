"""Writing a solved plan back: each hole's `?` replaced by text the language reads, in the user's file,
then formatted (comments and every fixed choice kept as written)."""
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


def fill_holes(source: str, path: str, fills: list[Fill], header: list[str] | None = None) -> str:
    """`source` with every fill applied (right to left by offset), formatted, with `header` comment
    lines after the file's leading comment block."""
    edits: dict[tuple[int, int], Fill] = {}
    for f in fills:
        sp = f.hole.span
        q = source.rfind("?", sp.start, sp.end) if sp.file == path else -1  # a statement-wide span: its `?`
        if q < 0:
            raise HoleOutsidePlan(f"a hole at {sp} is not in {path}; write its value there or move the `?` "
                                  "into the plan file")
        edits[(q, q + 1)] = f  # holes shared through a template expand once
    text = source
    for (start, end), f in sorted(edits.items(), reverse=True):
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
