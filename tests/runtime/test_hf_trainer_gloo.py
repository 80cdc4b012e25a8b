"""planlang.runtime.hf_trainer.PlanTrainer: transformers.Trainer's loop under a plan, on 4 gloo ranks, against
one process running the same steps (tests/runtime/hf_trainer_worker.py).

HF GPT-2 (examples/zoo/causal_lm.py) under dp 4 with `microbatches 2` (gradient accumulation), dp 2 x tp 2
(Megatron attention and MLP), pp 2 x dp 2 (1F1B, 2 microbatches) and dp 4 with ZeRO-3 (FSDP2):
Trainer.train() for 3 steps (the plan's AdamW, Trainer's cosine schedule,
max_grad_norm below every step's norm), evaluate(), save_model(); dp 4 writes a checkpoint at step 2
(planlang.save inside it) and dp 2 x tp 2 resumes it with resume_from_checkpoint. Every error is judged
against verify's bound: max(1e-5, 10 x one process's own error against float64)."""
from __future__ import annotations

import math

import pytest

pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate (pip install -e .[hf])")

from tests.runtime import hf_trainer_worker as W  # noqa: E402 - after the skip
from tests.runtime.spawned import written_results  # noqa: E402

TIMEOUT_S = 300


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return written_results(W.worker, W.WORLD, str(tmp_path_factory.mktemp("hf_trainer")), TIMEOUT_S)


def _within(what: str, err_bound) -> None:
    err, bound = err_bound[0], err_bound[1]
    assert err <= bound, f"{what}: error {err:.2e} > bound {bound:.2e} {err_bound[2:]}"


@pytest.mark.parametrize("name", list(W.PLANS))
def test_trainer_steps_match_one_process(results, name):
    """Trainer's log history (loss, pre-clip grad_norm, learning rate of each step) on every rank."""
    for r, res in enumerate(results):
        c = res[name]
        assert len(c["history"]) == W.STEPS
        for s, row in enumerate(c["judged"]["steps"]):
            _within(f"rank {r} {name} step {s + 1} loss", row["loss"])
            _within(f"rank {r} {name} step {s + 1} grad_norm", row["grad_norm"])
            assert math.isclose(*row["lr"], rel_tol=1e-12)
        assert all(h["grad_norm"] > W.MAX_NORM for h in c["history"])  # every step clipped
        lrs = [h["learning_rate"] for h in c["history"]]
        assert lrs[0] > lrs[1] > lrs[2] > 0  # the scheduler ran on the plan's optimizer


@pytest.mark.parametrize("name", list(W.PLANS))
def test_evaluate_matches_one_process(results, name):
    for r, res in enumerate(results):
        _within(f"rank {r} {name} eval_loss", res[name]["judged"]["eval_loss"])


def test_ignored_labels_average_over_the_tokens_kept(results):
    """Labels of -100 (uneven over the dp shards) under dp 2 x tp 2: the loss of one process's
    cross_entropy, which averages over the tokens not ignored."""
    for r, res in enumerate(results):
        _within(f"rank {r} masked eval loss", res["dp2_tp2"]["judged"]["masked_loss"])


@pytest.mark.parametrize("name", list(W.PLANS))
def test_save_model_writes_the_whole_model(results, name):
    """save_pretrained on rank 0 of the gathered parameters: from_pretrained reads the trained model."""
    saved = results[0][name]["saved"]
    assert saved["missing"] == [] and saved["names"] == 28
    _within(f"{name} saved parameters", saved["params"])


def test_resume_from_a_checkpoint_of_another_plan(results):
    """dp 4's checkpoint-2 (2 microbatches a step) resumed under dp 2 x tp 2: step 3 equals the uninterrupted run's."""
    for r, res in enumerate(results):
        c = res["resumed"]
        assert "planlang" in c["from"] and c["global_step"] == W.STEPS
        assert f"checkpoint-{W.SAVE_STEPS}" in res["dp4_acc2"]["checkpoints"]
        _within(f"rank {r} resumed step 3 loss", c["judged"]["loss"])
        _within(f"rank {r} resumed step 3 grad_norm", c["judged"]["grad_norm"])
        assert math.isclose(*c["judged"]["lr"], rel_tol=1e-12)  # the scheduler's state came back


def test_what_ran(results):
    c = results[0]
    assert [c[n]["model"] for n in W.PLANS] == ["ParallelModel", "ParallelModel", "PipelinedModel",
                                                "FSDPParallelModel"]
    assert {c[n]["world_size"] for n in W.PLANS} == {W.WORLD}  # Accelerate saw the 4 ranks
    # tp splits the blocks' weights: each rank holds less than dp 4's whole model
    assert c["dp2_tp2"]["local_numel"] < c["dp4_acc2"]["local_numel"]
    assert c["dp4_acc2"]["microbatches"] == 2  # Trainer's step accumulated inside pm.step


@pytest.mark.parametrize("case, says", [
    ("accumulation", "`microbatches 2` in the plan"),
    ("batch_size", "set it to the plan's batch, 8"),
    ("checkpointing", "activation_checkpointing=True"),
    ("best_model", "load_best_model_at_end=True"),
    ("ranks_differ", "the ranks read different batches"),
    ("padding_mask", "an attention mask with zeros"),
    ("unknown_key", "batch key `token_type_ids`"),
    ("ignored_labels", "runs a step as 2 microbatches"),
    ("logits", "gives the loss only"),
])
def test_refusals_say_why(results, case, says):
    """Trainer settings the plan decides, and data the plan cannot take, stop with a PlanError."""
    for res in results:
        assert says in res["refused"][case], res["refused"][case]
        assert res["refused"]["same_batch_passes"]
