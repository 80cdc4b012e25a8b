"""`pm.eval()` / `pm.train()`, the evaluation loss under torch.no_grad (`pm(x, y)`; a pipeline's forward-only
schedule, `pm.evaluate`) and a batch shorter than the plan's, on 4 gloo ranks against one process
(tests/runtime/eval_worker.py).

One group of 4 processes runs every config (GPT-2, 4 layers, dropout 0.1: dp 4; dp 2 x tp 2; pp 2 x dp 2,
1F1B over 2 microbatches; dp 4 with ZeRO-3; dp 2 x tp 2 with gradient accumulation over 2 microbatches;
pp 2 x dp 2 with ZeRO-3 (FSDP2 stages); pp 2 x dp 2 interleaved, 2 stages per rank):
the loss in training mode (dropout on) differs from the eval
loss, which equals one process's `model.eval()` loss; 2 training steps in eval mode, the eval loss again
(no gradient made, the optimizer state untouched), one step on half the batch (the program lowered again
for it, or the pipeline's stages rebuilt) and the eval loss on the plan's batch after it. Every error is
judged against verify's bound (max(1e-5, 10 x one process's own error against float64)).
A BatchNorm CNN (examples/zoo/cnn.py) under dp 4 and pp 2 x dp 2 (GPipe, BatchNorm synced over dp) trains
2 steps in training mode, then its eval loss (running statistics: after 2 steps near their initial
values, far from the eval batch's own) equals one process's, before and after a step on half the batch.
pp 2 x tp 2 (the lowered program cut into stages), applied in eval mode: evaluation and steps as one
process; `pm.train()` (dropout on) and the half batch lower the program again, cut into the same stages.
"""
from __future__ import annotations

import pytest

from tests.runtime import eval_worker as W
from tests.runtime.spawned import written_results

TIMEOUT_S = 240


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return written_results(W.worker, W.WORLD, str(tmp_path_factory.mktemp("eval")), TIMEOUT_S)


def _within(row, what):
    for key, (err, lim, *where) in row.items():
        assert err <= lim, f"{what}: {key} error {err:.2e} > bound {lim:.2e} {where}"


@pytest.mark.parametrize("name", list(W.CONFIGS))
def test_eval_loss_is_one_process_eval_loss(results, name):
    for r, res in enumerate(results):
        c = res[name]
        for key in ("eval0", "eval", "eval_after"):
            _within(c[key], f"rank {r} {name} {key}")
        # dropout is on in training mode: its loss is not the eval loss (and far beyond the eval's error)
        assert c["train_vs_eval"] > 1e-5
        # evaluation makes no gradient and leaves the optimizer's state alone
        assert c["grads_after_eval"] == 0 and c["grads_after_eval2"] == 0 and c["state_untouched"]


@pytest.mark.parametrize("name", list(W.CONFIGS))
def test_training_steps_match_one_process(results, name):
    for r, res in enumerate(results):
        for s in ("s0", "s1"):
            _within(res[name][s], f"rank {r} {name} {s}")


@pytest.mark.parametrize("name", list(W.CONFIGS))
def test_shorter_batch_trains_as_one_process(results, name):
    for r, res in enumerate(results):
        _within(res[name]["half"], f"rank {r} {name} half batch")


@pytest.mark.parametrize("name", list(W.CONFIGS))
def test_state_and_save_right_after_an_evaluation(results, name):
    # ZeRO-3: the evaluation's forward leaves FSDP2's units gathered; the gathers and the save read shards
    for r, res in enumerate(results):
        assert res[name]["state_after_eval"] == 0.0, (r, name)
        assert res[name]["saved_after_eval"] == "ok", (r, name, res[name]["saved_after_eval"])


@pytest.mark.parametrize("name", list(W.CONFIGS))
def test_batch_that_does_not_divide_or_is_larger_is_refused(results, name):
    errors = results[0][name]["errors"]
    assert "larger than the plan's 8" in errors["larger"]
    if name == "dp2_tp2":  # 6 samples split over dp 2: 3 each, a program of its own
        assert errors["odd"] == "ran"
    else:  # dp 4 (4 ranks), the pipelines or dp 2 with 2 microbatches (2 ranks x 2 microbatches): a multiple of 4
        assert "batch of 6" in errors["odd"] and "a multiple of 4" in errors["odd"]


def test_what_ran(results):
    assert [results[0][n]["model"] for n in W.CONFIGS] == ["ParallelModel", "ParallelModel", "PipelinedModel",
                                                          "FSDPParallelModel", "ParallelModel", "PipelinedModel",
                                                          "PipelinedModel"]
    assert results[0]["pp2_dp2_zero3"]["fsdp"] == ["dp"] and results[0]["dp4_zero3"]["fsdp"] == ["dp"]
    assert results[0]["pp2_tp2"]["model"] == "ProgramPipelinedModel"


def test_pipeline_tensor_parallel_lowers_again_for_mode_and_batch(results):
    for r, res in enumerate(results):
        c = res["pp2_tp2"]
        for key in ("eval0", "s0", "s1", "eval", "half", "eval_after"):
            _within(c[key], f"rank {r} pp2_tp2 {key}")
        assert c["grads_after_eval"] == 0
        assert c["train_vs_eval"] > 1e-5  # pm.train(): the program lowered again, dropout on
        assert "larger than the plan's 8" in c["errors"]["larger"]


@pytest.mark.parametrize("name", list(W.CNN))
def test_batch_norm_running_statistics_in_eval(results, name):
    for r, res in enumerate(results):
        c = res[name]
        for key in ("s0", "s1", "eval", "half", "eval_after"):
            _within(c[key], f"rank {r} {name} {key}")
    assert results[0][name]["model"] == {"resnet_dp4": "ParallelModel", "resnet_pp2_dp2": "PipelinedModel"}[name]
