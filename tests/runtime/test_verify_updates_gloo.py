"""`verify` judges each step from the same start (planlang.runtime.verify): the one-process model takes
the plan's parameters before each step (in mixed precision it follows them: its master copy starts equal)
and its optimizer steps the plan's own gradients, so a correct update agrees to rounding whatever Adam does
with noise, and a wrong one fails by orders of magnitude, in f32 and in f16 and bf16 alike. 2 gloo ranks."""
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
    optimizer adamw(lr = 0.01)
    data x : [dp, _]
""")
F16_DEVICE = 'device cpu_f16 {\n    memory = 24 GiB\n    flops.f32 = 100 GFLOPS\n    flops.f16 = 50 GFLOPS\n    backend = "gloo"\n}\n'
# the same plan in f16 with a dynamic loss scale, and in bf16 (f32 master weights in both)
PRECISIONS = {
    "f32": PLAN,
    "f16": PLAN.replace("x hardware.cpu", "x cpu_f16").replace("input x", F16_DEVICE + "input x").replace(
        "optimizer adamw(lr = 0.01)", "optimizer adamw(lr = 0.01) {\n    precision = f16\n    loss_scale = dynamic\n}"),
    "bf16": PLAN.replace("optimizer adamw(lr = 0.01)", "optimizer adamw(lr = 0.01) { precision = bf16 }"),
}


@pytest.fixture(scope="module", params=list(PRECISIONS))
def rows(request, tmp_path_factory) -> dict:
    import torch.multiprocessing as mp

    d = tmp_path_factory.mktemp("verify_updates")
    (d / "p.plan").write_text(PRECISIONS[request.param])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(verify_update_worker.run, args=(2, port, str(d / "p.plan"), str(d / "rows.json")), nprocs=2, join=True)
    return json.loads((d / "rows.json").read_text()) | {"precision": request.param}


def test_the_plans_own_optimizer_passes_every_step(rows):
    assert all(r["ok"] for r in rows["as_planned"]), rows["as_planned"]
    # the update is compared after the same gradients: only the optimizer's own rounding is left (in
    # mixed precision the master copies step the same f32 arithmetic and round to the same narrow values)
    assert max(r["param_rel_err"] for r in rows["as_planned"]) < 1e-6


@pytest.mark.parametrize("mutant", ["wrong_lr", "left_out"])
def test_a_wrong_update_fails_at_the_parameters(rows, mutant):
    first = rows[mutant][0]
    assert first["loss_rel_err"] <= first["loss_bound"] and first["grad_rel_err"] <= first["grad_bound"]  # the step was right
    # a bf16 parameter resolves its update to a bf16 ulp: one step at lr 0.01 left out is 4x its bound
    assert not first["ok"] and first["param_rel_err"] > 4 * first["param_bound"], first


def test_a_gradient_summed_twice_fails_by_orders_of_magnitude(rows):
    first = rows["summed_twice"][0]
    assert first["loss_rel_err"] <= first["loss_bound"]  # forward was right
    assert not first["ok"] and first["grad_rel_err"] > 10 * first["grad_bound"], first
