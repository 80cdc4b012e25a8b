"""Multi-query attention (one key/value head broadcast against 4 query heads, as HF Falcon) under
dp2 x tp2 with the query heads split over tp on 4 gloo processes: each rank attends with its 2 query
heads and the whole key/value head, the gradients of k and v summed over tp once; `planlang verify`
compares every step's loss, gradients and parameters with one process."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.model.test_tensor_op_models import MODELS, _plan

ROOT = Path(__file__).resolve().parents[2]


def test_multi_query_attention_with_split_query_heads_trains_like_one_process(tmp_path):
    forward, _ = MODELS["multi_query"]
    extra = "shard fc1.weight : [tp, _]\nshard fc1.bias : [tp]\nshard fc2.weight : [_, tp]\n"
    plan = _plan(tmp_path, "mqa_tp", forward, mesh="dp = 2;tp = 2", extra=extra, seq=128)
    lowered = subprocess.run([sys.executable, "-m", "planlang.cli", "lower", plan, "--rank", "0"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=300)
    assert lowered.returncode == 0, lowered.stderr[-3000:]
    assert "all_gather(tp" not in lowered.stdout  # the query heads stay split: attention on the local heads
    out = subprocess.run([sys.executable, "-m", "planlang.cli", "verify", plan, "--steps", "2", "--quiet"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PLANLANG_BACKEND": "gloo",
                              "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "PASS" in out.stdout and "PL364" not in out.stderr
