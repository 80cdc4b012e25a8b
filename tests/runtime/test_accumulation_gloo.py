"""Gradient accumulation without a pipeline (a plan's top-level `microbatches N`) on 4 gloo ranks: the
step runs N microbatches in sequence and sums the gradients once, so its loss and gradients equal one
process's step on the whole batch (dp, dp x tp, ZeRO-3 per block); every collective it issues is the one
planlang.model.price.accumulation predicts (the gradient sums once, the program's collectives and
ZeRO-3's gathers once per microbatch); `verify` passes such a plan."""
from __future__ import annotations

import json
import socket
import textwrap
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from tests.runtime import accumulation_worker

MLP = 'model mlp = "examples.mlp.model:build"(in_features = 16, hidden = 32, out_features = 8)\n' \
      "input x : f32[batch = 16, features = 16]\n"
PLANS = {
    "mlp_dp4": MLP + textwrap.dedent("""\
        mesh ranks of 4 x hardware.cpu { dp = 4 over hardware.loopback }
        optimizer adamw(lr = 0.001)
        data x : [dp, _]
        microbatches 2
    """),
    "mlp_dp2_tp2": MLP + textwrap.dedent("""\
        mesh ranks of 4 x hardware.cpu {
            dp = 2 over hardware.loopback
            tp = 2 over hardware.loopback
        }
        optimizer adamw(lr = 0.001)
        data x : [dp, _]
        microbatches 4
        shard fc1.weight    : [tp, _]
        shard fc1.bias      : [tp]
        shard output of fc1 : [dp, tp]
        shard fc2.weight    : [_, tp]
        shard fc2.bias      : [_]
        shard output of fc2 : [dp, _] partial(tp)
    """),
    "gpt2_dp4_zero3": textwrap.dedent("""\
        model gpt2 = "examples.gpt2.model:build"(layers = 2, hidden = 32, heads = 4, vocab = 64, seq = 8)
        input idx : i64[batch = 8, seq = 8]
        mesh ranks of 4 x hardware.cpu { dp = 4 over hardware.loopback }
        optimizer adamw(lr = 0.001) { zero = 3 over dp }
        data idx : [dp, _]
        microbatches 2
    """),
}
VERIFY = {"mlp_dp2_tp2": 2}  # verify's own steps, for one plan (each costs a step of every run)


def _predict(path: str) -> list:
    """The step's collectives as the estimate prices them, from the plan alone (no process group)."""
    from planlang.model.capture.load import build_model, plan_loss
    from planlang.model.price.accumulation import step_traffic
    from planlang.model.price.traffic import program_zero_units
    from planlang.plan.microbatches import accumulation_microbatch
    from planlang.runtime.apply import lower_plan

    plan, model, _, targets = accumulation_worker.batch(path)
    m = plan.microbatches
    example = tuple(t[: t.shape[0] // m].to("meta") for t in targets)
    prog = lower_plan(model, accumulation_microbatch(plan), plan_loss(plan), example)
    zero = program_zero_units(build_model(plan.model, plan.path), prog, plan) if plan.optimizer.zero_stage else None
    return accumulation_worker.rows(step_traffic(plan, prog, zero))


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    import threading

    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("accumulation")
    jobs, predicted = [], {}
    for name, text in PLANS.items():
        path = out / f"{name}.plan"
        path.write_text("use hardware\n" + text)
        predicted[name] = _predict(str(path))
        jobs.append((str(path), VERIFY.get(name, 0)))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    method = "fork" if threading.active_count() == 1 else "spawn"
    mp.start_processes(accumulation_worker.run, args=(4, port, jobs, str(out)), nprocs=4, join=True,
                       start_method=method)
    data = json.loads((out / "accumulation.json").read_text())
    return {Path(k).stem: {"predicted": predicted[Path(k).stem], "measured": v} for k, v in data.items()}


@pytest.mark.parametrize("name", list(PLANS))
def test_the_step_equals_one_process_on_the_whole_batch(results, name):
    for r in results[name]["measured"]:
        assert "error" not in r, r.get("error")
        assert r["microbatches"] > 1
        assert r["grads"] == r["ref_grads"]  # every parameter got its gradient
        assert r["grad_rel_err"] < 1e-5, r["grad_rel_err"]
        assert r["loss_rel_err"] < 1e-5, r["loss_rel_err"]


def _per_group(rows) -> tuple[dict, Counter]:
    """Full bytes per (kind, axes), and the calls per (kind, axes, S)."""
    full: dict = defaultdict(int)
    for kind, axes, s, *_ in rows:
        full[kind, tuple(axes)] += s
    return dict(full), Counter((k, tuple(a), s) for k, a, s, *_ in rows)


@pytest.mark.parametrize("name", list(PLANS))
def test_every_collective_is_the_predicted_one(results, name):
    """The gradient sums once per step (not once per microbatch), the rest once per microbatch, exactly
    as priced: the same calls (kind, axes, bytes) on every rank."""
    pred = results[name]["predicted"]
    assert any(row[4] == "grad_sync" or row[4] == "zero_backward" for row in pred)
    for rank, m in enumerate(results[name]["measured"]):
        assert not m["unknown"], m["unknown"]
        pf, pc = _per_group(pred)
        mf, mc = _per_group(m["rows"])
        assert mf == pf, f"rank {rank}: S per kind and axes measured {mf} != predicted {pf}"
        assert mc == pc, f"rank {rank}: calls measured {mc} != predicted {pc}"


def test_gradients_are_summed_once_per_step(results):
    """mlp_dp4 by hand: 2 microbatches, each a loss all-reduce (one f32) over dp; the gradients (4 bytes per
    parameter element) summed once."""
    pred = results["mlp_dp4"]["predicted"]
    sums = [row for row in pred if row[4] == "grad_sync"]
    params = 16 * 32 + 32 + 32 * 8 + 8
    assert sum(row[2] for row in sums) == 4 * params
    assert [row[2] for row in pred if row[4] == "loss"] == [4, 4]


def test_verify_passes(results):
    for r in results["mlp_dp2_tp2"]["measured"]:
        assert r["verify"] and all(row["ok"] for row in r["verify"]), r["verify"]


def test_a_users_no_sync_loop_under_zero3_reduce_scatters_once(results):
    """pm.no_sync() around all but the last microbatch's backward (a user's own accumulation loop): FSDP2
    reduce-scatters nothing inside (the gathers run), once per block after the last backward, and the
    gradients are the whole batch's."""
    for r in results["gpt2_dp4_zero3"]["measured"]:
        loop = r["user_loop"]
        assert loop["no_sync_rows"] and not [row for row in loop["no_sync_rows"] if row[0] == "reduce_scatter"]
        after = [row for row in loop["rows"][len(loop["no_sync_rows"]):] if row[0] == "reduce_scatter"]
        assert after and loop["grad_rel_err"] < 1e-5, loop
