"""`out = pm(**batch)` on 4 gloo ranks against one process (tests/runtime/call_worker.py): dp 4, dp 2 x tp 2
(HF GPT-2 computing its own loss from `labels`, declared as a plan input) and dp 4 with ZeRO-3.

Each config trains STEPS steps through `out.loss.backward()`, `pm.clip_grad_norm_` (which finishes the
deferred gradient sums), the optimizer's step and a LambdaLR scheduler, as one process runs torch's own
loop; then, from the plan's parameters, the evaluation loss (pm.eval(), torch.no_grad) and the logits
gathered whole by `pm.whole`, a shorter evaluation batch and sequence, and a shorter training batch of
shorter sequences (loss and gradients). Every error is judged against verify's bound (max(1e-5, 10 x one
process's own error against float64)). Then, on two copies from the same parameters: under f16 with a
loss scale, `pm(...)` + backward + the optimizer equal `pm.step` + the optimizer exactly; under
`microbatches 2`, a call's loss and gradients equal step's up to the summation order.
"""
from __future__ import annotations

import math

import pytest

from tests.runtime import call_worker as W
from tests.runtime.spawned import written_results

TIMEOUT_S = 300
OWN_LOSS = {"hf_dp2_tp2"}  # HF's loss: its -100 padding of the shifted labels ignored (cross_entropy's ignore_index)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return written_results(W.worker, W.WORLD, str(tmp_path_factory.mktemp("call")), TIMEOUT_S)


def _within(pair, what):
    err, bound = pair[0], pair[1]
    assert err <= bound, f"{what}: error {err:.2e} > bound {bound:.2e} {pair[2:]}"


@pytest.mark.parametrize("name", list(W.CONFIGS))
def test_call_backward_clip_and_scheduler_match_one_process(results, name):
    for r, res in enumerate(results):
        for row in res[name]["steps"]:
            for key in ("grads", "params"):
                _within(row[key], f"rank {r} {name} step {row['step']} {key}")
            assert row["norm_value"] > W.C.MAX_NORM  # every step clipped
            assert math.isclose(row["lr"], row["ref_lr"], rel_tol=1e-12)


@pytest.mark.parametrize("name", list(W.CONFIGS))
def test_call_loss_and_norm_match_one_process(results, name):
    for r, res in enumerate(results):
        for row in res[name]["steps"]:
            for key in ("loss", "norm"):
                _within(row[key], f"rank {r} {name} step {row['step']} {key}")


@pytest.mark.parametrize("name", list(W.CONFIGS))
def test_output_is_the_models_with_logits_whole_on_request(results, name):
    for r, res in enumerate(results):
        ev = res[name]["eval"]
        assert ev["type"] == ("CausalLMOutputWithCrossAttentions" if name in OWN_LOSS else "PlanOutput")
        assert not ev["loss_requires_grad"]  # under torch.no_grad
        _within(ev["logits"], f"rank {r} {name} logits")
        assert ev["whole_logits"][0] == 8 and ev["local_logits"][0] == 8 // res[name]["data_degree"]


@pytest.mark.parametrize("name", list(W.CONFIGS))
def test_evaluation_loss_and_shorter_batches_match_one_process(results, name):
    for r, res in enumerate(results):
        ev, short = res[name]["eval"], res[name]["short"]
        _within(ev["loss"], f"rank {r} {name} eval loss")
        _within(ev["short_loss"], f"rank {r} {name} shorter eval batch loss")
        _within(ev["seq_loss"], f"rank {r} {name} shorter eval sequence loss")
        _within(short["loss"], f"rank {r} {name} shorter training batch loss")
        assert short["grads_over_bound"][0] <= 1.0, f"rank {r} {name} shorter batch gradients {short}"


@pytest.mark.parametrize("name", list(W.CONFIGS))
def test_step_program_keeps_no_output(results, name):
    """`pm.step` runs the loss-only program; `pm(...)` its own (the outputs)."""
    for res in results:
        assert res[name]["step_outputs"] == 0 and res[name]["call_outputs"] > 0


def test_call_under_a_loss_scale_trains_as_step_does(results):
    """f16 parameters, f32 masters, loss scale 1024: `out.loss.backward()` and the optimizer's step give the
    parameters `pm.step` gives (the backward scaled as step's, the optimizer unscaling it)."""
    for res in results:
        f16 = res["f16"]
        assert f16["optimizer"] == "MasterWeights" and f16["scales"] == [1024.0, 1024.0]
        assert f16["loss_diff"] == 0.0 and f16["param_diff"] == 0.0, f16


def test_call_under_accumulation_equals_step(results):
    """`microbatches 2` with ZeRO-3: a call runs the step's batch as one program; its loss and gradients
    equal step's over 2 microbatches up to the summation order."""
    for res in results:
        acc = res["accumulation"]
        assert acc["microbatches"] == 2
        assert acc["loss"] <= 1e-6 and acc["grads"] <= 1e-5, acc


def test_llama_evaluates_with_its_rotary_buffer(results):
    """HF Llama's rotary inv_freq: a constant of the call's program lowered on meta, read from the live
    model (was a PlanError: `not one of the model's buffers`)."""
    for res in results:
        ll = res["llama"]
        assert ll["type"] == "CausalLMOutputWithPast" and ll["loss"] <= 1e-6 and ll["logits"] <= 1e-6, ll
