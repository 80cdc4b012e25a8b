"""`out = pm(**batch)` on 4 gloo ranks against one process (tests/runtime/call_worker.py): dp 4, dp 2 x tp 2
(HF GPT-2 computing its own loss from `labels`, declared as a plan input) and dp 4 with ZeRO-3.

Each config trains STEPS steps through `out.loss.backward()`, `pm.clip_grad_norm_` (which finishes the
deferred gradient sums), the optimizer's step and a LambdaLR scheduler, as one process runs torch's own
loop; then, from the plan's parameters, the evaluation loss (pm.eval(), torch.no_grad) and the logits
gathered whole by `pm.whole`, a shorter evaluation batch and a shorter training batch (loss and
gradients). Every error is judged against verify's bound (max(1e-5, 10 x one process's own error
against float64)).
"""
from __future__ import annotations

import math

import pytest

from tests.runtime import call_worker as W
from tests.runtime.spawned import written_results

TIMEOUT_S = 300
# HF's causal-LM loss pads the shifted labels with -100 and averages over the other tokens; the
# lowered cross_entropy (planlang.runtime.local_ops) divides by every token: its loss is 15/16 of HF's
# at seq 16 (an exact 1/16 error), and so are its gradients (clipping hides the scale in the steps)
IGNORE_INDEX = pytest.mark.xfail(strict=True, reason="cross_entropy's mean ignores ignore_index=-100 "
                                 "(local_ops): HF's own loss comes out 15/16 of one process's")
OWN_LOSS = {"hf_dp2_tp2"}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return written_results(W.worker, W.WORLD, str(tmp_path_factory.mktemp("call")), TIMEOUT_S)


def _within(pair, what):
    err, bound = pair[0], pair[1]
    assert err <= bound, f"{what}: error {err:.2e} > bound {bound:.2e} {pair[2:]}"


def _params(name):
    return [pytest.param(n, marks=IGNORE_INDEX) if n in OWN_LOSS else n for n in name]


@pytest.mark.parametrize("name", list(W.CONFIGS))
def test_call_backward_clip_and_scheduler_match_one_process(results, name):
    for r, res in enumerate(results):
        for row in res[name]["steps"]:
            for key in ("grads", "params"):
                _within(row[key], f"rank {r} {name} step {row['step']} {key}")
            assert row["norm_value"] > W.C.MAX_NORM  # every step clipped
            assert math.isclose(row["lr"], row["ref_lr"], rel_tol=1e-12)


@pytest.mark.parametrize("name", _params(list(W.CONFIGS)))
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


@pytest.mark.parametrize("name", _params(list(W.CONFIGS)))
def test_evaluation_loss_and_shorter_batches_match_one_process(results, name):
    for r, res in enumerate(results):
        ev, short = res[name]["eval"], res[name]["short"]
        _within(ev["loss"], f"rank {r} {name} eval loss")
        _within(ev["short_loss"], f"rank {r} {name} shorter eval batch loss")
        _within(short["loss"], f"rank {r} {name} shorter training batch loss")
        assert short["grads_over_bound"][0] <= 1.0, f"rank {r} {name} shorter batch gradients {short}"


@pytest.mark.parametrize("name", list(W.CONFIGS))
def test_step_program_keeps_no_output(results, name):
    """`pm.step` runs the loss-only program; `pm(...)` its own (the outputs)."""
    for res in results:
        assert res[name]["step_outputs"] == 0 and res[name]["call_outputs"] > 0
