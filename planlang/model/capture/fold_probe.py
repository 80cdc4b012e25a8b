"""The module probe of a model's repeated blocks, run as a few (issue #29: a transformer's N identical
layers are traced once and reused).

`probe_modules` (planlang.model.capture.trace) records the order in which modules first run and the shapes
of their first call. Of a model whose blocks fold (planlang.model.capture.fold), that record is: the
modules before the blocks, block 0 (with any module outside the list that block 0 runs first), the
interior block 1 renamed to blocks 1 .. N-2, the last block renamed to N-1, the modules after. So the
model runs cut to its first `k` blocks for each k of FOLD_RUNS (3, 4: first, interior and last blocks) and
each record is expanded to N blocks; the expansions must agree with each other, block 2 with block 1 at 4
blocks, and the forward's output must have the same structure and shapes at both counts — else the whole
model runs (`folded_run` says why not: folding changes how long the probe takes, never what it finds).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Protocol, TypeVar

import torch
from torch.utils._pytree import tree_flatten

from .fold import FOLD_RUNS, Fold, FoldError, find_fold, truncated


class _Run(Protocol):  # planlang.model.capture.trace.Run (which imports this module)
    order: list[str]
    calls: dict[str, Any]
    output: Any
    how: str


R = TypeVar("R", bound=_Run)


def probe_fold(module: torch.nn.Module) -> tuple[Fold | None, str]:
    """The model's blocks as the probe folds them, or None and why not."""
    fold = find_fold(module)
    if fold is None:
        return None, "no list of identical blocks"
    paths: dict[int, list[str]] = {}
    for name, m in module.named_modules(remove_duplicate=False):
        paths.setdefault(id(m), []).append(name)
    for names in paths.values():
        if len(names) > 1 and any(fold.split(n) is not None for n in names):
            # the probe names a module's calls by its last path, which a cut list moves
            return None, f"`{names[0]}` is also `{names[-1]}`: a module shared with a block"
    return fold, ""


def folded_run(module: torch.nn.Module, inputs: dict[str, torch.Tensor],
               record: Callable[..., R]) -> tuple[tuple[list[str], dict[str, Any], R, Fold] | None, str]:
    """((order, calls) of the whole model, the run at FOLD_RUNS[0] blocks, the fold), or None and why
    the whole model must run. `record(module, inputs, before)` runs the model once with every module call
    recorded, calling `before()` before each try (valueless.run_without_values)."""
    fold, why = probe_fold(module)
    if fold is None:
        return None, why
    if min(FOLD_RUNS) < 3:
        return None, f"FOLD_RUNS {FOLD_RUNS}: the probe needs a first, an interior and a last block"
    runs: dict[int, R] = {}
    try:
        for k in FOLD_RUNS:
            with truncated(module, fold, k) as counts:
                runs[k] = record(module, inputs, lambda c=counts: c.calls.__setitem__(slice(None), [0] * c.kept))
            counts.check()
        expanded = [_expand(run, fold, k) for k, run in runs.items()]
        if any(e != expanded[0] for e in expanded[1:]):
            raise FoldError(f"the module calls at {' and '.join(map(str, FOLD_RUNS))} blocks expand differently")
        outs = [(run.how, _structure(run.output)) for run in runs.values()]
        if any(o != outs[0] for o in outs[1:]):
            raise FoldError("the forward's output differs with the number of blocks")
    except FoldError as err:
        return None, str(err)
    except (Exception, SystemExit) as err:  # noqa: BLE001 - the cut model failed: the whole run says how
        return None, f"the model cut to its first blocks raised {type(err).__name__}: {err}"
    order, calls = expanded[0]
    return (order, calls, runs[FOLD_RUNS[0]], fold), ""


def _expand(run: _Run, fold: Fold, k: int) -> tuple[list[str], dict[str, Any]]:
    """`run`'s order and calls (a model cut to `k` blocks) for the model's `fold.count` blocks."""
    order = run.order
    tags = [got[0] if (got := fold.split(n)) is not None else None for n in order]
    where = [i for i, t in enumerate(tags) if t is not None]
    if not where:
        raise FoldError("no module of a block ran")
    firsts = [tags.index(b) if b in tags else -1 for b in range(k)]
    if min(firsts) < 0 or firsts != sorted(firsts):
        raise FoldError(f"the first calls of blocks 0 .. {k - 1} are not in block order")
    bounds = [*firsts, where[-1] + 1]
    segs = [list(range(bounds[b], bounds[b + 1])) for b in range(k)]
    for b, seg in enumerate(segs):
        # block 0's stretch may hold modules outside the list that it runs first; the others only their own
        if any(tags[i] != b and not (b == 0 and tags[i] is None) for i in seg):
            raise FoldError(f"block {b}'s module calls interleave with others'")
    names = [[order[i] for i in seg] for seg in segs]
    for b in range(2, k - 1):  # the interior blocks alike
        if [fold.rename(n, b) for n in names[1]] != names[b] or \
                any(_moved(run.calls[n], fold, b) != run.calls[fold.rename(n, b)] for n in names[1]):
            raise FoldError(f"blocks 1 and {b} ran differently")
    out = order[:bounds[1]]
    calls = {n: run.calls[n] for n in out}
    last = fold.count - 1
    for block, b in [*((names[1], j) for j in range(1, last)), (names[k - 1], last)]:
        for n in block:
            moved = _moved(run.calls[n], fold, b)
            out.append(moved.path)
            calls[moved.path] = moved
    for n in order[bounds[-1]:]:
        out.append(n)
        calls[n] = run.calls[n]
    return out, calls


def _moved(call: Any, fold: Fold, b: int) -> Any:
    return replace(call, path=fold.rename(call.path, b))


def _structure(out: Any) -> tuple:
    """What the forward's output is, without values: its pytree and each leaf's shape and dtype."""
    leaves, spec = tree_flatten(out)
    return spec, tuple((tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor)
                       else (type(x), x if type(x) in (int, float, str, bool, type(None)) else None) for x in leaves)


__all__ = ["folded_run", "probe_fold"]
