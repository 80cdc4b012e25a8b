"""Every ```plan block of docs/language.md parses without diagnostics.

Blocks that show a mistake on purpose are tagged ```plan-invalid and are skipped. The complete GPT-2
example (the block whose first line starts with `# gpt2_3d.plan`) must also pass the model-free checks.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from planlang.lang.parser import parse

DOC = Path(__file__).resolve().parents[1] / "docs" / "language.md"

_FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def _blocks(text: str) -> list[tuple[str, int, str]]:
    """(info string, line number of the opening fence, body) for every fenced block."""
    out = []
    for m in _FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        out.append((m.group("info").strip(), line, m.group("body")))
    return out


BLOCKS = _blocks(DOC.read_text(encoding="utf-8"))
PLAN_BLOCKS = [(line, body) for info, line, body in BLOCKS if info == "plan"]


def test_doc_has_plan_examples():
    assert len(PLAN_BLOCKS) >= 30, "the ```plan blocks of docs/language.md were not found"
    infos = {info.split()[0] for info, _, _ in BLOCKS if info}
    assert infos <= {"plan", "plan-invalid"}, f"unexpected fence tags: {sorted(infos)}"


@pytest.mark.parametrize("line,body", PLAN_BLOCKS, ids=[f"line{line}" for line, _ in PLAN_BLOCKS])
def test_plan_block_parses(line, body):
    result = parse(body, f"docs/language.md:{line}")
    detail = "\n".join(f"  {d.code} {d.span.line}:{d.span.col} {d.message}" for d in result.diagnostics)
    assert not result.diagnostics, f"```plan block at docs/language.md:{line} does not parse:\n{detail}"


def test_complete_example_checks_clean():
    from planlang.plan.checker import check_text

    bodies = [body for _, body in PLAN_BLOCKS if body.startswith("# gpt2_3d.plan")]
    assert len(bodies) == 1, "the complete GPT-2 example was not found"
    result = check_text(bodies[0], "gpt2_3d.plan")
    detail = "\n".join(f"  {d.code} {d.span.line}:{d.span.col} {d.message}" for d in result.diagnostics)
    # pp x dp x tp checks clean
    assert not result.diagnostics, f"the complete example has diagnostics:\n{detail}"
