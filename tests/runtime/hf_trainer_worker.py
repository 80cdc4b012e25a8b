"""Gloo worker for tests/runtime/test_hf_trainer_gloo.py: every rank trains HF GPT-2 (examples/zoo/causal_lm.py,
2 layers, hidden 64) with planlang.runtime.hf_trainer.PlanTrainer under each plan of PLANS —

    TrainingArguments(max_steps=3, cosine schedule with 1 warmup step, max_grad_norm=MAX_NORM, logging_steps=1)

then evaluate() and save_model() — and, on every rank, one process runs the same steps as Trainer
defines them (the same sampler order, AdamW + get_scheduler, loss, backward, clip_grad_norm_, step) in
float32 and float64. Every rank reports Trainer's log history (loss, grad_norm, learning_rate per step),
the eval loss, the one-process runs' and rank 0 what save_pretrained wrote, loaded back with
from_pretrained, against the one-process parameters after the 3 steps.
"""
from __future__ import annotations

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from tests.runtime.spawned import manual_run, write_rank

WORLD = 4
STEPS = 3
MAX_NORM = 0.2  # below every step's gradient norm: every step clips
BATCH, SEQ, VOCAB = 8, 16, 256
SEED = 42
TOL = 1e-5  # verify's floor; each bound is max(TOL, 10 x one process's own error against float64)
PLANS = {"dp4_acc2": "tests/runtime/plans/hf_trainer_gpt2_dp4_acc2.plan",
         "dp2_tp2": "tests/runtime/plans/hf_trainer_gpt2_dp2_tp2.plan",
         "pp2_dp2": "tests/runtime/plans/hf_trainer_gpt2_pp2_dp2.plan",
         "dp4_zero3": "tests/runtime/plans/hf_trainer_gpt2_dp4_zero3.plan"}
SAVE_STEPS = 2  # dp4_acc2 writes checkpoint-2; RESUME resumes it under another plan and runs step 3
RESUME = "dp2_tp2"


def build():
    from examples.zoo.causal_lm import gpt2
    torch.manual_seed(0)
    return gpt2()


def dataset(n: int, seed: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)
    return [{"input_ids": ids[i], "labels": ids[i], "attention_mask": torch.ones(SEQ, dtype=torch.int64)}
            for i in range(n)]


TRAIN, EVAL = dataset(BATCH * STEPS, 1), dataset(2 * BATCH, 2)
# an evaluation batch whose labels ignore tokens (-100: padding, masked prompts), unevenly over the rows
MASKED = {k: torch.stack([e[k] for e in EVAL[:BATCH]]) for k in EVAL[0]}
MASKED["labels"] = MASKED["labels"].clone()
MASKED["labels"][1::2, -5:] = -100
MASKED["labels"][0, 3:9] = -100


def arguments(out: str, save: bool = False):
    import transformers
    return transformers.TrainingArguments(
        output_dir=out, max_steps=STEPS, per_device_train_batch_size=BATCH, per_device_eval_batch_size=BATCH,
        lr_scheduler_type="cosine", max_grad_norm=MAX_NORM, logging_steps=1,
        save_strategy="steps" if save else "no", save_steps=SAVE_STEPS,
        report_to="none", disable_tqdm=True, use_cpu=True, seed=SEED)


def reference(dtype: torch.dtype) -> dict:
    """One process, Trainer's step as Trainer writes it: the plan's AdamW(lr=0.001), Trainer's scheduler."""
    import transformers
    from examples.zoo.causal_lm import loss as loss_fn
    model = build().to(dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=0.001)
    sched = transformers.get_scheduler("cosine", opt, num_warmup_steps=0, num_training_steps=STEPS)
    order = list(torch.utils.data.RandomSampler(TRAIN, generator=torch.Generator().manual_seed(SEED)))
    rows = []
    for s in range(STEPS):
        idx = torch.stack([TRAIN[i]["input_ids"] for i in order[s * BATCH:(s + 1) * BATCH]])
        loss = loss_fn(model(idx), idx)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        lr = sched.get_last_lr()[0]
        opt.step()
        sched.step()
        opt.zero_grad()
        rows.append({"loss": loss.item(), "grad_norm": float(norm), "learning_rate": lr})
    model.eval()
    with torch.no_grad():
        losses = [float(loss_fn(model(torch.stack([e["input_ids"] for e in EVAL[i:i + BATCH]])),
                                torch.stack([e["labels"] for e in EVAL[i:i + BATCH]])))
                  for i in range(0, len(EVAL), BATCH)]
        masked = float(loss_fn(model(MASKED["input_ids"]), MASKED["labels"]))
    return {"steps": rows, "eval_loss": sum(losses) / len(losses), "masked_loss": masked,
            "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


def judge(got: dict, ref32: dict, ref64: dict) -> dict:
    """Per quantity, [error, bound] (verify's rule: max(TOL, 10 x one process's own error vs float64))."""
    from planlang.runtime.verify import bound
    out = {"steps": [judge_step(g, a, b) for g, a, b in zip(got["history"], ref32["steps"], ref64["steps"])]}
    e, a, b = got["eval_loss"], ref32["eval_loss"], ref64["eval_loss"]
    out["eval_loss"] = [abs(e - a) / abs(a), bound(abs(a - b) / abs(b), TOL)]
    return out


def judge_step(got: dict, a: dict, b: dict) -> dict:
    """One logged step against one process's (a: float32, b: float64): [error, bound] per quantity."""
    from planlang.runtime.verify import bound
    row: dict = {k: [abs(got[k] - a[k]) / abs(a[k]), bound(abs(a[k] - b[k]) / abs(b[k]), TOL)]
                 for k in ("loss", "grad_norm")}
    row["lr"] = [got["learning_rate"], a["learning_rate"]]
    return row


def saved_vs(path: str, ref32: dict, ref64: dict) -> dict:
    """save_pretrained's folder loaded back with from_pretrained: the parameter whose error against one
    process's is largest against its bound, [error, bound, name], and the names missing."""
    import transformers
    from planlang.runtime.verify import judged, rel
    got = dict(transformers.GPT2LMHeadModel.from_pretrained(path).named_parameters())
    errs = {n: rel(got[n], p) for n, p in ref32["params"].items() if n in got}
    noise = {n: rel(p, ref64["params"][n]) for n, p in ref32["params"].items()}
    name, err, lim = judged(errs, noise, TOL)
    return {"params": [err, lim, name], "names": len(errs), "missing": sorted(set(ref32["params"]) - set(got))}


def train(plan: str, out: str, save: bool = False, resume: str | None = None):
    import planlang
    trainer = planlang.PlanTrainer(build(), plan, arguments(out, save), train_dataset=TRAIN, eval_dataset=EVAL)
    trainer.train(resume_from_checkpoint=resume)
    history = [{k: row[k] for k in ("loss", "grad_norm", "learning_rate")}
               for row in trainer.state.log_history if "loss" in row]
    return trainer, history


def refused(fn) -> str:
    """The PlanError `fn()` raises ('' when it raises none)."""
    from planlang.runtime.apply import PlanError
    try:
        fn()
    except PlanError as e:
        return str(e)
    return ""


def refusals(outdir: str, trainer) -> dict:
    """What PlanTrainer refuses, each with its message: Trainer settings the plan decides, a batch that is
    not the plan's, batches that differ between ranks, batch keys the plan has no input for, logits."""
    import dataclasses

    from planlang.runtime.hf_trainer import PlanTrainer, same_on_every_rank
    args = arguments(os.path.join(outdir, "refused"))
    make = lambda **kw: PlanTrainer(build(), PLANS["dp4_acc2"], dataclasses.replace(args, **kw),  # noqa: E731
                                    train_dataset=TRAIN)
    batch = {k: torch.stack([e[k] for e in TRAIN[:BATCH]]) for k in TRAIN[0]}
    padded = dict(batch, attention_mask=batch["attention_mask"].clone())
    padded["attention_mask"][0, -1] = 0
    return {
        "accumulation": refused(lambda: make(gradient_accumulation_steps=2)),
        "batch_size": refused(lambda: make(per_device_train_batch_size=4)),
        "checkpointing": refused(lambda: make(activation_checkpointing=True)),
        "best_model": refused(lambda: make(load_best_model_at_end=True, eval_strategy="steps", save_strategy="steps")),
        "ranks_differ": refused(lambda: same_on_every_rank([torch.full((2,), dist.get_rank())])),
        "padding_mask": refused(lambda: trainer.plan_args(padded)),
        "unknown_key": refused(lambda: trainer.plan_args(dict(batch, token_type_ids=batch["input_ids"]))),
        "ignored_labels": refused(lambda: trainer.plan_args(MASKED)),  # (its plan accumulates 2 microbatches)
        "logits": refused(lambda: trainer.prediction_step(trainer.model, batch, prediction_loss_only=False)),
        "same_batch_passes": refused(lambda: same_on_every_rank([batch["input_ids"]])) == "",
    }


def run(outdir: str) -> dict:
    import glob
    ref32, ref64 = reference(torch.float32), reference(torch.float64)
    results: dict = {"reference": {k: v for k, v in ref32.items() if k != "params"}}
    for name, plan in PLANS.items():
        out = os.path.join(outdir, name)
        t0 = time.time()
        trainer, history = train(plan, out, save=name == "dp4_acc2")
        t1 = time.time()
        metrics = trainer.evaluate()
        t2 = time.time()
        trainer.save_model(os.path.join(out, "final"))
        dist.barrier()
        seconds = [round(t1 - t0, 1), round(t2 - t1, 1), round(time.time() - t2, 1)]  # train, evaluate, save
        res = {"history": history, "eval_loss": metrics["eval_loss"], "model": type(trainer.pm).__name__,
               "optimizer": type(trainer.optimizer).__name__, "world_size": trainer.args.world_size,
               "local_numel": sum(p.numel() for p in trainer.pm.parameters()), "seconds": seconds,
               "microbatches": getattr(trainer.pm, "microbatches", None),
               "checkpoints": sorted(os.path.basename(p) for p in glob.glob(os.path.join(out, "checkpoint-*")))}
        res["judged"] = judge(res, ref32, ref64)
        if name == "dp2_tp2":  # ignored labels, uneven over the dp shards: the batch's mean over its tokens
            got = float(trainer.prediction_step(trainer.model, MASKED, True)[0])
            a, b = ref32["masked_loss"], ref64["masked_loss"]
            from planlang.runtime.verify import bound
            res["judged"]["masked_loss"] = [abs(got - a) / abs(a), bound(abs(a - b) / abs(b), TOL), got, a]
        if dist.get_rank() == 0:
            res["saved"] = saved_vs(os.path.join(out, "final"), ref32, ref64)
        results[name] = res
        if name == "dp4_acc2":
            results["refused"] = refusals(outdir, trainer)
    # dp4_acc2's checkpoint-2 (planlang.save of model, optimizer, scheduler) resumed under another plan: step 3
    ckpt = os.path.join(outdir, "dp4_acc2", f"checkpoint-{SAVE_STEPS}")
    trainer, history = train(PLANS[RESUME], os.path.join(outdir, "resumed"), resume=ckpt)
    results["resumed"] = {"history": history, "global_step": trainer.state.global_step, "from": os.listdir(ckpt),
                          "judged": judge_step(history[-1], ref32["steps"][-1], ref64["steps"][-1])}
    return results


def worker(rank: int, port: int, outdir: str) -> None:
    # what torchrun sets: Accelerate reads the rank and world from them (TrainingArguments.world_size)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(WORLD))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
    write_rank(outdir, rank, lambda: run(outdir))


if __name__ == "__main__":  # a manual run: python -m tests.runtime.hf_trainer_worker
    manual_run(worker, WORLD)
