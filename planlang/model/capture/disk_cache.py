"""What a model command computed, kept on disk for the next command on the same plan and model.

`check --model` and `estimate` of a large model take tens of CPU seconds (build, probe, export, profile,
lower, estimate) and say the same thing the next time while nothing they read changed. An entry holds
what the command shows (its diagnostics; the estimate's table and JSON), keyed by everything the result
is a function of:

  - the plan's sources as resolved (the plan file, the files it `use`s, the standard library): the
    model's factory and its arguments, the input shapes, the mesh and everything else the plan says;
  - planlang's own code (a digest of its package files: a changed planlang is another key, released or
    not), the Python, torch and transformers versions;
  - the command and its options (`kind`);

and is used only while the model's Python files (`source.ModelSource`: the factory's file and the local
modules its build imported) read as they did when it was written, each checked by its digest. An entry
that cannot be read (a partial write, another planlang's format, a corrupt file) is ignored and written
again. The directory is `$PLANLANG_CACHE_DIR`, else `$XDG_CACHE_HOME/planlang`, else
`~/.cache/planlang`; deleting it is always safe. `--no-cache` on the model commands reads and writes
nothing.

No torch here: a command that finds its entry never imports it.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import os
import pickle
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planlang.lang.parser_cache import cache_dir  # one directory for planlang's caches

from .source import Files, digest

FORMAT = 1  # bumped when an entry's layout changes




_CODE: list[str] = []


def planlang_code() -> str:
    """A digest of planlang's package files (its .py, .lark and .plan files), once per process."""
    if not _CODE:
        root = Path(__file__).resolve().parents[2]
        h = hashlib.sha256()
        for p in sorted(root.rglob("*")):
            if p.suffix in (".py", ".lark", ".plan") and "__pycache__" not in p.parts:
                h.update(str(p.relative_to(root)).encode())
                h.update(p.read_bytes())
        _CODE.append(h.hexdigest())
    return _CODE[0]


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def key(kind: str, sources: dict[str, str]) -> str:
    """The key of a command's result: `kind` (the command and its options) and the plan's resolved
    `sources` (name -> text), with planlang's code and the versions it runs on."""
    h = hashlib.sha256()
    for part in (f"format {FORMAT}", kind, planlang_code(), sys.version, _version("torch"),
                 _version("transformers")):
        h.update(f"{part}\0".encode())
    for name in sorted(sources):
        h.update(f"{name}\0{sources[name]}\0".encode())
    return h.hexdigest()


@dataclass(frozen=True)
class Entry:
    """A command's result (`payload`) and the model files it was computed from, each with its digest."""

    files: Files
    payload: Any


def _path(k: str) -> Path:
    return cache_dir() / k[:2] / f"{k}.pickle"


def load(k: str) -> Any | None:
    """The payload stored under `k` while the model's files read as they did; None on a miss (no entry,
    a changed model file, an entry that cannot be read)."""
    try:
        with open(_path(k), "rb") as f:
            entry = pickle.load(f)
    except FileNotFoundError:
        return None
    except Exception:  # noqa: BLE001 - a corrupt or foreign entry is a miss; `store` writes it again
        return None
    if not isinstance(entry, Entry) or any(digest(p) != d for p, d in entry.files):
        return None
    return entry.payload


def store(k: str, payload: Any, files: Files) -> None:
    """Keep `payload` under `k`, written whole or not at all (a temporary file renamed into place). A cache
    that cannot be written (read-only, full) is skipped: the command has its result already."""
    path = _path(k)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                pickle.dump(Entry(files, payload), f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        return
