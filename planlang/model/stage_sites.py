"""Which sizes a module or parameter of the model runs on, for the model-aware rules: the mesh's, or, in a
plan whose pipeline stages have degrees of their own (`stage h[0:2] with dp = 4, tp = 1`,
planlang.plan.stage_meshes), its stage's. A rule that reads axis sizes (PL362's divisibility, PL365's heads)
checks each name under the sizes it runs on, and says which stage when they are a stage's own
("in stage 1 (dp = 2, tp = 2): ...", as planlang.plan.rules.stage_data_specs says PL305)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from planlang.plan import types as T
from planlang.plan.selection import stage_targets
from planlang.plan.stage_meshes import describe, heterogeneous, stage_sizes, with_sizes

from .price.local_model import stage_of_modules


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
    stage_of = stage_of_modules(plan, stage_targets(facts.all_modules, facts.params))  # type: ignore[arg-type]
    sites: dict[int, Site] = {}
    for s in range(len(p.stages)):
        sizes = stage_sizes(plan, s)
        if sizes is not None:
            sites[s] = Site(with_sizes(plan, sizes), f"in stage {s} ({describe(plan, sizes)}): ")

    def site(name: str) -> Site:
        parts = name.split(".")
        for k in range(len(parts), 0, -1):  # the name, then its enclosing modules (a parameter's owner)
            s = stage_of.get(".".join(parts[:k]))
            if s is not None:
                return sites.get(s, whole)
        return whole

    return site
