"""Whether, and how, the estimate runs a plan's local model as a few of its repeated blocks
(planlang.model.capture.fold_step; issue #29)."""
from __future__ import annotations

import dataclasses

from planlang.model.capture import fold_step
from planlang.model.capture.fold import Fold, find_fold
from planlang.model.price.block_fold import plan_fold
from planlang.model.price.local_model import _consecutive_items, plan_checkpoint_groups


def local_fold(plan, facts, module) -> tuple[Fold | None, str | None]:
    """block_fold.plan_fold of the local model `module`, with its checkpoint groups as wrap_checkpoints
    wrapped them: a group whose modules are checkpointed one by one (they take more than one tensor, as
    Hugging Face's decoder layers do: `checkpoint model.layers[*]` over Llama) is as many groups of one,
    each within its block; a chain (one checkpoint over consecutive blocks) is one group across blocks."""
    fold = find_fold(module)
    got, why = plan_fold(plan, facts, fold)
    if got is not None or fold is None or why != "a checkpoint group spans blocks":
        return got, why
    got, why = plan_fold(dataclasses.replace(plan, checkpoints=()), facts, fold)
    if got is None:
        return got, why
    sigs: list[list[tuple]] = [[] for _ in range(fold.count)]
    for group in plan_checkpoint_groups(plan, facts):
        for part in ([group] if _chain(group, facts) else [[m] for m in group]):
            places = [fold.split(m) for m in part]
            where = {p[0] if p is not None else None for p in places}
            if len(where) > 1:
                return None, "a checkpoint group spans blocks"
            if places and places[0] is not None:
                sigs[places[0][0]].append(tuple(sorted(p[1] for p in places if p is not None)))
    for i in range(1, fold.count):
        if sorted(sigs[i]) != sorted(sigs[0]):
            return None, f"the plan checkpoints {fold.block(i)} unlike {fold.block(0)}"
    return fold, None


def _chain(group: list[str], facts) -> bool:
    """Whether wrap_checkpoints runs `group` as one checkpoint (local_model.wrap_checkpoints' test)."""
    calls = facts.calls
    return len(group) > 1 and _consecutive_items(group) and all(
        len(calls[n].inputs) == 1 and len(calls[n].outputs) == 1 and not calls[n].keywords for n in group
    ) and all(calls[a].output == calls[b].inputs[0] for a, b in zip(group, group[1:]))


def folded_run(plan, facts, module, inputs, loss, **run) -> fold_step.FoldedRun | None:
    """The local model's simulated step and profile (`run`: fold_step.run_folded's switches) from runs of
    a few of its repeated blocks when the plan treats them alike; None when they cannot be folded
    (fold_step.LOG says why): the caller runs the whole model, as it would without folding."""
    if not fold_step.ENABLED:
        return None
    fold, why = local_fold(plan, facts, module)
    if fold is not None and fold.count < fold_step.FOLD_FROM:
        fold, why = None, f"{fold}: fewer than {fold_step.FOLD_FROM} blocks run whole (as fast)"
    if fold is None:
        fold_step.LOG.append((None, why))
        return None
    try:
        got = fold_step.run_folded(module, fold, inputs, loss, **run)
    except Exception as err:  # noqa: BLE001 - FoldError, or a model that cannot run cut: run it whole
        fold_step.LOG.append((None, f"{fold}: {type(err).__name__}: {err}"))
        return None
    fold_step.LOG.append((fold, None))
    return got
