"""What the search never prices (issue #29, the solver at cluster scale), and what it says when no
candidate fits.

- A candidate the model cannot run: the checker's own model rules (planlang.model.checks) on its specs
  and mesh — PL362, a split dim its axes do not divide; PL365, an attention split through its heads or
  key/value heads (more tp than heads, or a tp that does not divide them). PL365 is a warning for a plan a
  user wrote and a refusal for a candidate: the model's code cannot run it. The rules read the probe and
  only the mesh, the specs and the data axes, so candidates that share those share the answer.
- A pipeline of more stages than the model has layers (planlang.solve.pipeline_stages' layer sequence at
  its coarsest: the top-level modules and each repeated block): every stage past that count splits a
  block, which lowers no stage's flops below the block's largest part while the min–max DP that cuts it
  costs O(k·n²) over the finer layers (minutes at 1T's 768 stages). Such meshes are not enumerated when
  the plan leaves its stages `?` (written stages fix the count), and the summary says how many.
- A candidate whose memory floor (planlang.solve.pricing.memory_floor: its parameters and optimizer
  states alone, a lower bound on the estimator's peak) is over the budget.

No plan fits: the nearest miss, the least peak priced or the least floor of those not priced, with the
budget it needs.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from planlang.plan import types as T
from planlang.plan.checker import check_resolution
from planlang.plan.complete import CompletePlan
from planlang.plan.resolve import Resolution
from planlang.plan.stage_meshes import heterogeneous
from planlang.plan.units import format_bytes
from planlang.model.checks import MODEL_RULES
from planlang.model.facts import ModelFacts
from planlang.solve.facts import SolveFacts
from planlang.solve.pricing import Candidate, memory_floor
from planlang.solve.space import Choices, SolveError

# the model rules whose findings mean the model cannot run a candidate (their codes: REFUSING)
RUNNABLE_RULES = ("shard_targets", "attention_head_splits")
REFUSING = ("PL362", "PL365")


class Infeasible(SolveError):
    def __init__(self, message: str, smallest_budget: int | None, cut: str | None = None) -> None:
        super().__init__(message)
        self.smallest_budget = smallest_budget
        self.cut = cut  # what the time limit left unexplored, when it cut the search


class Gate:
    """The candidates one solve does not price, and why (counted for the summary and the error)."""

    def __init__(self, resolution: Resolution, path: str, budget: int | None, facts: Callable[[], SolveFacts],
                 probed: ModelFacts | None = None) -> None:
        self.resolution, self.path, self.budget, self.facts = resolution, path, budget, facts
        self._probed = probed  # the CLI's validation's probe, when it has one
        self._runnable: dict[tuple, str | None] = {}  # (mesh, shards, data, own stages) -> why not, or None
        self.refused: dict[str, tuple[int, str]] = {}  # code -> candidates the model cannot run, the first why
        self.floored: tuple[Choices, int] | None = None  # the least memory floor over the budget
        self.floored_count = 0
        self.deep: tuple[int, int] | None = None  # (meshes not enumerated for their stage count, the layers)

    def probed(self) -> ModelFacts:
        """The probe as the model rules read it (module tree, shapes, each attention module's heads)."""
        if self._probed is None:
            self._probed = self.facts().modules
        return self._probed

    def cannot_run(self, plan: T.Plan) -> str | None:
        """Why the model cannot run this candidate (counted in `refused`), or None."""
        # stages of their own degrees: each stage's targets are checked on its sizes (planlang.model.stage_sites)
        own = plan.pipeline.stages if heterogeneous(plan) and plan.pipeline is not None else None
        key = (plan.mesh, plan.shards, plan.data, own)
        if key not in self._runnable:
            rules = [r for r in MODEL_RULES if r.name in RUNNABLE_RULES]
            res = check_resolution(replace(self.resolution, plan=plan), self.path, {"model": self.probed()}, rules,
                                   resolution=False)
            bad = [d for d in res.diagnostics if d.code in REFUSING]
            self._runnable[key] = None if not bad else f"{bad[0].code}: {bad[0].message}"
        why = self._runnable[key]
        if why is not None:
            code = why.split(":", 1)[0]
            n, first = self.refused.get(code, (0, why))
            self.refused[code] = (n + 1, first)
        return why

    def over_floor(self, plan: CompletePlan, choices: Choices) -> bool:
        """Is the candidate's memory floor over the budget? (The least such floor is kept for the error.)"""
        if self.budget is None:
            return False
        floor = memory_floor(plan, self.facts())
        if floor <= self.budget:
            return False
        if self.floored is None or floor < self.floored[1]:
            self.floored = (choices, floor)
        self.floored_count += 1
        return True

    def shallow(self, meshes: list[dict], stage_count: Callable[[dict], int]) -> list[dict]:
        """The meshes whose pipeline has at most as many stages as the model has layers (see the module
        docstring; counted in `deep`). The caller asks only when the plan leaves its stages `?`."""
        layers = getattr(self.facts().layers, "layers", None)  # a LayerSequence, None: not a chain
        if layers is None:
            return meshes
        n = len(layers.layers)
        kept = [a for a in meshes if stage_count(a) <= n]
        if len(kept) < len(meshes):
            self.deep = (len(meshes) - len(kept), n)
        return kept

    def summary(self) -> str | None:
        """The candidates never priced because the model cannot run them or their pipeline is deeper than
        the model, in a line."""
        said = []
        if self.deep is not None:
            said.append(f"never enumerated: {self.deep[0]} meshes whose pipeline has more stages than the model's "
                        f"{self.deep[1]} layers")
        if self.refused:
            said.append("never priced, the model cannot run them: " + "; ".join(
                f"{n} candidate{'s' if n > 1 else ''} by {code} (first: {why})"
                for code, (n, why) in self.refused.items()))
        return "; ".join(said) or None

    def infeasible(self, tried: list[Candidate], cut: str | None, notes: list[str]) -> Infeasible:
        """No candidate fits: the nearest miss — the least peak priced, or the least floor of those not
        priced — and the budget it needs."""
        within = "" if cut is None else f" among the candidates priced before the cut ({cut})"
        more = "" if cut is None else ", or raise --time-limit"
        smallest = min(tried, key=lambda c: c.peak) if tried else None
        if smallest is not None and (self.floored is None or smallest.peak <= self.floored[1]):
            return Infeasible(f"no plan fits the budget{within}; the nearest miss peaks at "
                              f"{format_bytes(smallest.peak)} per device ({smallest}); raise the budget to at least "
                              f"that or add devices{more}", smallest.peak, cut)
        if self.floored is None:
            raise SolveError("no candidate plan could be priced: " + "; ".join(notes[-3:]))
        choices, floor = self.floored
        what = ", ".join(f"{k}={v}" for k, v in choices)
        return Infeasible(f"no plan fits the budget{within}: {self.floored_count} candidates hold more than the "
                          f"budget in parameters and optimizer states alone; the nearest ({what}) holds "
                          f"{format_bytes(floor)} per device before any activation; raise the budget above that "
                          "(with room for activations), add devices, or shard more (ZeRO, tensor or pipeline "
                          f"parallelism){more}", floor, cut)
