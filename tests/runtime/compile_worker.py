"""Gloo worker for tests/runtime/test_compile_gloo.py: every rank runs every config twice from the same seed,

    pm = planlang.apply(build(), plan, compile=BACKEND)   # compiled: the second run only
    opt = pm.optimizer()
    3 x (pm.step(x, x); opt.step())           # the training losses
    pm.eval(); with torch.no_grad(): pm(x, x)  # a program lowered (and compiled) after apply: Programs.install

and writes both runs' losses, whether the training and the evaluation steps were compiled, the first
compiled call's seconds and what the compiled run wrote on stderr (rank 0's notes).
"""
from __future__ import annotations

import contextlib
import io
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from tests.runtime.spawned import manual_run, write_rank

WORLD = 4
BACKEND = "aot_eager"  # inductor's C++ compile takes minutes per program here (bench/runtime_overhead.py has it)
PLANS = "tests/runtime/plans"
GPT2 = dict(layers=2, hidden=64, heads=4, vocab=128, seq=16)
CONFIGS: dict[str, tuple[str, dict]] = {  # name -> (plan, the model's build arguments)
    "dp4_tied": ("gpt2_dp4_tied.plan", dict(GPT2, tie_embeddings=True)),
    "dp2_tp2_ckpt": ("gpt2_dp2_tp2_ckpt.plan", GPT2),  # Megatron blocks, each block one checkpoint group
    "dp4_dropout": ("eval_gpt2_dp4.plan", dict(GPT2, layers=4, dropout=0.1)),  # refused: dropout's seed
    "pp2_dp2": ("compile_gpt2_pp2_dp2.plan", dict(GPT2, layers=4)),  # the stage modules compiled
    "pp2_dp2_dropout": ("eval_gpt2_pp2_dp2.plan", dict(GPT2, layers=4, dropout=0.1)),  # refused: dropout
}


def batches() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 128, (8, 16), generator=g) for _ in range(4)]


def _loss(out) -> float:
    return float(getattr(out, "loss", out))


def run(plan: str, kwargs: dict, compiled: bool) -> dict:
    import planlang.runtime.apply as planlang
    from examples.gpt2.model import build
    from planlang.runtime.compiled import CompiledStep

    torch.manual_seed(0)
    model = build(**kwargs)
    err = io.StringIO()
    with contextlib.redirect_stderr(err) if compiled else contextlib.nullcontext():
        if compiled:
            torch._dynamo.reset()
        # compile: planlang.runtime.compiled.compile_model of the model apply made
        pm = planlang.apply(model, os.path.join(PLANS, plan), compile=BACKEND if compiled else False)
        opt = pm.optimizer()
        xs = batches()
        losses = []
        for x in xs[:3]:
            losses.append(float(pm.step(x, x)))
            opt.step()
            opt.zero_grad()
        train_step = getattr(pm, "_step", None)  # a pipeline has none: its stage modules are compiled
        stages = pm.runner.stage_modules.values() if hasattr(pm, "runner") else ()
        staged = [getattr(m, "_compiled_call_impl", None) is not None for m in stages]
        pm.eval()
        with torch.no_grad():
            evaluation = _loss(pm(xs[3], xs[3]))
    return {"losses": losses, "eval": evaluation, "compiled": isinstance(train_step, CompiledStep) or any(staged),
            "eval_compiled": isinstance(getattr(pm, "_step", None), CompiledStep) or any(staged),
            "seconds": getattr(train_step, "seconds", None), "note": err.getvalue()}


def worker(rank: int, port: int, outdir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=300))
    write_rank(outdir, rank, lambda: {name: {"eager": run(plan, kw, False), "compiled": run(plan, kw, True)}
                                      for name, (plan, kw) in CONFIGS.items()})


if __name__ == "__main__":
    manual_run(worker, WORLD)
