"""Generate docs/diagnostics.md from the table of codes (planlang.lang.codes).

Run `python scripts/gen_diagnostics_doc.py` after adding or changing a code; tests/test_diagnostics_doc.py
fails while the file and the table disagree. The table is complete on import (model-aware codes too), so
this needs neither torch nor the model layer.

Each code gets a `### PLxxx` heading; GitHub renders it with the anchor `Code.anchor` (`#pl301`), which
the summary table links to and SARIF rules' `helpUri` points at.
"""
from __future__ import annotations

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


def render() -> str:
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
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    target = Path(__file__).resolve().parents[1] / "docs" / "diagnostics.md"
    target.write_text(render(), encoding="utf-8")
    print(f"wrote {target}")
