"""The fast driver's tables kept on disk, so that a parse in a new process needs no Lark parser object.

Building the driver (`driver.FastParser`) from Lark costs about 45 ms of every `planlang check`: Lark
loads its grammar cache and builds its rules and lexers, then the driver converts the parse table and
compiles its reductions. What it ends with is plain data -- the action and goto tables, each rule's
compiled reduction (its code and the `to_ast.ToAst` method it calls) and each lexer state's regex, its
compiled program (`regex_programs`) and terminal kinds -- which is written here once, after the first
build, and read back by later processes (`load`): a few milliseconds. Each state's regex is made from its
program when a parse first lexes in that state, as the driver compiles it then.

At a syntax error the cached driver needs Lark's own objects: Lark's exceptions hold an interactive
parser, which the diagnostics read. It builds the driver from Lark then and, where that driver's tables
are the cached ones (the same states: a Lark that builds its table another way numbers them otherwise),
has it raise the exception from the parse's own stacks; else it raises `NeedLark` and `parser.py`
parses that text again with the driver built from Lark. Clean plans never load Lark's parser.

The file is `parser-<key>.marshal` (the data as `marshal` writes it: this Python's own format, and
the key holds Python's version) under `$PLANLANG_CACHE_DIR`, else `$XDG_CACHE_HOME/planlang`, else
`~/.cache/planlang` (as the model results' cache, planlang.model.capture.disk_cache); the key is a
digest of the grammar, the modules that shape the tables (this one, the driver, the reductions, Lark's
setup), Lark's `__init__.py` (its version) and Python's version. Deleting it is always safe; a file that cannot be read or does
not fit is ignored and written again; files of other keys are removed after STALE_DAYS. `PLANLANG_PARSER_CACHE=0`
reads and writes nothing.
"""
from __future__ import annotations

import hashlib
import importlib.util
import marshal
import os
import re
import sys
import time
import types
from pathlib import Path
from typing import Any, Callable, cast

from .logs import debug
from . import driver as D
from .regex_programs import pattern_of, program
from .reductions import BUILDER, Reduced, _positions
from .to_ast import ToAst


FORMAT = 3  # bumped when the file's layout changes
_HERE = Path(__file__).resolve().parent
# what the cached data is a function of, besides Lark's and Python's versions
_INPUTS = (_HERE.parent / "grammar" / "planlang.lark", _HERE / "parser_cache.py", _HERE / "driver.py",
           _HERE / "reductions.py", _HERE / "lark_parser.py")
_KINDS = {k: k for k in (D._WORD, D._PUNCT, D._OPEN, D._CLOSE, D._SPECIAL)}  # the driver's sentinels


class NeedLark(Exception):
    """The cached driver met a syntax error: only Lark's own tables raise it as Lark's parser does."""


def enabled() -> bool:
    return os.environ.get("PLANLANG_PARSER_CACHE", "1") != "0"


def cache_dir() -> Path:
    """Where planlang keeps its caches (this parser's tables, the model results of
    planlang.model.capture.disk_cache): `$PLANLANG_CACHE_DIR`, else `$XDG_CACHE_HOME/planlang`, else
    `~/.cache/planlang`."""
    explicit = os.environ.get("PLANLANG_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "planlang"


def cache_path() -> Path:
    """The cache file for this grammar, driver, Lark and Python."""
    h = hashlib.sha256(f"format {FORMAT}\0{sys.version}\0".encode())
    for p in (*_INPUTS, _lark_init()):
        h.update(p.read_bytes())
        h.update(b"\0")
    return cache_dir() / f"parser-{h.hexdigest()[:32]}.marshal"


def _lark_init() -> Path:
    """Lark's `__init__.py`, which holds its `__version__`: found, not imported (a parse from the cache loads
    no Lark; `import lark` alone is ~0.03 CPU-s of a check)."""
    spec = importlib.util.find_spec("lark")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("lark is not installed", name="lark")
    return Path(spec.origin)


class CachedFastParser(D.FastParser):
    """`FastParser` with its tables read from the cache (see the module docstring): the same parse loop,
    the scanners compiled from the stored regexes, and `NeedLark` where Lark's exception is due."""

    def __init__(self, data: dict[str, Any], from_lark: Callable[[], D.FastParser | None] = lambda: None):
        # not super().__init__: that builds from Lark, which this avoids
        self._from_lark = from_lark
        self.start_state, self.end_state = data["start"], data["end"]
        self.goto = data["goto"]
        reductions = [_reduction(code, method) for code, method in data["rules"]]
        self.actions = [{sym: a if a.__class__ is int else (reductions[a[0]], a[1], a[2]) for sym, a in row.items()}
                        for row in data["actions"]]
        self._specs = data["scanners"]
        self._state_scanner = data["state_scanner"]
        self.scanners = [None] * len(self.actions)
        self._compiled: dict[int, tuple] = {}

    def _scanner_of(self, state: int) -> tuple:
        i = self._state_scanner[state]
        made = self._compiled.get(i)
        if made is None:
            pattern, flags, kinds, special, prog = self._specs[i]
            made = self._compiled[i] = (pattern_of(pattern, flags, prog).match, kinds, special)
        self.scanners[state] = made
        return made

    def _parser_error(self, text, tok, states, values):
        return self._lark_driver()._parser_error(text, tok, states, values)

    def _lexer_error(self, text, pos, line, line_start, states, values):
        return self._lark_driver()._lexer_error(text, pos, line, line_start, states, values)

    def _lark_driver(self) -> D.FastParser:
        """The driver built from Lark, where its tables are these (so the stacks of a parse by this one mean
        the same states in it); else NeedLark."""
        lark = self._from_lark()
        if lark is None or not same_tables(self, lark):
            raise NeedLark
        return lark


def same_tables(a: D.FastParser, b: D.FastParser) -> bool:
    """Whether two drivers have the same states, shifts, reductions (by rule size and name) and gotos."""
    if (a.start_state, a.end_state, a.goto) != (b.start_state, b.end_state, b.goto) or len(a.actions) != len(b.actions):
        return False

    def plain(act):
        return act if act.__class__ is int else act[1:]

    return all(ra.keys() == rb.keys() and all(plain(ra[k]) == plain(rb[k]) for k in ra)
               for ra, rb in zip(a.actions, b.actions))


def _reduction(code: bytes, method: str | None):
    scope = {"Reduced": Reduced, "_positions": _positions, "BUILDER": BUILDER,
             "method": getattr(ToAst, method) if method is not None else None}
    return types.FunctionType(marshal.loads(code), scope)


def _data(fast: D.FastParser) -> dict[str, Any]:
    """What `CachedFastParser` is built from, read off a driver built from Lark (every scanner built);
    TypeError where something is not as this module stores it."""
    rules: list[tuple[bytes, str | None]] = []
    index: dict[int, int] = {}
    actions = []
    for row in fast.actions:
        out: dict[str, object] = {}
        for sym, act in row.items():
            if act.__class__ is int:
                out[sym] = act
                continue
            fn, size, origin = cast(tuple, act)
            if id(fn) not in index:
                g = fn.__globals__
                if set(g) - {"Reduced", "_positions", "BUILDER", "method", "__builtins__", "reduce"} or fn.__closure__:
                    raise TypeError("a reduction that is not the compiled kind")
                method = g["method"]
                if method is not None and getattr(ToAst, method.__name__, None) is not method:
                    raise TypeError(f"a reduction calls {method!r}, not a method of ToAst")
                index[id(fn)] = len(rules)
                rules.append((marshal.dumps(fn.__code__), None if method is None else method.__name__))
            out[sym] = (index[id(fn)], size, origin)
        actions.append(out)
    specs: list[tuple] = []
    seen: dict[int, int] = {}
    state_scanner: list[int | None] = []
    for state in range(len(fast.actions)):
        if state not in fast.contextual.lexers:
            state_scanner.append(None)
            continue
        match, kinds, special = fast._scanner_of(state)
        pat = match.__self__
        if not isinstance(pat, re.Pattern) or any(not isinstance(k, dict) and k not in _KINDS for k in kinds.values()):
            raise TypeError("a scanner that is not the driver's kind")
        if id(pat) not in seen:
            seen[id(pat)] = len(specs)
            flags = int(pat.flags & ~re.UNICODE)  # a plain int: the file is marshal data
            specs.append((pat.pattern, flags, kinds, special, program(pat.pattern, flags)))
        state_scanner.append(seen[id(pat)])
    return {"start": fast.start_state, "end": fast.end_state, "goto": fast.goto, "actions": actions,
            "rules": rules, "scanners": specs, "state_scanner": state_scanner}


def load(from_lark: Callable[[], D.FastParser | None] = lambda: None) -> CachedFastParser | None:
    """The driver from the cache file, or None (no file, disabled, or one that does not fit); `from_lark`
    gives the driver built from Lark, for syntax errors."""
    if not enabled():
        return None
    try:
        data = marshal.loads(cache_path().read_bytes())
        if data.get("format") != FORMAT:
            return None
        for spec in data["scanners"]:  # the driver tells kinds apart by identity: its own strings
            spec[2].update({k: _KINDS[v] for k, v in spec[2].items() if not isinstance(v, dict)})
        return CachedFastParser(data, from_lark)
    except FileNotFoundError:
        return None
    except Exception as exc:  # noqa: BLE001 -- a partial write, another layout: built from Lark and written again
        debug(__name__, "the parser cache cannot be read (%s: %s); building the parser from Lark", type(exc).__name__, exc)
        return None


STALE_DAYS = 30  # a cache file of another grammar, driver or Lark, not written for this long, is removed


def _forget_old(kept: Path) -> None:
    """Remove the cache files of other keys (an older planlang or Lark) not written for STALE_DAYS: one
    still in use (another installation sharing the folder) is at worst written again by its next process."""
    limit = time.time() - STALE_DAYS * 86400
    for old in kept.parent.glob("parser-*"):  # .pickle: the layout before FORMAT 3
        try:
            if old != kept and old.stat().st_mtime < limit:
                old.unlink()
        except OSError:
            pass  # another process removed it first


def store(fast: D.FastParser) -> None:
    """Write the cache file of `fast` (a driver built from Lark), atomically; where it cannot be written,
    the next process builds from Lark again (logged at debug)."""
    if not enabled():
        return
    try:
        data = _data(fast)
        data["format"] = FORMAT
        path = cache_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        # lazy: only a write needs it (tempfile imports shutil, random, bz2, lzma)
        import tempfile

        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".parser-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(marshal.dumps(data))
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        _forget_old(path)
    except Exception as exc:  # noqa: BLE001 -- a read-only home, a full disk: the parse goes on from Lark
        debug(__name__, "the parser cache cannot be written (%s: %s)", type(exc).__name__, exc)
