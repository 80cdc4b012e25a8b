"""One simulated step and profile of a plan's local model (planlang.model.price.estimate's expensive
half): the model with its parameters sharded, the batch each device sees, the checkpoint groups wrapped,
folded where the plan treats its blocks alike (local_fold) and replayed per cut into stages (stage_replay)."""
from __future__ import annotations

import dataclasses

from planlang.plan.complete import CompletePlan

from planlang.model.capture.load import build_model, model_loss
from planlang.model.capture.profile import Profile, profile_model
from planlang.model.capture.simulate import simulate_step
from planlang.model.price.caches import LruCache
from planlang.model.price.local_fold import folded_run
from planlang.model.price.local_model import (LocalParam, LocalPieces, autocast_for, build_local_model, has_module,
                                              in_precision, local_inputs, plan_model, split_widths, wrap_checkpoints)
from planlang.model.price.stage_replay import record, stage_units


def simulate_local(plan: CompletePlan, facts, params: dict[str, LocalParam], divide: int, micro: int, stage_of,
                    profile_key: tuple, profiled: LruCache[Profile], profile: bool = True,
                    recorded: LruCache | None = None) -> tuple:
    """One simulated step and profile of the local model (parameters sharded, the batch divided by `divide`,
    the checkpoint groups wrapped); the parameters that got a gradient; notes. The profile is `profiled`'s
    (by `profile_key`) or kept there; without `profile` (memory only) None unless one was made before. A
    pipeline's step is replayed from the local model's run kept in `recorded` (recorded on first use), the
    same step for every cut of it into stages (planlang.model.price.stage_replay)."""
    units = stage_units(stage_of, facts) if stage_of and recorded is not None else None
    rec_key = (profile_key, micro > 1, units.key()) if units is not None else None
    rec = recorded.get(rec_key) if recorded is not None and rec_key is not None else None
    if rec is not None and units is not None and (not profile or profiled.get(profile_key) is not None):
        return rec.replay(units.stages(stage_of)), profiled.get(profile_key), rec.trained, rec.notes
    module, notes = build_local_model(plan, facts, params)
    local_in = local_inputs(plan, divide)
    loss = model_loss(plan_model(plan))
    stage_map = stage_of or None
    # the parts of the step FSDP2's per-block units change (ZeRO-2/3 without a pipeline: zero_blocks_peak)
    blocks = () if stage_map else tuple(b for b in getattr(facts, "blocks", ()) if has_module(module, b))
    trained: frozenset[str] | None = None
    try:
        with LocalPieces(split_widths(params)), autocast_for(plan.precision):
            prof = profiled.get(profile_key)
            # a few of the repeated blocks run when the plan treats them alike (no pipeline: stage_map None)
            folded = folded_run(plan, facts, module, local_in, loss, simulate=True, profile=prof is None and profile,
                                accumulate=micro > 1, blocks=blocks) if stage_map is None else None
            if folded is not None:
                assert folded.sim is not None
                sim, trained = folded.sim, folded.trained
                if prof is None and folded.profile is not None:
                    prof = profiled.put(profile_key, folded.profile)
            else:
                if rec is None and units is not None and recorded is not None:  # the first cut of this local model
                    rec = record(simulate_step, module, local_in, loss, units, micro > 1, tuple(notes))
                    if rec is not None:
                        recorded.put(rec_key, rec)
                if rec is not None and units is not None:
                    sim, trained = rec.replay(units.stages(stage_of)), rec.trained
                else:
                    sim = simulate_step(module, local_in, loss, stage_map, accumulate=micro > 1, blocks=blocks)
                    trained = frozenset(n for n, p in module.named_parameters(remove_duplicate=False)
                                        if p.grad is not None)
            if prof is None and profile:
                prof = profiled.put(profile_key, profile_model(module, local_in, loss) if stage_map is None
                                    else profile_local(plan, facts, module, local_in, loss))  # not folded yet
    except Exception as err:  # a model whose code does not follow its local parameter shapes
        notes.append(f"local simulation failed ({type(err).__name__}); activations from the unsharded model")
        module = build_model(plan_model(plan), plan.path)
        in_precision(module, plan.precision)
        notes += wrap_checkpoints(module, plan, facts)
        with autocast_for(plan.precision):
            sim = simulate_step(module, local_in, loss, stage_map, accumulate=micro > 1, blocks=blocks)
            prof = profile_model(module, local_in, loss) if profile else None
        trained = None
    if trained is None:
        trained = frozenset(n for n, p in module.named_parameters(remove_duplicate=False) if p.grad is not None)
    return sim, prof, trained, tuple(notes)


def profile_local(plan: CompletePlan, facts, module, local_in: dict, loss) -> Profile:
    """The local model's profile, folded (local_fold) when the plan treats its blocks alike, else whole. It
    reads no stages: a pipeline's is folded as the plan without it (1T: ~0.3 CPU-s for ~3 whole)."""
    got = folded_run(dataclasses.replace(plan, pipeline=None), facts, module, local_in, loss, simulate=False,
                     profile=True)
    return got.profile if got is not None and got.profile is not None else profile_model(module, local_in, loss)
