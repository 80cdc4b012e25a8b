"""Load the model a plan names, on the meta device, and make meta inputs from its `input` declarations.

`model gpt2 = "examples.gpt2.model:build"(layers = 12)` imports `examples.gpt2.model` and calls
`build(layers=12)` under `torch.device("meta")`, so no parameter memory is allocated. The module is
looked up on sys.path, then from the plan's folder and each folder above it (a plan inside a project
finds the project's packages), then the current directory. A build follows the model's source: a file
of it edited since an earlier build in the same process is imported again (planlang.model.source).
"""
from __future__ import annotations

import importlib
import sys
import traceback
import warnings
from contextlib import contextmanager

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_flatten

from planlang.plan.types import Input, ModelRef

from .graph_values import keyword_inputs
from .source import model_source, record, refresh, search_roots
from planlang.lang.diagnostics import did_you_mean

TORCH_DTYPES = {
    "f64": torch.float64, "f32": torch.float32, "tf32": torch.float32, "f16": torch.float16,
    "bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn, "i64": torch.int64, "i32": torch.int32,
    "i16": torch.int16, "i8": torch.int8, "u8": torch.uint8, "bool": torch.bool,
}


class ModelLoadError(Exception):
    """The model could not be imported or built. `code` is PL260 (import) or PL261 (factory call)."""

    def __init__(self, code: str, message: str, help: str, detail: str = ""):
        super().__init__(message)
        self.code, self.message, self.help, self.detail = code, message, help, detail


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
    try:
        mod = importlib.import_module(ref.module)
    except ModuleNotFoundError:
        with _extra_path(search_roots(plan_path)):
            try:
                mod = importlib.import_module(ref.module)
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
    fn = getattr(mod, ref.attr, None)
    if fn is None or not callable(fn):
        names = [n for n in dir(mod) if not n.startswith("_") and callable(getattr(mod, n))]

        guess = did_you_mean(ref.attr, names)
        raise ModelLoadError("PL260", f"`{ref.module}` has no callable `{ref.attr}`",
                             f"did you mean `{guess}`?" if guess else f"callables there: {', '.join(names[:8])}")
    return fn


def build_model(ref: ModelRef, plan_path: str | None = None, device: str | torch.device = "meta") -> torch.nn.Module:
    """Import and call the factory under `device` (meta by default: shapes only, no memory).

    The build runs the model's current code: modules of it whose files changed since an earlier build in
    this process are imported again, and the local modules the build imports are remembered
    (planlang.model.source)."""
    before = refresh(model_source(ref, plan_path))
    try:
        fn = import_factory(ref, plan_path)
        try:
            with torch.device(device):
                model = fn(**dict(ref.kwargs))
        except Exception as err:
            raise ModelLoadError(
                "PL261", f"`{ref.factory}({', '.join(f'{k}={v!r}' for k, v in ref.kwargs)})` raised "
                f"{type(err).__name__}: {err}", "check the model arguments in the plan", traceback.format_exc(),
            ) from err
    finally:
        record(before, plan_path)
    if not isinstance(model, torch.nn.Module):
        raise ModelLoadError("PL261", f"`{ref.factory}` returned {type(model).__name__}, not an nn.Module",
                             "the factory must return the model (an nn.Module)")
    return model


def model_loss(ref: ModelRef):
    """The loss a training step of this model computes, for estimates: the factory module's own
    `loss(output, *targets)` when it defines one (the convention of the bundled examples), else None
    (the caller then sums the output). The plan declares inputs, not targets, so targets are made to fit:
    the model's integer inputs (a language model scores its own tokens), then class indices over the
    output's leading dims, then zeros of the output's shape (regression), then one float per sample —
    the first that the loss function accepts without a warning."""
    fn = loss_function(ref)
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


def loss_function(ref: ModelRef, plan_path: str | None = None):
    """The factory module's own `loss(output, *targets)` (the bundled examples' convention), or None."""
    try:
        with _extra_path(search_roots(plan_path)):
            fn = getattr(importlib.import_module(ref.module), "loss", None)
    except Exception:  # noqa: BLE001 - no importable loss: the caller's default applies
        return None
    return fn if callable(fn) else None


def plan_loss(plan):
    """The loss of a plan's model (`loss_function` of its `model` declaration), or None."""
    return loss_function(plan.model, plan.path) if plan.model is not None else None


def guess_targets(model: torch.nn.Module, loss_fn, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...] | None:
    """Meta targets of the shapes `loss_fn` accepts (`target_candidates`' order), found by running the
    model under FakeTensorMode (nothing is allocated); None when no candidate fits."""

    dev = next((p.device for p in model.parameters()), torch.device("cpu"))
    with FakeTensorMode(allow_non_fake_inputs=True):
        fin = {k: torch.zeros(v.shape, dtype=v.dtype, device=dev) for k, v in inputs.items()}
        names = keyword_inputs(model, list(fin))
        out = model(**fin) if names else model(*fin.values())
        for targets in target_candidates(out, fin):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("error")
                    v = loss_fn(out, *targets)
            except Exception:  # noqa: BLE001 - a wrong guess: try the next
                continue
            if isinstance(v, torch.Tensor) and v.dim() == 0:
                return tuple(torch.empty(t.shape, dtype=t.dtype, device="meta") for t in targets)
    return None


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
