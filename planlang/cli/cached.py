"""The model commands' results kept on disk (planlang.model.capture.disk_cache), as `check --model` and
`estimate` read and write them: the plan is resolved and checked without its model first (no torch), which
ends a plan the model-free rules refuse and gives the key; a hit is shown without building the model.
`--no-cache` skips both the read and the write."""
from __future__ import annotations

import dataclasses
from typing import Callable

from planlang.cli.progress import progress

# the option both commands take
NO_CACHE_HELP = ("Compute everything again, neither reading nor writing the cache of model results "
                 "($PLANLANG_CACHE_DIR, else ~/.cache/planlang; safe to delete).")


def model_free(name: str, text: str, use_paths: tuple[str, ...] = ()):
    """The plan checked by the model-free rules (planlang.plan.checker.check_text: no torch)."""
    # lazy: lark loads only when this runs
    from planlang.plan.checker import check_text

    return check_text(text, name, search_paths=use_paths)


def result_key(kind: str, free) -> str | None:
    """The cache key of a model command's result on the plan `free` (its model-free check), None when
    there is no model result to keep (errors, no model)."""
    if free.errors or free.plan is None or free.plan.model is None:
        return None
    # lazy: the model layer, loaded by the model commands only
    from planlang.model.capture import disk_cache

    return disk_cache.key(kind, {n: s.text for n, s in free.sources.items()})


def load(k: str | None):
    if k is None:
        return None
    # lazy: the model layer, loaded by the model commands only
    from planlang.model.capture import disk_cache

    return disk_cache.load(k)


def store(k: str | None, plan, payload) -> None:
    """Keep `payload`, keyed by `k`, for the model `plan` declares, as its last build here imported it."""
    if k is None or plan is None or plan.model is None:
        return
    # lazy: the model layer, loaded by the model commands only
    from planlang.model.capture import disk_cache
    from planlang.model.capture.source import imported_source

    src = imported_source(plan.model)
    if src is not None:  # the model was built: its files are what the result depends on
        disk_cache.store(k, payload, src.files)


def check_model(name: str, text: str, use_paths: tuple[str, ...], cache: bool, run: Callable):
    """`check --model` of one plan: the model-free check when it finds errors (no model work), the cached
    diagnostics of the same plan and model, or `run()` (planlang.model.validation.check_with_model),
    whose diagnostics are then kept."""
    free = model_free(name, text, use_paths)
    if free.errors or free.plan is None or free.plan.model is None:
        return free
    k = result_key(f"check --model {use_paths}", free) if cache else None
    hit = load(k)
    if hit is not None:
        diagnostics, suppressed = hit
        return dataclasses.replace(free, diagnostics=diagnostics, suppressed=suppressed)
    with progress("check") as say:
        say(f"checking {name} against its model (built on meta)")
        res = run()
    store(k, res.plan, (res.diagnostics, res.suppressed))
    return res
