"""Gloo worker for tests/runtime/test_pipeline_gloo.py: every rank runs every pipeline config and writes,
per config, the loss and gradient relative errors against a single-process reference it computes itself.

Each config is a plan text (resolved with planlang's resolver) over a 4-rank mesh. Pure pipeline configs
use a mesh `rep x pp` where `rep` is not a data axis: two independent pipelines, each training on the
whole batch. The pp x dp configs split the batch over `dp` (`data idx : [dp, _]`); every rank's
reference trains on the whole batch, and its pipeline replica on its shard.
"""
from __future__ import annotations

import json
import os
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class SkipNet(nn.Module):
    """a -> b -> c -> d, with a's output skipping to d's stage, the float input `x` read again by `e`
    (next to c) and the integer input `idx` read only by `emb` in the last stage: values that cross
    several stage boundaries, and inputs without gradients passed through stages."""

    def __init__(self, width: int = 16, vocab: int = 10) -> None:
        super().__init__()
        self.a, self.b, self.c, self.d, self.e = (nn.Linear(width, width) for _ in range(5))
        self.emb = nn.Embedding(vocab, width)

    def forward(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.a(x))
        k = self.b(h)
        j = self.c(k) + self.e(x)
        return self.d(j) + h + self.emb(idx)


def build_skip() -> SkipNet:
    return SkipNet()


class RootNet(nn.Module):
    """Parameters the root module holds itself, read by its own forward in different stages: `pos` after
    `a` (stage 0), `scale` after `c` (stage 1). The plan names each in its stage."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.a, self.b, self.c = (nn.Linear(width, width) for _ in range(3))
        self.pos = nn.Parameter(torch.linspace(-0.5, 0.5, width))
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.a(x)) + self.pos
        return self.c(torch.tanh(self.b(h))) * self.scale


def build_root() -> RootNet:
    return RootNet()


def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(output, target)


WORLD = 4
STEPS = 3
GPT2 = '"examples.gpt2.model:build"(layers = 4, hidden = 64, heads = 4, vocab = 128, seq = 16)'
MLP = '"examples.mlp.model:build"(in_features = 16, hidden = 32, out_features = 8)'


def _plan(model: str, inp: str, mesh: str, pipeline: str, data: str = "", opt: str = "sgd(lr = 0.1)") -> str:
    return (f"use hardware\nmodel net = {model}\ninput {inp}\nmesh ranks of 4 x hardware.cpu {{\n{mesh}\n}}\n"
            f"optimizer {opt}\n{data}\n{pipeline}\n")


def _lb(axis: str) -> str:
    return f"    {axis} = 2 over hardware.loopback"


GPT2_2 = "{\n    stage wte, wpe, drop, h[0:2]\n    stage h[2:4], ln_f, lm_head\n}"
GPT2_4 = "{\n    stage wte, wpe, drop, h[0]\n    stage h[1]\n    stage h[2]\n    stage h[3], ln_f, lm_head\n}"
MLP_2 = "{\n    stage fc1, act\n    stage fc2\n}"
SKIP = '"tests.runtime.pipeline_worker:build_skip"()'
SKIP_IN = "x : f32[batch = 8, features = 16]\ninput idx : i64[batch = 8]"
SKIP_2 = "{\n    stage a, b\n    stage c, e, d, emb\n}"
SKIP_4 = "{\n    stage a\n    stage b\n    stage c, e\n    stage d, emb\n}"
ROOT = '"tests.runtime.pipeline_worker:build_root"()'
ROOT_2 = "{\n    stage a, pos, b\n    stage c, scale\n}"

# name -> (plan text, model kind)
CONFIGS = {
    "gpt2-1f1b": (_plan(GPT2, "idx : i64[batch = 8, seq = 16]", _lb("rep") + "\n" + _lb("pp"),
                        "pipeline over pp schedule 1f1b microbatches 4 " + GPT2_2, opt="adamw(lr = 0.001)"), "gpt2"),
    "gpt2-gpipe": (_plan(GPT2, "idx : i64[batch = 8, seq = 16]", _lb("pp") + "\n" + _lb("rep"),
                         "pipeline over pp schedule gpipe microbatches 4 " + GPT2_2), "gpt2"),
    "gpt2-interleaved": (_plan(GPT2, "idx : i64[batch = 8, seq = 16]", _lb("rep") + "\n" + _lb("pp"),
                               "pipeline over pp schedule interleaved chunks 2 microbatches 4 " + GPT2_4), "gpt2"),
    "gpt2-looped-bfs": (_plan(GPT2, "idx : i64[batch = 8, seq = 16]", _lb("rep") + "\n" + _lb("pp"),
                              "pipeline over pp schedule looped_bfs chunks 2 microbatches 4 " + GPT2_4), "gpt2"),
    "gpt2-zero-bubble": (_plan(GPT2, "idx : i64[batch = 8, seq = 16]", _lb("rep") + "\n" + _lb("pp"),
                               "pipeline over pp schedule zero_bubble chunks 2 microbatches 4 " + GPT2_4), "gpt2"),
    # a split backward: torch assigns the weight gradients of stages 1-3 itself (GradSync.adopt)
    "gpt2-zero-bubble-dp": (_plan(GPT2, "idx : i64[batch = 8, seq = 16]", _lb("pp") + "\n" + _lb("dp"),
                                  "pipeline over pp schedule zero_bubble chunks 2 microbatches 2 " + GPT2_4,
                                  data="data idx : [dp, _]", opt="adamw(lr = 0.001)"), "gpt2"),
    # V placement: rank 0 holds stages 0 and 3, rank 1 the adjacent 1 and 2 (handed over in place)
    "gpt2-zbv-dp": (_plan(GPT2, "idx : i64[batch = 8, seq = 16]", _lb("pp") + "\n" + _lb("dp"),
                          "pipeline over pp schedule zbv chunks 2 microbatches 2 " + GPT2_4,
                          data="data idx : [dp, _]", opt="adamw(lr = 0.001)"), "gpt2"),
    "gpt2-dualpipev": (_plan(GPT2, "idx : i64[batch = 8, seq = 16]", _lb("rep") + "\n" + _lb("pp"),
                             "pipeline over pp schedule dualpipev chunks 2 microbatches 4 " + GPT2_4), "gpt2"),
    "gpt2-pp-dp": (_plan(GPT2, "idx : i64[batch = 8, seq = 16]", _lb("pp") + "\n" + _lb("dp"),
                         "pipeline over pp schedule 1f1b microbatches 2 " + GPT2_2, data="data idx : [dp, _]",
                         opt="adamw(lr = 0.001)"), "gpt2"),
    "mlp-1f1b": (_plan(MLP, "x : f32[batch = 8, features = 16]", _lb("rep") + "\n" + _lb("pp"),
                       "pipeline over pp schedule 1f1b microbatches 4 " + MLP_2), "mlp"),
    "mlp-gpipe-dp": (_plan(MLP, "x : f32[batch = 8, features = 16]", _lb("dp") + "\n" + _lb("pp"),
                           "pipeline over pp schedule gpipe microbatches 2 " + MLP_2, data="data x : [dp, _]"), "mlp"),
    "skip-1f1b": (_plan(SKIP, SKIP_IN, _lb("rep") + "\n" + _lb("pp"),
                        "pipeline over pp schedule 1f1b microbatches 2 " + SKIP_2), "skip"),
    "skip-interleaved-dp": (_plan(SKIP, SKIP_IN, _lb("pp") + "\n" + _lb("dp"),
                                  "pipeline over pp schedule interleaved chunks 2 microbatches 2 " + SKIP_4,
                                  data="data x : [dp, _]\ndata idx : [dp]"), "skip"),
    # a parameter that gets no gradient in the last stage's bucket: the sum starts after the schedule
    "unused-1f1b-dp": (_plan('"tests.runtime.unused_net:build"()', "x : f32[batch = 8, features = 16]",
                             _lb("pp") + "\n" + _lb("dp"), "pipeline over pp schedule 1f1b microbatches 2 "
                             "{\n    stage a, b, f\n    stage c, s\n}", data="data x : [dp, _]"), "root"),
    # the same under zero bubble: torch's W assigns the gradients of stage 1 itself, and `s` must keep none
    # (an AdamW step would decay it)
    "unused-zb-dp": (_plan('"tests.runtime.unused_net:build"()', "x : f32[batch = 8, features = 16]",
                           _lb("pp") + "\n" + _lb("dp"), "pipeline over pp schedule zero_bubble microbatches 2 "
                           "{\n    stage a, b, f\n    stage c, s\n}", data="data x : [dp, _]",
                           opt="adamw(lr = 0.001)"), "root"),
    "root-params-1f1b-dp": (_plan(ROOT, "x : f32[batch = 8, features = 16]", _lb("pp") + "\n" + _lb("dp"),
                                  "pipeline over pp schedule 1f1b microbatches 2 " + ROOT_2, data="data x : [dp, _]",
                                  opt="adamw(lr = 0.001)"), "root"),
}


def _optimizer(plan, params):
    o = plan.optimizer
    kw = dict(o.kwargs)
    if o.name == "adamw":
        return torch.optim.AdamW(params, **kw)
    return torch.optim.SGD(params, **kw)


def _batches(kind: str, model, steps: int):
    g = torch.Generator().manual_seed(1234)
    out = []
    for _ in range(steps):
        if kind == "gpt2":
            idx = torch.randint(0, model.vocab, (8, 16), generator=g)
            out.append(((idx,), idx))
        elif kind == "mlp":
            out.append(((torch.randn(8, 16, generator=g),), torch.randn(8, 8, generator=g)))
        elif kind == "root":
            out.append(((torch.randn(8, 16, generator=g),), torch.randn(8, 16, generator=g)))
        else:
            x, idx = torch.randn(8, 16, generator=g), torch.randint(0, 10, (8,), generator=g)
            out.append(((x, idx), torch.randn(8, 16, generator=g)))
    return out


def _rel(a: torch.Tensor | None, b: torch.Tensor | None) -> float:
    if a is None or b is None:  # a parameter the loss does not reach: no gradient on either side
        return 0.0 if a is None and b is None else float("inf")
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _key_bias_masked(name: str, t: torch.Tensor) -> torch.Tensor:
    """`attn.c_attn.bias` without its key third. Its gradient is zero in exact arithmetic (softmax does
    not change when a constant is added to every score of a row), so it is pure rounding noise, which
    Adam's per-element normalisation turns into lr-sized steps of random sign — in a single process
    too, merely from accumulating microbatches. The other parameters are compared in full."""
    if not name.endswith("attn.c_attn.bias"):
        return t
    h = t.numel() // 3
    return torch.cat([t[:h], t[2 * h:]])


def run_config(name: str, text: str, kind: str) -> dict:
    from planlang.model.capture.load import build_model
    from planlang.plan.resolve import resolve_text
    from planlang.runtime.apply import load_plan
    from planlang.runtime.pipeline import build_pipeline, plan_loss
    from planlang.runtime.redistribute import MeshGroups

    res = resolve_text(text, "pipeline_test.plan")
    plan = load_plan(res.plan)  # validated, as planlang.apply takes it
    groups = MeshGroups(plan.mesh)
    torch.manual_seed(0)
    model = build_model(plan.model, plan.path, device="cpu")
    torch.manual_seed(0)
    reference = build_model(plan.model, plan.path, device="cpu")
    loss_fn = plan_loss(plan)
    transformed: list[int] = []

    def transform(index: int, module):  # the hook the tensor-parallel rewrite will use
        transformed.append(index)
        return module

    runner = build_pipeline(model, plan, groups, transform_stage=transform)
    launches: list[bool] = []  # each bucket sum's async_op: True when it started during backward
    if runner.grad_sync is not None:
        launch = runner.grad_sync._launch
        runner.grad_sync._launch = lambda b, async_op: (launches.append(async_op), launch(b, async_op))[1]
    ref_params = dict(reference.named_parameters())
    opt = _optimizer(plan, runner.parameters())
    ref_opt = _optimizer(plan, list(reference.parameters()))
    axes = plan.dims.data
    shards = 1
    shard = 0
    for a in axes:
        shard = shard * groups.size(a) + groups.coords[a]
        shards *= groups.size(a)
    out = {"loss_rel": [], "grad_rel": [], "param_rel": [], "param_rel_masked": [],
           "stages": sorted(runner.stage_modules), "transformed": transformed, "has_last": runner.has_last,
           "names": [n for n, _ in runner.named_parameters()], "all_names": sorted(ref_params),
           "coords": groups.coords, "optimizer": plan.optimizer.name, "launches": launches,
           "buckets": len(runner.grad_sync.buckets) if runner.grad_sync is not None else 0}
    for inputs, target in _batches(kind, reference, STEPS):
        # single-process reference on the whole batch
        ref_opt.zero_grad(set_to_none=True)
        ref_loss = loss_fn(reference(*inputs), target)
        ref_loss.backward()
        # this replica's pipeline on its shard of the batch
        n = target.shape[0] // shards
        local = tuple(x[shard * n:(shard + 1) * n] for x in inputs)
        opt.zero_grad(set_to_none=True)
        loss = runner.step(*local, target=target[shard * n:(shard + 1) * n])
        if runner.has_last:
            out["loss_rel"].append(abs(loss.item() - ref_loss.item()) / abs(ref_loss.item()))
        else:
            assert loss is None
        worst = 0.0
        named = list(runner.named_parameters())
        for fqn, p in named:
            worst = max(worst, _rel(p.grad, ref_params[fqn].grad))
        out["grad_rel"].append(worst)
        opt.step()
        ref_opt.step()
        out["param_rel"].append(max(_rel(p.detach(), ref_params[f].detach()) for f, p in named))
        out["param_rel_masked"].append(max(
            _rel(_key_bias_masked(f, p.detach()), _key_bias_masked(f, ref_params[f].detach())) for f, p in named))
    # a batch that does not split into the plan's microbatches is refused before anything is sent
    from planlang.runtime.pipeline import PipelineError

    inputs, target = _batches(kind, reference, 1)[0]
    try:
        runner.step(*(x[:6] for x in inputs), target=target[:6])
        out["uneven"] = None
    except PipelineError as err:
        out["uneven"] = str(err)
    dist.barrier()
    return out


def worker(rank: int, port: int, outdir: str, launched: float) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD))
    torch.set_num_threads(1)
    started = time.time()
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
    results = {"startup_s": round(started - launched, 1), "configs": {}}
    for name, (text, kind) in CONFIGS.items():
        t0 = time.time()
        try:
            r = run_config(name, text, kind)
        except Exception as err:  # noqa: BLE001 - reported by the test; the other ranks may hang until timeout
            r = {"error": f"{type(err).__name__}: {err}\n{traceback.format_exc()}"}
            with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
                json.dump({**results, "configs": {**results["configs"], name: r}}, f)
            raise
        r["seconds"] = round(time.time() - t0, 2)
        results["configs"][name] = r
    results["total_s"] = round(time.time() - launched, 1)
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    from planlang.runtime.teardown import leave

    leave()  # barrier, destroy, exit without finalization (see teardown.py)
