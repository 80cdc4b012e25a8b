"""Bytes moved by collectives in one training step equal the cost model's prediction (issue #5).

One gloo launch with 4 ranks runs one step (forward, backward, parameter-gradient sums) of each plan under
planlang.apply while a TorchDispatchMode records every collective call (planlang.runtime.traffic.
CollectiveSpy: tensor sizes and process group of each call, not the runtime's own bookkeeping). The
prediction comes from the lowered program and planlang.cost alone. Compared on every rank:

* per kind and per mesh axes: the sum of S (planlang.cost.comm's full size) exactly, and bytes sent;
* forward and backward (with checkpoint recomputation): the multiset of (kind, axes, S) call by call;
* parameter-gradient sums: totals only (the runtime buckets gradients, which changes calls, not bytes).
"""
from __future__ import annotations

import functools
import math
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import torch

from tests.runtime import traffic_worker

PLANS = Path(__file__).parent / "plans"
# the last two are derived from gpt2_tp4 (see DERIVED)
CONFIGS = ["mlp_dp4", "mlp_tp4", "mlp_dp2_tp2", "gpt2_tp4", "gpt2_dp2_tp2_ckpt", "bert_tp2_dp2",
           "gpt2_tp4_ckpt_pinned", "gpt2_tp4_vocab_parallel"]
# measured phase -> the predicted phases it covers
PHASES = {"forward": ("forward", "loss"), "backward": ("recompute", "backward"), "grad_sync": ("grad_sync",)}


def _predict(plan_path: str):
    """The batch of one step and the predicted traffic, from the plan alone (no process group)."""
    from planlang.runtime.traffic import predict_step_traffic

    plan, prog, inputs, targets = traffic_worker.lowered_with_batch(plan_path)
    return inputs, targets, traffic_worker.rows(predict_step_traffic(plan, prog))


def _edit(text: str, old: str, new: str) -> str:
    assert old in text, f"gpt2_tp4.plan no longer contains {old!r}"
    return text.replace(old, new)


_MLP = "    apply megatron.mlp(tp) to block.mlp\n"
DERIVED = {
    # each block's MLP output pinned replicated and every block checkpointed: the MLP's all-reduce then
    # sits inside the group after its last op that saves a tensor, so torch's early stop does not
    # recompute it (the case `traffic.recomputed` models)
    "gpt2_tp4_ckpt_pinned": lambda t: _edit(t, _MLP, _MLP + "    shard output of block.mlp : [_, _, _]\n")
    + "checkpoint h[*] every 1\n",
    # embedding and LM head split over the vocabulary, large enough that cross-entropy runs
    # vocab-parallel: op-internal all-reduces (Strategy.forward) and a partial embedding output
    "gpt2_tp4_vocab_parallel": lambda t: _edit(_edit(t, "vocab = 128", "vocab = 4096"), "for block in",
                                               "shard wte.weight : [tp, _]\nshard lm_head.weight : [tp, _]\n"
                                               "for block in"),
}


def _plan_path(config: str, out: Path) -> str:
    if config not in DERIVED:
        return str(PLANS / f"{config}.plan")
    path = out / f"{config}.plan"
    path.write_text(DERIVED[config]((PLANS / "gpt2_tp4.plan").read_text()))
    return str(path)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("traffic")
    jobs, predicted = [], {}
    for c in CONFIGS:
        path = _plan_path(c, out)
        inputs, targets, predicted[c] = _predict(path)
        jobs.append((path, inputs, targets))
    # fork: the workers inherit the imports and the conversion-path caches the prediction warmed up (a
    # third of spawn's time here)
    data = traffic_worker.launch(jobs, str(out))
    return {Path(k).stem: {"predicted": predicted[Path(k).stem], "measured": v} for k, v in data.items()}


def _totals(rows, key):
    full, sent = defaultdict(int), defaultdict(float)
    for kind, axes, s, b, _, _ in rows:
        k = key(kind, tuple(axes))
        full[k] += s
        sent[k] += b
    return dict(full), dict(sent)


def _same_bytes(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(math.isclose(a[k], b[k], rel_tol=1e-12) for k in a)


@pytest.mark.parametrize("config", CONFIGS)
def test_measured_equals_predicted(results, config):
    r = results[config]
    pred = r["predicted"]
    assert pred, "the plan moves no bytes at all: the test would prove nothing"
    for rank, m in enumerate(r["measured"]):
        assert "error" not in m, m.get("error")
        meas = m["rows"]
        assert not m["unknown"], f"rank {rank}: collectives on groups that are no mesh axis: {m['unknown']}"
        for key in (lambda k, a: k, lambda k, a: a, lambda k, a: (k, a)):  # per kind, per axes, both
            pf, ps = _totals(pred, key)
            mf, ms = _totals(meas, key)
            assert mf == pf, f"rank {rank}: S per group measured {mf} != predicted {pf}"
            assert _same_bytes(ms, ps), f"rank {rank}: bytes sent measured {ms} != predicted {ps}"
        for phase, covers in PHASES.items():
            p = [row for row in pred if row[4] in covers]
            q = [row for row in meas if row[4] == phase]
            if phase == "grad_sync":
                assert _totals(q, lambda k, a: (k, a))[0] == _totals(p, lambda k, a: (k, a))[0], (rank, phase)
            else:
                calls = lambda rows: Counter((k, tuple(a), s) for k, a, s, *_ in rows)  # noqa: E731
                assert calls(q) == calls(p), f"rank {rank}, {phase}: measured {calls(q)} != predicted {calls(p)}"


# ------------------------------------------------------------------------------ without processes
@functools.lru_cache(maxsize=None)
def _lowered(name: str, path: str = ""):
    from planlang.model.capture.load import build_model
    from planlang.runtime.apply import load_plan, lower_plan

    plan = load_plan(path or str(PLANS / f"{name}.plan"))
    model = build_model(plan.model, plan.path)
    return plan, model, lower_plan(model, plan)


def test_data_parallel_moves_the_gradients_once():
    """mlp_dp4 by hand: the loss (one f32) and every parameter gradient summed over dp by ring all-reduce,
    2 (n-1)/n of the bytes each; nothing else."""
    from planlang.runtime.traffic import predict_step_traffic

    plan, model, prog = _lowered("mlp_dp4")
    traffic = predict_step_traffic(plan, prog)
    n = plan.mesh.axis_size("dp")
    grads = 4 * sum(p.numel() for p in model.parameters())
    assert traffic.full_by_kind_axes == {("all_reduce", ("dp",)): grads + 4}
    assert traffic.by_phase == pytest.approx({"loss": 2 * (n - 1) / n * 4, "grad_sync": 2 * (n - 1) / n * grads})


def test_prediction_from_graph_equals_prediction_from_program():
    from planlang.model.capture.load import meta_inputs, plan_loss
    from planlang.model.capture.opgraph import op_graph
    from planlang.runtime.traffic import predict_step_traffic

    plan, model, prog = _lowered("gpt2_dp2_tp2_ckpt")
    targets = (torch.zeros(8, 16, dtype=torch.long, device="meta"),)  # the LM target: the input's shape
    graph = op_graph(model, meta_inputs(plan.inputs), plan_loss(plan), targets)
    assert predict_step_traffic(plan, graph).transfers == predict_step_traffic(plan, prog).transfers


def test_traffic_table():
    from planlang.runtime.traffic import predict_step_traffic, traffic_table

    plan, _, prog = _lowered("gpt2_dp2_tp2_ckpt")
    text = traffic_table(str(PLANS / "gpt2_dp2_tp2_ckpt.plan"))
    total = predict_step_traffic(plan, prog).total
    assert f"{total:,.0f} B" in text
    for phase in ("forward", "loss", "recompute", "backward", "grad_sync"):
        assert f"\n{phase} " in text


def test_derived_plans_exercise_their_case(results, tmp_path):
    """The derived plans test what they are for: a checkpoint group whose trailing collective is not
    recomputed, and cross-entropy's own collectives."""
    from planlang.model.program.lowering import Convert
    from planlang.model.program.lowering import gradient_flow as _gradient_flow
    from planlang.model.price.traffic import recomputed

    plan, _, prog = _lowered("", _plan_path("gpt2_tp4_ckpt_pinned", tmp_path))
    req, grad = _gradient_flow(prog)
    skipped = []
    for start, end in prog.checkpoint_groups:
        kept = recomputed(prog, start, end, req, grad)
        assert kept, "every group is recomputed"
        skipped += [ins for ins in prog.instructions[start + len(kept):end]
                    if isinstance(ins, Convert) and ins.path.forward]
    assert skipped, "no group ends in a collective after its last saved tensor"
    vocab = results["gpt2_tp4_vocab_parallel"]["predicted"]
    assert any(phase == "forward" and what == "cross_entropy" for *_, phase, what in vocab)
