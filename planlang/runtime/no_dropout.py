"""Dropout off, on both sides of a comparison with one process (`planlang verify`).

The plan and the one-process run cannot draw the same dropout masks: the planlang runtime draws each
element of a program's dropout from a hash of its global index and the step (planlang.runtime.local_ops
`dropout_keep`), the model's own code from torch's generator, per rank. With dropout on, every error of a
correct plan is the difference of two random masks and `verify` could only say FAIL. Under `dropout_off()`
every dropout runs as the identity, in the program (the executor asks `is_off`) and in the model's own code
and the program's opaque calls (a torch function mode: `F.dropout` and its variants, `nn.Dropout`,
`aten.dropout`/`native_dropout`, and attention's `dropout_p` set to 0), so both sides compute the same
function and are judged against rounding. What it turned off is counted (`DropoutOff.calls`) and said:
never a silent change. The masks themselves are tested apart (tests/runtime/test_dropout_keep.py: each
device's piece is the slice of the one global mask).

The switch is process-wide, not per thread: autograd recomputes checkpointed code in its own threads.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

aten = torch.ops.aten

# (p's position, training's position) in each dropout function's arguments: identity when both say so
_DROPOUTS = {
    F.dropout: (1, 2), F.dropout1d: (1, 2), F.dropout2d: (1, 2), F.dropout3d: (1, 2),
    F.alpha_dropout: (1, 2), F.feature_alpha_dropout: (1, 2),
    torch.dropout: (1, 2), torch.alpha_dropout: (1, 2), torch.feature_dropout: (1, 2),
    torch.feature_alpha_dropout: (1, 2),
    aten.dropout.default: (1, 2), aten.alpha_dropout.default: (1, 2), aten.feature_dropout.default: (1, 2),
    aten.feature_alpha_dropout.default: (1, 2),
}
_DEFAULTS = {"p": 0.5, "training": True, "train": True}
# attention with a dropout probability: (its position, its keyword)
_ATTENTION = {F.scaled_dot_product_attention: 4, aten.scaled_dot_product_attention.default: 4}


@dataclass
class DropoutOff:
    """What `dropout_off` turned off: dropout calls and program ops with p > 0 in training."""

    calls: int = 0


_ACTIVE: list[DropoutOff] = []


def is_off() -> bool:
    """Whether dropout runs as the identity now (the executor's program ops ask)."""
    return bool(_ACTIVE)


def count_program_op() -> None:
    """A program's dropout op ran as the identity."""
    if _ACTIVE:
        _ACTIVE[-1].calls += 1


@contextlib.contextmanager
def dropout_off() -> Iterator[DropoutOff]:
    """Every dropout the block runs is the identity (see the module docstring); the counter says how many."""
    seen = DropoutOff()
    _ACTIVE.append(seen)
    try:
        with _NoDropout(seen):
            yield seen
    finally:
        _ACTIVE.remove(seen)


class _NoDropout(TorchFunctionMode):
    def __init__(self, seen: DropoutOff):
        super().__init__()
        self.seen = seen

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        where = _DROPOUTS.get(func)
        if where is not None:
            p = _arg(args, kwargs, where[0], "p")
            training = _arg(args, kwargs, where[1], "training" if "training" in kwargs else "train")
            if p and training:
                self.seen.calls += 1
                x = args[0] if args else kwargs["input"]
                return x
            return func(*args, **kwargs)
        if func is aten.native_dropout.default:
            x, p, train = (list(args) + [None] * 3)[:3]
            train = kwargs.get("train", train)
            if p and train:
                self.seen.calls += 1
                return x, torch.ones_like(x, dtype=torch.bool)
            return func(*args, **kwargs)
        at = _ATTENTION.get(func)
        if at is not None:
            if len(args) > at and args[at]:
                args = (*args[:at], 0.0, *args[at + 1:])
                self.seen.calls += 1
            elif kwargs.get("dropout_p"):
                kwargs["dropout_p"] = 0.0
                self.seen.calls += 1
        return func(*args, **kwargs)


def _arg(args: tuple, kwargs: dict, index: int, name: str):
    if len(args) > index:
        return args[index]
    return kwargs.get(name, _DEFAULTS.get(name))
