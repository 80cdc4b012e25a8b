"""Gloo worker for tests/runtime/test_clip_save_gloo.py: every rank runs every config's training loop

    loss = pm.step(idx, idx); norm = pm.clip_grad_norm_(MAX_NORM); opt.step(); sched.step()

(AdamW, a LambdaLR warmup + cosine) for STEPS steps, saves with planlang.save, then — after every config
has saved — loads the checkpoint another config saved (LOAD_FROM: another plan) and runs MORE steps.
Each step is compared with one process running torch's own loop (torch.nn.utils.clip_grad_norm_, the
same scheduler) uninterrupted for STEPS + MORE steps, and every error is judged against verify's bound:
max(TOL, 10 x one process's own error against the same loop in float64).
"""
from __future__ import annotations

import math
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from tests.runtime.spawned import manual_run, write_rank

WORLD = 4
STEPS = 3  # under the plan that saves
MORE = 2  # under the plan that loads
MAX_NORM = 0.2  # below every step's norm: every step clips
TOL = 1e-5
PLANS = "tests/runtime/plans"
CONFIGS = {
    "dp4": "clip_gpt2_dp4.plan",
    "dp2_tp2_zero1": "clip_gpt2_dp2_tp2_zero1.plan",
    "pp2_dp2_zero1": "clip_gpt2_pp2_dp2_zero1.plan",
    "dp4_zero3": "clip_gpt2_dp4_zero3.plan",
    "pp2_tp2": "clip_gpt2_pp2_tp2.plan",
    "dp2_fs2_hsdp": "clip_gpt2_dp2_fs2_hsdp.plan",
    "pp2_dp2_zero3": "clip_gpt2_pp2_dp2_zero3.plan",
}
# config -> the config whose checkpoint it loads (a cycle: every checkpoint is read under another plan)
LOAD_FROM = {"dp2_tp2_zero1": "dp4", "pp2_dp2_zero1": "dp2_tp2_zero1", "dp4_zero3": "pp2_dp2_zero1",
             "pp2_tp2": "dp4_zero3", "dp2_fs2_hsdp": "pp2_tp2", "pp2_dp2_zero3": "dp2_fs2_hsdp",
             "dp4": "pp2_dp2_zero3"}


def lr_lambda(step: int) -> float:
    """Linear warmup over 2 steps, then a cosine decay (to 0 at step STEPS + MORE + 2)."""
    if step < 2:
        return (step + 1) / 2
    return 0.5 * (1 + math.cos(math.pi * (step - 2) / (STEPS + MORE)))


def build():
    from examples.gpt2.model import build as gpt2
    torch.manual_seed(0)
    return gpt2(layers=4, hidden=64, heads=4, vocab=128, seq=16, tie_embeddings=True)


def batches() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 128, (8, 16), generator=g) for _ in range(STEPS + MORE)]


def reference(dtype: torch.dtype) -> list[dict]:
    """One process, torch's own loop, every step's loss, norm, clipped gradients and parameters after."""
    from examples.gpt2.model import loss as loss_fn
    model = build().to(dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, eps=1e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
    out = []
    for idx in batches():
        opt.zero_grad()
        loss = loss_fn(model(idx), idx)
        out.append(reference_step(model, loss, opt, sched))
    return out


def reference_step(model, loss, opt, sched) -> dict:
    """One process's backward, clip, optimizer and scheduler step: the loss, norm, clipped gradients, lr
    and parameters after (what `judge` compares a plan's step with)."""
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    opt.step()
    sched.step()
    return {"loss": loss.detach(), "norm": norm.detach(), "grads": grads, "lr": sched.get_last_lr()[0],
            "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


def judge(got: dict, ref: dict, exact: dict, grad_total: float) -> dict:
    """Per quantity (loss, norm, gradients, parameters): the worst error and its bound (verify's rule)."""
    from planlang.runtime.verify import GRAD_FLOOR, bound, judged, rel
    out = {}
    for key in ("loss", "norm"):
        err, noise = rel(got[key], ref[key]), rel(ref[key], exact[key])
        out[key] = [err, bound(noise, TOL)]
    floor = GRAD_FLOOR * grad_total
    for key, fl in (("grads", floor), ("params", 0.0)):
        errs = {n: rel(got[key][n], g, fl) if n in got[key] else 1.0 for n, g in ref[key].items()}
        noise = {n: rel(g, exact[key][n], fl) for n, g in ref[key].items()}
        name, err, lim = judged(errs, noise, TOL)
        out[key] = [err, lim, name]
    return out


def train(pm, opt, sched, steps, ref, exact) -> list[dict]:
    rows = []
    data = batches()
    for s in steps:
        opt.zero_grad()
        loss = pm.step(data[s], data[s])
        norm = pm.clip_grad_norm_(MAX_NORM)
        grads = pm.full_grads()
        opt.step()
        sched.step()
        params = pm.full_parameters()
        total = math.sqrt(sum(float(g.double().norm()) ** 2 for g in ref[s]["grads"].values()))
        row = judge({"loss": loss, "norm": norm, "grads": grads, "params": params}, ref[s], exact[s], total)
        row["step"], row["norm_value"], row["ref_norm"] = s, float(norm), float(ref[s]["norm"])
        row["lr"], row["ref_lr"] = sched.get_last_lr()[0], ref[s]["lr"]
        rows.append(row)
    return rows


def scramble(pm, opt, sched) -> None:
    """Parameters and optimizer state zeroed, the scheduler moved on: a load must restore all of them."""
    with torch.no_grad():
        for p in pm.parameters():
            (p.to_local() if hasattr(p, "to_local") else p).zero_()
        for st in getattr(opt, "optim", opt).state.values():  # ZeroRedundancyOptimizer: its local one's
            for v in st.values():
                if isinstance(v, torch.Tensor):
                    (v.to_local() if hasattr(v, "to_local") else v).zero_()
        for m in getattr(opt, "masters", ()):  # MasterWeights: the f32 copy the optimizer steps
            m.zero_()
    if sched is not None:
        sched.step()
        sched.step()


def run(outdir: str, ckpt: str) -> dict:
    import planlang
    from planlang.runtime.zero import is_zero1
    ref, exact = reference(torch.float32), reference(torch.float64)
    live, results = {}, {}
    for name, plan in CONFIGS.items():
        t0 = time.time()
        pm = planlang.apply(build(), os.path.join(PLANS, plan))
        opt = pm.optimizer()
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
        rows = train(pm, opt, sched, range(STEPS), ref, exact)
        planlang.save(pm, opt, os.path.join(ckpt, name), scheduler=sched)
        live[name] = (pm, opt, sched)
        results[name] = {"model": type(pm).__name__, "optimizer": type(opt).__name__, "zero1": is_zero1(opt),
                         "steps": rows, "seconds": round(time.time() - t0, 1)}
    for name, src in LOAD_FROM.items():
        pm, opt, sched = live[name]
        scramble(pm, opt, sched)  # so that what the resumed steps match can only come from the checkpoint
        planlang.load(pm, opt, os.path.join(ckpt, src), scheduler=sched)
        results[name]["loaded_from"] = src
        results[name]["loaded_lr"] = sched.get_last_lr()[0]
        results[name]["resumed"] = train(pm, opt, sched, range(STEPS, STEPS + MORE), ref, exact)
        # the last step's clipped gradients are still there: their norms of other orders, no clipping
        last = ref[-1]["grads"].values()
        results[name]["norms"] = {str(p): [float(pm.clip_grad_norm_(1e9, p)),
                                           float(torch.nn.utils.get_total_norm(list(last), p))]
                                  for p in (1.0, 2.0, math.inf)}
    # the whole model on rank 0 (save_pretrained's form): equal to the last config's parameters
    results["full_state_dict"] = {}
    for name, every in (("dp4", False), ("pp2_dp2_zero3", False), ("pp2_tp2", True)):
        full = live[name][0].full_state_dict(all_ranks=every)
        results["full_state_dict"][name] = {
            "keys": sorted(full), "err": max((float((t - ref[-1]["params"][n]).norm() / ref[-1]["params"][n].norm())
                                              for n, t in full.items()), default=-1.0)}
    results["f16"] = precision_run(ckpt, live["dp4"])  # (loads into dp4's model: after the above)
    return results


F16 = "clip_gpt2_dp2_tp2_f16.plan"  # f16 parameters, an f32 master copy (MasterWeights), loss scale 1024


def masters_by_name(pm, opt) -> dict[str, torch.Tensor]:
    ids = {id(p): n for n, p in pm.module.named_parameters()}
    return {ids[id(p)]: m for p, m in zip(opt.params, opt.masters)}


def precision_run(ckpt: str, dp4) -> dict:
    """Under F16: the norm `clip_grad_norm_` returns against the gathered (loss-scaled) gradients and the
    factor it applies; what a save stores (the f32 masters) and what loads restore."""
    import planlang
    from planlang.cost.layout import local_slices
    from planlang.runtime.checkpoint import load_full_state
    from planlang.runtime.verify import rel
    pm = planlang.apply(build(), os.path.join(PLANS, F16))
    opt = pm.optimizer()
    scale = opt.loss_scale.value
    out: dict = {"optimizer": type(opt).__name__, "scale": scale, "norm_vs_grads": [], "clip_factor": []}
    data = batches()
    for s in range(2):
        opt.zero_grad()
        pm.step(data[s], data[s])
        pre = {n: g.clone() for n, g in pm.full_grads().items()}  # (a whole one may be the gradient itself)
        norm = float(pm.clip_grad_norm_(MAX_NORM))
        want = math.sqrt(sum(float(g.double().norm()) ** 2 for g in pre.values())) / scale
        out["norm_vs_grads"].append(abs(norm - want) / want)
        post = pm.full_grads()
        coef = min(1.0, MAX_NORM / (norm + 1e-6))
        out["clip_factor"].append(max(rel(post[n], pre[n].double() * coef) for n in pre))
        opt.step()
    planlang.save(pm, opt, os.path.join(ckpt, "f16"))
    before = {n: m.detach().clone() for n, m in masters_by_name(pm, opt).items()}
    params_before = pm.full_parameters()
    # the f32 plan loads the f16 run's masters: f32 values an f16 parameter cannot hold
    dp4_pm, dp4_opt, _ = dp4
    planlang.load(dp4_pm, dp4_opt, os.path.join(ckpt, "f16"))
    f32 = dp4_pm.full_parameters()
    out["f32_rounds_to_f16_params"] = all(torch.equal(f32[n].to(torch.float16), params_before[n]) for n in f32)
    out["f32_not_f16_values"] = sum(int((f32[n].to(torch.float16).float() != f32[n]).any()) for n in f32)
    # scrambled, then its own checkpoint: masters, parameters and the loss scale back exactly
    scramble(pm, opt, None)
    opt.loss_scale.value = 1.0
    planlang.load(pm, opt, os.path.join(ckpt, "f16"))
    after = masters_by_name(pm, opt)
    out["own_masters_equal"] = all(torch.equal(after[n], before[n]) for n in before)
    out["own_params_equal"] = all(torch.equal(t, params_before[n]) for n, t in pm.full_parameters().items())
    out["scale_restored"] = opt.loss_scale.value
    # an f32 checkpoint (no loss scale in it): the masters are its values, the parameters them in f16
    planlang.load(pm, opt, os.path.join(ckpt, "dp4"))
    whole = load_full_state(os.path.join(ckpt, "dp4"))["model"]
    after = masters_by_name(pm, opt)
    out["dp4_masters_equal"] = all(torch.equal(
        m, whole[n][local_slices(pm.layouts[n].shape, pm.layouts[n].spec, pm.mesh, pm.groups.coords)])
        for n, m in after.items())
    out["dp4_params_are_f16_masters"] = all(torch.equal(t, whole[n].to(torch.float16))
                                            for n, t in pm.full_parameters().items())
    out["scale_kept"] = opt.loss_scale.value
    return out


def worker(rank: int, port: int, outdir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
    ckpt = os.path.join(outdir, "ckpt")
    write_rank(outdir, rank, lambda: run(outdir, ckpt))


if __name__ == "__main__":  # a manual run: python -m tests.runtime.clip_save_worker
    manual_run(worker, WORLD)
