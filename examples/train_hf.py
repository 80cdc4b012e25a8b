"""Train a Hugging Face causal LM under a plan: AdamW, warmup + cosine, clipping, gradient accumulation,
periodic evaluation, checkpoints and resume (docs/byom.md, "A complete training script").

    planlang run examples/train_hf/dp.plan -- examples/train_hf.py --steps 8 --checkpoint-dir ckpt
    planlang run examples/train_hf/zero3.plan -- examples/train_hf.py --steps 8 --resume ckpt/step-4
    python examples/train_hf.py --reference --steps 8      # one process, no plan: the losses to expect

This file is also the plans' factory (`model gpt2 = "train_hf:build"()`): `build` and `loss` below.
Rank 0 prints one line per event, `key=value` words after the event's name:

    train step=2 loss=5.56155562 lr=0.005 grad_norm=1.80789387
    saved step=2 path=ckpt/step-2
    eval step=2 loss=5.5490005
"""
from __future__ import annotations

import argparse
import contextlib
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel, get_cosine_schedule_with_warmup

import planlang

VOCAB = 256


def build(layers: int = 2, hidden: int = 64, heads: int = 4, seq: int = 16) -> torch.nn.Module:
    """The factory the plans name: a small GPT-2 from a config (no download), a fresh one on every call.
    Dropout is off so that a run under a plan can be compared with one process (dropout draws other
    random numbers on every rank); `lm_head` shares `wte`'s weight, as in GPT-2."""
    config = GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, vocab_size=VOCAB, n_positions=seq,
                        use_cache=False, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def loss(output, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy: position t predicts token t + 1 (planlang splits it under the plan)."""
    logits = output.logits[:, :-1, :]
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1))


# ---------------------------------------------------------------------------------------------- data
def sequence(index: int, seq: int, split: int) -> torch.Tensor:
    """Sample `index` of a split (0: train, 1: held out): tokens that count up from a random start by a
    random stride, mod VOCAB, so there is something to learn. The same on every rank and every run."""
    g = torch.Generator().manual_seed(1_000_003 * split + index)
    start, stride = torch.randint(0, VOCAB, (1,), generator=g), torch.randint(1, 8, (1,), generator=g)
    return (start + stride * torch.arange(seq)) % VOCAB


def batch(step: int, size: int, seq: int, split: int = 0) -> dict[str, torch.Tensor]:
    """The global batch of optimizer step `step` (0-based): every rank builds it whole and planlang takes
    this rank's piece. A resumed run reads the same batches from where it stopped."""
    ids = torch.stack([sequence(step * size + i, seq, split) for i in range(size)])
    return {"input_ids": ids, "labels": ids}


def microbatches(b: dict[str, torch.Tensor], n: int) -> list[dict[str, torch.Tensor]]:
    """`b` cut into `n` microbatches along the batch dim."""
    return [{k: v.chunk(n)[i] for k, v in b.items()} for i in range(n)]


# ---------------------------------------------------------------------------------------------- training
def train_step(pm, micro: list[dict[str, torch.Tensor]]) -> float:
    """Forward and backward of one optimizer step given as microbatches (gradient accumulation): each
    loss divided by their number, the gradients adding up in `.grad`, the data-parallel sums started by
    the last backward only (`pm.no_sync()`; a pipeline sums each call's own gradients and has none).
    Returns the step's mean loss."""
    total = 0.0
    for i, b in enumerate(micro):
        last = i == len(micro) - 1
        with contextlib.nullcontext() if last or not hasattr(pm, "no_sync") else pm.no_sync():
            out = pm(**b)  # GPT-2's CausalLMOutput: `loss` global, with autograd; `logits` this rank's piece
            (out.loss / len(micro)).backward()
        total += out.loss.item() / len(micro)
    return total


def evaluate(pm, held_out: list[dict[str, torch.Tensor]]) -> float:
    """The mean loss over held-out batches: eval mode, no gradients, back to training after."""
    pm.eval()
    with torch.no_grad():  # a pipeline runs its forward-only schedule
        value = sum(pm(**b).loss.item() for b in held_out) / len(held_out)
    pm.train()
    return value


def say(line: str) -> None:
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(line, flush=True)


def train(args: argparse.Namespace) -> None:
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    torch.manual_seed(args.seed)  # the same initial weights on every rank: `apply` keeps this rank's piece
    pm = planlang.apply(build(), args.plan)
    # the plan's AdamW and its ZeRO wrapping, at the command line's learning rate and weight decay
    opt = pm.optimizer(lr=args.lr, weight_decay=args.weight_decay)
    sched = get_cosine_schedule_with_warmup(opt, args.warmup, args.steps)
    done = 0
    if args.resume:
        planlang.load(pm, opt, args.resume, scheduler=sched)  # under this plan, whichever plan saved it
        done = sched.last_epoch  # the scheduler counts the optimizer steps taken
        say(f"resumed step={done} path={args.resume}")
    held_out = microbatches(batch(0, args.batch, args.seq, split=1), args.accumulate)
    for step in range(done, args.steps):
        opt.zero_grad()
        value = train_step(pm, microbatches(batch(step, args.batch, args.seq), args.accumulate))
        norm = pm.clip_grad_norm_(args.max_grad_norm)  # finishes the gradient sums; the whole model's norm
        lr = sched.get_last_lr()[0]
        opt.step()
        sched.step()
        say(f"train step={step + 1} loss={value:.9g} lr={lr:.9g} grad_norm={float(norm):.9g}")
        if args.checkpoint_dir and ((step + 1) % args.save_every == 0 or step + 1 == args.steps):
            path = os.path.join(args.checkpoint_dir, f"step-{step + 1}")
            planlang.save(pm, opt, path, scheduler=sched)  # every rank writes its pieces
            say(f"saved step={step + 1} path={path}")
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            say(f"eval step={step + 1} loss={evaluate(pm, held_out):.9g}")
    dist.barrier()  # every rank done with its collectives before any tears down (gloo aborts otherwise)
    dist.destroy_process_group()


def reference(args: argparse.Namespace, dtype: torch.dtype = torch.float32) -> list[str]:
    """The same loop in one process on the plain model, torch's own AdamW and clipping: the lines a plan's
    run prints, up to rounding (no checkpoints: one uninterrupted run)."""
    torch.manual_seed(args.seed)
    model = build().to(dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    sched = get_cosine_schedule_with_warmup(opt, args.warmup, args.steps)
    held_out = microbatches(batch(0, args.batch, args.seq, split=1), args.accumulate)
    lines = []
    for step in range(args.steps):
        opt.zero_grad()
        value = 0.0
        for b in microbatches(batch(step, args.batch, args.seq), args.accumulate):
            micro = loss(model(b["input_ids"]), b["labels"])
            (micro / args.accumulate).backward()
            value += micro.item() / args.accumulate
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        lr = sched.get_last_lr()[0]
        opt.step()
        sched.step()
        lines.append(f"train step={step + 1} loss={value:.9g} lr={lr:.9g} grad_norm={float(norm):.9g}")
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            model.eval()
            with torch.no_grad():
                value = sum(loss(model(b["input_ids"]), b["labels"]).item() for b in held_out) / len(held_out)
            model.train()
            lines.append(f"eval step={step + 1} loss={value:.9g}")
    return lines


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--plan", default=os.environ.get("PLANLANG_PLAN"),
                   help="the plan (default: $PLANLANG_PLAN, which `planlang run` sets)")
    p.add_argument("--steps", type=int, default=8, help="optimizer steps in all (the schedule's length)")
    p.add_argument("--batch", type=int, default=8, help="sequences per optimizer step: the plan's batch")
    p.add_argument("--accumulate", type=int, default=2,
                   help="microbatches per optimizer step (gradient accumulation): the plan's `microbatches`")
    p.add_argument("--seq", type=int, default=16, help="tokens per sequence: the plan's seq")
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--warmup", type=int, default=2, help="warmup steps, then a cosine decay to 0")
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--eval-every", type=int, default=2)
    p.add_argument("--save-every", type=int, default=2)
    p.add_argument("--checkpoint-dir", default=None, help="save DIR/step-N every --save-every steps")
    p.add_argument("--resume", default=None, help="a checkpoint directory to continue from")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reference", action="store_true", help="one process, no plan: the losses to compare")
    return p.parse_args(argv)


if __name__ == "__main__":
    arguments_ = arguments()
    if arguments_.reference:
        print("\n".join(reference(arguments_)), flush=True)
    elif not arguments_.plan:
        raise SystemExit("give --plan PLAN, or launch with `planlang run PLAN -- train_hf.py`")
    else:
        train(arguments_)
