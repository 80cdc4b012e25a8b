"""What one solve knows of its model, computed once and shared by every candidate it prices.

A candidate changes the plan (its mesh, specs, microbatches, stages, ZeRO, checkpoint groups), never the
model: the model built on meta, its probe (modules in execution order, call shapes, parameters), its
profile at the whole batch and its layer sequence (planlang.solve.pipeline_stages.plan_layers), and the
op graph the intra-op ILP reads are the same for all of them. The estimator's simulations and profiles
of *local* models do depend on the candidate, but only on part of it (local parameter shapes, batch,
checkpoint groups, stages): two candidates that agree there share one (planlang.model.price.estimate keys
them), and `SolveFacts.estimates` keeps them for the whole solve — no bounded module-wide cache, no
eviction in the middle of a search.

Counted by tests/solve/test_plan_values.py: one model probe and one layer profile per solve, one op-graph
trace per solve, one simulation per distinct key.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from planlang.model.program.shared_lowering import SharedLowerings
from planlang.plan import types as T


@dataclass
class SolveFacts:
    """What one solve knows of its model. `layers` is planlang.solve.pipeline_stages.ModelParts (module,
    probe, whole-batch profile, layer sequence); `estimates` the estimator's cache
    (`estimate_plan(cache=...)`); the op graph is traced the first time the intra-op ILP asks."""

    layers: object
    estimates: dict = field(default_factory=dict)
    graph: object | None = None
    probed: object | None = None
    # pricing.memory_floor's local parameters, in parts: stages per pipeline, local shapes per specs and mesh
    param_stages: dict = field(default_factory=dict)
    local_shapes: dict = field(default_factory=dict)
    lowered: dict = field(default_factory=dict)  # pricing.lowered: a plan value's collectives
    # the programs pricing.lowered's candidates share (planlang.model.program.shared_lowering)
    programs: SharedLowerings = field(default_factory=SharedLowerings)

    @property
    def modules(self):
        """The probe as validation has it: planlang.model.facts.ModelFacts (modules, call shapes,
        parameters, each attention module's heads), made once from the layers' probe."""
        if self.probed is None:
            # lazy: torch loads only when this runs
            from planlang.model.facts import ModelFacts, attention_heads

            module, probe = getattr(self.layers, "module"), getattr(self.layers, "facts")  # ModelParts (typed object)
            self.probed = ModelFacts(**vars(probe), heads=attention_heads(module))
        return self.probed

    def op_graph(self, plan: T.Plan):
        """The op graph of the model with its loss (`plan` gives the inputs and the loss): the one
        planlang.model.price.traffic.graph_of traces once per input shape, so a candidate lowered at the
        whole batch does not trace it again."""
        if self.graph is None:
            # lazy: torch loads only when this runs
            from planlang.model.price.traffic import graph_of

            self.graph = graph_of(plan)
        return self.graph


def model_facts(plan: T.Plan) -> SolveFacts:
    """Build the plan's model on meta, probe and profile it once (the batch whole, `divide=1`)."""
    # lazy: torch loads only when this runs
    from planlang.solve.pipeline_stages import plan_layers

    return SolveFacts(plan_layers(plan, divide=1))
