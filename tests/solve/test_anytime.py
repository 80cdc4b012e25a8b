"""`planlang solve --time-limit S` is anytime: when the limit is reached the best complete plan priced so
far is written (it checks), with a warning on stderr and a header line saying what was left unexplored;
when nothing priced fits, the error is PL560 with the smallest peak seen and says the search was cut."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from planlang.plan.checker import check_text
from planlang.solve.driver import Infeasible, solve
from tests.solve.test_driver import MLP  # the partial MLP plan, BUDGET to fill

REPO = Path(__file__).resolve().parents[2]
TINY = "0.001"  # past before the first candidate is priced: only the anytime seed runs


def _write(tmp_path: Path, budget: str) -> Path:
    p = tmp_path / "mlp_partial.plan"
    p.write_text(MLP.replace("BUDGET", budget))
    return p


def planlang(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "planlang.cli", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=300, env={**os.environ, "COLUMNS": "80"})


def test_tiny_time_limit_writes_a_complete_plan_that_checks_with_a_warning(tmp_path):
    path = _write(tmp_path, "1 GiB")
    out = planlang("solve", str(path), "--time-limit", TINY)
    assert out.returncode == 0, out.stderr
    res = check_text(out.stdout, str(path))
    assert not res.errors and res.plan is not None and not res.plan.holes()
    warning = [line for line in out.stderr.splitlines() if line.startswith("warning[PL561]: ")]
    assert len(warning) == 1, out.stderr
    # what was priced, of how many meshes, and which were left
    assert re.search(r"search cut by --time-limit 0\.001 s .* after 1 candidate plans priced", warning[0])
    assert "stage 1 tried 1 of 3 meshes (not tried: dp=2, tp=2 | dp=4, tp=1)" in warning[0]
    assert "stage 2" in warning[0] and "refined none" in warning[0]
    # the written plan says so in its header, and the summary printed is that header
    header = [line[2:] for line in out.stdout.splitlines() if line.startswith("# ")]
    assert any(line.strip().startswith("INCOMPLETE SEARCH: search cut by --time-limit") for line in header)
    summary = out.stderr.split(warning[0] + "\n", 1)[1].splitlines()
    assert summary == header[1:len(summary) + 1]


def test_without_a_cut_the_plan_says_nothing_of_one(tmp_path):
    res = solve(str(_write(tmp_path, "1 GiB")), time_limit=600)
    assert res.cut is None and "INCOMPLETE" not in res.text


def test_cut_result_is_the_best_priced_and_fits(tmp_path):
    res = solve(str(_write(tmp_path, "1 GiB")), time_limit=0.0)
    assert res.cut is not None and res.best.fits
    assert res.best == min(res.tried, key=lambda c: c.key("time"))
    assert not check_text(res.text, str(tmp_path / "mlp_partial.plan")).errors


def test_infeasible_budget_under_a_cut_is_pl505_with_the_smallest_peak(tmp_path):
    path = _write(tmp_path, "64 KiB")
    with pytest.raises(Infeasible) as err:
        solve(str(path), time_limit=0.0)
    assert err.value.cut is not None
    assert err.value.smallest_budget and err.value.smallest_budget > 64 * 1024
    out = planlang("solve", str(path), "--time-limit", TINY)
    assert out.returncode == 1 and out.stdout == ""
    error = out.stderr.strip().splitlines()[-1]
    assert error.startswith("error[PL560]: no plan fits the budget among the candidates priced before the cut")
    assert "search cut by --time-limit" in error and "raise --time-limit" in error
    m = re.search(r"the smallest peak found is ([\d.]+) KiB per device", error)
    assert m and float(m.group(1)) * 1024 == pytest.approx(err.value.smallest_budget, rel=1e-3)


def test_a_cut_ilp_keeps_its_incumbent(tmp_path, monkeypatch):
    """The limit reached inside the intra-op ILP (HiGHS returns its incumbent, status `feasible`): the
    spec set it gives is priced once past the limit, then the search ends with the best plan so far."""
    import dataclasses
    import time

    from planlang.solve import ilp
    from planlang.solve.driver import _Search

    search = _Search(str(_write(tmp_path, "1 GiB")), "time", lambda s: None, time_limit=600)
    real = ilp.solve

    def at_the_limit(inst, objective, options, **kw):
        result = real(inst, objective, options, **kw)
        search.clock.deadline = time.monotonic() - 1  # the limit is reached while this call runs
        return dataclasses.replace(result, status="feasible")

    monkeypatch.setattr(ilp, "solve", at_the_limit)
    res = search.run()
    assert res.cut is not None and "stage 2" in res.cut and "cut while refining" in res.cut
    assert any("stopped at its time limit with a feasible solution" in n for n in res.notes)
    after = [c for c in res.tried if any(k == "spec 0" for k, _ in c.choices)]
    assert len(after) == 1  # the incumbent's specs, priced past the limit; nothing more
    assert res.best == min(res.tried, key=lambda c: c.key("time"))
    assert not check_text(res.text, str(tmp_path / "mlp_partial.plan")).errors
