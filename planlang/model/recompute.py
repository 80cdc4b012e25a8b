"""Checkpoint wrappers shared by the estimator (planlang.model.estimate) and the pipeline runtime
(planlang.runtime.pipeline): how a plan's checkpoint group becomes non-reentrant torch.utils.checkpoint."""
from __future__ import annotations

from typing import Sequence

import torch
import torch.utils.checkpoint as cp


def wrap_chain(mods: Sequence[torch.nn.Module]) -> None:
    """Modules called one after another on a single tensor (blocks of a ModuleList): the first runs the
    whole chain under one checkpoint, the others pass their input through (recomputed as one group)."""

    def run_chain(x, _fwds=tuple(m.forward for m in mods)):
        for f in _fwds:
            x = f(x)
        return x

    mods[0].forward = lambda x, _run=run_chain: cp.checkpoint(_run, x, use_reentrant=False)
    for m in mods[1:]:
        m.forward = lambda x: x


def wrap_each(mods: Sequence[torch.nn.Module]) -> None:
    """Every module checkpointed on its own (a group whose modules take more than one tensor)."""

    for m in mods:
        m.forward = (lambda f: lambda *a, **k: cp.checkpoint(f, *a, use_reentrant=False, **k))(m.forward)
