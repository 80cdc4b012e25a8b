"""Checkpoint-group expansion, defined once: the plan's `checkpoint` statements as lists of module
names in execution order, for the checker's model rules, the estimator, the solver and the runtime.

`checkpoint h[*] every 2` is cut into consecutive runs of two of the selected modules; a statement in a
`for` body or a pattern (`per`) stands once for each module its scope matches, one group (or one run
of `every` groups) inside each; nested selections keep their outermost modules only.
"""
from __future__ import annotations

from typing import Iterable, Sequence

from .types import CheckpointGroup


def checkpoint_groups(checkpoints: Iterable[CheckpointGroup], names: Sequence[str],
                      order: Sequence[str]) -> list[list[str]]:
    """The groups of `checkpoints` over a model whose modules are `names`, run in `order`."""
    position = {n: i for i, n in enumerate(order)}
    groups: list[list[str]] = []
    for g in checkpoints:
        picked: list[str] = []
        for sel in g.modules:
            picked += [n for n in sel.select(list(names)) if n in position]
        picked = sorted(set(picked), key=position.__getitem__)
        picked = [n for n in picked if not any(n.startswith(o + ".") for o in picked)]  # outermost only
        if g.per is not None:
            scopes = [[n for n in picked if n == s or n.startswith(s + ".")] for s in g.per.select(list(names))]
            runs = [r for r in scopes if r]
        else:
            runs = [picked]
        for run in runs:
            if isinstance(g.every, int) and g.every >= 1:
                groups += [run[i:i + g.every] for i in range(0, len(run), g.every)]
            elif run:
                groups.append(run)
    return groups
