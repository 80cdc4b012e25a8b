"""GitHub Actions workflow commands: ``::error file=F,line=L,col=C,...,title=CODE::message``.

GitHub turns these into annotations on the pull request. Escaping follows the runner's rules: in the
message, ``%`` ``\\r`` ``\\n``; in property values additionally ``:`` and ``,``.
GitHub only accepts ``col``/``endColumn`` for single-line regions, so they are left out of
annotations whose span covers several lines.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._common import severity_name, sorted_diagnostics, to_posix

_COMMANDS = {"error": "error", "warning": "warning", "note": "notice"}


def escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def format_one(diag: Any) -> str:
    s = diag.span
    command = _COMMANDS.get(severity_name(diag), "error")
    props = [("file", to_posix(s.file)), ("line", str(s.line))]
    if s.end_line == s.line:
        props += [("col", str(s.col)), ("endLine", str(s.end_line)), ("endColumn", str(s.end_col))]
    else:
        props += [("endLine", str(s.end_line))]
    props.append(("title", diag.code))
    message = diag.message
    if diag.help:
        message += "\nhelp: " + diag.help
    prop_text = ",".join(f"{k}={escape_property(v)}" for k, v in props)
    return f"::{command} {prop_text}::{escape_data(message)}"


def render(diagnostics: list[Any], sources: Mapping[str, Any], color: bool = False) -> str:
    return "".join(format_one(d) + "\n" for d in sorted_diagnostics(diagnostics))
