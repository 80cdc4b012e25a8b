"""GitHub Actions workflow commands: ``::error file=F,line=L,col=C,...,title=CODE::message``.

GitHub turns these into annotations on the pull request. Escaping follows the runner's rules: in the
message, ``%`` ``\\r`` ``\\n``; in property values additionally ``:`` and ``,``. Other control and
format characters (a message may quote source text) are shown as ``\\u200b``-style escapes.

Every annotation has ``col``. The runner drops an annotation with ``col``/``endColumn`` whose ``line``
and ``endLine`` differ (actions/runner#4167), so a span over several lines is annotated on its first
line: from its start column to the end of that line (``endColumn`` only when the source is known).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._common import escape_text, severity_name, sorted_diagnostics, to_posix

_COMMANDS = {"error": "error", "warning": "warning", "note": "notice"}


def escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def format_one(diag: Any, sources: Mapping[str, Any] | None = None) -> str:
    s = diag.span
    command = _COMMANDS.get(severity_name(diag), "error")
    props = [("file", to_posix(s.file)), ("line", str(s.line)), ("col", str(s.col))]
    if s.end_line == s.line:
        props += [("endLine", str(s.end_line)), ("endColumn", str(s.end_col))]
    else:  # the first line of the span
        props.append(("endLine", str(s.line)))
        src = (sources or {}).get(s.file)
        if src is not None:
            props.append(("endColumn", str(max(len(src.line_text(s.line)) + 1, s.col))))
    props.append(("title", diag.code))
    message = diag.message
    if diag.help:
        message += "\nhelp: " + diag.help
    prop_text = ",".join(f"{k}={escape_property(escape_text(v, newlines=True))}" for k, v in props)
    return f"::{command} {prop_text}::{escape_data(escape_text(message))}"


def render(diagnostics: list[Any], sources: Mapping[str, Any], color: bool = False) -> str:
    return "".join(format_one(d, sources) + "\n" for d in sorted_diagnostics(diagnostics))
