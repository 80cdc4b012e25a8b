"""Measure the per-rank peak live tensor bytes of one training step of each memory case (ground truth).

Run: .venv/bin/python bench/memory_measure.py [--case NAME ...] [--json out.json]

For every case (bench/memory_cases.py) the hand-written torch equivalent of the plan runs on CPU:
one process for world 1, ``torch.multiprocessing`` spawn with gloo on 127.0.0.1 otherwise. Each rank
builds the model with a fixed seed, runs TWO untracked warm-up steps (the optimizer states exist, and DDP
has rebuilt its buckets, which it does once, in the second iteration: the tracked step is steady state),
then tracks exactly one full step - forward, loss, backward, ``optimizer.step()``,
``zero_grad(set_to_none=True)`` - under ``MemTracker`` with the model, the optimizer and the step's
input/target tensors registered through ``track_external``. The result per rank is MemTracker's
snapshot at the peak of the Total, by category, in bytes:

    Total, parameters, gradients, optimizer, activations, temporaries, buffers, inputs

(``inputs`` is the step's input and target tensors, created before tracking.) ``buffers`` are the
runtime's own persistent tensors, registered with the tracker too: DDP's gradient buckets (captured by a
comm hook that does DDP's own all-reduce) and torch.distributed.pipelining's per-microbatch receive
buffers (activations from the previous stage, gradients from the next). MemTracker counts a tensor
that existed before tracking only from the first op that touches it, so without registering them the
peak would include them or not depending on when they are first touched.
Each rank also reports ``end`` (the live bytes by category after the step: the persistent state),
``param_bytes`` (the parameter bytes it holds, computed directly) and ``optimizer_state_bytes``.
Notes on what the tracker sees: during backward new tensors are "temporaries"; with activation
checkpointing the activation/temporary split in backward is approximate (the Total is not).
"""
from __future__ import annotations

import argparse
import importlib
import json
import socket
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (str(ROOT), str(ROOT / "bench")):
    if p not in sys.path:
        sys.path.insert(0, p)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

from memory_cases import CASES, CASES_BY_NAME, Case, pipeline_stages  # noqa: E402

CATEGORIES = ("Total", "parameters", "gradients", "optimizer", "activations", "temporaries", "buffers", "inputs")
_MAP = {"Total": "Total", "Parameter": "parameters", "Gradient": "gradients", "Optstate": "optimizer",
        "Activation": "activations", "Temp": "temporaries", "Buffer": "buffers", "Other": "inputs"}
SEED = 0


# ------------------------------------------------------------------------------ model helpers

def model_module(case: Case):
    return importlib.import_module(f"examples.{case.model}.model")


def build_model(case: Case) -> nn.Module:
    torch.manual_seed(SEED)
    return model_module(case).build(**case.kwargs)


def make_batch(case: Case) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """The whole (global) batch: (forward inputs, loss targets), deterministic."""
    g = torch.Generator().manual_seed(SEED + 1)
    kw, b, s = case.kwargs, case.batch, case.seq
    m = case.model
    if m == "mlp":
        return (torch.randn(b, kw["in_features"], generator=g),), (torch.randn(b, kw["out_features"], generator=g),)
    if m == "gpt2":
        idx = torch.randint(0, kw["vocab"], (b, s), generator=g)
        return (idx,), (idx.clone(),)
    if m == "bert":
        ids = torch.randint(0, kw["vocab"], (b, s), generator=g)
        return (ids,), (torch.randint(0, kw["vocab"], (b, s), generator=g),)
    if m == "t5":
        src = torch.randint(0, kw["vocab"], (b, s), generator=g)
        tgt = torch.randint(0, kw["vocab"], (b, s // 2), generator=g)
        return (src, tgt), (torch.randint(0, kw["vocab"], (b, s // 2), generator=g),)
    if m == "resnet":
        return (torch.randn(b, 3, 32, 32, generator=g),), (torch.randint(0, kw["num_classes"], (b,), generator=g),)
    if m == "moe":
        return (torch.randn(b, s, kw["hidden"], generator=g),), (torch.randn(b, s, kw["hidden"], generator=g),)
    if m == "ncf":
        users = torch.randint(0, kw["users"], (b,), generator=g)
        items = torch.randint(0, kw["items"], (b,), generator=g)
        return (users, items), (torch.randint(0, 2, (b,), generator=g).float(),)
    raise ValueError(m)


def local_batch(case: Case, dp_rank: int):
    """This dp rank's slice of the batch (contiguous, as `data x : [dp, ...]` splits dim 0)."""
    inputs, targets = make_batch(case)
    n = case.dp_size
    if n == 1:
        return inputs, targets
    return (tuple(t.chunk(n)[dp_rank].clone() for t in inputs),
            tuple(t.chunk(n)[dp_rank].clone() for t in targets))


def make_optimizer(case: Case, params) -> torch.optim.Optimizer:
    params = list(params)
    if case.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=1e-3)
    if case.optimizer == "sgd":
        return torch.optim.SGD(params, lr=1e-3)
    if case.optimizer == "momentum":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    raise ValueError(case.optimizer)


def local_param_bytes(module: nn.Module) -> int:
    """Bytes of the parameters this rank holds (a DTensor's local shard; tied parameters once)."""
    seen, total = set(), 0
    for p in module.parameters():
        t = p.to_local() if hasattr(p, "to_local") else p
        key = t.untyped_storage().data_ptr()
        if key in seen:
            continue
        seen.add(key)
        total += t.untyped_storage().nbytes()
    return total


# ------------------------------------------------------------------------------ strategies

def _ckpt_forward(case: Case, model: nn.Module):
    from torch.utils.checkpoint import checkpoint

    k = case.checkpoint_every

    def run_group(blocks):
        def f(x):
            for blk in blocks:
                x = blk(x)
            return x
        return f

    def groups(blocks):
        blocks = list(blocks)
        return [blocks[i:i + k] for i in range(0, len(blocks), k)]

    if case.model == "gpt2":
        def fwd(idx):
            pos = torch.arange(idx.size(1), device=idx.device)
            x = model.drop(model.wte(idx) + model.wpe(pos))
            for g in groups(model.h):
                x = checkpoint(run_group(g), x, use_reentrant=False)
            return model.lm_head(model.ln_f(x))
        return fwd
    if case.model == "bert":
        def fwd(ids):
            h = model.embeddings(ids)
            for g in groups(model.encoder.layer):
                h = checkpoint(run_group(g), h, use_reentrant=False)
            return model.cls(h), model.pooler(h)
        return fwd
    raise ValueError(f"no checkpointing for {case.model}")


def _tensor_parallel(case: Case, model: nn.Module, mesh) -> None:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    tp = mesh.size()
    col, row = ColwiseParallel, RowwiseParallel
    if case.model == "mlp":
        parallelize_module(model, mesh, {"fc1": col(), "fc2": row()})
    elif case.model == "moe":
        for e in model.experts:
            parallelize_module(e, mesh, {"fc1": col(), "fc2": row()})
    elif case.model == "bert":
        for layer in model.encoder.layer:
            parallelize_module(layer, mesh, {
                "attention.self.query": col(), "attention.self.key": col(), "attention.self.value": col(),
                "attention.output.dense": row(), "intermediate.dense": col(), "output.dense": row()})
            att = layer.attention.self
            att.heads //= tp
            att.hidden //= tp
    elif case.model == "t5":
        def attn(a):
            a.heads //= tp
            a.inner //= tp
        for blk in model.encoder.block:
            parallelize_module(blk, mesh, {"layer.0.SelfAttention.q": col(), "layer.0.SelfAttention.k": col(),
                                           "layer.0.SelfAttention.v": col(), "layer.0.SelfAttention.o": row(),
                                           "layer.1.DenseReluDense.wi": col(), "layer.1.DenseReluDense.wo": row()})
            attn(blk.layer[0].SelfAttention)
        for blk in model.decoder.block:
            parallelize_module(blk, mesh, {"layer.0.SelfAttention.q": col(), "layer.0.SelfAttention.k": col(),
                                           "layer.0.SelfAttention.v": col(), "layer.0.SelfAttention.o": row(),
                                           "layer.1.EncDecAttention.q": col(), "layer.1.EncDecAttention.k": col(),
                                           "layer.1.EncDecAttention.v": col(), "layer.1.EncDecAttention.o": row(),
                                           "layer.2.DenseReluDense.wi": col(), "layer.2.DenseReluDense.wo": row()})
            attn(blk.layer[0].SelfAttention)
            attn(blk.layer[1].EncDecAttention)
    else:
        raise ValueError(f"no tensor-parallel split for {case.model}")


class _GPT2Stage(nn.Module):
    """Stage i of a hand split GPT-2: [wte, wpe, drop] + blocks + [ln_f, lm_head] (as pipeline_stages says)."""

    def __init__(self, model: nn.Module, lo: int, hi: int, first: bool, last: bool) -> None:
        super().__init__()
        self.first, self.last = first, last
        if first:
            self.wte, self.wpe, self.drop = model.wte, model.wpe, model.drop
        self.h = nn.ModuleList(model.h[i] for i in range(lo, hi))
        if last:
            self.ln_f, self.lm_head = model.ln_f, model.lm_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            pos = torch.arange(x.size(1), device=x.device)
            x = self.drop(self.wte(x) + self.wpe(pos))
        for blk in self.h:
            x = blk(x)
        if self.last:
            x = self.lm_head(self.ln_f(x))
        return x


def _pipeline_stage_module(case: Case, model: nn.Module, rank: int) -> nn.Module:
    pipeline_stages(case)  # validates the split
    n = case.world
    if case.model == "mlp":
        return nn.Sequential(model.fc1, model.act) if rank == 0 else model.fc2
    if case.model == "gpt2":
        per = case.kwargs["layers"] // n
        return _GPT2Stage(model, rank * per, (rank + 1) * per, rank == 0, rank == n - 1)
    raise ValueError(case.model)


def _capture_bucket_hook(buckets: dict, bucket):
    """DDP comm hook: remember the bucket's flat buffer (to register it with the tracker), then DDP's
    own averaging all-reduce (torch's allreduce_hook: divide in place, all-reduce in place)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    buckets[bucket.index()] = bucket.buffer()
    return allreduce_hook(None, bucket)


class Runner:
    """Sets up one rank of a case; ``step()`` runs one full training step."""

    def __init__(self, case: Case, rank: int, world: int) -> None:
        self.case, self.rank = case, rank
        mod = model_module(case)
        model = build_model(case)
        model.train()
        s = case.strategy
        self.dp_group = None
        self.schedule = None
        self.stage = None
        self.buckets: dict[int, torch.Tensor] = {}  # DDP bucket index -> its flat gradient buffer
        dp_rank = 0
        if s in ("single", "ckpt"):
            self.module = model
            self.fwd = _ckpt_forward(case, model) if s == "ckpt" else model
            self.opt = make_optimizer(case, model.parameters())
        elif s in ("ddp", "zero1"):
            from torch.nn.parallel import DistributedDataParallel as DDP

            dp_rank = rank
            self.module = model
            # BERT's pooler output does not reach the MLM loss: its parameters get no gradient
            self.fwd = DDP(model, find_unused_parameters=case.model == "bert")
            self.fwd.register_comm_hook(self.buckets, _capture_bucket_hook)
            if s == "zero1":
                from torch.distributed.optim import ZeroRedundancyOptimizer

                cls = {"adamw": torch.optim.AdamW, "sgd": torch.optim.SGD, "momentum": torch.optim.SGD}[case.optimizer]
                extra = {"momentum": 0.9} if case.optimizer == "momentum" else {}
                self.opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=cls, lr=1e-3, **extra)
            else:
                self.opt = make_optimizer(case, model.parameters())
        elif s in ("tp", "dp_tp"):
            from torch.distributed.device_mesh import init_device_mesh

            if s == "tp":
                mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
                tp_mesh = mesh
            else:
                mesh = init_device_mesh("cpu", (case.dp, world // case.dp), mesh_dim_names=("dp", "tp"))
                tp_mesh = mesh["tp"]
                self.dp_group = mesh.get_group("dp")
                dp_rank = mesh.get_local_rank("dp")
            _tensor_parallel(case, model, tp_mesh)
            self.module = model
            self.fwd = model
            self.opt = make_optimizer(case, model.parameters())
        elif s in ("pp_1f1b", "pp_gpipe"):
            from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

            stage_mod = _pipeline_stage_module(case, model, rank)
            del model
            self.module = stage_mod
            self.fwd = None
            stage = PipelineStage(stage_mod, rank, world, torch.device("cpu"))
            self.stage = stage
            cls = Schedule1F1B if s == "pp_1f1b" else ScheduleGPipe
            self.schedule = cls(stage, n_microbatches=case.microbatches, loss_fn=mod.loss)
            self.opt = make_optimizer(case, stage_mod.parameters())
        else:
            raise ValueError(s)
        self.loss_fn = mod.loss
        self.inputs, self.targets = local_batch(case, dp_rank)
        self.param_bytes = local_param_bytes(self.module)

    def runtime_buffers(self) -> list[torch.Tensor]:
        """The runtime's persistent tensors that exist before a step: DDP's gradient buckets, the
        pipeline stage's receive buffers (one per microbatch, activations in and gradients back)."""
        out = list(self.buckets.values())
        if self.stage is not None:
            for infos in (*self.stage.args_recv_info.values(), *self.stage.grad_recv_info.values()):
                out += [i.buffer for i in infos if getattr(i, "buffer", None) is not None
                        and not getattr(i, "is_root_arg", False)]
        return out

    def step(self) -> None:
        c = self.case
        if self.schedule is not None:
            first, last = self.rank == 0, self.rank == c.world - 1
            args = self.inputs if first else ()
            kw = {"target": self.targets[0], "losses": []} if last else {}
            # a training step needs the losses only (the planlang runtime does the same): without
            # return_outputs=False the last stage keeps every microbatch's output and concatenates them
            self.schedule.step(*args, return_outputs=False, **kw)
        else:
            out = self.fwd(*self.inputs)
            loss = self.loss_fn(out, *self.targets)
            del out
            loss.backward()
            del loss
            if self.dp_group is not None:
                # dp over a TP model (DDP does not take DTensor parameters): one flat all-reduce of every
                # gradient over dp after backward, as the planlang runtime's sync_grads does
                grads = [p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                         for p in self.module.parameters() if p.grad is not None]
                flat = torch.cat([g.reshape(-1) for g in grads])
                dist.all_reduce(flat, group=self.dp_group)
                flat /= dist.get_world_size(self.dp_group)
                off = 0
                for g in grads:
                    g.copy_(flat[off:off + g.numel()].view_as(g))
                    off += g.numel()
                del flat
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


class PlanlangRunner:
    """The same case on the planlang runtime: ``planlang.apply(model, plan)`` of ``to_plan(case)``, the
    plan's optimizer (``pm.optimizer()``, ZeRO as the plan says), ``pm.step(*inputs, *targets)`` on the
    global batch (the runtime takes this rank's piece), then ``opt.step()`` and ``opt.zero_grad()``."""

    def __init__(self, case: Case, rank: int, world: int) -> None:
        from memory_cases import to_plan

        from planlang.plan.checker import check_text
        from planlang.runtime.apply import apply

        self.case, self.rank = case, rank
        res = check_text(to_plan(case), str(ROOT / "bench" / f"{case.name}.plan"))
        if res.errors or res.plan is None:
            raise RuntimeError(f"{case.name}: the plan does not check")
        mod = model_module(case)
        model = build_model(case)
        model.train()
        self.inputs, self.targets = make_batch(case)  # the global batch: the runtime slices it
        self.pm = apply(model, res.plan, loss_fn=mod.loss, targets=tuple(t.to("meta") for t in self.targets))
        del model
        runner = getattr(self.pm, "runner", None)  # a PipelinedModel
        self.stages = list(runner.stages) if runner is not None else []
        self.module = (nn.ModuleList(runner.stage_modules.values()) if runner is not None else self.pm)
        self.opt = self.pm.optimizer()
        self.param_bytes = local_param_bytes(self.module)

    def runtime_buffers(self) -> list[torch.Tensor]:
        """The pipeline stages' receive buffers (built at the first step) and the persistent gradient
        buckets (planlang.runtime.grad_sync, made at the first step)."""
        sync = getattr(self.pm, "_grad_sync", None)
        out = [b.flat for b in sync.buckets if b.flat is not None] if sync is not None else []
        for st in getattr(self.pm, "runner", None) and self.pm.runner.stages or []:
            for infos in (*st.args_recv_info.values(), *st.grad_recv_info.values()):
                out += [i.buffer for i in infos if getattr(i, "buffer", None) is not None
                        and not getattr(i, "is_root_arg", False)]
        return out

    def step(self) -> None:
        loss = self.pm.step(*self.inputs, *self.targets)
        del loss
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


# the cases also measured on the planlang runtime: every strategy, MLP and transformer models
PLANLANG_CASES = (
    "mlp_single", "gpt2_single", "bert_single", "t5_single", "resnet_single",
    "mlp_ddp_2", "gpt2_ddp_2", "bert_ddp_2", "t5_ddp_2", "resnet_ddp_2", "gpt2_ddp_4", "mlp_ddp_4", "resnet_ddp_4",
    "mlp_tp_2", "bert_tp_2", "t5_tp_2", "mlp_tp_4", "bert_tp_4", "mlp_dp_tp_4_dp2_tp2", "bert_dp_tp_4_dp2_tp2",
    "gpt2_pp_1f1b_2_mb4", "gpt2_pp_gpipe_2_mb4", "gpt2_pp_1f1b_2_mb8", "gpt2_pp_gpipe_2_mb8", "mlp_pp_1f1b_2_mb4",
    "mlp_pp_gpipe_2_mb4", "gpt2_pp_1f1b_4_mb8",
    "gpt2_ckpt_every1", "gpt2_ckpt_every2", "bert_ckpt_every1", "bert_ckpt_every2",
    "mlp_zero1_2", "gpt2_zero1_2", "bert_zero1_2", "gpt2_zero1_4",
)


def without_backward_module_hooks() -> None:
    """MemTracker's module tracker hooks every module's backward with `register_multi_grad_hook`, which
    raises inside `torch.autograd.grad` on a leaf input, and a split backward (torch's zero-bubble
    stages) computes the input gradient with it. Without those hooks the tracker does not know backward
    from forward; the totals the benches read (every tensor alive, bytes) are the same."""
    import torch.distributed._tools.mod_tracker as mod_tracker

    class _NoHook:
        def remove(self) -> None:
            pass

    mod_tracker.register_multi_grad_hook = lambda *args, **kwargs: _NoHook()  # type: ignore[assignment]


def _tracker():
    from torch.distributed._tools.mem_tracker import MemTracker

    class _Tracker(MemTracker):
        """MemTracker that lets a root module run several times in one step (a pipeline stage runs once per
        microbatch): the root's per-module stats are restarted instead of raising. Totals are unaffected."""

        def _pre_fw_hook(self, module, inputs):
            name = self._mod_tracker.get_known_fqn(module)
            if (module in self.memory_tracking and not self._mod_tracker.is_bw
                    and set(self._mod_tracker.parents) - {name} == {"Global"}):
                del self.memory_tracking[module]
            super()._pre_fw_hook(module, inputs)

    return _Tracker()


def _measure_rank(case: Case, rank: int, world: int, runtime: str = "torch") -> dict:
    # MemTracker warns for every parameter without a gradient (BERT's pooler under DDP)
    warnings.filterwarnings("ignore", message="Expected a tensor or a traceable wrapper-subclass")
    torch.manual_seed(SEED)
    runner = Runner(case, rank, world) if runtime == "torch" else PlanlangRunner(case, rank, world)
    runner.step()  # untracked warm-up: optimizer states exist afterwards
    runner.step()  # and DDP has rebuilt its buckets (second iteration)
    mt = _tracker()
    opts = [runner.opt] + ([runner.opt.optim] if hasattr(runner.opt, "optim") else [])
    rbufs = runner.runtime_buffers()
    mt.track_external(runner.module, *opts, *runner.inputs, *runner.targets, *rbufs)
    t0 = time.perf_counter()
    with mt:
        runner.step()
    dt = time.perf_counter() - t0
    peak, end = _categories(mt.get_tracker_snapshot("peak")), _categories(mt.get_tracker_snapshot("current"))
    # the registered runtime buffers are in MemTracker's "Other" with the inputs, unless it saw them as
    # something else first (a bucket whose slices are gradients): what is there beyond the batch moves to
    # buffers (they are persistent, so live at the peak and at the end)
    rb = sum(t.untyped_storage().nbytes() for t in {t.untyped_storage()._cdata: t for t in rbufs}.values())
    batch = sum(t.untyped_storage().nbytes() for t in (*runner.inputs, *runner.targets))
    for snap in (peak, end):
        snap["buffers"] += snap["inputs"] - batch
        snap["inputs"] = batch
    state = 0
    for o in opts:
        for st in o.state.values():
            state += sum(v.untyped_storage().nbytes() for v in st.values()
                         if isinstance(v, torch.Tensor) and v.dim() > 0)
    return {"rank": rank, "peak": peak, "end": end, "param_bytes": runner.param_bytes, "runtime_buffer_bytes": rb,
            "optimizer_state_bytes": state, "step_s": round(dt, 4)}


def _categories(snap: dict) -> dict:
    out = {k: 0 for k in CATEGORIES}
    for dev_snap in snap.values():
        for k, v in dev_snap.items():
            key = _MAP.get(str(getattr(k, "value", k)))
            if key is not None:
                out[key] += int(v)
    return out


# ------------------------------------------------------------------------------ launching

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, case: Case, world: int, port: int, outdir: str, runtime: str = "torch") -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        res = _measure_rank(case, rank, world, runtime)
        dist.barrier()
    except BaseException:
        res = {"rank": rank, "error": traceback.format_exc()}
    finally:
        path = Path(outdir) / f"rank{rank}.json"
        path.write_text(json.dumps(res))
        dist.destroy_process_group()


def measure(case: Case, runtime: str = "torch") -> dict:
    """Run ``case`` on the hand-written torch equivalent (`runtime` "torch") or on the planlang runtime
    ("planlang") and return {"case", "runtime", "world", "strategy", "ranks": [{"rank", "peak": {category:
    bytes}, "param_bytes", "step_s"}], "wall_s"}; raises RuntimeError if a rank failed. The planlang
    runtime needs a process group, so it always runs under gloo, also for one rank."""
    t0 = time.perf_counter()
    if case.world == 1 and runtime == "torch":
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            ranks = [_measure_rank(case, 0, 1)]
        finally:
            torch.set_num_threads(threads)
    else:
        import torch.multiprocessing as mp

        for attempt in range(2):  # gloo teardown occasionally aborts a process: retry once
            with tempfile.TemporaryDirectory(prefix="memcase_") as d:
                spawn_err = None
                try:
                    mp.spawn(_worker, args=(case, case.world, _free_port(), d, runtime), nprocs=case.world,
                             join=True)
                except Exception as err:  # a rank died; its result may still have been written
                    spawn_err = err
                ranks = []
                for r in range(case.world):
                    p = Path(d) / f"rank{r}.json"
                    ranks.append(json.loads(p.read_text()) if p.exists() else {"rank": r, "error": f"no result ({spawn_err})"})
            errs = [r for r in ranks if "error" in r]
            if not errs:
                break
        if errs:
            raise RuntimeError(f"{case.name}: rank {errs[0]['rank']} failed:\n{errs[0]['error']}")
    return {"case": case.name, "runtime": runtime, "model": case.model, "strategy": case.strategy, "world": case.world,
            "ranks": ranks, "wall_s": round(time.perf_counter() - t0, 3)}


def _mib(b: int) -> str:
    return f"{b / 2**20:8.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--case", action="append", help="case name (repeatable); default: all")
    ap.add_argument("--json", help="write all results to this file")
    ap.add_argument("--runtime", choices=("torch", "planlang", "both"), default="torch",
                    help="hand-written torch equivalents (default), the planlang runtime, or both")
    args = ap.parse_args(argv)
    cases = [CASES_BY_NAME[n] for n in args.case] if args.case else CASES
    runs = [(c, "torch") for c in cases] if args.runtime in ("torch", "both") else []
    if args.runtime in ("planlang", "both"):
        runs += [(c, "planlang") for c in cases if c.name in PLANLANG_CASES]
    short = ("parameters", "gradients", "optimizer", "activations", "temporaries", "buffers", "inputs")
    print(f"{'case':28} {'rank':>4} {'total MiB':>9} " + " ".join(f"{k[:8]:>8}" for k in short) + "   (MiB)")
    results, failed = [], []
    t_all = time.perf_counter()
    for c, runtime in runs:
        label = c.name if runtime == "torch" else f"{c.name}@planlang"
        try:
            res = measure(c, runtime)
        except Exception as err:  # keep going: report at the end
            failed.append((label, str(err)))
            print(f"{label:28} FAILED: {str(err).strip().splitlines()[-1]}", flush=True)
            continue
        results.append(res)
        for r in res["ranks"]:
            p = r["peak"]
            print(f"{label:28} {r['rank']:>4} {_mib(p['Total']):>9} " + " ".join(_mib(p[k]) for k in short),
                  flush=True)
    total = time.perf_counter() - t_all
    print(f"\n{len(results)} cases measured, {len(failed)} failed, {total:.1f} s")
    for n, e in failed:
        print(f"--- {n}\n{e}")
    if args.json:
        Path(args.json).write_text(json.dumps({"torch": torch.__version__, "seconds": round(total, 2),
                                               "results": results, "failed": failed}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
