"""`verify` judges each step from the same start (planlang.runtime.verify): the one-process model takes
the plan's parameters before each step and its optimizer steps the plan's own gradients, so a correct
update agrees to rounding whatever Adam does with noise, and a wrong one fails. 2 gloo ranks."""
from __future__ import annotations

import json
import socket
import textwrap

import pytest

from tests.runtime import verify_update_worker

PLAN = textwrap.dedent("""\
    use hardware
    model mlp = "examples.mlp.model:build"(in_features = 16, hidden = 32, out_features = 8)
    input x : f32[batch = 8, features = 16]
    mesh ranks of 2 x hardware.cpu { dp = 2 over hardware.loopback }
    optimizer adamw(lr = 0.001)
    data x : [dp, _]
""")


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> dict:
    import torch.multiprocessing as mp

    d = tmp_path_factory.mktemp("verify_updates")
    (d / "p.plan").write_text(PLAN)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(verify_update_worker.run, args=(2, port, str(d / "p.plan"), str(d / "rows.json")), nprocs=2, join=True)
    return json.loads((d / "rows.json").read_text())


def test_the_plans_own_optimizer_passes_every_step(rows):
    assert all(r["ok"] for r in rows["as_planned"]), rows["as_planned"]
    # the update is compared after the same gradients: only the optimizer's own rounding is left
    assert max(r["param_rel_err"] for r in rows["as_planned"]) < 1e-6


@pytest.mark.parametrize("mutant", ["wrong_lr", "left_out"])
def test_a_wrong_update_fails_at_the_parameters(rows, mutant):
    first = rows[mutant][0]
    assert first["loss_rel_err"] < 1e-6 and first["grad_rel_err"] < 1e-5  # the step itself was right
    assert not first["ok"] and first["param_rel_err"] > 10 * first["param_bound"], first
