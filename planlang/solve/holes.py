"""Writing a solved plan back, once, at the end of the search: each hole's `?` replaced by text the
language reads, in the user's file, then formatted (comments and every fixed choice kept as written).

A `Fill` is one hole's choice as a value (`value`: what the search substitutes into the plan value it
prices, planlang.solve.substitute: an int, an axis, a `Spec`, a spec entry's axes, stages, groups); its
text is printed here, once, when the plan is written (`written`). A candidate is named by its holes and
their values (`edit_key`), not by text: two candidates that give every hole the same value are the same
plan (the search prices it once)."""
from __future__ import annotations

from dataclasses import dataclass

from planlang.lang.fmt import format_text
from planlang.plan import types as T



class HoleOutsidePlan(ValueError):
    """A hole sits in a `use`d file or template the solver does not rewrite."""


@dataclass(frozen=True)
class Fill:
    hole: T.Hole
    value: object = None  # what the hole holds in the plan value (an int, an axis, a Spec, stages, groups)
    # the text that replaces the `?` when the value's own is not it (stages, checkpoint groups); "" with
    # `drop_line` removes the statement
    text: str | None = None
    drop_line: str = ""  # a comment written instead of the hole's statement (e.g. no checkpointing)


def written(f: Fill) -> str:
    """The text a fill writes in place of its `?`: a spec as the language writes it, a spec entry's
    axes (`_`, `tp`, `(dp, tp)`), a number or a name."""
    if f.text is not None:
        return f.text
    if isinstance(f.value, tuple) and f.value and all(isinstance(g, T.CheckpointGroup) for g in f.value):
        # `checkpoint ?` -> the first statement's modules, then each other statement on a line of its own
        return "\ncheckpoint ".join(str(g)[len("checkpoint "):] for g in f.value)
    if isinstance(f.value, tuple) and all(isinstance(a, str) for a in f.value):
        return axes_text(f.value)
    return str(f.value)


def axes_text(axes: tuple[str, ...]) -> str:
    """A spec entry: `_`, an axis, or a tuple of axes (major to minor)."""
    return "_" if not axes else axes[0] if len(axes) == 1 else "(" + ", ".join(axes) + ")"


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


def candidate_key(path: str, fills: list[Fill]) -> tuple:
    """A candidate's identity: each hole (where it is written: a `?` a template or loop expands into
    several holes is one) with its value (equal keys, equal plans, equal texts). Raises HoleOutsidePlan
    for a hole outside the plan file, which the search cannot write."""
    out: dict[tuple[str, int, int], tuple] = {}
    for f in fills:
        sp = f.hole.span
        if sp.file != path:
            raise HoleOutsidePlan(f"a hole at {sp} is not in {path}; write its value there or move the `?` "
                                  "into the plan file")
        out[(sp.file, sp.start, sp.end)] = (f.value, f.text, f.drop_line)
    return tuple(sorted(out.items(), key=lambda kv: kv[0]))


def edit_key(source: str, path: str, fills: list[Fill]) -> tuple:
    """`candidate_key` (the source is not read: the key is the holes' values, not text)."""
    return candidate_key(path, fills)


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
            text = text[:start] + written(f) + text[end:]
    text = format_text(text, path)
    if header:
        lines = text.split("\n")
        k = 0
        while k < len(lines) and lines[k].startswith("#"):
            k += 1
        text = "\n".join(lines[:k] + [f"# {h}" if h else "#" for h in header] + lines[k:])
    return text
