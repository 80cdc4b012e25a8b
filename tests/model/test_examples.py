"""Every bundled example plan passes the model-aware checks against its real model (built on meta)."""
from pathlib import Path

import pytest

from planlang.model.validation import check_with_model

ROOT = Path(__file__).resolve().parents[2]
PLANS = sorted((ROOT / "examples").rglob("*.plan"))


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: str(p.relative_to(ROOT)))
def test_example_plan_checks_clean_with_its_model(plan):
    result = check_with_model(str(plan))
    found = [str(d) for d in result.diagnostics]
    assert found == []
