"""Mixed precision through planlang.apply: 4 gloo ranks run `verify` on each precision plan (3 AdamW steps)
against one process in the same precision (planlang.runtime.precision), and every error is within the
bound verify derives from the dtype (docs/runtime.md, "What verify judges")."""
from __future__ import annotations

import functools
import json
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from planlang.runtime.precision import LossScale, MasterWeights, tolerance
from planlang.plan.types import Precision
from tests.runtime import apply_worker

# plan -> (the optimizer class pm.optimizer() gives, the model class apply gives)
PLANS = {
    "mlp_dp2_tp2_bf16": ("MasterWeights", "ParallelModel"),       # bf16 params, f32 master, f32 reduce
    "gpt2_dp4_amp_bf16": ("AdamW", "ParallelModel"),              # f32 params, autocast bf16, bf16 reduce
    "gpt2_dp4_zero3_bf16": ("AdamW", "FSDPParallelModel"),        # FSDP2 MixedPrecisionPolicy
    "gpt2_dp2_tp2_zero1_bf16": ("MasterWeights", "ParallelModel"),  # ZeroRedundancyOptimizer on the copy
    "mlp_dp4_f16": ("MasterWeights", "ParallelModel"),            # f16 with dynamic loss scaling
    # pipelines: the module cut (pp x dp, ZeRO-1) and the program cut (pp x tp), bf16 with the f32 master
    "gpt2_pp2_dp2_zero1_bf16": ("MasterWeights", "PipelinedModel"),
    "gpt2_pp2_tp2_bf16": ("MasterWeights", "ProgramPipelinedModel"),
    # and in f16 with a dynamic loss scale: each microbatch's loss scaled, the step unscaled
    "gpt2_pp2_dp2_zero1_f16": ("MasterWeights", "PipelinedModel"),
    "gpt2_pp2_tp2_f16": ("MasterWeights", "ProgramPipelinedModel"),
    # ZeRO-2 stages (FSDP2 units gathering f16 from f32 shards): the optimizer unscales the shards' gradients
    "gpt2_pp2_dp2_zero2_f16": ("ScaledOptimizer", "PipelinedModel"),
}


@functools.cache
def results() -> dict:
    import torch.multiprocessing as mp

    out = Path(tempfile.mkdtemp(prefix="planlang_precision_"))
    plans = [str(apply_worker.PLANS / f"{c}.plan") for c in PLANS]
    mp.spawn(apply_worker.run, args=(apply_worker.WORLD, apply_worker._port(), plans, str(out)),
             nprocs=apply_worker.WORLD, join=True)
    data = json.loads((out / "results.json").read_text())
    shutil.rmtree(out, ignore_errors=True)
    return {Path(k).stem: v for k, v in data.items()}


@pytest.mark.parametrize("config", list(PLANS))
def test_matches_one_process_in_the_same_precision(config):
    r = results()[config]
    assert "error" not in r, r.get("error")
    apply_worker.assert_within_bounds(r["rows"])
    optimizer, model = PLANS[config]
    assert r["report"]["optimizer"] == optimizer
    assert r["report"]["model"] == model
    # f16 steps with a dynamic loss scale (2^16 to start), which the optimizer holds; the others with none
    assert (r["report"]["loss_scale"] is not None) == config.endswith("_f16")


def test_the_bound_comes_from_the_dtype():
    assert tolerance(Precision(), 1e-5) == 1e-5
    assert tolerance(Precision("bf16", "bf16", "f32", "f32"), 1e-5) == pytest.approx(4 * 2.0 ** -8)
    assert tolerance(Precision("f16", "f16", "f32", "f32", "dynamic"), 1e-5) == pytest.approx(4 * 2.0 ** -11)


def test_master_weights_step_the_f32_copy_and_skip_an_overflow():
    p = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    scale = LossScale("dynamic")
    opt = MasterWeights([p], torch.float32, lambda ps: torch.optim.SGD(ps, lr=0.25), scale)
    start = scale.value
    p.grad = torch.full((4,), start, dtype=torch.bfloat16)  # a gradient of 1 after unscaling
    opt.step()
    assert opt.masters[0].dtype == torch.float32 and p.dtype == torch.bfloat16
    assert torch.equal(p, torch.full((4,), 0.75, dtype=torch.bfloat16))
    assert opt.masters[0].grad is None  # the f32 gradients live only during the step
    p.grad = torch.tensor([1.0, float("inf"), 1.0, 1.0], dtype=torch.bfloat16)
    opt.step()  # overflow: skipped, the scale halved
    assert torch.equal(p, torch.full((4,), 0.75, dtype=torch.bfloat16))
    assert scale.value == start / 2
    # tiny updates accumulate in the f32 copy where bf16 alone would round them away
    opt = MasterWeights([p], torch.float32, lambda ps: torch.optim.SGD(ps, lr=1.0))
    for _ in range(8):
        p.grad = torch.full((4,), 2.0 ** -12, dtype=torch.bfloat16)
        opt.step()
    assert float(p.detach()[0]) == pytest.approx(0.75 - 8 * 2.0 ** -12, abs=2.0 ** -9)
    assert float(opt.masters[0].detach()[0]) == pytest.approx(0.75 - 8 * 2.0 ** -12)


def test_predicted_gradient_sums_are_in_the_reduce_dtype(tmp_path):
    """planlang.runtime.traffic prices the gradient buckets in the plan's `reduce` dtype (grad_sync casts them)."""
    from planlang.plan.checker import check_file
    from planlang.plan.complete import complete
    from planlang.model.price.traffic import graph_of as _graph_of, predict_step_traffic

    def grad_sync_bytes(text):
        path = tmp_path / f"p{len(text)}.plan"
        path.write_text(text)
        plan = complete(check_file(str(path)).plan)
        traffic = predict_step_traffic(plan, _graph_of(plan))
        return sum(t.full_bytes for t in traffic.transfers if t.phase == "grad_sync")

    amp = (apply_worker.PLANS / "gpt2_dp4_amp_bf16.plan").read_text()  # reduce = bf16
    f32 = amp.replace("    compute = bf16", "    compute = f32").replace("    reduce = bf16", "    reduce = f32")
    assert grad_sync_bytes(amp) * 2 == grad_sync_bytes(f32) > 0


def test_fsdp2_leaves_the_inputs_to_autocast():
    # FSDP2 would cast the root unit's whole-batch inputs to bf16 before the rank takes its slice (and the
    # slice a conv saves would keep the whole copy through backward): autocast casts what each op reads
    from planlang.runtime.precision import mp_policy

    policy = mp_policy(Precision("bf16", "bf16", "f32", "f32"))  # f32 shards gathered in bf16
    assert policy.param_dtype == torch.bfloat16 and policy.reduce_dtype == torch.float32
    assert policy.cast_forward_inputs is False
    amp = mp_policy(Precision("f32", "bf16", "f32", "f32"))  # f32 parameters under autocast
    assert amp.param_dtype is None and amp.cast_forward_inputs is False
