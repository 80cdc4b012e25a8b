"""Which sizes a module or parameter of the model runs on, for the model-aware rules: the mesh's, or, in a
plan whose pipeline stages have degrees of their own (`stage h[0:2] with dp = 4, tp = 1`,
planlang.plan.stage_meshes), its stage's. A rule that reads axis sizes (PL362's divisibility, PL365's heads)
checks each name under the sizes it runs on, and says which stage when they are a stage's own
("in stage 1 (dp = 2, tp = 2): ...", as planlang.plan.rules.stage_data_specs says PL305)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from planlang.plan import types as T
from planlang.plan.selection import covered_modules, stage_targets
from planlang.plan.stage_meshes import heterogeneous, stage_sizes, with_sizes


@dataclass(frozen=True)
class Site:
    """The plan a name runs under (the mesh's sizes, or its stage's) and the prefix of a diagnostic about
    it ("" for the mesh's)."""

    plan: T.Plan
    prefix: str = ""


def stage_sites(plan: T.Plan, facts) -> Callable[[str], Site]:
    """For a module or parameter name of the probed model (`facts`), the Site it runs on: the plan itself
    but for a plan of stages of their own degrees, where a name in a stage runs on the stage's sizes (a
    name in no stage, on the mesh's)."""
    whole = Site(plan)
    p = plan.pipeline
    if not heterogeneous(plan) or p is None or not isinstance(p.stages, tuple):
        return lambda name: whole
    names = stage_targets(facts.all_modules, facts.params)
    stage_of: dict[str, int] = {}
    for st in p.stages:
        for m in covered_modules(st.modules, names):
            stage_of.setdefault(m, st.index)
    sites: dict[int, Site] = {}
    for s in range(len(p.stages)):
        sizes = stage_sizes(plan, s)
        if sizes is not None:
            wrote = ", ".join(f"{a} = {n}" for a, n in sizes if a != p.axis)
            sites[s] = Site(with_sizes(plan, sizes), f"in stage {s} ({wrote}): ")

    def site(name: str) -> Site:
        parts = name.split(".")
        for k in range(len(parts), 0, -1):  # the name, then its enclosing modules (a parameter's owner)
            s = stage_of.get(".".join(parts[:k]))
            if s is not None:
                return sites.get(s, whole)
        return whole

    return site
