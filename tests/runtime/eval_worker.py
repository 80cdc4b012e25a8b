"""Gloo worker for tests/runtime/test_eval_gloo.py: every rank runs every config (GPT-2 with dropout 0.1)

    pm = planlang.apply(build(), plan); opt = pm.optimizer()
    with torch.no_grad(): pm(x, x).loss   # training mode: dropout on (the pipeline: pm.evaluate)
    pm.eval(); with torch.no_grad(): pm(x, x).loss   # == one process's model.eval() loss
    2 x (pm.step(x, x); opt.step())       # in eval mode: no dropout, so one process can match it
    evaluation loss                       # == one process's; no gradient made
    pm.step(half, half); opt.step()       # a batch of 4 (the plan's is 8): == one process on it
    evaluation loss on the plan's batch   # back to the plan's program

against one process running torch's own loop (AdamW), each error judged against verify's bound:
max(TOL, 10 x one process's own error against float64).
"""
from __future__ import annotations

import os
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist

from tests.runtime.spawned import manual_run, write_rank

WORLD = 4
TOL = 1e-5
PLANS = "tests/runtime/plans"
CONFIGS = {
    "dp4": "eval_gpt2_dp4.plan",
    "dp2_tp2": "eval_gpt2_dp2_tp2.plan",
    "pp2_dp2": "eval_gpt2_pp2_dp2.plan",
    "dp4_zero3": "eval_gpt2_dp4_zero3.plan",
    "dp2_tp2_acc2": "eval_gpt2_dp2_tp2_acc2.plan",  # gradient accumulation: 2 microbatches a step
    "pp2_dp2_zero3": "eval_gpt2_pp2_dp2_zero3.plan",  # FSDP2 stages
    "pp2_dp2_interleaved": "eval_gpt2_pp2_dp2_interleaved.plan",  # 2 stages per rank (a multi-stage schedule)
}
# pipeline x tensor parallelism: the model applied in eval mode; pm.train() and a shorter batch refused
PP_TP = "eval_gpt2_pp2_tp2.plan"


def build():
    from examples.gpt2.model import build as gpt2
    torch.manual_seed(0)
    return gpt2(layers=4, hidden=64, heads=4, vocab=128, seq=16, dropout=0.1)


def batches() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {"s0": torch.randint(0, 128, (8, 16), generator=g), "s1": torch.randint(0, 128, (8, 16), generator=g),
            "eval": torch.randint(0, 128, (8, 16), generator=g), "half": torch.randint(0, 128, (4, 16), generator=g)}


def reference(dtype: torch.dtype) -> dict:
    """One process, model.eval() throughout (dropout off), torch's own loop."""
    from examples.gpt2.model import loss as loss_fn
    model = build().to(dtype)
    model.eval()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, eps=1e-4)
    data = batches()

    def evaluate():
        with torch.no_grad():
            return loss_fn(model(data["eval"]), data["eval"])

    def step(x):
        opt.zero_grad()
        loss = loss_fn(model(x), x)
        loss.backward()
        opt.step()
        return {"loss": loss.detach(), "params": {n: p.detach().clone() for n, p in model.named_parameters()}}

    out = {"eval0": evaluate(), "s0": step(data["s0"]), "s1": step(data["s1"])}
    out["eval"] = evaluate()
    out["half"] = step(data["half"])
    out["eval_after"] = evaluate()
    return out


def judge(got: dict, ref: dict, exact: dict) -> dict:
    from planlang.runtime.verify import bound, judged, rel
    out: dict[str, list] = {"loss": [rel(got["loss"], ref["loss"]), bound(rel(ref["loss"], exact["loss"]), TOL)]}
    if "params" in got:
        errs = {n: rel(got["params"][n], p) if n in got["params"] else 1.0 for n, p in ref["params"].items()}
        noise = {n: rel(p, exact["params"][n]) for n, p in ref["params"].items()}
        name, err, lim = judged(errs, noise, TOL)
        out["params"] = [err, lim, name]
    return out


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def loss_only(pm, x) -> torch.Tensor:
    with torch.no_grad():
        return loss_of(pm(x, x))


def loss_of(out) -> torch.Tensor:
    """`pm(...)`'s loss: its output's `loss` (a ParallelModel); a pipeline's call returns the loss itself."""
    return out.loss if hasattr(out, "loss") else out


def run_pp_tp(ref: dict, exact: dict) -> dict:
    """pp 2 x tp 2 (the lowered program cut into stages), the model applied in eval mode: evaluate and train
    in it; pm.train() (dropout on) and a shorter batch lower the program again, cut into the same stages."""
    import planlang
    from planlang.runtime.apply import PlanError
    data = batches()
    model = build()
    model.eval()
    pm = planlang.apply(model, os.path.join(PLANS, PP_TP))
    opt = pm.optimizer()
    res: dict = {"model": type(pm).__name__,
                 "eval0": judge({"loss": loss_only(pm, data["eval"])}, {"loss": ref["eval0"]}, {"loss": exact["eval0"]})}
    for s in ("s0", "s1"):
        opt.zero_grad()
        loss = pm.step(data[s], data[s])
        opt.step()
        res[s] = judge({"loss": loss, "params": pm.full_parameters()}, ref[s], exact[s])
    opt.zero_grad()
    eval_loss = loss_only(pm, data["eval"])
    res["eval"] = judge({"loss": eval_loss}, {"loss": ref["eval"]}, {"loss": exact["eval"]})
    res["grads_after_eval"] = len(pm.full_grads())
    pm.train()
    res["train_vs_eval"] = abs(float(loss_only(pm, data["eval"])) - float(eval_loss)) / float(eval_loss)
    pm.eval()
    _half_step_then_eval(pm, opt, data, ref, exact, res)
    res["errors"] = {}
    x = torch.randint(0, 128, (16, 16))
    try:
        pm.step(x, x)
        res["errors"]["larger"] = "ran"
    except PlanError as e:
        res["errors"]["larger"] = str(e)
    return res


CNN = {"resnet_dp4": "eval_resnet_dp4.plan", "resnet_pp2_dp2": "eval_resnet_pp2_dp2.plan"}  # BatchNorm


def cnn_data() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(2)
    return {k: (torch.randn(n, 3, 16, 16, generator=g), torch.randint(0, 10, (n,), generator=g))
            for k, n in (("s0", 8), ("s1", 8), ("eval", 8), ("half", 4))}


def cnn_build():
    from examples.zoo.cnn import resnet
    torch.manual_seed(0)
    return resnet()


def cnn_reference(dtype: torch.dtype) -> dict:
    """One process: 2 steps in training mode (BatchNorm's batch statistics, its running ones updated), the
    eval loss (running statistics), a step on half the batch, the eval loss again."""
    from examples.zoo.cnn import loss as loss_fn
    model = cnn_build().to(dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = {k: (x.to(dtype), y) for k, (x, y) in cnn_data().items()}

    def evaluate():
        model.eval()
        with torch.no_grad():
            out = loss_fn(model(data["eval"][0]), data["eval"][1])
        model.train()
        return out

    def step(k):
        opt.zero_grad()
        loss = loss_fn(model(data[k][0]), data[k][1])
        loss.backward()
        opt.step()
        return {"loss": loss.detach(), "params": {n: p.detach().clone() for n, p in model.named_parameters()}}

    out = {"s0": step("s0"), "s1": step("s1")}
    out["eval"] = evaluate()
    out["half"] = step("half")
    out["eval_after"] = evaluate()
    return out


def run_cnn(plan: str, ref: dict, exact: dict) -> dict:
    import planlang
    data = cnn_data()
    pm = planlang.apply(cnn_build(), os.path.join(PLANS, plan))
    opt = pm.optimizer()
    res: dict = {"model": type(pm).__name__}

    def evaluate(key):
        pm.eval()
        with torch.no_grad():
            res[key] = judge({"loss": loss_of(pm(*data["eval"]))}, {"loss": ref[key]}, {"loss": exact[key]})
        pm.train()

    for k in ("s0", "s1"):
        opt.zero_grad()
        loss = pm.step(*data[k])
        opt.step()
        res[k] = judge({"loss": loss, "params": pm.full_parameters()}, ref[k], exact[k])
    evaluate("eval")
    opt.zero_grad()
    loss = pm.step(*data["half"])
    opt.step()
    res["half"] = judge({"loss": loss, "params": pm.full_parameters()}, ref["half"], exact["half"])
    evaluate("eval_after")
    return res


def _half_step_then_eval(pm, opt, data, ref, exact, res: dict) -> None:
    """A step on half the plan's batch (judged: loss and parameters), then the evaluation loss after it,
    then the whole state and a save right after that evaluation."""
    import planlang
    loss = pm.step(data["half"], data["half"])
    opt.step()
    opt.zero_grad()
    res["half"] = judge({"loss": loss, "params": pm.full_parameters()}, ref["half"], exact["half"])
    before = {n: t.clone() for n, t in pm.full_parameters().items()}
    res["eval_after"] = judge({"loss": loss_only(pm, data["eval"])}, {"loss": ref["eval_after"]},
                              {"loss": exact["eval_after"]})
    # right after an evaluation (FSDP2 units left gathered by a forward without backward): the whole
    # state is the parameters as they were, and planlang.save writes them
    whole = pm.full_state_dict(all_ranks=True)
    res["state_after_eval"] = max(float((whole[n] - t.cpu()).abs().max()) for n, t in before.items() if n in whole)
    where = [tempfile.mkdtemp(prefix="planlang-eval-save-") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(where, src=0)
    try:
        planlang.save(pm, opt, where[0])
        res["saved_after_eval"] = "ok"
    except Exception as e:  # noqa: BLE001 - reported to the test, which names it
        res["saved_after_eval"] = f"{type(e).__name__}: {e}"


def run_config(plan: str, ref: dict, exact: dict) -> dict:
    import planlang
    from planlang.runtime.apply import PlanError
    data = batches()
    pm = planlang.apply(build(), os.path.join(PLANS, plan))
    opt = pm.optimizer()
    res: dict = {"model": type(pm).__name__, "fsdp": list(getattr(pm, "fsdp_axes", ()))}
    train_loss = loss_only(pm, data["eval"])  # dropout on
    pm.eval()
    eval0 = loss_only(pm, data["eval"])
    res["eval0"] = judge({"loss": eval0}, {"loss": ref["eval0"]}, {"loss": exact["eval0"]})
    res["train_vs_eval"] = abs(float(train_loss) - float(eval0)) / float(eval0)
    res["grads_after_eval"] = len(pm.full_grads())
    for s in ("s0", "s1"):
        opt.zero_grad()
        loss = pm.step(data[s], data[s])
        opt.step()
        res[s] = judge({"loss": loss, "params": pm.full_parameters()}, ref[s], exact[s])
    opt.zero_grad()
    # (DTensor states compared by their local shards: torch.equal on DTensors is a collective)
    state = {k: [_local(v).clone() if isinstance(v, torch.Tensor) else v for v in st.values()]
             for k, st in enumerate(getattr(opt, "optim", opt).state.values())}
    res["eval"] = judge({"loss": loss_only(pm, data["eval"])}, {"loss": ref["eval"]}, {"loss": exact["eval"]})
    res["grads_after_eval2"] = len(pm.full_grads())
    after = {k: [_local(v) for v in st.values()] for k, st in enumerate(getattr(opt, "optim", opt).state.values())}
    res["state_untouched"] = all(all(not isinstance(a, torch.Tensor) or torch.equal(a, b) for a, b in zip(after[k], v))
                                 for k, v in state.items())
    _half_step_then_eval(pm, opt, data, ref, exact, res)
    res["errors"] = {}
    for name, n in (("odd", 6), ("larger", 16)):
        x = torch.randint(0, 128, (n, 16))
        try:
            pm.step(x, x)
            res["errors"][name] = "ran"
        except PlanError as e:
            res["errors"][name] = str(e)
    return res


def worker(rank: int, port: int, outdir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
    def run_all() -> dict:
        ref, exact = reference(torch.float32), reference(torch.float64)
        out = {name: run_config(plan, ref, exact) for name, plan in CONFIGS.items()}
        out["pp2_tp2"] = run_pp_tp(ref, exact)
        ref, exact = cnn_reference(torch.float32), cnn_reference(torch.float64)
        out.update({name: run_cnn(plan, ref, exact) for name, plan in CNN.items()})
        return out

    write_rank(outdir, rank, run_all)


if __name__ == "__main__":  # a manual run: python -m tests.runtime.eval_worker
    manual_run(worker, WORLD)
