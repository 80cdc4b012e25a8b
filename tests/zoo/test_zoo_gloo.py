"""Model-zoo conformance on 4 gloo processes (one case on 8): `planlang verify` trains each architecture under data
parallelism over 4 ranks - HF Llama also as a 1F1B pipeline of 2 stages x 2 data replicas and under
Megatron tensor parallelism x data parallelism, GPT-2 as a pipeline whose stages share its tied
embedding and with head-parallel attention over tp (its fused c_attn stored per head), T5 with its two
inputs, the BatchNorm CNN as a pipeline of one microbatch (BatchNorm synced over dp), Llama and GPT-2 (its tied
embedding on both pipeline ranks) under pipeline x tensor parallelism, Llama and GPT-2 under looped BFS (two
chunks per rank, pp2 x dp2), Llama on 8 processes with stages of their own degrees (stage 0 dp4, stage 1
dp2 x tp2) - and compares every step's loss,
gradients, parameters and BatchNorm running statistics with one process (the table's bounds). bench/model_zoo.py runs the whole matrix.

One case runs the command itself (`planlang verify`, torchrun); the others do what it does in one launch of
gloo ranks per world size (tests/zoo/zoo_worker.py: `check --model`'s validation, then `verify` with
PLANLANG_STRICT=1 so that an op gathering the batch, PL364, fails instead of warning)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the zoo's Hugging Face models need transformers")

from tests.zoo.plans import plan_text  # noqa: E402
from tests.zoo.zoo_worker import launch  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
STEPS = 2
FOUR = (("bert", "dp4"), ("vit", "dp4"), ("resnet", "dp4"), ("resnet", "zero3"), ("llama", "pp2dp2"),
        ("llama", "dp2tp2"), ("t5", "dp4"), ("gpt2", "pp2dp2"), ("gpt2", "dp2tp2"), ("resnet", "pp2dp2"),
        ("llama", "pp2tp2"), ("gpt2", "pp2tp2"), ("llama", "pp2dp2bfs"), ("gpt2", "pp2dp2bfs"),
        ("llama", "pp2dp2zb"), ("gpt2", "pp2dp2zbv"), ("llama", "pp2dp2dpv"))
EIGHT = (("llama", "pp2het"),)  # stages of their own degrees: stage 0 dp4, stage 1 dp2 x tp2


def test_planlang_verify_trains_like_one_process(tmp_path):
    """The command's path: validation, torchrun, the workers' verdict and its PASS table."""
    plan = tmp_path / "llama_dp4.plan"
    plan.write_text(plan_text("llama", "dp4"))
    out = subprocess.run([sys.executable, "-m", "planlang.cli", "verify", str(plan), "--steps", str(STEPS), "--quiet"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PLANLANG_BACKEND": "gloo"})
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "PASS" in out.stdout and "PL364" not in out.stderr


@pytest.mark.parametrize("model,layout,world", [(m, lay, 4) for m, lay in FOUR] + [(m, lay, 8) for m, lay in EIGHT])
def test_trains_like_one_process(model, layout, world):
    res = launch(FOUR if world == 4 else EIGHT, world, STEPS)[f"{model}_{layout}"]
    diags = res.get("diagnostics", [{"code": "none", "severity": "error", "message": "not checked"}])
    assert [d for d in diags if d["severity"] == "error" or d["code"] == "PL364"] == []
    assert "error" not in res, res["error"]
    rows = res["rows"]
    assert len(rows) == STEPS
    for row in rows:  # each step within the bounds verify judged it against (its PASS)
        assert row["loss_rel_err"] <= row["loss_bound"], row
        assert row["grad_rel_err"] <= row["grad_bound"], row
        assert row["param_rel_err"] <= row["param_bound"], row
        assert row["worst_grad"], "no gradient was compared"
    assert rows[-1]["loss_reference"] != rows[0]["loss_reference"]  # the optimizer really stepped
