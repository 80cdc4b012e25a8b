"""Gloo worker for tests/runtime/test_call_gloo.py: every rank runs each config's loop through `pm(...)`

    out = pm(**batch); out.loss.backward(); norm = pm.clip_grad_norm_(MAX_NORM); opt.step(); sched.step()

for STEPS steps against one process running torch's own loop (the clip/save tests' reference for the
bundled GPT-2; HF GPT-2 computing its own loss from `labels=` for the HF config), then the evaluation
loss (pm.eval(), torch.no_grad) and a shorter last batch (a training step's loss and gradients) against
one process holding the plan's parameters, and the logits `pm.whole` gathers against one process's.
Every error is judged against verify's bound: max(TOL, 10 x one process's own error against float64).
"""
from __future__ import annotations

import math
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from tests.runtime import clip_save_worker as C
from tests.runtime.spawned import manual_run, write_rank

WORLD = 4
STEPS = 3
TOL = 1e-5
PLANS = "tests/runtime/plans"
# config -> (plan, the model: "gpt2" is the bundled one (loss(logits, labels)), "hf" HF GPT-2 with labels)
CONFIGS = {
    "dp4": ("call_gpt2_dp4.plan", "gpt2"),
    "hf_dp2_tp2": ("call_hf_gpt2_dp2_tp2.plan", "hf"),
    "dp4_zero3": ("call_gpt2_dp4_zero3.plan", "gpt2"),
}
SHORT = 4  # the shorter last batch (of the plans' 8)
SEQ = 12  # a shorter sequence (of the plans' 16)


def build(kind: str) -> torch.nn.Module:
    if kind == "gpt2":
        return C.build()
    from tests.runtime.call_models import gpt2
    torch.manual_seed(0)
    return gpt2(n_layer=2)


def call_args(kind: str, idx: torch.Tensor) -> dict:
    """The call's keywords: HF's names (the model computes its loss from `labels`); the bundled GPT-2's
    input `idx` and its loss' `labels`."""
    return {"input_ids": idx, "labels": idx} if kind == "hf" else {"idx": idx, "labels": idx}


def ref_loss(kind: str, model, idx: torch.Tensor):
    """(loss, logits) of one process."""
    if kind == "hf":
        out = model(input_ids=idx, labels=idx)
        return out.loss, out.logits
    from examples.gpt2.model import loss as loss_fn
    logits = model(idx)
    return loss_fn(logits, idx), logits


def reference(kind: str, dtype: torch.dtype) -> list[dict]:
    """One process, torch's loop: each step's loss, norm, clipped gradients and parameters after."""
    model = build(kind).to(dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, eps=1e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, C.lr_lambda)
    out = []
    for idx in C.batches()[:STEPS]:
        opt.zero_grad()
        out.append(C.reference_step(model, ref_loss(kind, model, idx)[0], opt, sched))
    return out


def train(kind, pm, opt, sched, ref, exact) -> list[dict]:
    rows = []
    data = C.batches()
    for s in range(STEPS):
        opt.zero_grad()
        out = pm(**call_args(kind, data[s]))
        out.loss.backward()
        norm = pm.clip_grad_norm_(C.MAX_NORM)  # finishes the deferred gradient sums itself
        grads = pm.full_grads()
        opt.step()
        sched.step()
        params = pm.full_parameters()
        total = math.sqrt(sum(float(g.double().norm()) ** 2 for g in ref[s]["grads"].values()))
        row = C.judge({"loss": out.loss.detach(), "norm": norm, "grads": grads, "params": params},
                      ref[s], exact[s], total)
        row["step"], row["norm_value"], row["lr"], row["ref_lr"] = s, float(norm), sched.get_last_lr()[0], ref[s]["lr"]
        rows.append(row)
    return rows


def at(kind: str, params: dict, dtype: torch.dtype, training: bool) -> torch.nn.Module:
    """One process holding the plan's parameters, in `dtype`, in the given mode."""
    model = build(kind)
    model.load_state_dict({n: t.clone() for n, t in params.items()}, strict=False)
    return model.to(dtype).train(training)


def judged(got: torch.Tensor, params: dict, kind: str, idx, training: bool, what: str) -> list:
    """[error, bound] of `got` (the loss, or with what="logits" the logits) against one process."""
    from planlang.runtime.verify import bound, rel
    pick = 0 if what == "loss" else 1
    with torch.no_grad():
        ref = ref_loss(kind, at(kind, params, torch.float32, training), idx)[pick]
        exact = ref_loss(kind, at(kind, params, torch.float64, training), idx.clone())[pick]
    return [rel(got, ref), bound(rel(ref, exact), TOL)]


def evaluate(kind, pm) -> dict:
    """pm.eval() + torch.no_grad(): the loss and the logits (whole, through pm.whole) against one process;
    the local logits' shape; a shorter batch's and a shorter sequence's evaluation loss."""
    data = C.batches()
    idx = data[STEPS]
    params = {n: t.clone() for n, t in pm.full_parameters().items()}
    pm.eval()
    with torch.no_grad():
        out = pm(**call_args(kind, idx))
        whole = pm.whole(out)
        short = pm(**call_args(kind, idx[:SHORT]))
        seq = pm(**call_args(kind, idx[:, :SEQ]))  # a shorter sequence
    pm.train()
    logits = whole.logits if kind == "hf" else whole.output
    local = out.logits if kind == "hf" else out.output
    return {"type": type(out).__name__, "loss": judged(out.loss, params, kind, idx, False, "loss"),
            "logits": judged(logits, params, kind, idx, False, "logits"),
            "local_logits": list(local.shape), "whole_logits": list(logits.shape),
            "loss_requires_grad": out.loss.requires_grad,
            "short_loss": judged(short.loss, params, kind, idx[:SHORT], False, "loss"),
            "seq_loss": judged(seq.loss, params, kind, idx[:, :SEQ], False, "loss")}


def short_step(kind, pm, opt) -> dict:
    """A shorter last batch of shorter sequences in training mode: its loss and gradients (out.loss.backward(), summed by the
    optimizer's pre-step hook through full_grads) against one process at the same parameters."""
    from planlang.runtime.verify import GRAD_FLOOR, bound, rel
    idx = C.batches()[STEPS + 1][:SHORT, :SEQ]  # shorter in both the batch and the sequence
    params = {n: t.clone() for n, t in pm.full_parameters().items()}  # (a whole one is the parameter itself)
    opt.zero_grad()
    out = pm(**call_args(kind, idx))
    out.loss.backward()
    grads = pm.full_grads()
    opt.step()
    refs = []
    for dtype in (torch.float32, torch.float64):
        m = at(kind, params, dtype, True)
        ref_loss(kind, m, idx)[0].backward()
        refs.append({n: p.grad for n, p in m.named_parameters()})
    total = sum(float(g.double().norm()) ** 2 for g in refs[0].values()) ** 0.5
    worst = max((rel(grads[n], g, GRAD_FLOOR * total) / bound(rel(g, refs[1][n], GRAD_FLOOR * total), TOL), n)
                for n, g in refs[0].items())
    return {"loss": judged(out.loss.detach(), params, kind, idx, True, "loss"), "grads_over_bound": list(worst)}


F16 = "call_gpt2_dp2_tp2_f16.plan"  # f16 parameters, f32 masters (MasterWeights), loss scale 1024


def same_as_step(plan: str, steps: int = 2) -> dict:
    """The plan applied twice to one model: one trained by `pm.step`, the other by `pm(...)` +
    `out.loss.backward()` (the optimizer's pre-step hook finishing the sums); the largest difference of
    their losses and parameters after each step (the same program and sums: expected 0), and their loss
    scales."""
    import planlang
    data = C.batches()
    by_step, by_call = (planlang.apply(C.build(), os.path.join(PLANS, plan)) for _ in range(2))
    opts = by_step.optimizer(), by_call.optimizer()
    loss_diff, param_diff = 0.0, 0.0
    for s in range(steps):
        for o in opts:
            o.zero_grad()
        a = by_step.step(data[s], data[s])
        out = by_call(idx=data[s], labels=data[s])
        out.loss.backward()
        for o in opts:
            o.step()
        loss_diff = max(loss_diff, abs(float(a) - float(out.loss)))
        pa, pb = by_step.full_parameters(), by_call.full_parameters()
        param_diff = max(param_diff, max(float((pa[n].double() - pb[n].double()).abs().max()) for n in pa))
    return {"loss_diff": loss_diff, "param_diff": param_diff, "optimizer": type(opts[1]).__name__,
            "scales": [o.loss_scale.value for o in opts]}


ACC = "call_gpt2_dp4_zero3_acc2.plan"  # ZeRO-3 with `microbatches 2`


def accumulation(plan: str) -> dict:
    """Under gradient accumulation: `pm.step` (2 microbatches, one gradient sum) and `pm(...)` +
    `out.loss.backward()` (the step's batch as one program) on two copies from the same parameters:
    the relative difference of their losses and of their gradients (summation orders differ)."""
    import planlang
    from planlang.runtime.verify import rel
    idx = C.batches()[0]
    by_step, by_call = (planlang.apply(C.build(), os.path.join(PLANS, plan)) for _ in range(2))
    a = by_step.step(idx, idx)
    out = by_call(idx, idx)
    out.loss.backward()
    ga, gb = by_step.full_grads(), by_call.full_grads()
    total = sum(float(g.double().norm()) ** 2 for g in ga.values()) ** 0.5
    return {"microbatches": by_call.microbatches, "loss": rel(out.loss.detach(), a),
            "grads": max(rel(gb[n], g, 1e-3 * total) for n, g in ga.items())}


LLAMA = "call_llama_dp4.plan"


def llama_eval(plan: str) -> dict:
    """HF Llama under dp 4, pm.eval(): the call's program is lowered again on the meta copy, where the
    rotary `inv_freq` buffer cannot fold into constants (live_consts reads it from the live model): the
    loss and the whole logits against one process."""
    import planlang
    from examples.zoo.causal_lm import llama, loss
    from planlang.runtime.verify import rel
    torch.manual_seed(0)
    ref = llama().eval()
    torch.manual_seed(0)
    pm = planlang.apply(llama(), os.path.join(PLANS, plan))
    idx = C.batches()[0] % 256
    pm.eval()
    with torch.no_grad():
        out = pm(input_ids=idx, labels=idx)
        logits = pm.whole(out).logits
        r = ref(idx)
    return {"type": type(out).__name__, "loss": rel(out.loss, loss(r, idx)), "logits": rel(logits, r.logits)}


def run() -> dict:
    import planlang
    results = {}
    refs = {}
    for name, (plan, kind) in CONFIGS.items():
        t0 = time.time()
        if kind not in refs:
            refs[kind] = reference(kind, torch.float32), reference(kind, torch.float64)
        pm = planlang.apply(build(kind), os.path.join(PLANS, plan))
        opt = pm.optimizer()
        sched = torch.optim.lr_scheduler.LambdaLR(opt, C.lr_lambda)
        res: dict = {"model": type(pm).__name__, "steps": train(kind, pm, opt, sched, *refs[kind])}
        res["eval"] = evaluate(kind, pm)
        res["short"] = short_step(kind, pm, opt)
        spec = pm.program.input_specs[pm._inputs[0].name]
        res["data_degree"] = math.prod(pm.groups.size(a) for a in spec.axes_of(0))
        res["call_outputs"] = len(pm.program.outputs)
        idx = C.batches()[0]
        pm.step(idx, idx)  # inputs then targets, positionally: the loss-only program
        res["step_outputs"] = len(pm.program.outputs)
        res["seconds"] = round(time.time() - t0, 1)
        results[name] = res
    t0 = time.time()
    results["f16"] = same_as_step(F16)
    results["f16"]["seconds"] = round(time.time() - t0, 1)
    t0 = time.time()
    results["accumulation"] = accumulation(ACC)
    results["accumulation"]["seconds"] = round(time.time() - t0, 1)
    t0 = time.time()
    results["llama"] = llama_eval(LLAMA)
    results["llama"]["seconds"] = round(time.time() - t0, 1)
    return results


def worker(rank: int, port: int, outdir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD),
                      LOCAL_RANK=str(rank), PLANLANG_PL364_SHOWN="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=300))
    write_rank(outdir, rank, run)


if __name__ == "__main__":
    manual_run(worker, WORLD)
