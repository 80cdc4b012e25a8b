"""Model-zoo conformance on 4 gloo processes (one case on 8): `planlang verify` trains each architecture under data
parallelism over 4 ranks - HF Llama also as a 1F1B pipeline of 2 stages x 2 data replicas and under
Megatron tensor parallelism x data parallelism, GPT-2 as a pipeline whose stages share its tied
embedding and with head-parallel attention over tp (its fused c_attn stored per head), T5 with its two
inputs, the BatchNorm CNN as a pipeline of one microbatch (BatchNorm synced over dp), Llama and GPT-2 (its tied
embedding on both pipeline ranks) under pipeline x tensor parallelism, Llama and GPT-2 under looped BFS (two
chunks per rank, pp2 x dp2), Llama on 8 processes with stages of their own degrees (stage 0 dp4, stage 1
dp2 x tp2) - and compares every step's loss,
gradients, parameters and BatchNorm running statistics with one process (the table's bounds). bench/model_zoo.py runs the whole matrix."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the zoo's Hugging Face models need transformers")

from tests.zoo.plans import plan_text  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("model,layout", [("llama", "dp4"), ("bert", "dp4"), ("vit", "dp4"), ("resnet", "dp4"),
                                          ("resnet", "zero3"), ("llama", "pp2dp2"), ("llama", "dp2tp2"),
                                          ("t5", "dp4"), ("gpt2", "pp2dp2"), ("gpt2", "dp2tp2"),
                                          ("resnet", "pp2dp2"), ("llama", "pp2tp2"), ("gpt2", "pp2tp2"),
                                          ("llama", "pp2dp2bfs"), ("gpt2", "pp2dp2bfs"), ("llama", "pp2dp2zb"),
                                          ("gpt2", "pp2dp2zbv"), ("llama", "pp2dp2dpv"), ("llama", "pp2het")])
def test_trains_like_one_process(tmp_path, model, layout):
    plan = tmp_path / f"{model}_{layout}.plan"
    plan.write_text(plan_text(model, layout))
    out = subprocess.run([sys.executable, "-m", "planlang.cli", "verify", str(plan), "--steps", "2", "--quiet"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PLANLANG_BACKEND": "gloo"})
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "PASS" in out.stdout and "PL364" not in out.stderr
