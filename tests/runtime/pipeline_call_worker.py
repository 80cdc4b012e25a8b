"""Gloo worker for tests/runtime/test_pipeline_call_gloo.py: on every rank, under each pipeline plan,

    out = pm(idx=x, labels=x); out.loss.backward(); norm = pm.clip_grad_norm_(MAX_NORM); opt.step(); sched.step()

for STEPS steps (AdamW, LambdaLR warmup + cosine; the last step as two half batches, each loss / 2 before
its backward), then evaluation (`pm.eval()`, `torch.no_grad()`: the forward-only schedule) on the plan's
batch and a shorter one. Each is compared with one process running torch's own loop
(tests/runtime/clip_save_worker.reference), every error judged against verify's bound (max(TOL, 10 x one
process's own error against float64)).
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
MAX_NORM = C.MAX_NORM
TOL = C.TOL
PLANS = "tests/runtime/plans"
CONFIGS = {
    "pp2_dp2": "pcall_gpt2_pp2_dp2.plan",
    "pp2_dp2_zero3": "pcall_gpt2_pp2_dp2_zero3.plan",
    "pp2_dp2_interleaved": "pcall_gpt2_pp2_dp2_interleaved.plan",  # 2 stages per rank
    "pp2_tp2": "pcall_gpt2_pp2_tp2.plan",  # the lowered program cut into stages
}


def eval_batch() -> torch.Tensor:
    return torch.randint(0, 128, (8, 16), generator=torch.Generator().manual_seed(2))


def reference_outputs(ref: list[dict], dtype: torch.dtype) -> dict:
    """One process: the logits of the first step's batch at the initial parameters, and after STEPS steps
    (`ref`'s parameters) the eval loss and logits on the eval batch and its first half."""
    from examples.gpt2.model import loss as loss_fn
    model = C.build().to(dtype)
    out = {"logits0": model(C.batches()[0].clone()).detach()}
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(ref[STEPS - 1]["params"][n])
        model.eval()
        ev = eval_batch()
        logits = model(ev)
        out["eval_loss"], out["eval_logits"] = loss_fn(logits, ev), logits
        out["short_loss"] = loss_fn(model(ev[:4]), ev[:4])
    return out


def _err(got: torch.Tensor, ref: torch.Tensor, exact: torch.Tensor) -> list[float]:
    from planlang.runtime.verify import bound, rel
    return [rel(got, ref), bound(rel(ref, exact), TOL)]


def run_config(plan: str, ref: list[dict], exact: list[dict], outs: dict, exact_outs: dict) -> dict:
    import planlang
    from planlang.runtime.pipeline import PipelineError
    from planlang.runtime.programs import PlanError
    pm = planlang.apply(C.build(), os.path.join(PLANS, plan))
    opt = pm.optimizer()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, C.lr_lambda)
    data = C.batches()
    dp = pm.groups.coords.get("dp", 0)
    pieces = 4 if "dp" in pm.groups.coords else 8  # this replica's rows of a batch of 8
    last = pm.runner.has_last
    res: dict = {"model": type(pm).__name__, "last": last, "steps": []}
    for s in range(STEPS):
        opt.zero_grad()
        x = data[s]
        if s < STEPS - 1:
            out = pm(x, x) if s == 0 else pm(idx=x, labels=x)
            loss = out.loss
            res.setdefault("requires_grad", []).append(loss.requires_grad)
            if s == 0 and last and out.output is not None:  # this replica's piece of the logits
                rows = slice(pieces * dp, pieces * (dp + 1))
                res["logits0"] = _err(out.output, outs["logits0"][rows], exact_outs["logits0"][rows])
            if s == 0:
                res["others_none"] = last or out.output is None
                res["output_type"] = type(out).__name__
            loss.backward(retain_graph=s == 0)
            if s == 0:  # the step's gradients were handed over: a second backward is refused
                try:
                    loss.backward()
                    res["second_backward"] = "ran"
                except PipelineError as e:
                    res["second_backward"] = str(e)
            if s == 1:  # a pm(...) without backward leaves the gradients as they were
                before = {n: g.clone() for n, g in pm.full_grads().items()}
                pm(data[STEPS], data[STEPS])
                after = pm.full_grads()
                res["grads_kept"] = sorted(before) == sorted(after) and all(
                    torch.equal(after[n], g) for n, g in before.items())
        else:  # two half batches, each loss / 2: the gradients add up in .grad to the whole batch's
            loss = sum(_half(pm, h) for h in (x[:4], x[4:]))
        norm = pm.clip_grad_norm_(MAX_NORM)
        grads = pm.full_grads()
        opt.step()
        sched.step()
        params = pm.full_parameters()
        total = math.sqrt(sum(float(g.double().norm()) ** 2 for g in ref[s]["grads"].values()))
        row = C.judge({"loss": loss, "norm": norm, "grads": grads, "params": params}, ref[s], exact[s], total)
        row["step"], row["norm_value"] = s, float(norm)
        res["steps"].append(row)
    pm.eval()
    ev = eval_batch()
    res["eval_mode_no_grad"] = not pm(idx=ev, labels=ev).loss.requires_grad  # eval mode: forward only
    with torch.no_grad():
        out = pm(idx=ev, labels=ev)
        res["eval_loss"] = _err(out.loss, outs["eval_loss"], exact_outs["eval_loss"])
        if last and out.output is not None:
            rows = slice(pieces * dp, pieces * (dp + 1))
            res["eval_logits"] = _err(out.output, outs["eval_logits"][rows], exact_outs["eval_logits"][rows])
        full = pm.whole(out)  # every rank: the whole batch's logits
        if full.output is not None:
            res["whole_logits"] = _err(full.output, outs["eval_logits"], exact_outs["eval_logits"])
        res["whole_loss_kept"] = full.loss is out.loss
        res["short_loss"] = _err(pm(idx=ev[:4], labels=ev[:4]).loss, outs["short_loss"], exact_outs["short_loss"])
        try:
            pm(idx=torch.cat([ev, ev]), labels=torch.cat([ev, ev]))
            res["larger"] = "ran"
        except PlanError as e:
            res["larger"] = str(e)
    res["step_accumulates"] = _accumulated(pm, data)
    return res


def _accumulated(pm, data) -> list:
    """`pm.step` twice without zero_grad: the gradients are the sum of each step's alone (the tied copies'
    sum and the data / tensor axes' sums count each step's gradients once): the worst relative error;
    then after zeroing the gradients in place, a step's error against the step alone and whether every
    `.grad` is still the tensor it was (no new gradient memory)."""
    from planlang.runtime.verify import rel
    alone = []
    for x in data[:2]:
        pm.zero_grad()
        pm.step(x, x)
        alone.append({n: g.clone() for n, g in pm.full_grads().items()})
    pm.zero_grad()
    for x in data[:2]:
        pm.step(x, x)
    both = pm.full_grads()
    err = max(rel(both[n], alone[0][n] + alone[1][n]) for n in alone[0])
    # zero_grad(set_to_none=False): the zeroed gradients stay in place and the step adds into them
    held = {id(p): p.grad for p in pm.parameters()}
    with torch.no_grad():
        for g in held.values():
            (g.to_local() if hasattr(g, "to_local") else g).zero_()
    pm.step(data[0], data[0])
    again = pm.full_grads()
    kept = all(p.grad is held[id(p)] for p in pm.parameters())
    return [err, max(rel(again[n], alone[0][n]) for n in alone[0]), kept]


def _half(pm, h: torch.Tensor) -> torch.Tensor:
    loss = pm(idx=h, labels=h).loss / 2
    loss.backward()
    return loss.detach()


HF = "pcall_llama_pp2_dp2.plan"


def run_hf() -> dict:
    """HF Llama under pp 2 x dp 2 (a torch.export cut): `pm(input_ids=x, labels=x)` is the model's own
    CausalLMOutputWithPast with the plan's loss; its backward's gradients, the eval loss and
    `pm.whole(out).logits` against one process (in float32 and float64 for the bound)."""
    import copy

    import planlang
    from examples.zoo.causal_lm import llama, loss as loss_fn
    from planlang.runtime.verify import GRAD_FLOOR, judged, rel
    torch.manual_seed(0)
    model = llama()
    x = torch.randint(0, 256, (8, 16), generator=torch.Generator().manual_seed(3))
    refs = {}
    for dtype in (torch.float32, torch.float64):
        one = copy.deepcopy(model).to(dtype)
        out = one(input_ids=x)
        loss = loss_fn(out, x)
        loss.backward()
        refs[dtype] = {"loss": loss.detach(), "logits": out.logits.detach(),
                       "grads": {n: p.grad for n, p in one.named_parameters()}}
    ref, exact = refs[torch.float32], refs[torch.float64]
    pm = planlang.apply(model, os.path.join(PLANS, HF))
    out = pm(input_ids=x, labels=x)
    res: dict = {"type": type(out).__name__, "last": pm.runner.has_last, "loss": _err(out.loss, ref["loss"], exact["loss"])}
    dp = pm.groups.coords["dp"]
    if pm.runner.has_last:
        rows = slice(4 * dp, 4 * dp + 4)
        res["logits"] = _err(out.logits, ref["logits"][rows], exact["logits"][rows])
    else:
        res["others_none"] = out.logits is None
    out.loss.backward()
    grads = pm.full_grads()
    total = math.sqrt(sum(float(g.double().norm()) ** 2 for g in ref["grads"].values()))
    floor = GRAD_FLOOR * total
    errs = {n: rel(grads[n], g, floor) if n in grads else 1.0 for n, g in ref["grads"].items()}
    noise = {n: rel(g, exact["grads"][n], floor) for n, g in ref["grads"].items()}
    name, err, lim = judged(errs, noise, TOL)
    res["grads"] = [err, lim, name]
    pm.eval()
    with torch.no_grad():
        out = pm(input_ids=x, labels=x)
        res["eval_loss"] = _err(out.loss, ref["loss"], exact["loss"])
        full = pm.whole(out)
    res["whole_type"] = type(full).__name__
    res["whole_logits"] = _err(full.logits, ref["logits"], exact["logits"])
    return res


F16 = "gpt2_pp2_dp2_zero1_f16.plan"  # f16 parameters, f32 masters (MasterWeights over ZeRO-1), a loss scale


def run_f16() -> dict:
    """Under a dynamic loss scale: `pm(x, x).loss.backward()` leaves in `.grad` what `pm.step(x, x)` does
    (the scaled gradients the optimizer unscales), bit for bit, with the same loss."""
    import planlang
    from examples.gpt2.model import build
    torch.manual_seed(0)
    pm = planlang.apply(build(layers=4, hidden=64, heads=4, vocab=128, seq=16), os.path.join(PLANS, F16))
    opt = pm.optimizer()
    x = C.batches()[0]
    step_loss = pm.step(x, x)
    by_step = {n: g.clone() for n, g in pm.full_grads().items()}
    opt.zero_grad()
    out = pm(x, x)
    out.loss.backward()
    by_call = pm.full_grads()
    opt.step()
    return {"optimizer": type(opt).__name__, "scale": opt.loss_scale.value,
            "loss_equal": torch.equal(out.loss.detach(), step_loss),
            "grads_equal": sorted(by_step) == sorted(by_call) and all(torch.equal(by_call[n], g)
                                                                       for n, g in by_step.items()),
            "params_finite": all(bool(torch.isfinite(p).all()) for p in pm.full_parameters().values())}


def run() -> dict:
    ref, exact = C.reference(torch.float32), C.reference(torch.float64)
    outs, exact_outs = reference_outputs(ref, torch.float32), reference_outputs(exact, torch.float64)
    results = {}
    for name, plan in CONFIGS.items():
        t0 = time.time()
        results[name] = run_config(plan, ref, exact, outs, exact_outs)
        results[name]["seconds"] = round(time.time() - t0, 1)
    results["f16"] = run_f16()
    t0 = time.time()
    results["hf"] = run_hf()
    results["hf"]["seconds"] = round(time.time() - t0, 1)
    return results


def worker(rank: int, port: int, outdir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
    write_rank(outdir, rank, run)


if __name__ == "__main__":  # a manual run: python -m tests.runtime.pipeline_call_worker
    manual_run(worker, WORLD)
