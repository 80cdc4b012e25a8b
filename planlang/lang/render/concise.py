"""One line per diagnostic: ``file:line:col: severity[CODE] message`` (control and format characters of
the message, newlines included, shown escaped: ``\\n``, ``\\u200b``). As in ruff, ``[*]`` before the
message marks a diagnostic that `planlang lint --fix` fixes (a safe fix)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._common import escape_text, severity_name, sorted_diagnostics

_COLORS = {"error": "\x1b[1;31m", "warning": "\x1b[1;33m", "note": "\x1b[1;36m"}
_RESET = "\x1b[0m"


def format_one(diag: Any, color: bool = False) -> str:
    s = diag.span
    sev = severity_name(diag)
    tag = f"{sev}[{diag.code}]"
    if color:
        tag = f"{_COLORS.get(sev, '')}{tag}{_RESET}"
    fix = getattr(diag, "fix", None)
    mark = "[*] " if fix is not None and fix.safe else ""
    return f"{escape_text(s.file, newlines=True)}:{s.line}:{s.col}: {tag} {mark}{escape_text(diag.message, newlines=True)}"


def render(diagnostics: list[Any], sources: Mapping[str, Any], color: bool = False) -> str:
    lines = [format_one(d, color) for d in sorted_diagnostics(diagnostics)]
    return "".join(line + "\n" for line in lines)
