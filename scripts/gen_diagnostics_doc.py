"""Generate docs/diagnostics.md from the table of codes (planlang.lang.codes).

Run `python scripts/gen_diagnostics_doc.py` after adding or changing a code; tests/test_diagnostics_doc.py
fails while the file and the table disagree. The table is complete on import (model-aware codes too), so
this needs neither torch nor the model layer.

Each code gets a `### PLxxx` heading; GitHub renders it with the anchor `Code.anchor` (`#pl301`), which
the summary table links to and SARIF rules' `helpUri` points at.

Each entry's worked example (a failing plan and its fix, between `<!-- example PLxxx -->` and
`<!-- /example -->`) is written by hand in docs/diagnostics.md itself: the generator carries every example
of the current file over to the entry of its code (tests/test_diagnostic_examples.py checks them).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planlang.lang.codes import CODES  # noqa: E402

RANGES = [
    ("PL1", "Syntax"),
    ("PL2", "Names, values and units"),
    ("PL3", "Mesh and sharding specs"),
    ("PL4", "Pipeline and checkpointing"),
    ("PL5", "Memory and optimizer"),
]


DOC = Path(__file__).resolve().parents[1] / "docs" / "diagnostics.md"
_EXAMPLE = re.compile(r"^<!-- example (PL\d{3})(?: [a-z-]+)? -->\n.*?^<!-- /example -->$", re.M | re.S)


def examples(text: str) -> dict[str, str]:
    """Each code's example block (markers included) in a rendered file's text."""
    return {m.group(1): m.group(0) for m in _EXAMPLE.finditer(text)}


def render(kept: dict[str, str] | None = None) -> str:
    """The document, with the examples `kept` (by default, those of the file as it is)."""
    if kept is None:
        kept = examples(DOC.read_text(encoding="utf-8")) if DOC.exists() else {}
    out = [
        "# Diagnostics",
        "",
        "Every diagnostic has a stable code. `planlang explain CODE` prints the entry below. This file is",
        "generated from `planlang/lang/codes.py` by `scripts/gen_diagnostics_doc.py`; a test keeps them in sync.",
        "",
        "Severities: **error** fails `planlang check`; **warning** fails `planlang lint`; **note** never fails.",
        "Suppress one line with `# plan: ignore[CODE]` (at the end of the line, or on the line before) and a",
        "whole file with `# plan: ignore-file[CODE]`.",
        "",
        "Codes x60–x89 of each range are reserved for the model-aware checks (module paths, shapes, stage",
        "coverage, estimated memory).",
        "",
        "Every entry has a worked example: a plan that fails with that code and the plan fixed, in fenced",
        "blocks whose info string is `plan title=\"fails\"` and `plan title=\"fixed\"`, between the markers",
        "`<!-- example PLxxx -->` and `<!-- /example -->`. Where a plan needs another file beside it (a used",
        "module, the model's Python file), that block says `file=\"PATH\"` and `title=\"fails\"`, `\"fixed\"`",
        "or `\"both\"`; the plan checked is the first block of its title. `escapes` on a block means `\\xNN`",
        "stands for that byte and `\\uNNNN` for that character. The marker says how the example is checked:",
        "no mark, `planlang check PLAN` (no model); `model`, `planlang check --model PLAN` (the plan's model",
        "is built on the meta device, so a bundled example or the Python file shown); `runtime-only` and",
        "`solve`, shown with the command that reports the code (a run under torchrun, `planlang solve`).",
        "tests/test_diagnostic_examples.py checks each failing plan yields exactly its code at its severity",
        "and each fixed plan checks clean. The examples are written here by hand; the generator keeps them.",
        "",
        "| code | name | severity | meaning |",
        "| --- | --- | --- | --- |",
    ]
    for c in sorted(CODES.values(), key=lambda c: c.code):
        out.append(f"| [{c.code}](#{c.anchor}) | {c.name} | {c.severity.value} | {c.title} |")
    for prefix, title in RANGES:
        out += ["", f"## {prefix}xx — {title}"]
        for c in sorted((c for c in CODES.values() if c.code.startswith(prefix)), key=lambda c: c.code):
            out += ["", f"### {c.code}", "", f"**{c.name}** ({c.severity.value}): {c.title}."]
            if c.explanation:
                out += ["", c.explanation_text]
            if c.code in kept:
                out += ["", kept[c.code]]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    DOC.write_text(render(), encoding="utf-8")
    print(f"wrote {DOC}")
