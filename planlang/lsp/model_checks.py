"""Model-aware checks for the editor: the plan against its model built on the meta device.

The model layer imports torch (seconds), so it is imported here lazily, on the first run, and only
when the user enabled model checks; `import planlang.lsp` never imports torch. A run resolves the
document's text, builds and probes the model, estimates per-device memory, and runs every rule: what
`planlang check --model` does for a file on disk, for the editor's unsaved text.

Caches are keyed by content. The probed model is cached per model declaration (factory, arguments,
inputs, the plan's folder) and the *source* of the model: a digest of the factory's file and of every
Python module it brought in from the plan's folder or its own package (`ModelSource`). When one of
those files changes, the next run imports them all afresh (their entries in sys.modules, and stale
bytecode, are dropped), probes the model anew and drops the estimator's own caches of that model, so
nothing computed from the old code is shown. The estimate is cached per plan and model source. Both
caches are bounded (least recently used first out).
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import logging
import os
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from planlang.lang.diagnostics import Diagnostic, Severity
from planlang.plan.complete import complete
from planlang.plan.types import Plan

from .analysis import PARSE_LOCK
from .symbols import factory_source

log = logging.getLogger(__name__)
CACHE_SIZE = 4
SOURCES_SIZE = 32  # model modules whose source files are remembered


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
        from dataclasses import replace

        return replace(self, facts=None, estimates=(), stale=True)


@dataclass(frozen=True)
class ModelSource:
    """The Python files one model was built from, each with a digest of its content (None: unreadable)."""

    module: str  # the factory's module
    files: tuple[tuple[str, str | None], ...]

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(p for p, _ in self.files)

    def changed(self, quick: bool = False) -> bool:
        """Whether a file reads differently now. `quick`: trust a file whose size and modification
        time (in nanoseconds) are those it had when last read (for a check on every request)."""
        return any(digest(p, quick) != d for p, d in self.files)


_DIGESTS: dict[str, tuple[tuple[int, int, int], str]] = {}  # path -> ((mtime_ns, size, inode), digest)
DIGESTS_SIZE = 4096


def digest(path: str, quick: bool = False) -> str | None:
    """A digest of a file's content (not its modification time: a same-size edit in the same second
    counts). `quick`: the last digest of the file while its mtime_ns, size and inode are unchanged."""
    try:
        st = os.stat(path)
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        known = _DIGESTS.get(path)
        if quick and known is not None and known[0] == stamp:
            return known[1]
        value = hashlib.sha1(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None
    if len(_DIGESTS) >= DIGESTS_SIZE:
        _DIGESTS.clear()
    _DIGESTS[path] = (stamp, value)
    return value


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


class _Sources:
    """What this process imported for each model module, and from which files (with their digests as
    imported). One per process, like sys.modules and the estimator's caches it keeps in step."""

    def __init__(self):
        self.lock = threading.RLock()
        self.seen: OrderedDict[str, tuple[tuple[tuple[str, str | None], ...], tuple[str, ...]]] = OrderedDict()

    def current(self, module: str, factory_file: str | None) -> ModelSource:
        """The source of `module` now. When a file of it changed since it was imported (or it was
        imported before this tracker saw it), its modules are dropped from sys.modules, with their stale
        bytecode, and the estimator forgets the model: the next build imports the current code."""
        with self.lock:
            known = self.seen.get(module)
            paths = [p for p, _ in known[0]] if known else []
            if factory_file is not None and factory_file not in paths:
                paths.insert(0, factory_file)
            files = tuple((p, digest(p)) for p in paths)
            if known is None:
                if module in sys.modules:  # imported before we kept track: we cannot tell how old it is
                    _reimport((module,), ())
            elif files != known[0]:
                old = dict(known[0])
                _reimport(known[1] + (module,), [p for p, d in files if old.get(p, d) != d or p not in old])
                del self.seen[module]  # recorded again once it is built
            else:
                self.seen.move_to_end(module)
            return ModelSource(module, files)

    def loaded(self, before: ModelSource, plan_path: str) -> ModelSource:
        """After a build: `before` with the local modules now imported (the plan's folder and the
        factory's package), remembered for the next `current`."""
        with self.lock:
            if not before.files:  # not found next to the plan: where the import found it
                f = getattr(sys.modules.get(before.module), "__file__", None)
                if f:
                    before = ModelSource(before.module, ((str(Path(f).resolve()), digest(f)),))
            local = _local_modules(before, plan_path)
            known = dict(before.files)
            files = tuple(before.files) + tuple(sorted((f, digest(f)) for f in set(local.values()) if f not in known))
            names = tuple(sorted(n for n in local if n != before.module))
            self.seen[before.module] = (files, names)
            self.seen.move_to_end(before.module)
            while len(self.seen) > SOURCES_SIZE:
                self.seen.popitem(last=False)
            return ModelSource(before.module, files)


SOURCES = _Sources()


def _local_roots(source: ModelSource, plan_path: str) -> list[Path]:
    """Where the model's own modules live: the plan's folder, and the top folder of the factory's
    package (the factory's folder for a top-level module)."""
    roots = [Path(plan_path).resolve().parent]
    if source.files:
        factory = Path(source.files[0][0]).resolve()
        depth = source.module.count(".") + (1 if factory.name == "__init__.py" else 0)
        top = factory.parents[depth] if depth < len(factory.parents) else factory.parent
        roots.append(top / source.module.split(".")[0] if depth else factory.parent)
    return roots


def _foreign_roots() -> list[Path]:
    """Folders whose modules are never the model's own: this package, the interpreter's."""
    import planlang

    out = [Path(planlang.__file__).resolve().parent]
    for p in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
        out.append(Path(p).resolve())
    return out


def _local_modules(source: ModelSource, plan_path: str) -> dict[str, str]:
    """module name -> file, for the imported modules under the model's local roots."""
    roots, foreign = _local_roots(source, plan_path), _foreign_roots()
    out: dict[str, str] = {}
    for name, mod in list(sys.modules.items()):
        if name in ("__main__", "__mp_main__"):  # the program itself (a script next to the plan)
            continue
        f = getattr(mod, "__file__", None)
        if not f or not f.endswith(".py"):
            continue
        try:
            path = Path(f).resolve()
        except OSError:
            continue
        if any(path.is_relative_to(r) for r in foreign):
            continue
        if any(path.is_relative_to(r) for r in roots):
            out[name] = str(path)
    return out


def _reimport(modules, changed_files) -> None:
    """Make the next import of `modules` read their source again: drop them from sys.modules, drop the
    bytecode of the changed files (its check is by whole-second mtime and size, which an edit can keep),
    forget the import system's directory listings and the estimator's caches of these models."""
    for name in modules:
        sys.modules.pop(name, None)
    for f in changed_files:
        try:
            os.remove(importlib.util.cache_from_source(f))
        except (OSError, ValueError, NotImplementedError):
            pass
    importlib.invalidate_caches()
    _forget_estimates(set(modules))


def _estimator_caches() -> tuple[dict | None, dict | None]:
    """The estimator's module-level caches (facts per model, simulations), when it is loaded. They are
    keyed by the model declaration, not its source, so the editor keeps them in step with the source."""
    est = sys.modules.get("planlang.model.estimate")
    facts, sims = getattr(est, "_FACTS", None), getattr(est, "_SIMULATED", None)
    return (facts if isinstance(facts, dict) else None), (sims if isinstance(sims, dict) else None)


def _model_key_module(key) -> str | None:
    """The factory module of an estimator cache key ((str(model), path, inputs) first)."""
    while isinstance(key, tuple) and key and isinstance(key[0], tuple):
        key = key[0]
    if isinstance(key, tuple) and key and isinstance(key[0], str):
        return key[0].split(":", 1)[0]
    return None


def _forget_estimates(modules: set[str]) -> None:
    for cache in _estimator_caches():
        if cache is None:
            continue
        for k in [k for k in list(cache) if _model_key_module(k) in modules]:
            cache.pop(k, None)


class ModelChecker:
    """Runs model-aware checks; keeps the probed model and the estimates between runs."""

    def __init__(self):
        self._facts = _Lru()
        self._estimates = _Lru()

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
        source = SOURCES.current(plan.model.module, src.path if src else None)
        base = (plan.model, plan.inputs, os.path.dirname(os.path.abspath(path)))
        facts, load_diags = self._facts.get(base + (source.files,)), []
        if facts is None:  # failures are not cached: their diagnostics point at this version's lines
            facts, load_diags = model_facts_for(plan)
            source = SOURCES.loaded(source, path)
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
        result = check_resolution(res, path, {"model": facts, **extra} if facts is not None else None)
        return ModelInsight(tuple(load_diags) + result.diagnostics, plan, facts,
                            tuple(extra.get("estimate") or ()), tuple(notes), source)


def _estimate(plan: Plan, facts):
    from planlang.model.estimate import estimate_plan

    cache, _ = _estimator_caches()
    if cache is not None:  # the estimator probes the model itself unless it has it: give it ours
        cache[(str(plan.model), plan.path, tuple(str(i) for i in plan.inputs))] = facts
    return estimate_plan(complete(plan))

