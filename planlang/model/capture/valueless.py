"""Running a model without values: on meta tensors, and what to do when the model's code reads one.

Meta tensors have shapes and dtypes but no data, so `.item()`, `bool(t)` and the like raise. Libraries
that must also run under torch.compile and torch.export ask whether they are being traced before they
read a value, and take a shape-only path when they are (Hugging Face transformers' mask creation checks
for packed sequences and an all-ones padding mask only outside a trace). A model's run without values
is such a trace, so `meta_or_fake` says so, in the cheapest way the model's code accepts:

1. ``meta``: plain meta tensors (no library asked);
2. ``traced``: meta tensors while `torch.compiler.is_compiling()` answers True, the question
   Hugging Face's `is_tracing` and torch's own code ask (torch.export sets the same flag while it traces);
3. ``fake``: FakeTensorMode (still as a trace), for code that asks whether a tensor is fake. Each op
   then runs through the fake-tensor dispatcher, ~2-3x the CPU of a meta op (Llama-3-8B's `estimate`:
   ~6.4 CPU-s fake, ~4.8 traced, the same estimate).

Each is tried only when the one before it read a value.
"""
from __future__ import annotations

import contextlib
import os
import sysconfig
import traceback
from typing import Callable, Iterator, TypeVar

import torch
import torch.compiler
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode

T = TypeVar("T")
HOWS = ("meta", "traced", "fake")
# a private flag of torch.compiler (is_compiling() returns it): another torch without it skips "traced"
_CAN_TRACE = isinstance(getattr(torch.compiler, "_is_compiling_flag", None), bool)


def reads_a_value(err: BaseException) -> bool:
    """Whether `err` is a meta tensor's refusal to give a value."""
    return isinstance(err, RuntimeError) and "meta tensors" in str(err)


#: how to fix a model that reads a value in every way `run_without_values` tries (PL261's help)
VALUE_HELP = ("make that code depend on shapes only (`x.shape`, `x.dim()`), or skip it while the model is "
              "traced: `if not torch.compiler.is_compiling(): ...` (torch.export and torch.compile need the same)")
# code that is not the user's: a value read there is named by the user's line that called it
_LIBRARIES = tuple(os.path.realpath(p) + os.sep for p in {
    os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    *(sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib"))})


def value_read(err: BaseException) -> str | None:
    """When `err` ended a run without values because the model's code read a tensor's value (a meta
    tensor's refusal, or fake tensors' DataDependentOutputException): the innermost line of the model's
    own code in its traceback (`file:line: code`), or "" when none is outside the libraries. None for
    any other error."""
    if not (reads_a_value(err) or isinstance(err, DataDependentOutputException)):
        return None
    for frame in reversed(traceback.extract_tb(err.__traceback__)):
        path = os.path.realpath(frame.filename)
        if frame.filename.startswith("<") or path.startswith(_LIBRARIES):
            continue
        rel = os.path.relpath(path)
        return f"{path if rel.startswith('..') else rel}:{frame.lineno}: `{(frame.line or '').strip()}`"
    return ""


@contextlib.contextmanager
def traced() -> Iterator[None]:
    """`torch.compiler.is_compiling()` True inside (as it was again after)."""
    was = torch.compiler._is_compiling_flag
    torch.compiler._is_compiling_flag = True
    try:
        yield
    finally:
        torch.compiler._is_compiling_flag = was


def context(how: str, fake_mode: FakeTensorMode | None = None) -> contextlib.AbstractContextManager:
    """A fresh context to run in as `how` says (see the module docstring); under fake tensors (in
    `fake_mode`, else a new FakeTensorMode) still as a trace, so that code skipped while tracing stays
    skipped."""
    if how == "fake":
        return _faked(fake_mode)
    return traced() if how == "traced" else contextlib.nullcontext()


@contextlib.contextmanager
def _faked(mode: FakeTensorMode | None) -> Iterator[None]:
    with traced() if _CAN_TRACE else contextlib.nullcontext(), mode or FakeTensorMode(allow_non_fake_inputs=True):
        yield


def run_without_values(fn: Callable[[], T]) -> tuple[T, str]:
    """`fn()` in the first of HOWS whose run reads no value, and which it was."""
    for how in HOWS[:-1]:
        if how == "traced" and not _CAN_TRACE:
            continue
        try:
            with context(how):
                return fn(), how
        except RuntimeError as err:
            if not reads_a_value(err):
                raise
    with context(HOWS[-1]):
        return fn(), HOWS[-1]


def meta_or_fake(fn: Callable[[], T]) -> T:
    """`fn()` on meta tensors, as a trace or under fake tensors when the model reads a value
    (`run_without_values`)."""
    return run_without_values(fn)[0]


__all__ = ["HOWS", "VALUE_HELP", "context", "meta_or_fake", "reads_a_value", "run_without_values", "traced",
           "value_read"]
