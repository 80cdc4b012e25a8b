"""Parity of planlang.apply with single-process training: 4 gloo ranks, several plans, 3 steps each
(fp32; relative error of the loss and of every gradient, Frobenius norms, ≤ 1e-5)."""
from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from tests.runtime import apply_worker

PLANS = Path(__file__).parent / "plans"
CONFIGS = ["mlp_dp4", "mlp_tp4", "mlp_dp2_tp2", "gpt2_tp4", "gpt2_dp2_tp2_ckpt", "bert_tp2_dp2"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("apply")
    plans = [str(PLANS / f"{c}.plan") for c in CONFIGS]
    mp.spawn(apply_worker.run, args=(4, _port(), plans, str(out)), nprocs=4, join=True)
    data = json.loads((out / "results.json").read_text())
    return {Path(k).stem: v for k, v in data.items()}


@pytest.mark.parametrize("config", CONFIGS)
def test_matches_single_process(results, config):
    r = results[config]
    assert "error" not in r, r.get("error")
    rows = r["rows"]
    assert len(rows) == 3
    for row in rows:
        assert row["loss_rel_err"] <= 1e-5, row
        assert row["grad_rel_err"] <= 1e-5, row
        assert row["worst_grad"], "no gradient was compared"
    # training moved: the loss of step 3 differs from step 1 (the optimizer really stepped)
    assert rows[2]["loss_reference"] != rows[0]["loss_reference"]
