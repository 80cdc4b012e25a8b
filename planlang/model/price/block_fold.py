"""Whether a plan treats a model's repeated blocks alike, so that facts measured on a few of them
(planlang.model.capture.fold) hold for all."""
from __future__ import annotations

from planlang.model.capture.fold import Fold
from planlang.model.price.local_model import is_chain, local_params, plan_checkpoint_groups, spec_for


def plan_fold(plan, facts, fold: Fold | None) -> tuple[Fold | None, str | None]:
    """`fold` when the plan (a CompletePlan) gives every block the same parameter specs and local shapes,
    activation rules and checkpoint groups (as they are wrapped: local_model.is_chain); otherwise (None,
    why not). `facts`: the probed model
    (ModuleFacts). A pipeline is never folded: its stage boundaries fall between blocks."""
    if fold is None:
        return None, "no list of identical blocks"
    if plan.pipeline is not None:
        return None, "a pipeline's stages cut the blocks"
    sigs: list[list] = [[] for _ in range(fold.count)]
    _, params = local_params(plan, facts)
    for name, p in params.items():
        got = fold.split(name)
        if got is not None:
            sigs[got[0]].append(("param", got[1], p.local, str(spec_for(name, plan))))
    for j, rule in enumerate(plan.shards):
        if rule.kind == "param":
            continue
        for m in rule.target.select(facts.all_modules):
            got = fold.split(m)
            if got is not None:
                sigs[got[0]].append(("activation", j, got[1]))
    # each group as the local model wraps it: a chain as one checkpoint, any other group module by module
    # (HF decoder layers under `checkpoint model.layers[*]`: one group per layer, each within its block)
    for group in plan_checkpoint_groups(plan, facts):
        for part in ([group] if is_chain(group, facts) else [[m] for m in group]):
            places = [fold.split(m) for m in part]
            where = {g[0] if g is not None else None for g in places}
            if len(where) > 1:
                return None, "a checkpoint group spans blocks"
            if places and places[0] is not None:
                sigs[places[0][0]].append(("checkpoint", tuple(sorted(g[1] for g in places if g is not None))))
    first = sorted(map(repr, sigs[0]))
    for i in range(1, fold.count):
        if sorted(map(repr, sigs[i])) != first:
            return None, f"the plan treats {fold.block(i)} unlike {fold.block(0)}"
    return fold, None
