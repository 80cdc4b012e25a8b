"""Load the model a plan names, on the meta device, and make meta inputs from its `input` declarations.

`model gpt2 = "examples.gpt2.model:build"(layers = 12)` imports `examples.gpt2.model` and calls
`build(layers=12)` under `torch.device("meta")`, so no parameter memory is allocated. The module is
looked up on sys.path, then from the plan's folder and each folder above it (a plan inside a project
finds the project's packages), then the current directory. A build follows the model's source: a file
of it edited since an earlier build in the same process is imported again (planlang.model.capture.source).
"""
from __future__ import annotations

import contextlib
import copy
import importlib
import inspect
import os
import sys
import threading
import traceback
import warnings
import weakref
from collections import OrderedDict
from contextlib import contextmanager
from typing import Callable, Iterator

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._pytree import tree_flatten

from planlang.plan.types import Input, ModelRef

from planlang.model.capture.fold import FOLD_RUNS, Fold, truncated
from planlang.model.capture.graph_values import keyword_inputs
from planlang.model.capture.hf_import import dedupe_structure_scan
from planlang.model.capture.source import model_source, record, refresh, search_roots
from planlang.model.capture.valueless import context, value_read
from planlang.lang.diagnostics import did_you_mean

TORCH_DTYPES = {
    "f64": torch.float64, "f32": torch.float32, "tf32": torch.float32, "f16": torch.float16,
    "bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn, "i64": torch.int64, "i32": torch.int32,
    "i16": torch.int16, "i8": torch.int8, "u8": torch.uint8, "bool": torch.bool,
}


class ModelLoadError(Exception):
    """The model could not be imported or built. `code` is PL260 (import), PL261 (factory call) or PL368
    (the model's code exited the process)."""

    def __init__(self, code: str, message: str, help: str, detail: str = ""):
        super().__init__(message)
        self.code, self.message, self.help, self.detail = code, message, help, detail


class _OsExit(SystemExit):
    """`os._exit(status)` called by the model's code while `no_exit` holds it (a SystemExit, so that the
    code's own `except Exception` does not swallow it, as it could not have swallowed the real exit)."""

    how = "os._exit"


@contextmanager
def no_exit():
    """Run the model's code so that it cannot end planlang: `os._exit` raises `_OsExit` instead of ending
    the process at once (no output, its status as planlang's: a CI gate would pass having checked
    nothing) and is restored after; `sys.exit`'s SystemExit is the caller's to catch (`exited`)."""
    real = os._exit

    def refuse(status: int = 0):
        raise _OsExit(status)

    os._exit = refuse
    try:
        yield
    finally:
        os._exit = real


def exited(err: SystemExit) -> str:
    """What the model's code did, for a message: `sys.exit(0)`, `os._exit(3)`."""
    return f"{getattr(err, 'how', 'sys.exit')}({err.code!r})"


EXIT_HELP = ("the model's code must return, not end the process: keep a script's entry point under "
             "`if __name__ == \"__main__\":`, and raise an exception for a bad argument")


@contextmanager
def _extra_path(roots: list[str]):
    added = [r for r in roots if r not in sys.path]
    sys.path[:0] = added
    try:
        yield
    finally:
        for r in added:
            if r in sys.path:
                sys.path.remove(r)


def import_factory(ref: ModelRef, plan_path: str | None = None):
    """The callable `ref.factory` names."""
    if not ref.attr:
        raise ModelLoadError("PL260", f'model factory "{ref.factory}" has no callable',
                             'write "package.module:callable", e.g. "examples.mlp.model:build"')
    dedupe_structure_scan()  # a model of transformers imports it: ~0.25 CPU-s less (hf_import)
    try:
        with no_exit():
            mod = _import(ref, plan_path)
    except SystemExit as err:
        raise ModelLoadError("PL368", f"importing `{ref.module}` exited the process: {exited(err)}", EXIT_HELP,
                             traceback.format_exc()) from None
    fn = getattr(mod, ref.attr, None)
    if fn is None or not callable(fn):
        names = [n for n in dir(mod) if not n.startswith("_") and callable(getattr(mod, n))]

        guess = did_you_mean(ref.attr, names)
        raise ModelLoadError("PL260", f"`{ref.module}` has no callable `{ref.attr}`",
                             f"did you mean `{guess}`?" if guess else f"callables there: {', '.join(names[:8])}")
    return fn


def _import(ref: ModelRef, plan_path: str | None):
    """The factory's module, from sys.path first, then from the plan's folder and those above it."""
    try:
        return importlib.import_module(ref.module)
    except ModuleNotFoundError:
        with _extra_path(search_roots(plan_path)):
            try:
                return importlib.import_module(ref.module)
            except ModuleNotFoundError as err:
                raise ModelLoadError(
                    "PL260", f"cannot import `{ref.module}`: {err}",
                    "make the package importable (install it, or run from the project root)",
                ) from err
            except Exception as err:  # the user's module failed while importing
                raise ModelLoadError("PL260", f"importing `{ref.module}` raised {type(err).__name__}: {err}",
                                     "fix the error in the model's module", traceback.format_exc()) from err
    except Exception as err:
        raise ModelLoadError("PL260", f"importing `{ref.module}` raised {type(err).__name__}: {err}",
                             "fix the error in the model's module", traceback.format_exc()) from err


def build_model(ref: ModelRef, plan_path: str | None = None, device: str | torch.device = "meta") -> torch.nn.Module:
    """Import and call the factory under `device` (meta by default: shapes only, no memory).

    The build runs the model's current code: modules of it whose files changed since an earlier build in
    this process are imported again, and the local modules the build imports are remembered
    (planlang.model.capture.source). On meta, a model whose declaration and source are unchanged since
    its last build here is a copy of that build (`copy.deepcopy` runs no model code, and each caller may
    change its copy): validating, estimating and solving a plan run the factory once."""
    meta = torch.device(device).type == "meta"
    if meta:
        kept = _BUILT.copy_of(_built_key(ref, plan_path))
        if kept is not None:
            return kept
    model = _build(ref, plan_path, device)
    if meta:
        _BUILT.keep(_built_key(ref, plan_path), model)
    return model


def _built_key(ref: ModelRef, plan_path: str | None) -> tuple:
    """What a meta build depends on: the factory, its arguments, where the plan is (the factory's module
    is looked up from there) and the model's source as it reads now."""
    folder = os.path.dirname(os.path.abspath(plan_path)) if plan_path else None
    return (ref.factory, ref.kwargs, folder, model_source(ref, plan_path).files)


class _Builds:
    """The last BUILT_SIZE meta builds, by `_built_key`; handed out as copies."""

    def __init__(self) -> None:
        self._kept: OrderedDict[tuple, torch.nn.Module] = OrderedDict()
        self._lock = threading.Lock()

    def copy_of(self, key: tuple) -> torch.nn.Module | None:
        with self._lock:
            model = self._kept.get(key)
            if model is None:
                return None
            self._kept.move_to_end(key)
        try:
            return copy.deepcopy(model)
        except Exception:  # noqa: BLE001 - a module that cannot be copied is built again
            return None

    def keep(self, key: tuple, model: torch.nn.Module) -> None:
        try:
            kept = copy.deepcopy(model)  # the caller may change its model; the kept one stays as built
        except Exception:  # noqa: BLE001 - not copyable: never kept
            return
        with self._lock:
            self._kept[key] = kept
            while len(self._kept) > BUILT_SIZE:
                self._kept.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()


BUILT_SIZE = 4  # meta builds kept: a few models (the language server's open plans, a diff's two)
_BUILT = _Builds()


def _build(ref: ModelRef, plan_path: str | None, device: str | torch.device) -> torch.nn.Module:
    """One call of the factory (see build_model)."""
    before = refresh(model_source(ref, plan_path))
    try:
        fn = import_factory(ref, plan_path)
        call = f"{ref.factory}({', '.join(f'{k}={v!r}' for k, v in ref.kwargs)})"
        try:
            with no_exit(), torch.device(device):
                model = fn(**dict(ref.kwargs))
        except SystemExit as err:  # sys.exit, exit(), os._exit: not a model, and planlang must not end here
            raise ModelLoadError("PL368", f"the model factory `{call}` exited the process: {exited(err)}, "
                                 "instead of returning a model", EXIT_HELP, traceback.format_exc()) from None
        except Exception as err:
            raise ModelLoadError(
                "PL261", f"`{call}` raised {type(err).__name__}: {err}", "check the model arguments in the plan",
                traceback.format_exc(),
            ) from err
    finally:
        record(before, plan_path)
    if not isinstance(model, torch.nn.Module):
        raise ModelLoadError("PL261", f"`{ref.factory}` returned {type(model).__name__}, not an nn.Module",
                             "the factory must return the model (an nn.Module)")
    return model


def model_loss(ref: ModelRef, plan_path: str | None = None, model: torch.nn.Module | None = None):
    """The loss a training step of this model computes, for estimates: `loss_function`'s (the factory
    module's `loss`, else the model's `loss` method), else None (the caller then sums the output). The
    plan declares inputs, not targets, so targets are made to fit: the model's integer inputs (a language
    model scores its own tokens), then class indices over the output's leading dims, then zeros of the
    output's shape (regression), then one float per sample — the first that the loss function accepts
    without a warning."""
    fn = loss_function(ref, plan_path, model)
    if fn is None:
        return None

    def loss(out, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        y = next(t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))

        for targets in target_candidates(out, inputs):
            if not targets:
                continue
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("error")  # e.g. mse_loss's "target size differs": a wrong guess
                    value = fn(out, *targets)
            except Exception:  # noqa: BLE001 - targets of another shape: try the next
                continue
            if isinstance(value, torch.Tensor) and value.dim() == 0:
                return value
        return y.float().sum()

    return loss


def loss_function(ref: ModelRef, plan_path: str | None = None, model: torch.nn.Module | None = None):
    """The model's loss, where docs/byom.md says to define it, or None (the output's sum is then the loss):

      1. the factory module's function `loss(output, *targets)` (the bundled examples' convention);
      2. else the model's method `loss(self, output, *targets)`, bound to `model`, or, when the caller has
         no instance, to one built on meta (so a method reads the model's settings, not its weights).

    The one place every command finds the loss: check, estimate, verify, apply and run agree on it."""
    try:
        with no_exit(), _extra_path(search_roots(plan_path)):
            fn = getattr(importlib.import_module(ref.module), "loss", None)
    except (Exception, SystemExit):  # noqa: BLE001 - build_model reports an unimportable module (PL260/PL368)
        fn = None
    if callable(fn):
        return fn
    return loss_method(model if model is not None else build_model(ref, plan_path))


def loss_method(model: torch.nn.Module) -> Callable | None:
    """`model.loss`, bound, when the model's class defines a method `loss` (a function, static or class
    method); None otherwise — a submodule or parameter that happens to be named `loss` is not one."""
    fn = inspect.getattr_static(type(model), "loss", None)
    if inspect.isfunction(fn) or isinstance(fn, (staticmethod, classmethod)):
        return getattr(model, "loss")
    return None


def plan_loss(plan, model: torch.nn.Module | None = None):
    """The loss of a plan's model (`loss_function` of its `model` declaration; `model`: the instance a
    `loss` method is bound to), or None. Without a `model` line, `model`'s own `loss` method, if any."""
    if plan.model is None:
        return loss_method(model) if model is not None else None
    return loss_function(plan.model, plan.path, model)


def sum_loss_note(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> str | None:
    """PL370's message for a model without a loss (`plan_loss` is None) whose output is not a scalar: the
    step then trains the output's sum (docs/byom.md's default), which is said, never silent. The output's
    shape comes from a run under FakeTensorMode (nothing is allocated)."""
    try:
        with context("fake"):  # as the target guess runs it
            fin = _zeros_like_inputs(model, inputs)
            out = model(**fin) if keyword_inputs(model, list(fin)) else model(*fin.values())
            y = next((t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)), None)
    except Exception:  # noqa: BLE001 - only a note: a forward that cannot run is the lowering's to report
        return None
    if y is None or y.dim() == 0:
        return None
    code = "PL370"  # a note (planlang.lang.codes): the documented default, said where it applies
    return (f"note[{code}]: the model defines no loss: a training step's loss is the sum of its output "
            f"{list(y.shape)}, and the step takes no targets; define `loss(output, *targets)` in the factory's "
            "module or a `loss(self, output, *targets)` method on the model (docs/byom.md; `planlang explain PL370`)")


def guess_targets(model: torch.nn.Module, loss_fn, inputs: dict[str, torch.Tensor],
                  fold: Fold | None = None, output=None,
                  mode: contextlib.AbstractContextManager | None = None) -> tuple[torch.Tensor, ...] | None:
    """Meta targets of the shapes `loss_fn` accepts (`target_candidates`' order), found by running the
    model under FakeTensorMode (nothing is allocated); None when no candidate fits. A forward of the
    model: one validation asks twice of one module (its loss check and its lowering), so the answer is
    kept per module, loss, input shapes and dtypes, parameter dtypes and mode (what the output's shape
    and dtype depend on). `fold`: blocks whose count the output's structure and shapes do not depend on
    (trace.probe_run found so); the model then runs cut to FOLD_RUNS[0] of them, whole if that fails.
    `output`: what that forward returned, when the caller ran it as a trace or under fake tensors (the
    probe's run: trace.probe_run, of the model cut as `fold` says), and `mode` the context it ran in
    (valueless.context; its FakeTensorMode under fake tensors, found from `output` when not given): the
    candidates are tried on it, in that mode, and the forward does not run again (a forward of
    Llama-3-8B's three blocks: ~0.1 CPU-s)."""
    key = (loss_fn, tuple((k, tuple(v.shape), v.dtype) for k, v in inputs.items()),
           tuple(sorted({str(p.dtype) for p in model.parameters()})), model.training)
    known = _TARGETS.setdefault(model, {})
    if key not in known:
        if mode is None and _fake_mode(output) is not None:
            mode = context("fake", _fake_mode(output))
        if output is not None and mode is not None:
            known[key] = _fitting_targets(model, loss_fn, inputs, output, mode)
        else:
            known[key] = _folded_guess(model, loss_fn, inputs, fold) if fold is not None else \
                _guess_targets(model, loss_fn, inputs)
    found = known[key]
    return None if found is None else tuple(torch.empty(t.shape, dtype=t.dtype, device="meta") for t in found)


#: guess_targets' answers, per module while it lives
_TARGETS: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = weakref.WeakKeyDictionary()


def _folded_guess(model: torch.nn.Module, loss_fn, inputs: dict[str, torch.Tensor],
                  fold: Fold) -> tuple[torch.Tensor, ...] | None:
    try:
        with truncated(model, fold, FOLD_RUNS[0]) as counts:
            found = _guess_targets(model, loss_fn, inputs)
        counts.check()
        return found
    except (Exception, SystemExit):  # noqa: BLE001 - the cut model failed: the whole one says how
        return _guess_targets(model, loss_fn, inputs)


def _guess_targets(model: torch.nn.Module, loss_fn, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...] | None:
    with context("fake"):  # as a trace: code skipped while tracing (a check of the targets' values) stays skipped
        fin = _zeros_like_inputs(model, inputs)
        names = keyword_inputs(model, list(fin))
        out = model(**fin) if names else model(*fin.values())
        return _first_fitting(loss_fn, out, fin)


def _fake_mode(output) -> FakeTensorMode | None:
    """The FakeTensorMode of the fake tensors in `output` (None when it holds none)."""
    return next((t.fake_mode for t in tree_flatten(output)[0] if isinstance(t, FakeTensor)), None)


def _fitting_targets(model: torch.nn.Module, loss_fn, inputs: dict[str, torch.Tensor], output,
                     mode: contextlib.AbstractContextManager) -> tuple[torch.Tensor, ...] | None:
    """`_guess_targets` of the forward's `output`, run already under `mode`."""
    with mode:
        return _first_fitting(loss_fn, output, _zeros_like_inputs(model, inputs))


def _zeros_like_inputs(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Fresh inputs of the declared shapes and dtypes on the model's device (in the caller's mode)."""
    dev = next((p.device for p in model.parameters()), torch.device("cpu"))
    return {k: torch.zeros(v.shape, dtype=v.dtype, device=dev) for k, v in inputs.items()}


def _attempts(loss_fn, out, fin: dict[str, torch.Tensor]) -> Iterator[tuple[list, object]]:
    """The loss on each of `target_candidates(out, fin)`, in order: (targets, its value or the exception it
    raised; a warning counts as one: the guess was wrong)."""
    for targets in target_candidates(out, fin):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                got: object = loss_fn(out, *targets)
        except Exception as err:  # noqa: BLE001 - a wrong guess: the caller tries the next
            got = err
        yield targets, got


def _first_fitting(loss_fn, out, fin: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...] | None:
    """Meta targets of the first of `target_candidates(out, fin)` the loss takes to a scalar, or None."""
    for targets, v in _attempts(loss_fn, out, fin):
        if isinstance(v, torch.Tensor) and v.dim() == 0:
            return tuple(torch.empty(t.shape, dtype=t.dtype, device="meta") for t in targets)
    return None


def loss_value_read(model: torch.nn.Module, loss_fn, inputs: dict[str, torch.Tensor], output,
                    mode: contextlib.AbstractContextManager) -> str | None:
    """Why no target fits, when it is this: the loss reads a tensor's value (valueless.value_read: where)
    on every target `target_candidates` makes for the forward's `output`, run in `mode` (the forward's)."""
    with mode:
        reads = [value_read(v) if isinstance(v, Exception) else None
                 for _, v in _attempts(loss_fn, output, _zeros_like_inputs(model, inputs))]
    return reads[0] if reads and all(r is not None for r in reads) else None


def target_candidates(out, inputs: dict[str, torch.Tensor]) -> list[list[torch.Tensor]]:
    """Targets to try, in order, for a loss over `out` (see `model_loss`)."""

    y = next(t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
    ints = [t for t in inputs.values() if not t.is_floating_point()]
    candidates = [ints] if len(ints) == 1 else []
    candidates += [[torch.zeros(y.shape[:-1], dtype=torch.int64, device=y.device)] if y.dim() >= 2 else [],
                   [torch.zeros_like(y)], [torch.zeros(y.shape[:1], dtype=y.dtype, device=y.device)]]
    return [c for c in candidates if c]


def meta_inputs(inputs: tuple[Input, ...], device: str | torch.device = "meta") -> dict[str, torch.Tensor]:
    """One tensor per `input` declaration, with its dtype and shape (zeros for integer inputs)."""
    out = {}
    for inp in inputs:
        dtype = TORCH_DTYPES.get(inp.dtype, torch.float32)
        out[inp.name] = torch.zeros(inp.shape, dtype=dtype, device=device)
    return out
