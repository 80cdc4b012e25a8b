"""Model-aware checks for the editor: the plan against its model built on the meta device.

The model layer imports torch (seconds), so it is imported here lazily, on the first run, and only
when the user enabled model checks; `import planlang.lsp` never imports torch. A run resolves the
document's text, builds and probes the model (cached per model declaration and factory file), estimates
per-device memory (cached per plan), and runs every rule: what `planlang check --model` does for a file
on disk, for the editor's unsaved text.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import sys
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

from planlang.lang.diagnostics import Diagnostic, Severity
from planlang.plan.types import Plan

from .analysis import PARSE_LOCK
from .symbols import factory_source

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
    facts: object | None = None  # planlang.model.trace.ModuleFacts
    estimates: tuple = ()  # planlang.model.estimate.DeviceEstimate, one per device class
    notes: tuple[str, ...] = field(default=())

    def estimate_for(self, device: str):
        return next((e for e in self.estimates if e.device == device), None)


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
        self._factory_mtimes: dict[str, float | None] = {}  # factory module -> mtime of its file when imported

    def run(self, text: str, path: str, read: Callable[[str], str] | None = None) -> ModelInsight:
        from planlang.model.checks import model_facts_for  # torch; registers the model-aware rules
        from planlang.plan.checker import check_resolution
        from planlang.plan.resolve import Resolver

        with PARSE_LOCK:
            res = (Resolver(read=read) if read else Resolver()).resolve_text(text, path)
        plan = res.plan
        if plan is None or plan.model is None:
            return ModelInsight(check_resolution(res, path).diagnostics, plan)
        src = factory_source(plan.model.factory, path)
        mtime = _mtime(src.path) if src else None
        self._forget_if_edited(plan.model.module, mtime)
        key = (plan.model, plan.inputs, os.path.dirname(os.path.abspath(path)), mtime)
        facts, load_diags = self._facts.get(key), []
        if facts is None:  # failures are not cached: their diagnostics point at this version's lines
            facts, load_diags = model_facts_for(plan)
            if facts is not None:
                self._facts.put(key, facts)
        extra: dict = {}
        notes: list[str] = []
        if facts is not None and plan.mesh is not None and not plan.holes() and not any(
                d.severity is Severity.ERROR for d in res.diagnostics):
            try:
                extra["estimate"] = self._estimates.get_or((plan, mtime), lambda: _estimate(plan))
            except Exception as err:  # noqa: BLE001 - an estimate is optional; the other checks still run
                notes.append(f"estimate failed: {type(err).__name__}: {err}")
                log.info("estimate failed for %s: %r", path, err)
        result = check_resolution(res, path, {"model": facts, **extra} if facts is not None else None)
        return ModelInsight(tuple(load_diags) + result.diagnostics, plan, facts,
                            tuple(extra.get("estimate") or ()), tuple(notes))


    def _forget_if_edited(self, module: str, mtime: float | None) -> None:
        """Drop the factory's module from sys.modules when its file changed since it was imported, so
        the next build imports the edited code (other modules it imports stay as first imported)."""
        seen = self._factory_mtimes.get(module)
        if module in self._factory_mtimes and seen != mtime:
            sys.modules.pop(module, None)
        self._factory_mtimes[module] = mtime


def _estimate(plan: Plan):
    from planlang.model.estimate import estimate_plan

    return estimate_plan(plan)


def _mtime(path: str) -> float | None:
    try:
        return os.path.getmtime(path)
    except OSError:
        return None

