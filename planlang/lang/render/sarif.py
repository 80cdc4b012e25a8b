"""SARIF 2.1.0, for code-scanning dashboards (GitHub code scanning, IDE SARIF viewers).

One run; one rule per distinct code; results point at `%SRCROOT%`-relative URIs. Columns are
counted in Unicode code points (``columnKind``), as planlang spans are; ``endColumn`` is exclusive,
as in SARIF.

Rules are described from the table of codes (planlang.lang.codes): ``shortDescription`` is the title,
``fullDescription`` the explanation, ``help`` the explanation plus how to fix it (text and markdown),
and ``helpUri`` the code's entry in docs/diagnostics.md in the repository (`REPOSITORY_URL`).
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from ..version import __version__

from ..codes import CODES, DIAGNOSTICS_DOC, REPOSITORY_URL, Code
from ._common import severity_name, sorted_diagnostics, to_posix

SCHEMA_URI = "https://json.schemastore.org/sarif-2.1.0.json"
SARIF_VERSION = "2.1.0"
INFORMATION_URI = REPOSITORY_URL
DOC_URI = f"{REPOSITORY_URL}/blob/main/{DIAGNOSTICS_DOC}"
SRCROOT = "%SRCROOT%"

_LEVELS = {"error": "error", "warning": "warning", "note": "note"}
_RANK = {"error": 0, "warning": 1, "note": 2}


def artifact_location(path: str) -> dict[str, str]:
    """A relative URI under %SRCROOT% when the path is relative (or inside the working directory)."""
    p = path
    if os.path.isabs(p):
        try:
            rel = os.path.relpath(p)
        except ValueError:  # another drive on Windows
            rel = None
        if rel is None or rel.startswith(".."):
            posix = to_posix(p)
            if not posix.startswith("/"):
                posix = "/" + posix
            return {"uri": "file://" + quote(posix, safe="/:")}
        p = rel
    posix = to_posix(p)
    while posix.startswith("./"):
        posix = posix[2:]
    return {"uri": quote(posix, safe="/"), "uriBaseId": SRCROOT}


def _region(span: Any) -> dict[str, int]:
    return {
        "startLine": span.line,
        "startColumn": span.col,
        "endLine": span.end_line,
        "endColumn": span.end_col,
    }


def _physical(span: Any) -> dict[str, Any]:
    return {"artifactLocation": artifact_location(span.file), "region": _region(span)}


def _fix(fix: Any) -> dict[str, Any]:
    """A SARIF `fix`: one `artifactChange` per file, each edit a `replacement` (the region deleted, the
    text inserted; an empty region inserts). An unsafe fix says so in its description and properties."""
    by_file: dict[str, list[Any]] = {}
    for e in fix.edits:
        by_file.setdefault(e.span.file, []).append(e)
    changes = [{"artifactLocation": artifact_location(f),
                "replacements": [{"deletedRegion": _region(e.span), "insertedContent": {"text": e.text}}
                                 for e in edits]}
               for f, edits in by_file.items()]
    text = fix.message + ("" if fix.safe else " (unsafe: changes what the plan means; `--unsafe-fixes`)")
    return {"description": {"text": text}, "artifactChanges": changes, "properties": {"safe": fix.safe}}


def fingerprint(diag: Any) -> str:
    """Stable across runs and line moves: a hash of code, file and message."""
    key = "\x00".join((diag.code, to_posix(diag.span.file), diag.message))
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]


def _message_text(diag: Any) -> str:
    text = diag.message
    if diag.help:
        text += "\nhelp: " + diag.help
    for note in diag.notes:
        text += "\nnote: " + note
    return text


def _how_to_fix(entry: Code) -> list[str]:
    """Paragraphs (markdown) on fixing, or deliberately silencing, a diagnostic of this code."""
    c = entry.code
    check = "`planlang check --model PLAN`" if entry.model_aware else "`planlang check PLAN`"
    out = [
        "Fix the cause described above. When a result's message has a `help:` line, it suggests a fix for "
        f"that occurrence. Run {check} again to confirm the diagnostic is gone.",
    ]
    if c.startswith("PL1"):
        out.append("Syntax errors cannot be suppressed: a file that does not parse is never clean.")
    elif entry.severity.value == "error":
        out.append(f"An error fails `planlang check`. A `# plan: ignore[{c}]` comment hides the report, not "
                   "the problem: fix the plan instead.")
    else:
        fails = "fails `planlang lint`" if entry.severity.value == "warning" else "never fails a command"
        out.append(f"A {entry.severity.value} {fails}. If the plan is right as written, suppress it on one line "
                   f"with `# plan: ignore[{c}]` (at the end of the line, or on the line before) or in a whole "
                   f"file with `# plan: ignore-file[{c}]`.")
    return out


def rule_descriptor(code: str, level: str, title: str | None = None) -> dict[str, Any]:
    """The `reportingDescriptor` of one code. `title` is used only for a code the table lacks."""
    entry = CODES.get(code)
    if entry is None:
        short = title or code
        text = f"{code} is not in planlang's table of diagnostic codes."
        return {
            "id": code,
            "shortDescription": {"text": short},
            "fullDescription": {"text": text},
            "help": {"text": f"{short}\n\n{text} Every code is listed in {DOC_URI}",
                     "markdown": f"{short}\n\n{text} Every code is listed in [{DIAGNOSTICS_DOC}]({DOC_URI})."},
            "helpUri": DOC_URI,
            "defaultConfiguration": {"level": level},
        }
    explanation = entry.explanation_text or entry.title
    head = f"{entry.code} ({entry.name}, {entry.severity.value}): {entry.title}."
    fix = _how_to_fix(entry)
    more = f"`planlang explain {entry.code}` prints this entry."
    text = "\n\n".join([head, explanation, "How to fix:", *fix, f"{more} See {entry.doc_url}"])
    markdown = "\n\n".join([f"**{entry.code} `{entry.name}`** ({entry.severity.value}): {entry.title}.",
                             explanation, "#### How to fix", *fix,
                             f"{more} See [{entry.code} in {DIAGNOSTICS_DOC}]({entry.doc_url})."])
    return {
        "id": entry.code,
        "name": entry.name,
        "shortDescription": {"text": entry.title},
        "fullDescription": {"text": explanation},
        "help": {"text": text, "markdown": markdown},
        "helpUri": entry.doc_url,
        "defaultConfiguration": {"level": level},
    }


def to_sarif(diagnostics: list[Any], rule_titles: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The SARIF log of `diagnostics`.

    Rules are described from the table of codes; `rule_titles` (code -> title) is still accepted but only
    names codes the table lacks: for the table's codes it would be redundant.
    """
    diags = sorted_diagnostics(diagnostics)
    titles = rule_titles or {}

    levels: dict[str, str] = {}
    for d in diags:
        level = _LEVELS.get(severity_name(d), "warning")
        if d.code not in levels or _RANK[level] < _RANK[levels[d.code]]:
            levels[d.code] = level
    codes = sorted(levels)
    rule_index = {code: i for i, code in enumerate(codes)}
    rules = [rule_descriptor(code, levels[code], titles.get(code)) for code in codes]

    results = []
    for d in diags:
        result: dict[str, Any] = {
            "ruleId": d.code,
            "ruleIndex": rule_index[d.code],
            "level": _LEVELS.get(severity_name(d), "warning"),
            "message": {"text": _message_text(d)},
            "locations": [{"physicalLocation": _physical(d.span)}],
        }
        if d.labels:
            related = []
            for i, lb in enumerate(d.labels):
                loc: dict[str, Any] = {"id": i, "physicalLocation": _physical(lb.span)}
                if lb.message:
                    loc["message"] = {"text": lb.message}
                related.append(loc)
            result["relatedLocations"] = related
        if getattr(d, "fix", None) is not None:
            result["fixes"] = [_fix(d.fix)]
        result["partialFingerprints"] = {"planlang/v1": fingerprint(d)}
        results.append(result)

    return {
        "$schema": SCHEMA_URI,
        "version": SARIF_VERSION,
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "planlang",
                        "informationUri": INFORMATION_URI,
                        "version": __version__,
                        "rules": rules,
                    }
                },
                "columnKind": "unicodeCodePoints",
                "results": results,
            }
        ],
    }


def render(
    diagnostics: list[Any],
    sources: Mapping[str, Any],
    color: bool = False,
    rule_titles: Mapping[str, str] | None = None,
) -> str:
    return json.dumps(to_sarif(diagnostics, rule_titles), indent=2, ensure_ascii=False) + "\n"
