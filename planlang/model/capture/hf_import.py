"""Hugging Face transformers' first import, without its package scan done twice.

transformers (5.x) maps its lazy modules by reading every file under `transformers/models` for `__all__`
(`transformers.utils.import_utils.create_import_structure_from_path`, ~3,300 files). Its package's
`__init__` asks for that map by the folder, `transformers.models`'s `__init__` by a file in it; the two
are different keys of the `lru_cache` in front of it, so the same scan runs twice whenever a model of
transformers is imported: ~0.25 of the ~1 CPU-s that first import costs (Llama-3-8B's `estimate`, issue
#29). `dedupe_structure_scan` makes the second ask read the first's result (a deep copy: transformers
keeps and may change what it got).

It only changes what transformers computes twice into once, so it cannot change a result: a transformers
without that function (another version), or one already imported, is left alone.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import importlib.abc
import os
import sys
from typing import Any, Callable

_MODULE = "transformers.utils.import_utils"
_FUNCTION = "create_import_structure_from_path"


def dedupe_structure_scan() -> bool:
    """Arrange for transformers' structure scan to run once per folder in this process, if transformers
    is not imported yet. Whether the arrangement is made (idempotent)."""
    if "transformers" in sys.modules or any(isinstance(f, _ScanOnce) for f in sys.meta_path):
        return False
    sys.meta_path.insert(0, _ScanOnce())
    return True


def scanning_once(scan: Callable[..., Any]) -> Callable[..., Any]:
    """`scan` (create_import_structure_from_path: a folder's, or a file's folder's, map) once per folder;
    a repeated ask gets a deep copy of the first answer (the callers may keep theirs). A call with other
    arguments than the one path (another transformers) goes to `scan` as it is."""
    seen: dict[str, Any] = {}

    @functools.wraps(scan)
    def once(module_path, *args, **kwargs):
        if args or kwargs:
            return scan(module_path, *args, **kwargs)
        path = os.fspath(module_path)
        key = os.path.abspath(os.path.dirname(path) if os.path.isfile(path) else path)
        if key in seen:
            return copy.deepcopy(seen[key])
        got = seen[key] = scan(module_path)  # transformers reads it (spread_import_structure builds anew)
        return got

    once.scans = seen  # type: ignore[attr-defined]  # what was scanned (the tests read it)
    return once


class _ScanOnce(importlib.abc.MetaPathFinder):
    """Asks the finders after it for transformers' import_utils and, once that module has run, puts
    `scanning_once` in front of its scan, before transformers' `__init__` takes the name from it; then
    leaves sys.meta_path. (It does not change sys.meta_path while the import system walks it.)"""

    def __init__(self) -> None:
        self.asking = False

    def find_spec(self, name, path, target=None):
        if name != _MODULE or self.asking:
            return None
        self.asking = True
        try:
            spec = _spec_after(self, name, path, target)
        finally:
            self.asking = False
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return None  # the import system asks the other finders itself
        run = loader.exec_module

        def exec_module(module):
            if self in sys.meta_path:  # found: not needed again
                sys.meta_path.remove(self)
            with contextlib.suppress(AttributeError):
                del loader.exec_module  # the loader's own again (one loader may serve other modules)
            run(module)
            scan = getattr(module, _FUNCTION, None)
            if module.__name__ == _MODULE and callable(scan):
                setattr(module, _FUNCTION, scanning_once(scan))

        try:
            loader.exec_module = exec_module
        except AttributeError:  # a loader that takes no attributes: transformers as it is
            return None
        return spec


def _spec_after(finder: _ScanOnce, name: str, path, target):
    """The spec the finders after `finder` in sys.meta_path give `name` (the first that gives one)."""
    finders = sys.meta_path
    after = finders[finders.index(finder) + 1:] if finder in finders else finders
    for other in after:
        find = getattr(other, "find_spec", None)
        spec = find(name, path, target) if find is not None else None
        if spec is not None:
            return spec
    return None
