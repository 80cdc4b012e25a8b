"""`out = pm(**batch)` on a pipeline, with autograd: the whole step runs in the call and
`out.loss.backward()` hands its gradients to `.grad`; then `pm.clip_grad_norm_`, the optimizer and an lr
scheduler train as one process does (tests/runtime/pipeline_call_worker.py, 4 gloo ranks, one spawn).

pp 2 x dp 2 (1F1B, 2 microbatches; GPT-2 with lm_head tied to wte, on both pipeline ranks) without ZeRO,
with ZeRO-3 (FSDP2 stages) and interleaved (2 stages per rank), and pp 2 x tp 2 (the lowered program cut
into stages; pm(...) runs it lowered again with the model's output, which its last stage returns after
what the loss tail reads): 3 steps, the first with positional inputs, the second by the plan's
input name and a target keyword, the third as two half batches whose losses / 2 accumulate in `.grad`;
a pm(...) without backward leaves the gradients as they were; the logits are this data replica's piece
on the last stage's ranks, None elsewhere; evaluation (pm.eval(), torch.no_grad()) on the plan's batch
and on half of it equals one process's, and `pm.whole(out)` gives every rank the whole batch's logits;
a larger batch is refused; `pm.step` twice without zero_grad adds the two steps' gradients. HF Llama
(pp 2 x dp 2, a torch.export cut) returns its own CausalLMOutputWithPast. Every error within verify's bound
(max(1e-5, 10 x one process's own error against float64)).
"""
from __future__ import annotations

import pytest

from tests.runtime import pipeline_call_worker as W
from tests.runtime.spawned import written_results

TIMEOUT_S = 180


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return written_results(W.worker, W.WORLD, str(tmp_path_factory.mktemp("pipeline_call")), TIMEOUT_S)


def _within(err_bound, what):
    err, lim = err_bound[0], err_bound[1]
    assert err <= lim, f"{what}: error {err:.2e} > bound {lim:.2e} {err_bound[2:]}"


@pytest.mark.parametrize("name", list(W.CONFIGS))
def test_call_backward_clip_scheduler_match_one_process(results, name):
    for r, res in enumerate(results):
        c = res[name]
        assert c["model"] == ("ProgramPipelinedModel" if name == "pp2_tp2" else "PipelinedModel")
        assert c["requires_grad"] == [True] * (W.STEPS - 1)
        assert len(c["steps"]) == W.STEPS
        for row in c["steps"]:
            for key in ("loss", "norm", "grads", "params"):
                _within(row[key], f"rank {r} {name} step {row['step']} {key}")
            assert row["norm_value"] > W.MAX_NORM  # every step clipped


@pytest.mark.parametrize("name", list(W.CONFIGS))
def test_call_without_backward_leaves_gradients(results, name):
    assert all(res[name]["grads_kept"] for res in results)


@pytest.mark.parametrize("name", list(W.CONFIGS))
def test_second_backward_refused_and_eval_mode_forward_only(results, name):
    """The step's gradients are handed to .grad once (a second backward, retain_graph or not, is a
    PipelineError, and step 0 still matches one process); in pm.eval() the call is forward only even with
    gradients on (its loss needs no grad)."""
    for res in results:
        assert "backpropagated twice" in res[name]["second_backward"]
        assert res[name]["eval_mode_no_grad"]


@pytest.mark.parametrize("name", list(W.CONFIGS))
def test_logits_are_the_last_stage_replica_piece(results, name):
    lasts = [r for r, res in enumerate(results) if res[name]["last"]]
    assert lasts == [2, 3]  # pp is the mesh's first axis: ranks 2 and 3 hold the last stage
    for r, res in enumerate(results):
        c = res[name]
        assert c["output_type"] == "PlanOutput"  # examples/gpt2 returns its logits: PlanOutput(loss, output)
        if c["last"]:
            _within(c["logits0"], f"rank {r} {name} training logits")
            _within(c["eval_logits"], f"rank {r} {name} eval logits")
        else:
            assert c["others_none"]
        _within(c["whole_logits"], f"rank {r} {name} pm.whole(out).output")  # every rank: the whole batch
        assert c["whole_loss_kept"]


@pytest.mark.parametrize("name", list(W.CONFIGS))
def test_evaluation_and_batch_sizes(results, name):
    for r, res in enumerate(results):
        c = res[name]
        _within(c["eval_loss"], f"rank {r} {name} eval loss")
        _within(c["short_loss"], f"rank {r} {name} eval loss on half the batch")
        assert "larger than the plan's 8" in c["larger"]


@pytest.mark.parametrize("name", list(W.CONFIGS))
def test_step_accumulates_each_step_once(results, name):
    """pm.step twice without zero_grad: each step's gradients summed (tied copies, data and tensor axes)
    once, so `.grad` is the sum of the two steps' own gradients; gradients zeroed in place stay."""
    for r, res in enumerate(results):
        both, zeroed, kept = res[name]["step_accumulates"]
        assert both < 1e-6, f"rank {r}: {both:.2e}"
        # after zero_grad(set_to_none=False) the step adds into the zeroed gradients, in place
        assert zeroed < 1e-6 and kept, f"rank {r}: {zeroed:.2e}, same tensors: {kept}"


def test_hf_model_output(results):
    """HF Llama under pp 2 x dp 2 (torch.export cut): pm(input_ids=x, labels=x) is the model's own
    CausalLMOutputWithPast with the plan's loss; logits this replica's piece on the last stage (None
    elsewhere); backward's gradients, the eval loss and pm.whole(out).logits (every rank) as one process."""
    for r, res in enumerate(results):
        c = res["hf"]
        assert c["type"] == c["whole_type"] == "CausalLMOutputWithPast"
        for key in ("loss", "grads", "eval_loss", "whole_logits"):
            _within(c[key], f"rank {r} hf {key}")
        if c["last"]:
            _within(c["logits"], f"rank {r} hf logits")
        else:
            assert c["others_none"]


def test_loss_scale_call_equals_step(results):
    """f16 with a dynamic loss scale (gpt2_pp2_dp2_zero1_f16.plan): pm(x, x).loss.backward() leaves the
    scaled gradients pm.step(x, x) leaves, bit for bit, and the optimizer unscales and steps them."""
    for r, res in enumerate(results):
        c = res["f16"]
        assert c["optimizer"] == "MasterWeights" and c["scale"] > 1
        assert c["loss_equal"] and c["grads_equal"] and c["params_finite"], f"rank {r}: {c}"
