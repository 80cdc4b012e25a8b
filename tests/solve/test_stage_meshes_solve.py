"""`planlang solve` on a plan whose stages have degrees of their own (`stage ... with dp = 4, tp = 1`) and
other holes: every candidate is priced stage by stage (planlang.model.price.stage_meshes), as `planlang
estimate` prices the solved plan, and its memory floor is each stage's on its own sizes (a lower bound on
the priced peak, above the floor the mesh's sizes would give the stage that holds its blocks whole)."""
from __future__ import annotations

import dataclasses

from planlang.model.price.estimate import estimate_plan
from planlang.solve import driver
from planlang.solve.pricing import memory_floor
from tests.model.test_stage_meshes_estimate import _text


def test_a_solve_prices_each_stage_on_its_own_degrees(tmp_path):
    path = tmp_path / "hetero.plan"
    path.write_text(_text((2, 2), (" with dp = 4, tp = 1", "")).replace("microbatches 2", "microbatches ?"))
    search = driver._Search(str(path), "time", lambda s: None, prune=False)
    res = search.run()
    assert res.tried
    for c in res.tried:
        rows = estimate_plan(c.plan)
        assert [r.peak for r in c.rows] == [r.peak for r in rows]
        assert list(c.steps) == [r.step_time for r in rows]
        assert 0 < memory_floor(c.plan, search.facts()) <= c.peak
        p = c.plan.pipeline
        assert p is not None
        mesh_sizes = dataclasses.replace(c.plan, pipeline=dataclasses.replace(
            p, stages=tuple(dataclasses.replace(st, degrees=()) for st in p.stages)))
        assert memory_floor(c.plan, search.facts()) > memory_floor(mesh_sizes, search.facts())
