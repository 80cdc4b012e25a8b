"""Project configuration for `check` and `lint`: which codes to report, which files to skip.

Read from `planlang.toml` (top-level keys) or from the `[tool.planlang]` table of `pyproject.toml`,
found in the current folder or the nearest one above it (`planlang.toml` first), or named with
`--config`. Keys, as in ruff:

    select = ["PL"]                 # codes or code prefixes to report (default: every code)
    extend-select = []              # added to `select`
    ignore = ["PL309"]              # codes or prefixes not to report
    per-file-ignores = { "legacy/*.plan" = ["PL4"] }
    exclude = ["generated/"]        # files and folders skipped when a folder is expanded
    extend-exclude = []             # added to `exclude` (whose default skips .git, .venv, build, ...)
    respect-gitignore = true        # skip what git ignores when a folder is expanded
    use-paths = ["../shared-plans"] # folders `use` may read besides the stdlib and the plan's own (PL222)

A code is reported when its most specific matching selector comes from `select`/`extend-select`
rather than from `ignore` (at equal length `ignore` wins): `select = ["PL3"]`, `ignore = ["PL30"]`,
`extend-select = ["PL305"]` reports PL305 and PL31x..PL39x. Files named on the command line are
always checked; `exclude` and `.gitignore` apply to the files found below a folder.
"""
from __future__ import annotations

import fnmatch
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Iterable

from .frozen import value_type
from .codes import CODES
from .diagnostics import Diagnostic, did_you_mean

CONFIG_FILES = ("planlang.toml", "pyproject.toml")
DEFAULT_EXCLUDE = (".git", ".hg", ".svn", ".venv", "venv", ".tox", ".nox", "node_modules", "build", "dist",
                   "__pycache__", "site-packages", ".mypy_cache", ".pytest_cache")
KEYS = ("select", "extend-select", "ignore", "per-file-ignores", "exclude", "extend-exclude",
        "respect-gitignore", "use-paths")


class ConfigError(ValueError):
    """A configuration that cannot be used: the message names the file, the key and the fix."""


@value_type
class Config:
    root: Path  # patterns are relative to this folder (the config file's, or the current one)
    source: str | None = None  # the file the settings came from
    select: tuple[str, ...] = ("PL",)
    extend_select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE
    respect_gitignore: bool = True
    use_paths: tuple[str, ...] = ()  # absolute folders `use` may read from (planlang.plan.resolve, PL222)

    def __str__(self) -> str:
        return f"config {self.source or '(defaults)'}"

    def with_options(self, select: Iterable[str] = (), extend_select: Iterable[str] = (),
                     ignore: Iterable[str] = ()) -> "Config":
        """The command line on top: `--select` replaces `select`; `--extend-select` and `--ignore` add."""
        select, extend_select, ignore = _codes(select, "--select"), _codes(extend_select, "--extend-select"), \
            _codes(ignore, "--ignore")
        return replace(self, select=select or self.select, extend_select=self.extend_select + extend_select,
                       ignore=self.ignore + ignore)

    def enabled(self, code: str, path: str | None = None) -> bool:
        ignore = self.ignore + (self._file_ignores(path) if path else ())
        chosen = _longest(code, self.select + self.extend_select)
        ignored = _longest(code, ignore)
        return chosen is not None and (ignored is None or chosen > ignored)

    def keep(self, diagnostics: Iterable[Diagnostic]) -> list[Diagnostic]:
        return [d for d in diagnostics if self.enabled(d.code, d.span.file)]

    def _relative(self, path: str) -> str:
        p = Path(path)
        try:
            return (p.resolve() if p.is_absolute() or p.exists() else self.root / p).relative_to(
                self.root.resolve()).as_posix()
        except ValueError:
            return p.as_posix()

    def _file_ignores(self, path: str) -> tuple[str, ...]:
        rel = self._relative(path)
        return tuple(c for pattern, codes in self.per_file_ignores if _matches(rel, pattern) for c in codes)

    def excluded(self, path: Path) -> bool:
        rel = self._relative(str(path))
        return any(_matches(rel, pattern) for pattern in self.exclude)

    def plan_files(self, folder: Path) -> list[Path]:
        """Every *.plan below `folder`, less excluded folders and files and (by default) what git ignores."""
        found: list[Path] = []
        for sub in sorted(folder.rglob("*.plan")):
            rel_parts = sub.relative_to(folder).parts
            if any(self.excluded(folder.joinpath(*rel_parts[:i + 1])) for i in range(len(rel_parts))):
                continue
            found.append(sub)
        if self.respect_gitignore and found:
            found = [f for f in found if f not in _git_ignored(folder, found)]
        return found


def _longest(code: str, selectors: Iterable[str]) -> int | None:
    """The length of the longest selector matching `code` (`ALL`: 0); None when none matches."""
    lengths = [0 if s == "ALL" else len(s) for s in selectors if s == "ALL" or code.startswith(s)]
    return max(lengths, default=None)


def _matches(rel: str, pattern: str) -> bool:
    """gitignore-like: a pattern with no `/` matches any path component or the file name; one with `/`
    matches the path from the root (a trailing `/` means the folder and everything below it)."""
    pattern = pattern.rstrip("/") if pattern.endswith("/") else pattern
    path = PurePosixPath(rel)
    if "/" not in pattern:
        return any(fnmatch.fnmatchcase(part, pattern) for part in path.parts)
    pattern = pattern.lstrip("/")
    return fnmatch.fnmatchcase(rel, pattern) or any(
        fnmatch.fnmatchcase(str(parent), pattern) for parent in path.parents if str(parent) != ".")


def _git_ignored(folder: Path, files: list[Path]) -> set[Path]:
    """The files git would ignore (none outside a work tree or without git)."""
    # lazy: only a folder's expansion runs git
    import subprocess

    try:
        out = subprocess.run(["git", "-C", str(folder), "check-ignore", "-z", "--stdin"],
                             input="\0".join(str(f.resolve()) for f in files), capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return set()
    if out.returncode not in (0, 1):  # 128: not a git work tree
        return set()
    ignored = {Path(p) for p in out.stdout.split("\0") if p}
    return {f for f in files if f.resolve() in ignored}


def _codes(values: Iterable[str], where: str) -> tuple[str, ...]:
    """Selectors from a list or comma-separated strings, each a code prefix such as PL3 or PL305 (or ALL)."""
    out: list[str] = []
    for value in values:
        for sel in str(value).split(","):
            sel = sel.strip().upper()
            if not sel:
                continue
            if sel != "ALL" and not any(c.startswith(sel) for c in CODES):
                guess = did_you_mean(sel, CODES)
                raise ConfigError(f"{where}: {sel} is no diagnostic code or code prefix"
                                  + (f"; did you mean {guess}?" if guess else " (codes are PL101 ... PL5xx; "
                                     "`planlang explain CODE` lists one)"))
            out.append(sel)
    return tuple(out)


def find_config(start: Path) -> Path | None:
    """The nearest planlang.toml, or pyproject.toml with a [tool.planlang] table, at or above `start`."""
    for folder in [start, *start.parents]:
        for name in CONFIG_FILES:
            f = folder / name
            if f.is_file() and (name != "pyproject.toml" or _has_planlang_table(f)):
                return f
    return None


def _has_planlang_table(pyproject: Path) -> bool:
    """Whether a pyproject.toml has a [tool.planlang] table; one that never names planlang is not parsed (most
    are not planlang's, and tomllib is ~5 ms of a check)."""
    try:
        if "planlang" not in pyproject.read_text(encoding="utf-8"):
            return False
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot read {pyproject}: {err}") from None
    return "planlang" in _read(pyproject).get("tool", {})


def _read(path: Path) -> dict:
    # lazy: only a configuration file needs a TOML reader
    import tomllib

    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot read {path}: {err}") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path} is not valid TOML: {err}") from None


def _list(table: dict, key: str, where: str) -> list[str]:
    value = table.get(key, [])
    if isinstance(value, str) or not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: `{key}` must be a list of strings, e.g. {key} = [\"PL3\"]")
    return value


def load_config(path: Path | None = None, cwd: Path | None = None) -> Config:
    """The configuration in `path`, or the one `find_config` finds from `cwd`; defaults without either."""
    cwd = cwd or Path.cwd()
    path = path or find_config(cwd)
    if path is None:
        return Config(root=cwd)
    data = _read(path)
    table = data.get("tool", {}).get("planlang", {}) if path.name == "pyproject.toml" else data
    if path.name != "pyproject.toml" and "tool" in data and "planlang" in data["tool"]:
        table = data["tool"]["planlang"]  # a planlang.toml written with the pyproject layout
    where = f"{path}" + (" [tool.planlang]" if path.name == "pyproject.toml" else "")
    unknown = [k for k in table if k not in KEYS]
    if unknown:
        guess = did_you_mean(unknown[0], KEYS)
        raise ConfigError(f"{where}: unknown setting `{unknown[0]}`"
                          + (f"; did you mean `{guess}`?" if guess else f"; settings are {', '.join(KEYS)}"))
    pfi = table.get("per-file-ignores", {})
    if not isinstance(pfi, dict):
        raise ConfigError(f"{where}: `per-file-ignores` must be a table of glob = [codes], "
                          "e.g. per-file-ignores = { \"legacy/*.plan\" = [\"PL4\"] }")
    respect = table.get("respect-gitignore", True)
    if not isinstance(respect, bool):
        raise ConfigError(f"{where}: `respect-gitignore` must be true or false")
    exclude = tuple(_list(table, "exclude", where)) if "exclude" in table else DEFAULT_EXCLUDE
    return Config(
        root=path.parent.resolve(), source=str(path),
        select=_codes(_list(table, "select", where), f"{where} select") or ("PL",),
        extend_select=_codes(_list(table, "extend-select", where), f"{where} extend-select"),
        ignore=_codes(_list(table, "ignore", where), f"{where} ignore"),
        per_file_ignores=tuple((glob, _codes(_list(pfi, glob, where), f"{where} per-file-ignores"))
                               for glob in pfi),
        exclude=exclude + tuple(_list(table, "extend-exclude", where)),
        respect_gitignore=respect,
        use_paths=tuple(str((path.parent / p).resolve()) for p in _list(table, "use-paths", where)),
    )
