"""Stage 2's checkpoint candidates for a plan that does not fit (planlang.solve.driver's search, `search`):
rotor's groups on the local model's chain for what the budget leaves, else the `every k` grid."""
from __future__ import annotations

from planlang.solve.checkpoint_plan import (NoChain, activation_budget, choose_checkpoints, leanest_checkpoints,
                                            no_recompute_peak, plan_chain)
from planlang.solve.checkpoint_values import Checkpoints
from planlang.solve.pricing import Candidate


def checkpointed(search, assign, micro, zero, specs, stages, base: Candidate) -> list[Candidate | None]:
    """Checkpoint candidates for a plan that does not fit: rotor's groups (planlang.solve.
    checkpoint_plan) for the activation budget the estimator leaves, tightened by the estimator's
    overshoot until the plan fits (three tries); pipeline plans and models without a chain of
    blocks take the `every k` grid."""
    # lazy: numpy loads only when this runs
    from planlang.solve.rotor import InfeasibleBudget as ChainTooBig

    def price(ckpt):
        return search.price_at(assign, micro, zero, specs, ckpt, stages)

    out: list[Candidate | None] = []
    budget = search.plan.budget.bytes if search.plan.budget is not None else None
    if search.plan.pipeline is None and budget is not None:
        try:
            linear, head = plan_chain(base.plan, facts=search.facts().modules)  # the priced candidate's value
            # the chain holds activations only: what the budget leaves after parameters, gradients,
            # optimizer states and buffers, and never more than the chain needs without recomputation
            room = min(activation_budget(max(base.rows, key=lambda r: r.peak), budget), no_recompute_peak(linear))
            over = base.peak - budget
            seen: set[Checkpoints] = set()
            for _ in range(3):
                try:
                    choice = choose_checkpoints(linear, max(room, 1), head)
                except ChainTooBig as e:  # the leanest grouping, to report how close it comes
                    choice = leanest_checkpoints(linear, head, e.exact if e.exact is not None else budget)
                search.progress(f"rotor: {choice} for {room / 2**20:.3g} MiB of activations "
                              f"(+{choice.recompute_seconds * 1e3:.3g} ms recomputation)")
                if choice.value in seen:
                    break
                seen.add(choice.value)
                c = price(choice.value) if choice.value else None
                out.append(c)
                if c is not None and c.fits or room <= 0:
                    break
                over = c.peak - budget if c is not None else over
                room -= max(over, 1)  # the estimator's overshoot comes off the chain's budget
            if any(c is not None and c.fits for c in out):
                return out
        except (NoChain, ChainTooBig) as e:
            search.notes.append(f"rotor: {e}")
    for opt in search.space.ckpt_options():
        c = price(opt)
        out.append(c)
        if c is not None and c.fits:
            break
    return out

