"""Lowered programs shared between the plans one caller lowers in a row (the solver's candidates).

`lower(graph, plan)` (planlang.model.program.lowering) reads of the plan only its mesh, its `shard` rules,
its `data` specs, its inputs and its data axes (`plan.dims.batch`) — never its checkpoint groups, ZeRO
stage, pipeline stages, schedule or microbatch count (a pipeline's program is lowered for one microbatch:
the count is in the inputs' shapes and the graph). Candidates that differ only there lower to the same
program: inside `shared_lowerings(cache)` each such program is lowered once and every caller gets its own
shallow copy (the fields a caller sets, `checkpoint_groups`, are its own; the instructions, layouts and
graph are shared and read-only). Outside such a scope `lower` lowers afresh, as it always did.

The cache keeps the few most recently used programs (a program of a large model is megabytes; the
candidates that share one are priced one after another: a mesh's schedules, a refined mesh's ZeRO
stages, partitions and checkpoint groups).
"""
from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

# the lowering's Program, by a type variable: lowering imports this module, which must not import it back
Program = TypeVar("Program")

__all__ = ["SharedLowerings", "active", "shared_lowerings"]


class SharedLowerings:
    """The programs lowered in a scope, by what the lowering reads (`key`), the `size` most recently
    used kept; `hits` and `misses` count the lowerings shared and made."""

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self._entries: OrderedDict[tuple, tuple[Any, Any]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key(plan) -> tuple | None:
        """What `lower` reads of `plan` besides the graph; None when it does not hash (lowered afresh)."""
        try:
            key = (plan.mesh, plan.shards, plan.data, plan.inputs, plan.dims.batch)
            hash(key)
        except TypeError:
            return None
        return key

    def lower(self, graph, plan, lower: Callable[[Any, Any], Program]) -> Program:
        key = self.key(plan)
        if key is None:
            return lower(graph, plan)
        key = (id(graph),) + key
        got = self._entries.get(key)
        if got is not None and got[0] is graph:  # the same graph object (its id is not reused while kept)
            self._entries.move_to_end(key)
            self.hits += 1
            prog = got[1]
        else:
            prog = lower(graph, plan)
            self.misses += 1
            self._entries[key] = (graph, prog)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
        return _copy(prog)


def _copy(prog: Program) -> Program:
    """A program of its own for the caller: the same instructions, layouts and graph (read-only), its
    own `checkpoint_groups` (callers set them: lowering.mark_checkpoints)."""
    return dataclasses.replace(prog, checkpoint_groups=list(prog.checkpoint_groups))  # type: ignore


_SCOPE: ContextVar[SharedLowerings | None] = ContextVar("planlang shared lowerings", default=None)


def active() -> SharedLowerings | None:
    """The scope's cache (None outside `shared_lowerings`)."""
    return _SCOPE.get()


@contextmanager
def shared_lowerings(cache: SharedLowerings) -> Iterator[SharedLowerings]:
    """Within this block `lowering.lower` shares its programs through `cache`."""
    token = _SCOPE.set(cache)
    try:
        yield cache
    finally:
        _SCOPE.reset(token)
