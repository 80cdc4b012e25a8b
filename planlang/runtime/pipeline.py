"""Pipeline parallelism: the plan's stages driven by torch.distributed.pipelining schedules.

`build_pipeline(model, plan, groups)` cuts the model into the plan's stages (planlang.model.program.stages),
keeps the stages this rank owns, wraps each in a `PipelineStage` over the pipeline axis' process group
(an `InFlightStage`: receive buffers for the microbatches in flight only, planlang.runtime.recv_buffers)
and builds the schedule the plan names:

    gpipe                  ScheduleGPipe           one stage per rank (p stages)
    1f1b                   Schedule1F1B            one stage per rank (p stages; microbatches >= p)
    interleaved chunks v   ScheduleInterleaved1F1B v stages per rank (p·v stages); rank r holds stages
                                                   r, r+p, …, r+(v−1)p (Narayanan et al. 2021, §2.2.2)
    looped_bfs chunks v    ScheduleLoopedBFS       placed as interleaved; each chunk runs all microbatches'
                                                   forwards in turn (breadth-first, arXiv:2211.05953)
    zero_bubble chunks v   ScheduleInterleaved-    placed as interleaved; backward split into the input
                           ZeroBubble              gradient and a later weight gradient (arXiv:2401.10241)
    zbv chunks 2           ScheduleZBVZeroBubble   V placement: rank r holds stages r and 2p−1−r (§6 there)
    dualpipev chunks 2     ScheduleDualPipeV       V placement; forward and backward of two microbatches
                                                   overlapped (DeepSeek-V3's DualPipe, one direction)

`PipelineRunner.step(*inputs, target=...)` runs one training step's forward and backward over the plan's
microbatches and returns the loss on ranks that hold the last stage (None elsewhere); `run` also returns
the last stage's outputs (`pm(...)`).

Loss and gradient scaling. The loss is the plan's convention (the model factory module's
`loss(output, *targets)`, or `loss_fn`). Each microbatch's loss is divided by the number of
microbatches m before its backward (schedules run with `scale_grads=False`), so the returned loss, the
sum of the scaled microbatch losses, is the mean over the batch and the accumulated gradients are those of
that mean — exactly the single-process values when the loss is a mean over samples (or tokens) and the
microbatches are equal in size (checked). With data axes (`data x : [dp, _]`), each replica runs its own
pipeline on its shard of the batch; the gradients of the stage parameters are averaged over the data axes
in DDP-style buckets (planlang.runtime.grad_sync, `mean`) that start during the last microbatch's backward of
the rank's last stage to run (`InFlightStage.grad_sync`), and so is the returned loss.
The ZeRO / DDP helpers (planlang.runtime.data_parallel) may take the gradient reduction over: pass
`reduce_grads=False` and reduce there.

A per-stage rewrite (tensor parallelism of the modules inside a stage) goes in `transform_stage(index,
module) -> module`, called on each of this rank's stage modules before its PipelineStage is built.

`planlang.apply` on a pipeline plan returns a `PipelinedModel` (`apply_pipeline`): the runner behind the
training-loop interface of ParallelModel (`step`, `optimizer`, `full_grads`, ...), with the plan's
checkpoint groups wrapped in their stages and, for ZeRO-2/3, each stage an FSDP2 unit over the data axis.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from collections.abc import Iterator, Mapping
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch import fx, nn
from torch.distributed.pipelining import (Schedule1F1B, ScheduleDualPipeV, ScheduleGPipe, ScheduleInterleaved1F1B,
                                          ScheduleInterleavedZeroBubble, ScheduleLoopedBFS, ScheduleZBVZeroBubble)
from torch.distributed.tensor import DTensor
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils._pytree import tree_unflatten

from planlang.plan.complete import CompletePlan
from planlang.plan.placement import stage_ranks, stages_on
from planlang.plan.schedule import rank_orders
from planlang.model.capture.load import plan_loss
from planlang.model.program.recompute import is_recomputing
from planlang.model.program.stages import OUT_FROM_LAST, OUT_SPEC, split_stages

from .executor import batch_norm_recomputed, sync_batch_norm
from .grad_sync import GradSync
from .precision import LossScale
from .recv_buffers import InFlightStage

StageTransform = Callable[[int, fx.GraphModule], nn.Module]  # a stage as split_stages cut it
TorchSchedule = (ScheduleGPipe | Schedule1F1B | ScheduleInterleaved1F1B | ScheduleLoopedBFS
                 | ScheduleInterleavedZeroBubble | ScheduleZBVZeroBubble | ScheduleDualPipeV)  # those a plan names
#: a chunked schedule (planlang.plan.types.CHUNKED) -> torch's schedule of several stages per rank
MULTI_STAGE = {"interleaved": ScheduleInterleaved1F1B, "looped_bfs": ScheduleLoopedBFS,
               "zero_bubble": ScheduleInterleavedZeroBubble, "zbv": ScheduleZBVZeroBubble,
               "dualpipev": ScheduleDualPipeV}


class PipelineError(ValueError):
    """The plan's pipeline cannot run as given: `message` names the cause, `help` the fix."""

    def __init__(self, message: str, help: str) -> None:
        self.message, self.help = message, help
        super().__init__(f"{message} (help: {help})")


@dataclass(frozen=True)
class PipelineLayout:
    """Which stages a pipeline rank holds."""

    schedule: str  # planlang.plan.types.SCHEDULES
    num_stages: int
    pp_size: int
    microbatches: int

    def __str__(self) -> str:
        return f"{self.schedule}: {self.num_stages} stages on {self.pp_size} ranks, {self.microbatches} microbatches"

    @property
    def stages_per_rank(self) -> int:
        return self.num_stages // self.pp_size

    def stages_of(self, pp_rank: int) -> list[int]:
        """The stages pipeline rank `pp_rank` holds, chunk by chunk (planlang.plan.placement.stages_on): looped,
        r, r + p, r + 2p, … (torch's "loop" style); V-shaped (zbv, dualpipev), r and 2p − 1 − r."""
        return list(stages_on(self.schedule, self.pp_size, self.stages_per_rank, pp_rank))

    def rank_of(self, stage: int) -> int:
        """The pipeline rank that holds model stage `stage` (planlang.plan.placement.stage_ranks)."""
        return stage_ranks(self.schedule, self.pp_size, self.stages_per_rank)[stage]

    def last_to_run(self, pp_rank: int) -> int:
        """The stage of the rank's last operation under its schedule (planlang.plan.schedule's orders, which
        are torch's): the stage whose last backward (or weight gradient) ends the rank's gradients."""
        return rank_orders(self.schedule, self.pp_size, self.microbatches, self.stages_per_rank)[pp_rank][-1].stage


def pipeline_layout(plan: CompletePlan) -> PipelineLayout:
    """Which stages each pipeline rank holds under the plan's schedule. The plan is a validated one: the
    checker has matched its stages, microbatches and schedule to the pipeline axis (PL401, PL402, PL411,
    PL416), so nothing is checked again here."""
    p = plan.pipeline
    if p is None:
        raise ValueError(f"{plan.path} has no `pipeline`: it runs without a pipeline layout")
    return PipelineLayout(p.schedule.kind, len(p.stages), plan.dims.pipeline_size, p.microbatches)


@dataclass(frozen=True)
class _Meta:
    """Shape, stride, dtype and requires_grad of one tensor crossing a stage boundary."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    requires_grad: bool

    @staticmethod
    def of(t: torch.Tensor) -> "_Meta":
        return _Meta(tuple(t.shape), tuple(t.stride()), t.dtype, t.requires_grad)

    def example(self, device) -> torch.Tensor:
        """A tensor of this layout (zeros: a valid index for integer inputs such as token ids)."""
        t = torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device=device).zero_()
        return t.requires_grad_(self.requires_grad and t.is_floating_point())


@dataclass(frozen=True)
class TiedParameter:
    """One parameter under several names (`transformer.wte.weight`, `lm_head.weight`) that the plan's
    stages split: each stage holding one of the names keeps a copy."""

    names: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: torch.dtype

    def local_shape(self, p: torch.Tensor) -> tuple[int, ...]:
        return tuple(p.to_local().shape) if isinstance(p, DTensor) else tuple(p.shape)


def retie(model: nn.Module, stages: Sequence[nn.Module]) -> None:
    """Make every name of one parameter of `model` refer to one parameter object across `stages`.
    torch.distributed.pipelining's cut gives a stage its own copy of a parameter used under several
    names (T5's `decoder.embed_tokens.weight` and `lm_head.weight`): two copies in one process would
    each get part of the gradient and the optimizer would step only one."""
    names: dict[int, list[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(n)
    for group in (g for g in names.values() if len(g) > 1):
        keep = None
        for st in stages:
            for n in group:
                owner, _, attr = n.rpartition(".")
                try:
                    mod = st.get_submodule(owner) if owner else st
                except AttributeError:
                    continue
                held = mod._parameters.get(attr)
                if held is None:
                    continue
                if keep is None:
                    keep = held
                elif held is not keep:
                    mod._parameters[attr] = keep


def tied_parameters(model: nn.Module, stages: Sequence[nn.Module]) -> list[TiedParameter]:
    """The parameters of `model` that several of `stages` hold (one object under several names)."""
    names: dict[int, list[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(n)
    out = []
    for n, p in model.named_parameters():
        group = names[id(p)]
        holders = {i for i, st in enumerate(stages) for sn, _ in st.named_parameters(remove_duplicate=False)
                   if sn in group}
        if len(group) > 1 and len(holders) > 1:
            out.append(TiedParameter(tuple(group), tuple(p.shape), p.dtype))
    return out


class PipelineRunner:
    """This rank's stages of the plan's pipeline and the schedule that drives them.

    The PipelineStages are built at the first `step` (and again if the input shapes change), with
    static shapes found by one forward of a zero-filled microbatch through the pipeline: torch's own
    runtime shape inference fills the inputs of later stages with uninitialised memory, which an
    integer input passed on to a later stage (token ids for an embedding) cannot take."""

    def __init__(self, stage_modules: Mapping[int, nn.Module], layout: PipelineLayout, pp_group: dist.ProcessGroup,
                 loss_fn: Callable[..., torch.Tensor], device: torch.device,
                 dp_groups: Sequence[dist.ProcessGroup] = (), reduce_grads: bool = True,
                 tied: Sequence[TiedParameter] = (), canonical: dict[str, str] | None = None) -> None:
        self.layout, self.device, self.pp_group = layout, device, pp_group
        self.tied = tuple(tied)
        self.canonical = dict(canonical or {})  # alias of a shared parameter -> the model's name for it
        self.stage_modules = dict(sorted(stage_modules.items()))
        expected = layout.stages_of(dist.get_rank(pp_group))
        if sorted(self.stage_modules) != expected:
            raise PipelineError(f"pipeline rank {dist.get_rank(pp_group)} must hold stages {expected}, "
                                f"got {sorted(self.stage_modules)}", "pass the stages `layout.stages_of(rank)` names")
        self.dp_groups, self.reduce_grads = tuple(dp_groups), reduce_grads
        # the data axes' gradient sums (made by build_pipeline; None: the caller reduces, ZeRO-2/3's FSDP2)
        self.grad_sync: GradSync | None = None
        self._scaled = _ScaledLoss(loss_fn, layout.microbatches)
        # the plan's loss scale (f16): each microbatch's loss is multiplied by it before its backward
        self.loss_scale: LossScale | None = None
        self._signature: tuple | None = None
        self.stages: list = []
        self.schedule: TorchSchedule | None = None  # built at the first step

    def __repr__(self) -> str:
        return f"PipelineRunner({self.layout}, stages {list(self.stage_modules)})"

    @property
    def has_first(self) -> bool:
        return 0 in self.stage_modules

    @property
    def has_last(self) -> bool:
        return self.layout.num_stages - 1 in self.stage_modules

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """(fully qualified name in the model, parameter) for every parameter of this rank's stages. A
        parameter with several names (BERT's `cls.predictions.bias` is also `...decoder.bias`) goes by the
        name the model's own `named_parameters()` gives it, whichever a stage module found first."""
        found: dict[str, tuple[str, nn.Parameter]] = {}
        seen: set[int] = set()
        for mod in self.stage_modules.values():
            for name, p in mod.named_parameters():
                if id(p) in seen:
                    continue
                seen.add(id(p))
                key = self.canonical.get(name, name)
                # torch.export's cut may attach a copy of a tied parameter under its other name to a stage
                # that does not use it (pipelining's aliasing): the one under the model's name runs
                if key not in found or name == key:
                    found[key] = (name, p)
        for key, (_name, p) in found.items():
            yield key, p

    def parameters(self) -> list[nn.Parameter]:
        return [p for _, p in self.named_parameters()]

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.grad = None

    def step(self, *inputs: torch.Tensor, target: torch.Tensor | None = None) -> torch.Tensor | None:
        """One forward + backward of this replica's batch, on every rank of the pipeline with the same
        arguments (the first stage reads `inputs`, the last `target`). Gradients add to `.grad`, averaged
        over the data axes. Returns the batch's mean loss (over data replicas) where the last stage lives."""
        prev = self.take_grads(zeros=False)  # the sums must see this step's gradients alone (take_grads)
        loss, _ = self.run(inputs, target)
        self.put_grads(prev)
        return loss

    def evaluate(self, *inputs: torch.Tensor, target: torch.Tensor | None = None) -> torch.Tensor | None:
        """Forward only of this replica's batch (torch's `schedule.eval`: no backward, no gradient sums,
        nothing saved for backward); the loss as `step` returns it. On every rank of the pipeline."""
        return self.run(inputs, target, backward=False)[0]

    def run(self, inputs: tuple[torch.Tensor, ...], target: torch.Tensor | None = None, *, backward: bool = True,
            outputs: bool = False) -> tuple[torch.Tensor | None, Any]:
        """One batch under the schedule: forward and backward with the gradient sums (`step`, adding to
        `.grad` as it holds), or forward only (`evaluate`). Returns the mean loss and, with `outputs`, the
        model's output for this replica's batch (`merge_outputs` of the last stage's microbatch outputs,
        detached; the model's output object for a torch.export cut), both where the last stage lives (None
        elsewhere). Keeping the outputs holds every microbatch's until the step ends (`step` keeps none)."""
        scale = 1.0 if self.loss_scale is None or not backward else self.loss_scale.value  # this step's
        schedule, tgt = self._prepare(inputs, target, scale)
        losses: list[torch.Tensor] = []
        last = next((st for st in self.stages if st.is_last), None)
        if last is not None and outputs:
            last.kept = []
        if self.grad_sync is not None:
            self.grad_sync.no_sync = True  # until the last backward of the rank's last stage to run
        try:
            first = inputs if self.has_first else ()
            if backward:
                schedule.step(*first, target=tgt, losses=losses, return_outputs=False)
            else:
                with torch.no_grad():
                    schedule.eval(*first, target=tgt, losses=losses, return_outputs=False)
            kept = last.kept if last is not None else None
        finally:
            if last is not None:
                last.kept = None
        if backward:
            if self.grad_sync is not None:
                self.grad_sync.finish()  # (sums commute: the data axes' before the tied copies')
            self.sum_tied_gradients()
        out = None
        if kept:
            out = merge_outputs(kept)
            if self.output_form is not None:
                out = self.output_form(out)
        return self._mean_loss(losses, scale), out

    # ------------------------------------------------------------------ gradients handed over
    # pp x tp: new gradient buckets for the next step, so that gradients taken out of `.grad` (views of
    # the old ones) keep their values (planlang.runtime.program_pipeline)
    release_grad_buffers: Callable[[], None] | None = None
    # a torch.export cut: the merged last-stage tensors -> the model's own output object
    output_form: Callable[[Any], Any] | None = None
    user_loss: Callable | None = None  # the plan's `loss(output, *targets)`, whose parameters name the targets

    def take_grads(self, zeros: bool = True) -> dict[nn.Parameter, torch.Tensor]:
        """Move the gradients out of `.grad` (left None) and return them: a step then sums only its own
        (the tied copies' and the data axes' sums would add up what `.grad` held once per copy or rank),
        and `put_grads` adds them back. `zeros` False: all-zero ones (zero_grad(set_to_none=False)) stay."""
        out = {p: g for p in self.parameters() if (g := p.grad) is not None}
        if not zeros and out:  # one device sync for all of them
            nonzero = torch.stack([_local(g).ne(0).any() for g in out.values()]).tolist()
            out = {p: g for (p, g), nz in zip(out.items(), nonzero) if nz}
        for p in out:
            p.grad = None
        if out and self.release_grad_buffers is not None:
            self.release_grad_buffers()
        return out

    def put_grads(self, grads: Mapping[nn.Parameter, torch.Tensor], scale: torch.Tensor | None = None) -> None:
        """Add `grads` (owned by the caller, given up here) times `scale` to `.grad`."""
        for p, g in grads.items():
            if scale is not None:
                _local(g).mul_(scale)
            if p.grad is None:
                p.grad = g
            else:
                _local(p.grad).add_(_local(g))

    def _prepare(self, inputs: tuple[torch.Tensor, ...], target: torch.Tensor | None,
                 scale: float) -> tuple[TorchSchedule, torch.Tensor | None]:
        """The schedule for these shapes (stages and schedule built again when they changed: a shorter
        batch) and the last stage's target."""
        m = self.layout.microbatches
        batch = _batch_size(inputs, target)
        if batch % m:
            raise PipelineError(f"batch {batch} does not split into {m} equal microbatches",
                                f"use a batch (per data-parallel replica) that is a multiple of {m}")
        signature = tuple((tuple(x.shape), x.dtype) for x in inputs)
        schedule = self.schedule
        if schedule is None or signature != self._signature:
            schedule = self._build(tuple(x[: batch // m] for x in inputs))
            self._signature = signature
        tgt = None
        if self.has_last:
            tgt = target if target is not None else torch.zeros(batch, device=self.device)
            self._scaled.takes_target = target is not None
            self._scaled.scale = scale
        return schedule, tgt

    def _mean_loss(self, losses: list[torch.Tensor], scale: float) -> torch.Tensor | None:
        if not self.has_last:
            return None
        loss = torch.stack([x.detach() for x in losses]).sum()
        if scale != 1.0:
            loss = loss / scale
        for g in self.dp_groups:  # every rank of a data group holds the same stages: all last or none
            dist.all_reduce(loss, group=g)
            loss /= dist.get_world_size(g)
        return loss

    def sum_tied_gradients(self) -> None:
        """A parameter tied across stages (input and output embeddings) has a copy on each stage that
        uses it, and each copy's gradient covers its own uses: sum them over the pipeline axis, so every
        copy gets the whole gradient and the optimizer keeps the copies equal (Megatron-LM's embedding
        group). Every pipeline rank joins each sum, with zeros where it holds no copy."""
        mine = dict(self.named_parameters())
        for tie in self.tied:
            p = next((mine[n] for n in tie.names if n in mine), None)
            grad = p.grad if p is not None else None
            local = grad.to_local() if isinstance(grad, DTensor) else grad
            buf = local if local is not None else torch.zeros(
                tie.local_shape(p) if p is not None else tie.shape, dtype=tie.dtype, device=self.device)
            dist.all_reduce(buf, group=self.pp_group)
            if p is not None and grad is None:
                p.grad = buf if not isinstance(p, DTensor) else DTensor.from_local(
                    buf, p.device_mesh, p.placements, shape=p.shape, stride=p.stride())

    # ------------------------------------------------------------------ building
    def _build(self, microbatch: tuple[torch.Tensor, ...]) -> TorchSchedule:
        metas = self._infer_metas(microbatch)
        lay, dev = self.layout, self.device
        self.stages = [
            InFlightStage(mod, i, lay.num_stages, dev, group=self.pp_group,
                          input_args=tuple(x.example("meta") for x in metas[i][0]),
                          output_args=tuple(x.example("meta") for x in metas[i][1]))
            for i, mod in self.stage_modules.items()]
        # the stage whose last backward (or weight gradient) is the rank's last operation (its first stage
        # under every schedule here, as planlang's orders say): the sums overlap it, the other stages' start
        # when it begins
        last = lay.last_to_run(dist.get_rank(self.pp_group))
        next(st for st in self.stages if st.stage_index == last).grad_sync = self.grad_sync
        for stage in self.stages:
            stage.grad_buckets = self.grad_sync
        # each microbatch's loss is scaled by 1/m (see the module docstring), so no scaling of grads
        schedule: TorchSchedule
        multi = MULTI_STAGE.get(lay.schedule)
        if multi is not None:
            schedule = multi(self.stages, lay.microbatches, loss_fn=self._scaled, scale_grads=False)
        else:
            cls = ScheduleGPipe if lay.schedule == "gpipe" else Schedule1F1B
            schedule = cls(self.stages[0], lay.microbatches, loss_fn=self._scaled, scale_grads=False)
        self.schedule = schedule
        return schedule

    def _infer_metas(self, microbatch) -> dict[int, tuple[list[_Meta], list[_Meta]]]:
        """Input and output layouts of this rank's stages: one forward of a zero-filled microbatch, stage
        after stage along the pipeline (layouts sent to the next stage's rank). RNG states and buffers
        (batch-norm statistics) are restored afterwards, so training is unaffected."""
        lay, me = self.layout, dist.get_rank(self.pp_group)
        out: dict[int, tuple[list[_Meta], list[_Meta]]] = {}
        devices = [self.device] if self.device.type == "cuda" else []
        for s in range(lay.num_stages):
            if lay.rank_of(s) != me:
                continue
            if s == 0:
                ins = [_Meta.of(x) for x in microbatch]
            elif lay.rank_of(s - 1) == me:
                ins = out[s - 1][1]
            else:
                box: list = [None]
                dist.recv_object_list(box, group=self.pp_group, group_src=lay.rank_of(s - 1))
                ins = box[0]
            mod = self.stage_modules[s]
            saved = {k: b.clone() for k, b in mod.named_buffers()}
            with torch.random.fork_rng(devices=devices), torch.enable_grad():
                args = [x.example(self.device) for x in ins] if s else [x.to(self.device) for x in microbatch]
                result = mod(*args)
            with torch.no_grad():
                for k, b in mod.named_buffers():
                    b.copy_(saved[k])
            results = result if isinstance(result, tuple) else (result,)
            if not all(isinstance(r, torch.Tensor) for r in results):
                raise PipelineError(f"stage {s} returns {type(result).__name__}, not tensors",
                                    "the model's output must be a tensor or a tuple of tensors for the pipeline")
            outs = [_Meta.of(r) for r in results]
            del result, results, args
            out[s] = (ins, outs)
            if s + 1 < lay.num_stages and lay.rank_of(s + 1) != me:
                dist.send_object_list([outs], group=self.pp_group, group_dst=lay.rank_of(s + 1))
        return out


def _with_output(loss_fn: Callable, spec, from_last: tuple[bool, ...] | None = None) -> Callable:
    """The loss of the model's own output (a Hugging Face ModelOutput) from the last stage's tensors."""
    form = model_output(spec, from_last)

    def loss(output, *targets):
        return loss_fn(form(output), *targets)
    return loss


def model_output(spec, from_last: tuple[bool, ...] | None = None) -> Callable[[Any], Any]:
    """The model's own output object (a Hugging Face ModelOutput) from the last stage's tensors of a
    torch.export cut; outputs an earlier stage computed (`from_last` False) are None. Given None (a rank
    without the last stage), the object with every field None."""
    def form(output):
        if output is None:
            return tree_unflatten([None] * spec.num_leaves, spec)
        leaves = list(output) if isinstance(output, tuple) else [output]
        if from_last and len(leaves) < len(from_last):
            mine = iter(leaves)
            leaves = [next(mine) if keep else None for keep in from_last]
        return tree_unflatten(leaves, spec)
    return form


def merge_outputs(chunks: list) -> Any:
    """The last stage's microbatch outputs (tensors or tuples of them) as the batch's: each tensor
    concatenated along dim 0 (the batch, as torch's schedules merge), a 0-dim one stacked (one value per
    microbatch: a scalar of a microbatch is not the batch's)."""
    first = chunks[0]
    if isinstance(first, tuple):
        return tuple(merge_outputs([c[i] for c in chunks]) for i in range(len(first)))
    if isinstance(first, torch.Tensor):
        return torch.cat(chunks) if first.dim() else torch.stack(chunks)
    return first


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


class _ScaledLoss:
    """loss(output, target) / m; without a target, loss(output) / m (the dummy target is ignored); times
    `scale`, the loss scale of the step (f16: planlang.runtime.precision.LossScale)."""

    def __init__(self, fn: Callable[..., torch.Tensor], microbatches: int) -> None:
        self.fn, self.m, self.takes_target, self.scale = fn, microbatches, True, 1.0

    def __call__(self, output, target):
        value = self.fn(output, target) if self.takes_target else self.fn(output)
        if not isinstance(value, torch.Tensor) or value.dim() != 0:
            raise PipelineError(f"the loss returned {type(value).__name__} {getattr(value, 'shape', '')}, "
                                "not a scalar tensor", "make `loss(output, *targets)` return the mean loss")
        return value * (self.scale / self.m) if self.scale != 1.0 else value / self.m


def _batch_size(inputs, target) -> int:
    for t in (*inputs, target):
        if isinstance(t, torch.Tensor) and t.dim() > 0:
            return int(t.shape[0])
    raise PipelineError("step() got no tensor to read the batch size from",
                        "pass the model inputs (and the target) on every rank of the pipeline")


def build_pipeline(model: nn.Module, plan: CompletePlan, groups, *, device: torch.device | str | None = None,
                   loss_fn: Callable[..., torch.Tensor] | None = None,
                   transform_stage: StageTransform | None = None,
                   reduce_grads: bool = True) -> PipelineRunner:
    """This rank's pipeline: split `model` into the plan's stages, keep the ones the rank's pipeline
    coordinate owns, apply `transform_stage(index, module)` to each, and build the schedule.

    `plan` is a validated complete plan (planlang.runtime.apply.load_plan); `groups` is a
    `planlang.runtime.redistribute.MeshGroups` over its mesh. The gradients are averaged over the plan's
    data axes (`plan.dims.data`). The other stages' modules are dropped; their parameters are freed once
    the caller drops `model`."""
    layout = pipeline_layout(plan)
    assert plan.pipeline is not None  # pipeline_layout refused a plan without one
    axis = plan.pipeline.axis
    if loss_fn is None:
        loss_fn = plan_loss(plan, model)
        if loss_fn is None:
            raise PipelineError(
                f"no loss for training: `{plan.model.module if plan.model else 'the model module'}` defines no "
                "`loss(output, *targets)`", "define `loss(output, target)` next to the model factory, or pass "
                "loss_fn")
    if device is None:
        nccl = dist.get_backend() == "nccl"
        device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    device = torch.device(device)
    mine = layout.stages_of(groups.coords[axis])
    all_stages = split_stages(model, plan)
    retie(model, all_stages)
    refuse_sharded_shared(plan, layout, {i: [n for n, _ in all_stages[i].named_parameters(remove_duplicate=False)]
                                         for i in mine},
                          {n: id(q) for i in mine for n, q in all_stages[i].named_parameters(remove_duplicate=False)})
    spec = getattr(all_stages[-1], OUT_SPEC, None)
    user_loss, form = loss_fn, None
    if spec is not None:  # cut from torch.export: the last stage returns the output's tensors
        loss_fn = _with_output(loss_fn, spec, getattr(all_stages[-1], OUT_FROM_LAST, None))
        form = model_output(spec, getattr(all_stages[-1], OUT_FROM_LAST, None))
    # tied parameters of stages on different pipeline ranks (a rank's own stages share one object), and
    # each alias's model name: found before `transform_stage`, whose FSDP2 wrapping (ZeRO-2/3) replaces a
    # stage's parameters with new objects and so unties them from the stages this rank does not hold
    tied = [t for t in tied_parameters(model, all_stages)
            if len({layout.rank_of(i) for i, st in enumerate(all_stages)
                    if any(n in t.names for n, _ in st.named_parameters(remove_duplicate=False))}) > 1]
    first = {id(p): n for n, p in model.named_parameters()}
    canonical = {n: first[id(p)] for n, p in model.named_parameters(remove_duplicate=False) if first[id(p)] != n}
    modules: dict[int, nn.Module] = {}
    for i in mine:
        modules[i] = transform_stage(i, all_stages[i]) if transform_stage is not None else all_stages[i]
    axes = plan.dims.data
    _sync_batch_norms(modules.values(), [groups.group(a) for a in axes if groups.size(a) > 1])
    runner = PipelineRunner(modules, layout, groups.group(axis), loss_fn, device,
                            [groups.group(a) for a in axes], reduce_grads, tied, canonical)
    runner.output_form, runner.user_loss = form, user_loss
    if reduce_grads and any(groups.size(a) > 1 for a in axes):
        trained: list[tuple[str, torch.Tensor]] = [(n, p) for n, p in runner.named_parameters()
                                                   if p.requires_grad]  # (a frozen one takes no hook)
        runner.grad_sync = GradSync(trained, {n: tuple(axes) for n, _ in trained}, groups, mean=True)
        runner.release_grad_buffers = runner.grad_sync.new_buffers
    return runner


def refuse_sharded_shared(plan: CompletePlan, layout: PipelineLayout, names: Mapping[int, list[str]],
                          ids: Mapping[str, int]) -> None:
    """PipelineError when ZeRO-2/3 would shard two stages of one rank that share a parameter (a V's rank 0
    holds the embedding and the head tied to it): each stage becomes an FSDP2 unit of its own, which makes
    its own copy of the parameter, and one copy would then not train. `names`: each of this rank's stages'
    parameter names; `ids`: a name's parameter object."""
    opt = plan.optimizer
    if opt is None or opt.zero_stage < 2 or plan.dims.zero_shards <= 1:
        return
    first: dict[int, tuple[int, str]] = {}
    for stage, stage_names in names.items():
        for n in stage_names:
            k = ids[n]
            if k in first and first[k][0] != stage:
                other, was = first[k]
                raise PipelineError(
                    f"`{was}` (stage {other}) and `{n}` (stage {stage}) are one parameter, and `schedule "
                    f"{layout.schedule}` puts both stages on pipeline rank {layout.rank_of(stage)}: ZeRO-{opt.zero_stage} "
                    "makes each stage an FSDP2 unit with its own copy of it, and one copy would not train",
                    "untie the weights, use `zero = 1`, or a schedule that places those stages on different "
                    "ranks (interleaved, zero_bubble)")
            first.setdefault(k, (stage, n))


def _sync_batch_norms(stages, data_groups: list) -> None:
    """Every BatchNorm a stage calls as a module normalizes its microbatch with the statistics of all the
    data-parallel ranks' microbatches (planlang.runtime.executor.sync_batch_norm: SyncBatchNorm's
    semantics), as the lowering does without a pipeline: with one microbatch that is one process's
    BatchNorm on the batch. (A torch.export cut inlines BatchNorm; `planlang check --model` says so, PL466.)
    In a checkpoint's recomputation it leaves the running statistics alone (updated once per step)."""
    for stage in stages:
        for bn in stage.modules():
            if isinstance(bn, _BatchNorm) and "forward" not in vars(bn):
                _set_forward(bn, functools.partial(_synced_batch_norm, bn, data_groups))


def _set_forward(module: nn.Module, forward: Callable[..., Any]) -> None:
    """Run `forward` as this module's forward (an instance attribute: nn.Module declares `forward` one)."""
    module.forward = forward


def _synced_batch_norm(bn: _BatchNorm, data_groups: list, x: torch.Tensor) -> torch.Tensor:
    if not bn.training:
        return type(bn).forward(bn, x)
    if data_groups:
        return sync_batch_norm(x, bn.weight, bn.bias, bn, data_groups)
    if is_recomputing():
        return batch_norm_recomputed(x, bn.weight, bn.bias, bn)
    return type(bn).forward(bn, x)
