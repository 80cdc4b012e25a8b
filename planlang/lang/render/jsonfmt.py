"""A JSON array of diagnostic objects (indent=2, fixed key order).

A diagnostic with a mechanical fix has one more key, `fix`: its message, whether it is safe (applied by
`planlang lint --fix`; unsafe ones by `--unsafe-fixes`), and its edits, each a span (as the diagnostic's,
plus `start`/`end` character offsets into the file) and the text that replaces it (empty: a deletion).
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ._common import severity_name, sorted_diagnostics


def _label(label: Any) -> dict[str, Any]:
    s = label.span
    return {
        "file": s.file,
        "line": s.line,
        "column": s.col,
        "end_line": s.end_line,
        "end_column": s.end_col,
        "message": label.message,
    }


def to_dict(diag: Any) -> dict[str, Any]:
    s = diag.span
    return {
        "code": diag.code,
        "severity": severity_name(diag),
        "message": diag.message,
        "file": s.file,
        "line": s.line,
        "column": s.col,
        "end_line": s.end_line,
        "end_column": s.end_col,
        "labels": [_label(lb) for lb in diag.labels],
        "help": diag.help,
        "notes": list(diag.notes),
    } | ({"fix": fix_dict(diag.fix)} if getattr(diag, "fix", None) is not None else {})


def fix_dict(fix: Any) -> dict[str, Any]:
    return {"message": fix.message, "safe": fix.safe, "edits": [_edit(e) for e in fix.edits]}


def _edit(edit: Any) -> dict[str, Any]:
    s = edit.span
    return {"file": s.file, "line": s.line, "column": s.col, "end_line": s.end_line, "end_column": s.end_col,
            "start": s.start, "end": s.end, "text": edit.text}


def render(diagnostics: list[Any], sources: Mapping[str, Any], color: bool = False) -> str:
    data = [to_dict(d) for d in sorted_diagnostics(diagnostics)]
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
