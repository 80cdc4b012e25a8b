"""Whether, and how, the estimate runs a plan's local model as a few of its repeated blocks
(planlang.model.capture.fold_step; issue #29)."""
from __future__ import annotations

from planlang.model.capture import fold_step
from planlang.model.capture.fold import Fold, find_fold
from planlang.model.price.block_fold import plan_fold


def local_fold(plan, facts, module) -> tuple[Fold | None, str | None]:
    """block_fold.plan_fold of the local model `module`'s repeated blocks."""
    return plan_fold(plan, facts, find_fold(module))


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
