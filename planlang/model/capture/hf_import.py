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

import copy
import functools
import importlib.abc
import importlib.machinery
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


def scanning_once(scan: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`scan` (create_import_structure_from_path: a folder's, or a file's folder's, map) once per folder;
    a repeated ask gets a deep copy of the first answer (the callers may keep theirs)."""
    seen: dict[str, Any] = {}

    @functools.wraps(scan)
    def once(module_path):
        path = os.fspath(module_path)
        key = os.path.abspath(os.path.dirname(path) if os.path.isfile(path) else path)
        if key in seen:
            return copy.deepcopy(seen[key])
        got = seen[key] = scan(module_path)  # transformers reads it (spread_import_structure builds anew)
        return got

    once.scans = seen  # type: ignore[attr-defined]  # what was scanned (the tests read it)
    return once


class _ScanOnce(importlib.abc.MetaPathFinder):
    """Finds transformers' import_utils as the path finder would and, once it has run, puts `scanning_once`
    in front of its scan, before transformers' `__init__` takes the name from it; then leaves sys.meta_path."""

    def find_spec(self, name, path, target=None):
        if name != _MODULE:
            return None
        if self in sys.meta_path:  # found: not needed again
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module):
            run(module)
            scan = getattr(module, _FUNCTION, None)
            if callable(scan):
                setattr(module, _FUNCTION, scanning_once(scan))

        loader.exec_module = exec_module
        return spec

