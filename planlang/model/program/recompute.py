"""Checkpoint wrappers shared by the estimator (planlang.model.price.estimate) and the pipeline runtime
(planlang.runtime.pipeline): how a plan's checkpoint group becomes non-reentrant torch.utils.checkpoint."""
from __future__ import annotations

from typing import Sequence

import contextlib
import threading

import torch
import torch.utils.checkpoint as cp
from planlang.model.capture.autocast import active_meta_autocast


_recomputing = threading.local()


def is_recomputing() -> bool:
    """Whether the forward running now is a checkpoint's recomputation (in backward). State that forward
    updates once per step (BatchNorm's running statistics) must not be updated again there: one process,
    which recomputes nothing, updates it once."""
    return getattr(_recomputing, "depth", 0) > 0


@contextlib.contextmanager
def _recomputation():
    _recomputing.depth = getattr(_recomputing, "depth", 0) + 1
    try:
        yield
    finally:
        _recomputing.depth -= 1


class _RecomputeContext:
    """Around a recomputation: `is_recomputing`'s mark and the meta autocast `meta` (or none). Entered
    anew each time: a split backward (the zero_bubble schedule's input gradient, then its weight gradient
    with the graph retained) recomputes a checkpoint once in each, and a generator's context manager can
    be entered only once."""

    def __init__(self, meta) -> None:
        self.meta = meta
        self._open: list[contextlib.ExitStack] = []

    def __enter__(self) -> None:
        stack = contextlib.ExitStack()
        stack.enter_context(_recomputation())
        if self.meta is not None:
            stack.enter_context(self.meta.recompute_context())
        self._open.append(stack)

    def __exit__(self, *exc) -> bool | None:
        return self._open.pop().__exit__(*exc)


def _contexts():
    """checkpoint's `context_fn`: nothing around the forward; around the recomputation, which backward
    runs outside any torch-function mode, the meta autocast the forward ran under (torch's checkpoint
    re-enters a real torch.autocast by itself), and the mark `is_recomputing` reads."""
    return contextlib.nullcontext(), _RecomputeContext(active_meta_autocast())


def checkpoint(fn, *args, **kwargs):
    """torch.utils.checkpoint, non-reentrant, whose recomputation casts as its forward did (`_contexts`)."""
    return cp.checkpoint(fn, *args, use_reentrant=False, context_fn=_contexts, **kwargs)


def wrap_chain(mods: Sequence[torch.nn.Module]) -> None:
    """Modules called one after another on a single tensor (blocks of a ModuleList): the first runs the
    whole chain under one checkpoint, the others pass their input through (recomputed as one group)."""

    def run_chain(x, _fwds=tuple(m.forward for m in mods)):
        for f in _fwds:
            x = f(x)
        return x

    mods[0].forward = lambda x, _run=run_chain: checkpoint(_run, x)
    for m in mods[1:]:
        m.forward = lambda x: x


def wrap_each(mods: Sequence[torch.nn.Module]) -> None:
    """Every module checkpointed on its own (a group whose modules take more than one tensor)."""

    for m in mods:
        m.forward = (lambda f: lambda *a, **k: checkpoint(f, *a, **k))(m.forward)
