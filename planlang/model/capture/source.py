"""The Python source a model is built from, as a fingerprint of content, and imports that follow it.

A model's *source* is its factory's file and every module its last build in this process imported from
the plan's folder or the factory's own package (its "local" modules), each with a digest of the file's
content (`ModelSource`). Caches of anything computed from the model key by `model_source(ref, path)`:
an edited model file gives another key, in the same process. `build_model` (planlang.model.capture.load) calls
`refresh` before it imports, so a build always runs the current code: when a file changed since it was
imported, the model's modules leave sys.modules (with stale bytecode, whose check by whole-second mtime
and size a quick edit can pass) and are imported again; and `record` after it, to learn the local
modules the build brought in.

Reading a file is skipped while its mtime_ns, size and inode are those it had when last read, provided
that mtime was older than that read by more than a file system's clock step (`RACY_NS`): a later write
could not then have kept the mtime. So the check on every build or estimate costs a stat per file, and a
same-size rewrite within the same second is still seen.

No torch here: the language server imports this at start.
"""
from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import os
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

DIGESTS_SIZE = 4096  # files whose last digest is remembered
SOURCES_SIZE = 128  # model modules whose imported files are remembered
RACY_NS = 2_000_000_000  # a stamp this close to its read is not trusted (coarse file system clocks)

Files = tuple[tuple[str, "str | None"], ...]


@dataclass(frozen=True)
class ModelSource:
    """The Python files one model is built from, each with a digest of its content (None: unreadable).
    `files` is the fingerprint to key caches by."""

    module: str  # the factory's module
    files: Files

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(p for p, _ in self.files)

    def changed(self, quick: bool = False) -> bool:
        """Whether a file reads differently now. `quick`: trust a file whose stamp is that of its last
        read, when that read came well after its mtime (see the module's doc)."""
        return any(digest(p, quick) != d for p, d in self.files)


_DIGESTS: dict[str, tuple[tuple[int, int, int], str, int]] = {}  # path -> (stamp, digest, read at)
_DIGESTS_LOCK = threading.Lock()


def digest(path: str, quick: bool = False) -> str | None:
    """A digest of a file's content (not its mtime: a same-size edit in the same second counts), None
    when it cannot be read. `quick`: the last digest, while the file's (mtime_ns, size, inode) are
    unchanged and that mtime was older than the last read by more than RACY_NS."""
    try:
        st = os.stat(path)
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        known = _DIGESTS.get(path)
        if quick and known is not None and known[0] == stamp and stamp[0] < known[2] - RACY_NS:
            return known[1]
        read_at = time.time_ns()
        value = hashlib.sha1(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None
    with _DIGESTS_LOCK:
        if len(_DIGESTS) >= DIGESTS_SIZE:
            _DIGESTS.clear()
        _DIGESTS[path] = (stamp, value, read_at)
    return value


def search_roots(plan_path: str | None) -> list[str]:
    """Where a plan's model is looked for when sys.path does not have it: the plan's folder and each
    folder above it, then the current directory."""
    roots = []
    if plan_path:
        p = Path(plan_path).resolve().parent
        roots += [str(d) for d in [p, *p.parents]]
    roots.append(str(Path.cwd()))
    return roots


def factory_file(module: str, plan_path: str | None = None) -> str | None:
    """The file of the factory's module: where it was imported from, else found without importing
    anything on sys.path and the search roots (a guess, before the first build)."""
    if not _valid(module):
        return None
    f = getattr(sys.modules.get(module), "__file__", None)
    if isinstance(f, str):
        return _resolved(f)
    rel = Path(*module.split("."))
    for root in [*sys.path, *search_roots(plan_path)]:
        for cand in (Path(root or ".") / rel.with_suffix(".py"), Path(root or ".") / rel / "__init__.py"):
            if cand.is_file():
                return _resolved(str(cand))
    return None


class _Imports:
    """What this process imported for each model module, from which files, and with what content: one
    per process, like sys.modules. module -> (files with their digests as imported, local module names)."""

    def __init__(self):
        self.lock = threading.RLock()
        self.seen: OrderedDict[str, tuple[Files, tuple[str, ...]]] = OrderedDict()

    def now(self, module: str, plan_path: str | None, quick: bool = True) -> ModelSource:
        """The source of `module` as its files read now: those of its last build, else its factory's."""
        if not _valid(module):
            return ModelSource(module, ())
        with self.lock:
            known = self.seen.get(module)
        if known is not None:
            paths = [p for p, _ in known[0]]
        else:
            f = factory_file(module, plan_path)
            paths = [f] if f else []
        return ModelSource(module, tuple((p, digest(p, quick)) for p in paths))

    def imported(self, module: str) -> ModelSource | None:
        """The source of `module` as its last build imported it (None: not built here)."""
        with self.lock:
            known = self.seen.get(module)
        return None if known is None else ModelSource(module, known[0])

    def refresh(self, source: ModelSource) -> ModelSource:
        """Make the next import of the model read `source`: when a file differs from what was imported,
        its modules are dropped from sys.modules with the bytecode of the changed files. A module that
        was imported outside a build is taken as it is (it was read at that import)."""
        with self.lock:
            known = self.seen.get(source.module)
            if known is None:
                return source
            if source.files == known[0]:
                self.seen.move_to_end(source.module)
                return source
            old = dict(known[0])
            _drop(known[1] + (source.module,), [p for p, d in source.files if old.get(p) != d])
            del self.seen[source.module]  # recorded again once built
            return source

    def record(self, before: ModelSource, plan_path: str | None) -> ModelSource:
        """After a build (even a failed one): `before`, the source refreshed for it, with the files the
        import actually used and the local modules now imported (read now), remembered for the next
        `now`/`refresh` and returned."""
        if not _valid(before.module):
            return before
        with self.lock:
            digests = dict(before.files)
            paths = list(before.paths)
            f = getattr(sys.modules.get(before.module), "__file__", None)
            actual = _resolved(f) if isinstance(f, str) else None
            if actual is not None and actual not in digests:  # not where `factory_file` guessed
                paths.insert(0, actual)
            local = _local_modules(before.module, paths[0] if paths else None, plan_path)
            paths += sorted(set(local.values()) - set(paths))
            files = tuple((p, digests[p] if p in digests else digest(p)) for p in paths)
            names = tuple(sorted(n for n in local if n != before.module))
            self.seen[before.module] = (files, names)
            self.seen.move_to_end(before.module)
            while len(self.seen) > SOURCES_SIZE:  # forgotten: not left imported, unknown how old later
                gone, (_, gone_names) = self.seen.popitem(last=False)
                for name in (gone, *gone_names):
                    sys.modules.pop(name, None)
            return ModelSource(before.module, files)


SOURCES = _Imports()


def _valid(module: str) -> bool:
    return bool(module) and all(part.isidentifier() for part in module.split("."))


def _module_name(ref) -> str:
    return ref if isinstance(ref, str) else ref.module


def model_source(ref, plan_path: str | None = None, quick: bool = True) -> ModelSource:
    """The source of the model `ref` (a ModelRef, or its factory's module name) names, as it reads now:
    the files of its last build here (the factory's alone before one), each with its digest now.
    `quick`: files whose stamp is unchanged since a read well after their mtime are not read again."""
    return SOURCES.now(_module_name(ref), plan_path, quick)


def imported_source(ref) -> ModelSource | None:
    """The source of the model `ref` names as its last build here imported it, None before one."""
    return SOURCES.imported(_module_name(ref))


def refresh(source: ModelSource) -> ModelSource:
    """Make the next import of `source.module` read the files as `source` has them (see `_Imports`)."""
    return SOURCES.refresh(source)


def record(before: ModelSource, plan_path: str | None = None) -> ModelSource:
    """After building the model of `before` (refreshed): the files and local modules it imported."""
    return SOURCES.record(before, plan_path)


_RESOLVED: dict[str, str | None] = {}  # a module's __file__ -> the resolved path (None: no such file)
_FOLDERS: dict[str, str] = {}  # a folder -> its resolved path


def _resolved(f: str) -> str | None:
    out = _RESOLVED.get(f, "")
    if out == "":
        try:
            out = _resolve(f)
        except (OSError, RuntimeError):
            out = None
        if len(_RESOLVED) >= 65536:
            _RESOLVED.clear()
            _FOLDERS.clear()
        _RESOLVED[f] = out
    return out


def _resolve(f: str) -> str:
    """str(Path(f).resolve()), with each folder resolved once: a file that is not itself a link resolves to
    its name in its folder's resolved path (one lstat a file; resolving each of the ~2,500 modules' paths
    whole, part by part, was ~0.1 CPU-s of every model build)."""
    folder, name = os.path.split(f)
    if not os.path.isabs(f) or name in ("", ".", ".."):
        return str(Path(f).resolve())
    real = _FOLDERS.get(folder)
    if real is None:
        real = _FOLDERS[folder] = str(Path(folder).resolve())
    path = os.path.join(real, name)
    return str(Path(path).resolve()) if os.path.islink(path) else path


def _local_roots(module: str, factory: str | None, plan_path: str | None) -> list[str]:
    """Where the model's own modules live: the plan's folder, and the top folder of the factory's
    package (the factory's folder for a top-level module)."""
    roots = [str(Path(plan_path).resolve().parent)] if plan_path else []
    if factory:
        path = Path(factory)
        depth = module.count(".") + (1 if path.name == "__init__.py" else 0)
        top = path.parents[depth] if depth < len(path.parents) else path.parent
        roots.append(str(top / module.split(".")[0] if depth else path.parent))
    return roots


@functools.cache
def _foreign_roots() -> tuple[str, ...]:
    """Folders whose modules are never the model's own: this package, the interpreter's."""

    out = [str(Path(__file__).resolve().parents[2])]  # the planlang package
    for p in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
        out.append(str(Path(p).resolve()))
    return tuple(out)


def _prefixes(roots) -> tuple[str, ...]:
    return tuple(r.rstrip(os.sep) + os.sep for r in roots)


def _local_modules(module: str, factory: str | None, plan_path: str | None) -> dict[str, str]:
    """module name -> file, for the imported modules under the model's local roots."""
    roots, foreign = _local_roots(module, factory, plan_path), _foreign_roots()
    roots_in, foreign_in = _prefixes(roots), _prefixes(foreign)
    out: dict[str, str] = {}
    for name, mod in list(sys.modules.items()):
        if name in ("__main__", "__mp_main__"):  # the program itself (a script next to the plan)
            continue
        f = getattr(mod, "__file__", None)
        # a relative __file__ (torch.ops' "_ops.py", torch.classes' "_classes.py") names no file: resolved
        # against the working directory it became a "local module" of any model built there
        if not isinstance(f, str) or not f.endswith(".py") or not os.path.isabs(f):
            continue
        path = _resolved(f)
        if path is None or path in foreign or path.startswith(foreign_in):
            continue
        if path in roots or path.startswith(roots_in):
            out[name] = path
    return out


def _drop(modules, changed_files) -> None:
    """Make the next import of `modules` read their source again: drop them from sys.modules, drop the
    bytecode of the changed files (its check is by whole-second mtime and size, which an edit can keep),
    forget the import system's directory listings."""
    for name in modules:
        sys.modules.pop(name, None)
    for f in changed_files:
        try:
            os.remove(importlib.util.cache_from_source(f))
        except (OSError, ValueError, NotImplementedError):
            pass
    importlib.invalidate_caches()
