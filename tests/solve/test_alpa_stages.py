"""Alpa's inter-operator stage DP as the solver's fifth stage method (`alpa`, pipeline_stages.alpa_partition):
on the one sub-mesh shape every stage has today (dp x tp devices), its cut is the best of every cut of the
layer sequence under Alpa's eq. 2 (Σ t_i + (B − 1)·max t_i) among those whose every stage fits the budget
by the 1F1B rule — checked against an enumeration written out here; and `planlang solve` reaches it on a
`stages ?` hole, forced (`stage_method="alpa"`) and among the other methods."""
from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

from planlang.plan.checker import check_text
from planlang.plan.selection import Selection
from planlang.solve.driver import SolveError, solve
from planlang.solve.pipeline_stages import alpa_partition, plan_layers, uniform_stages
from planlang.solve.space import STAGE_METHODS

sys.path.insert(0, str(Path(__file__).parent))
from test_partition_adapter import PLAN, make_plan  # noqa: E402  (the small GPT-2 of the adapter tests)


@pytest.fixture(scope="module")
def parts():
    return plan_layers(make_plan(2))  # one microbatch's profile, shared by every stage count


def _cut_of(choices, names) -> tuple[int, ...]:
    """The layer bounds a partition's stage lines select, in order."""
    bounds = [0]
    for c in choices:
        bounds.append(bounds[-1] + sum(any(Selection.parse(s).matches(n) for s in c.modules) for n in names))
    assert bounds[-1] == len(names)
    return tuple(bounds)


@pytest.mark.parametrize("pp", [2, 3, 4])
def test_alpa_cut_is_the_best_of_every_cut_that_fits(parts, pp):
    plan = make_plan(pp if pp != 3 else 2)
    u = uniform_stages(plan, pp, parts)
    n, m = len(u.times), u.microbatches
    names = u.layers.names
    # the inputs: AdamW states (W + grad + 2 moments) / tp; one microbatch's activations / (dp tp)
    assert u.static == pytest.approx([4 * w / u.tp for w in u.layers.costs("params")])
    assert u.act == pytest.approx([a * parts.divide / m / (u.dp * u.tp) for a in u.layers.costs("activations")])

    def stages(bounds):
        return list(zip(bounds, bounds[1:]))

    def objective(bounds):  # Alpa eq. 2
        t = [sum(u.times[a:b]) for a, b in stages(bounds)]
        return sum(t) + (m - 1) * max(t)

    def peak(bounds):  # 1F1B: stage i holds min(pp - i, m) microbatches
        return max(sum(u.static[a:b]) + min(pp - i, m) * sum(u.act[a:b]) for i, (a, b) in enumerate(stages(bounds)))

    cuts = [(0, *c, n) for c in itertools.combinations(range(1, n), pp - 1)]
    fastest = min(cuts, key=objective)
    # a budget between the least peak of any cut and the fastest cut's: the constraint binds
    least = min(peak(c) for c in cuts)
    assert least < peak(fastest)
    for budget in (None, (least + peak(fastest)) / 2):
        fit = [c for c in cuts if budget is None or peak(c) <= budget]
        best = min(objective(c) for c in fit)
        got = _cut_of(alpa_partition(plan, pp, parts, budget=budget if budget else 1e30), names)
        assert got in fit
        assert objective(got) == pytest.approx(best, rel=1e-12)
    # no cut fits: the fastest, said so
    over = alpa_partition(plan, pp, parts, budget=least / 2)
    assert objective(_cut_of(over, names)) == pytest.approx(objective(fastest), rel=1e-12)
    assert all("no cut fits the budget" in c.note for c in over)


def _plan_file(tmp_path: Path) -> str:
    text = PLAN.format(pp=4, tp=1, tie="", schedule="1f1b")
    p = tmp_path / "gpt2_stages_hole.plan"
    p.write_text(text)
    return str(p)


def test_solve_reaches_alpa_on_a_stages_hole(tmp_path):
    path = _plan_file(tmp_path)
    forced = solve(path, stage_method="alpa")
    assert dict(forced.best.choices)["stages"] == "alpa"
    checked = check_text(forced.text, path)
    assert not checked.errors and checked.plan is not None and not checked.plan.holes()
    # the solved plan's own mesh and microbatches, on the profile the solver makes (the whole batch)
    expected = alpa_partition(checked.plan, 4, plan_layers(checked.plan, divide=1))
    written = [[str(s) for s in st.modules] for st in checked.plan.pipeline.stages]
    assert written == [list(c.modules) for c in expected]
    # unforced: every method is priced (in full, or by its step alone when that cannot win), alpa's
    # among them unless its cut is an earlier method's (the same plan is priced once)
    free = solve(path)
    assert not any("by alpa skipped" in n for n in free.notes)
    named = {dict(ch)["stages"] for ch in [c.choices for c in free.tried] + [ch for ch, _ in free.bounded]}
    cuts = {tuple(tuple(str(s) for s in st.modules) for st in c.plan.pipeline.stages) for c in free.tried}
    assert "alpa" in named or tuple(tuple(c.modules) for c in expected) in cuts
    assert free.best.step_time <= forced.best.step_time  # the best-priced of all the methods
    assert "alpa" in STAGE_METHODS
    with pytest.raises(SolveError, match="unknown stage method"):
        solve(path, stage_method="fastest")
