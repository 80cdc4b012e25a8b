"""Every bundled plan (examples/, the stdlib templates) is in the formatter's canonical layout: the README's
main job (scripts/demo.sh) ends with `planlang fmt --check examples stdlib`, and a template edited by hand
once broke it without any test noticing."""
from __future__ import annotations

from pathlib import Path

import pytest

from planlang.lang.fmt import format_check, unified_diff

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = sorted([*(ROOT / "examples").rglob("*.plan"), *(ROOT / "planlang" / "stdlib").rglob("*.plan")])


@pytest.mark.parametrize("path", BUNDLED, ids=lambda p: str(p.relative_to(ROOT)))
def test_bundled_plan_is_formatted(path):
    text = path.read_text(encoding="utf-8")
    ok, formatted = format_check(text, str(path))
    assert ok, unified_diff(text, formatted, str(path.relative_to(ROOT)))
