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
from typing import TYPE_CHECKING, Callable

from planlang.lang.diagnostics import Diagnostic
from planlang.model.capture.source import ModelSource, imported_source, model_source  # torch-free
from planlang.plan.types import Plan

if TYPE_CHECKING:  # the model layer imports torch: for the type checker only
    from planlang.model.capture.trace import ModuleFacts

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
    facts: ModuleFacts | None = None  # the probed model (planlang.model.facts.ModelFacts)
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
        from planlang.model.validation import probe, validate_plan  # torch
        from planlang.plan.resolve import Resolver
        from planlang.runtime.program_memory import measure

        res = (Resolver(read=read) if read else Resolver()).resolve_text(text, path)
        plan = res.plan
        if plan is None or plan.model is None:
            return ModelInsight(validate_plan(res, path).diagnostics, plan)
        source = model_source(plan.model, path)  # the files of its last build, as they read now
        base = (plan.model, plan.inputs, os.path.dirname(os.path.abspath(path)))
        probed = self._facts.get(base + (source.files,))
        if probed is None:  # failures are not cached: their diagnostics point at this version's lines
            probed = probe(plan)  # builds the current code
            source = imported_source(plan.model) or source  # the files that build read
            if probed.facts is not None:
                self._facts.put(base + (source.files,), probed)
        # the same validation as `planlang check --model` (planlang.model.validation), so the editor shows
        # the same diagnostics; kept per plan and model source
        texts = tuple(sorted((name, src.text) for name, src in res.sources.items()))  # every file, as read now
        v = self._estimates.get_or((texts, source.files), lambda: validate_plan(res, path, measure, probed))
        return ModelInsight(v.diagnostics, plan, probed.facts, tuple(v.estimate or ()), (), source)
