"""A `checkpoint ?` hole's choice as the plan's value: `checkpoint` groups built from module names as
selections (never text parsed back); their text is printed once, when the plan is written
(planlang.solve.holes.written)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from planlang.plan import types as T
from planlang.plan.selection import Sel, SelSegment, Selection


@dataclass(frozen=True)
class Checkpoints:
    """A `checkpoint ?` hole's choice, as the plan's value: its groups (`checkpoint` statements; none: no
    recomputation). Printed as the plan writes it (planlang.solve.holes.written), never parsed back."""

    groups: tuple[T.CheckpointGroup, ...] = ()

    def __str__(self) -> str:
        return "; ".join(str(g) for g in self.groups) or "none"

    def __bool__(self) -> bool:
        return bool(self.groups)


def module_selection(name: str) -> Selection:
    """A torch module name as a plan selection: `h.0.attn` -> h[0].attn (a number indexes the container
    before it)."""
    segs: list[SelSegment] = []
    for part in name.split("."):
        if part.isdigit() and segs:
            segs[-1] = SelSegment(segs[-1].name, segs[-1].sels + (Sel("index", int(part)),))
        else:
            segs.append(SelSegment(part))
    return Selection(tuple(segs))


def range_selection(container: str, a: int, b: int) -> Selection:
    """Items a..b-1 of a numbered container: h[a:b] (h[a] for one)."""
    base = module_selection(container)
    last = base.segments[-1]
    sel = Sel("index", a) if b == a + 1 else Sel("slice", a, b)
    return Selection(base.segments[:-1] + (SelSegment(last.name, last.sels + (sel,)),))


def group_selections(group: Sequence[str]) -> tuple[Selection, ...]:
    """One checkpoint group's modules as selections: consecutive items of one container as a range
    (`h.2`, `h.3`, `h.4` -> h[2:5])."""
    parts: list[Selection] = []
    run: tuple[str, int, int] | None = None  # container, first index, next index
    for name in group:
        head, _, last = name.rpartition(".")
        if last.isdigit() and head and run and head == run[0] and int(last) == run[2]:
            run = (run[0], run[1], run[2] + 1)
            continue
        if run:
            parts.append(range_selection(*run))
            run = None
        if last.isdigit() and head:
            run = (head, int(last), int(last) + 1)
        else:
            parts.append(module_selection(name))
    if run:
        parts.append(range_selection(*run))
    return tuple(parts)


def checkpoint_value(groups: Sequence[Sequence[str]]) -> Checkpoints:
    """Groups of module names as `checkpoint` statements (values)."""
    return Checkpoints(tuple(T.CheckpointGroup(group_selections(g)) for g in groups))


def every_value(head: str, a: int, b: int, k: int | None) -> Checkpoints:
    """`checkpoint head[a:b] every k`, as a value."""
    return Checkpoints((T.CheckpointGroup((range_selection(head, a, b),), k),))


def star_value(head: str, k: int | None) -> Checkpoints:
    """`checkpoint head[*] every k` (every k blocks; k None: the blocks as one group)."""
    base = module_selection(head)
    last = base.segments[-1]
    sel = Selection(base.segments[:-1] + (SelSegment(last.name, last.sels + (Sel("star"),)),))
    return Checkpoints((T.CheckpointGroup((sel,), k),))
