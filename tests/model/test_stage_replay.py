"""A pipeline's simulated step replayed from one recorded run of its local model
(planlang.model.price.stage_replay) equals simulate_step with those stages, field for field, for every cut
of the model into stages: with and without accumulation, checkpointed blocks, bf16 autocast, tied
embeddings on the first and last stages."""
from __future__ import annotations

import pytest

from planlang.model.capture.load import build_model, meta_inputs, model_loss
from planlang.model.capture.simulate import simulate_step
from planlang.model.capture.trace import probe_modules
from planlang.model.price import stage_replay
from planlang.model.price.local_model import autocast_for, stage_of_modules, wrap_checkpoints
from planlang.plan.checker import check_text
from planlang.plan.complete import complete
from planlang.plan.selection import stage_targets

STAGES = {
    "2 even": ["wte, wpe, drop, h[0:3]", "h[3:6], ln_f, lm_head"],
    "2 uneven": ["wte, wpe, drop, h[0:1]", "h[1:6], ln_f, lm_head"],
    "3": ["wte, wpe, drop, h[0:2]", "h[2:4]", "h[4:6], ln_f, lm_head"],
    "6": ["wte, wpe, drop, h[0:1]", "h[1:2]", "h[2:3]", "h[3:4]", "h[4:5]", "h[5:6], ln_f, lm_head"],
}


def _plan(stages: list[str], checkpoint: str, bf16: bool):
    body = "\n".join(f"    stage {s}" for s in stages)
    opt = "optimizer adamw(lr = 0.001) {\n    precision = bf16\n}" if bf16 else "optimizer adamw(lr = 0.001)"
    text = f"""use hardware
model gpt2 = "examples.gpt2.model:build"(layers = 6, hidden = 64, heads = 4, vocab = 128, seq = 32)
input idx : i64[batch = 16, seq = 32]
mesh ranks of {len(stages)} x hardware.cpu {{
    pp = {len(stages)} over hardware.loopback
}}
{opt}
pipeline over pp schedule 1f1b microbatches 8 {{
{body}
}}
{checkpoint}
"""
    res = check_text(text, "/tmp/replay.plan")
    assert not res.errors, res.diagnostics
    return complete(res.plan)


@pytest.mark.parametrize("checkpoint,bf16,accumulate", [("", False, False), ("checkpoint h[*] every 1", False, True),
                                                        ("checkpoint h[*] every 2", True, True)])
def test_replayed_stages_equal_the_simulated_ones(checkpoint, bf16, accumulate):
    first = _plan(STAGES["2 even"], checkpoint, bf16)
    facts = probe_modules(build_model(first.model, first.path), meta_inputs(first.inputs))
    names = stage_targets(facts.all_modules, facts.params)
    loss = model_loss(first.model)

    def module_of(plan):
        module = build_model(plan.model, plan.path)
        wrap_checkpoints(module, plan, facts)
        return module

    inputs = meta_inputs(first.inputs)
    units = stage_replay.stage_units(stage_of_modules(first, names), facts)
    assert units is not None and "h.5" in units.names
    with autocast_for(first.precision):
        rec = stage_replay.record(simulate_step, module_of(first), inputs, loss, units, accumulate, ())
    assert rec is not None
    for stages in STAGES.values():
        plan = _plan(stages, checkpoint, bf16)
        stage_of = stage_of_modules(plan, names)
        assert stage_replay.stage_units(stage_of, facts) == units
        with autocast_for(plan.precision):
            direct = simulate_step(module_of(plan), inputs, loss, stage_of, accumulate=accumulate)
        replayed = rec.replay(units.stages(stage_of))
        assert replayed == direct
        assert len(direct.stage_saved) == len(stages) and (not accumulate or direct.stage_backward_peak_accum)


def test_a_cut_inside_a_unit_is_not_replayed():
    plan = _plan(STAGES["2 even"], "", False)
    facts = probe_modules(build_model(plan.model, plan.path), meta_inputs(plan.inputs))
    stage_of = stage_of_modules(plan, stage_targets(facts.all_modules, facts.params))
    units = stage_replay.stage_units(stage_of, facts)
    assert units is not None
    stage_of = dict(stage_of, **{"h.1.mlp": 1})  # a module of h.1 on the next stage
    assert units.cut(stage_of) is None
    assert stage_replay.stage_units(stage_of, facts) is None or stage_replay.stage_units(stage_of, facts) != units
