"""Model-aware checks for the editor: the plan against its model built on the meta device.

The model layer imports torch (seconds), so it is imported here lazily, on the first run, and only
when the user enabled model checks; `import planlang.lsp` never imports torch. A run resolves the
document's text, builds and probes the model, estimates per-device memory, and runs every rule: what
`planlang check --model` does for a file on disk, for the editor's unsaved text.

Caches are keyed by content. The probed model is cached per model declaration (factory, arguments,
inputs, the plan's folder) and the *source* of the model (planlang.model.capture.source.ModelSource, torch-free):
a digest of the factory's file and of every Python module it brought in from the plan's folder or its
own package. When one of those files changes, the key changes: the next run builds the model again, and
the model layer imports the current code (planlang.model.capture.load.build_model); the estimator keys its own
caches by the same source, so nothing computed from the old code is shown. The estimate is cached per
plan and model source. Both caches are bounded (least recently used first out).
"""
from __future__ import annotations

import importlib.util
import logging
import os
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Callable

from planlang.lang.diagnostics import Diagnostic, Severity
from planlang.model.capture.source import ModelSource, imported_source, model_source  # torch-free
from planlang.plan.complete import complete
from planlang.plan.types import Plan

log = logging.getLogger(__name__)
CACHE_SIZE = 4


def model_layer_available() -> bool:
    """Whether the model layer can run here (torch is installed), without importing it."""
    return importlib.util.find_spec("torch") is not None


@dataclass(frozen=True)
class ModelInsight:
    """What one model-aware run learned about one version of a document."""

    diagnostics: tuple[Diagnostic, ...]  # all of them, model-free included
    plan: Plan | None = None
    facts: object | None = None  # planlang.model.capture.trace.ModuleFacts
    estimates: tuple = ()  # planlang.model.price.estimate.DeviceEstimate, one per device class
    notes: tuple[str, ...] = field(default=())
    source: "ModelSource | None" = None  # the files the model was built from, as they were
    stale: bool = False  # the model's source has changed since: facts and estimates were dropped

    def estimate_for(self, device: str):
        return next((e for e in self.estimates if e.device == device), None)

    def source_changed(self, quick: bool = False) -> bool:
        """Whether a file the model was built from has changed since this run (`quick`: see
        `ModelSource.changed`)."""
        return self.source is not None and self.source.changed(quick)

    def without_model(self) -> "ModelInsight":
        """This insight without what came from the model (its source changed): marked stale."""

        return replace(self, facts=None, estimates=(), stale=True)


class _Lru(OrderedDict):
    """A small least-recently-used cache; unhashable keys are never cached."""

    def get(self, key, default=None):
        try:
            if key in self:
                self.move_to_end(key)
                return self[key]
        except TypeError:
            pass
        return default

    def put(self, key, value) -> None:
        try:
            self[key] = value
        except TypeError:
            return
        while len(self) > CACHE_SIZE:
            self.popitem(last=False)

    def get_or(self, key, make):
        value = self.get(key, _MISSING)
        if value is _MISSING:
            value = make()
            self.put(key, value)
        return value


_MISSING = object()


class ModelChecker:
    """Runs model-aware checks; keeps the probed model and the estimates between runs."""

    def __init__(self):
        self._facts = _Lru()
        self._estimates = _Lru()

    def run(self, text: str, path: str, read: Callable[[str], str] | None = None) -> ModelInsight:
        # lazy: torch loads only when this runs
        from planlang.model.checks import model_facts_for, validate  # torch
        from planlang.plan.resolve import Resolver

        res = (Resolver(read=read) if read else Resolver()).resolve_text(text, path)
        plan = res.plan
        if plan is None or plan.model is None:
            return ModelInsight(validate(res, path).diagnostics, plan)
        source = model_source(plan.model, path)  # the files of its last build, as they read now
        base = (plan.model, plan.inputs, os.path.dirname(os.path.abspath(path)))
        facts, load_diags = self._facts.get(base + (source.files,)), []
        if facts is None:  # failures are not cached: their diagnostics point at this version's lines
            facts, load_diags = model_facts_for(plan)  # builds the current code
            source = imported_source(plan.model) or source  # the files that build read
            if facts is not None:
                self._facts.put(base + (source.files,), facts)
        extra: dict = {}
        notes: list[str] = []
        if facts is not None and plan.mesh is not None and not plan.holes() and not any(
                d.severity is Severity.ERROR for d in res.diagnostics):
            try:
                extra["estimate"] = self._estimates.get_or((plan, source.files), lambda: _estimate(plan, facts))
            except Exception as err:  # noqa: BLE001 - an estimate is optional; the other checks still run
                notes.append(f"estimate failed: {type(err).__name__}: {err}")
                log.info("estimate failed for %s: %r", path, err)
        result = validate(res, path, facts, extra.get("estimate"))
        return ModelInsight(tuple(load_diags) + result.diagnostics, plan, facts,
                            tuple(extra.get("estimate") or ()), tuple(notes), source)


def _estimate(plan: Plan, facts):
    # lazy: torch loads only when this runs
    from planlang.model.price.estimate import estimate_plan
    from planlang.runtime.program_memory import measure

    return estimate_plan(complete(plan), facts=facts, program=measure)  # the facts just probed: the estimator need not probe again
