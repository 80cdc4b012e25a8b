"""Renderers: one output format per module, all over plain `Diagnostic` values.

    render(diagnostics, sources, "human", color=True)

Formats: ``human`` (rustc/Elm-style excerpts), ``concise`` (one line each), ``json``, ``sarif``
(SARIF 2.1.0) and ``github`` (GitHub Actions workflow commands). Diagnostics may be given in any
order; every renderer sorts them by (file, line, column, code). ``sources`` maps a file path (as
written in the spans) to its `SourceFile`; a file missing from it is rendered without an excerpt.

Format modules are imported on first use, so importing this package costs almost nothing.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from importlib import import_module
from typing import Any

from ._common import sorted_diagnostics, summary_line

__all__ = ["FORMATS", "render", "summary_line", "sorted_diagnostics"]

FORMATS: tuple[str, ...] = ("human", "concise", "json", "sarif", "github")

_MODULES = {
    "human": "human",
    "concise": "concise",
    "json": "jsonfmt",
    "sarif": "sarif",
    "github": "github",
}


def render(
    diagnostics: Iterable[Any],
    sources: Mapping[str, Any] | None,
    fmt: str,
    color: bool = False,
    **options: Any,
) -> str:
    """Render `diagnostics` in format `fmt` (one of `FORMATS`).

    `color` adds ANSI colour where the format has any (human, concise); machine formats ignore it.
    Extra keyword options go to the format's renderer (e.g. ``rule_titles=`` for sarif).
    The result ends with a newline unless it is empty (text formats with no diagnostics).
    """
    try:
        module_name = _MODULES[fmt]
    except KeyError:
        raise ValueError(f"unknown output format {fmt!r}; expected one of {', '.join(FORMATS)}") from None
    module = import_module(f"{__name__}.{module_name}")
    return module.render(list(diagnostics), sources or {}, color=color, **options)
