"""`pm.clip_grad_norm_`, an lr scheduler on `pm.optimizer()` and `planlang.save` / `planlang.load` across
plans, on 4 gloo ranks against one process running torch's own loop (tests/runtime/clip_save_worker.py).

One group of 4 processes runs every config (GPT-2, 4 layers, lm_head tied to wte: dp 4; dp 2 x tp 2 with
ZeRO-1; pp 2 x dp 2 with ZeRO-1, the tied weight on both pipeline ranks; dp 4 with ZeRO-3; pp 2 x tp 2;
HSDP (replicated over dp 2, ZeRO-2 over fs 2); pp 2 x dp 2 with ZeRO-3, the tied weight's shards on both
pipeline ranks):
3 steps of step + clip (every step clips) + AdamW + LambdaLR, a save, then each config loads another
config's checkpoint into its own (scrambled) model and optimizer and runs 2 more steps. Every error is
judged against verify's bound (max(1e-5, 10 x one process's own error against float64)).
"""
from __future__ import annotations

import math

import pytest

from tests.runtime import clip_save_worker as W
from tests.runtime.spawned import written_results

TIMEOUT_S = 240


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return written_results(W.worker, W.WORLD, str(tmp_path_factory.mktemp("clip_save")), TIMEOUT_S)


def _check(rows, what):
    assert rows
    for row in rows:
        for key in ("loss", "norm", "grads", "params"):
            err, bound = row[key][0], row[key][1]
            assert err <= bound, f"{what} step {row['step']}: {key} error {err:.2e} > bound {bound:.2e} {row[key][2:]}"
        assert row["norm_value"] > W.MAX_NORM  # every step clipped
        assert math.isclose(row["lr"], row["ref_lr"], rel_tol=1e-12)


@pytest.mark.parametrize("name", list(W.CONFIGS))
def test_step_clip_and_scheduler_match_one_process(results, name):
    for r, res in enumerate(results):
        _check(res[name]["steps"], f"rank {r} {name}")


@pytest.mark.parametrize("name", list(W.CONFIGS))
def test_checkpoint_of_another_plan_resumes_the_uninterrupted_run(results, name):
    for r, res in enumerate(results):
        c = res[name]
        assert c["loaded_from"] == W.LOAD_FROM[name] != name
        _check(c["resumed"], f"rank {r} {name} (loaded from {c['loaded_from']})")


@pytest.mark.parametrize("name", list(W.CONFIGS))
def test_other_norm_orders(results, name):
    for res in results:
        for p, (got, want) in res[name]["norms"].items():
            assert math.isclose(got, want, rel_tol=1e-5), f"{p}-norm: {got} != {want}"
        assert math.isclose(res[name]["norms"]["2.0"][0], W.MAX_NORM, rel_tol=1e-4)  # clipped to max_norm


def test_what_ran(results):
    c = results[0]
    assert [c[n]["model"] for n in W.CONFIGS] == ["ParallelModel", "ParallelModel", "PipelinedModel",
                                                  "FSDPParallelModel", "ProgramPipelinedModel", "FSDPParallelModel",
                                                  "PipelinedModel"]
    assert c["dp2_tp2_zero1"]["zero1"] and c["pp2_dp2_zero1"]["zero1"]  # the scheduler drove ZeRO-1


@pytest.mark.parametrize("name, every", [("dp4", False), ("pp2_dp2_zero3", False), ("pp2_tp2", True)])
def test_full_state_dict(results, name, every):
    """The whole parameters after the resumed steps, on rank 0 (or every rank): the uninterrupted run's."""
    for r, res in enumerate(results):
        full = res["full_state_dict"][name]
        if r and not every:
            assert full["keys"] == []
            continue
        assert "wte.weight" in full["keys"] and "lm_head.weight" not in full["keys"]  # tied: once
        assert len(full["keys"]) == 2 + 4 * 12 + 2
        assert full["err"] < 1e-5


def test_f16_master_weights_clip_and_checkpoint(results):
    """clip_gpt2_dp2_tp2_f16.plan: f16 parameters, f32 masters (MasterWeights), loss scale 1024."""
    for r, res in enumerate(results):
        c = res["f16"]
        assert c["optimizer"] == "MasterWeights" and c["scale"] == 1024.0
        # the norm of the gathered gradients, unscaled; each scaled by torch's factor (f16 rounding)
        assert max(c["norm_vs_grads"]) < 1e-5, f"rank {r}: {c['norm_vs_grads']}"
        assert max(c["clip_factor"]) < 2e-3, f"rank {r}: {c['clip_factor']}"
        # what was stored are the f32 masters: an f32 plan loads values f16 cannot hold, which round to
        # the f16 run's parameters
        assert c["f32_rounds_to_f16_params"] and c["f32_not_f16_values"] > 40
        assert c["own_masters_equal"] and c["own_params_equal"] and c["scale_restored"] == 1024.0
        # an f32 checkpoint: masters its values exactly, parameters them in f16, the plan's scale kept
        assert c["dp4_masters_equal"] and c["dp4_params_are_f16_masters"] and c["scale_kept"] == 1024.0
