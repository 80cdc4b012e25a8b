"""`PlanTrainer`: Hugging Face `transformers.Trainer` whose loop runs a model under a plan (docs/hf_trainer.md).

    trainer = PlanTrainer(model, "my.plan", args=TrainingArguments(...), train_dataset=..., eval_dataset=...)
    trainer.train(); trainer.evaluate(); trainer.save_model()

The model is built the same way on every rank; `__init__` runs `planlang.apply(model, plan)` and keeps
the result as `trainer.pm`. Trainer keeps its loop (epochs, logging, callbacks, evaluation and save
strategies, its lr scheduler); what it would hand to Accelerate runs through the plan instead:

    Trainer                           PlanTrainer
    accelerator.prepare(model, ...)   nothing: no DDP / FSDP / DeepSpeed wrapping, planlang placed the model
    create_optimizer                  pm.optimizer() (the plan's; `optimizer_cls_and_kwargs=` replaces its class
                                      and arguments, the ZeRO wrapping stays the plan's)
    create_scheduler                  Trainer's own, on that optimizer
    training_step                     pm.step(*inputs, *labels): forward, backward, gradient sums
    gradient_accumulation_steps > 1   refused: the plan's `microbatches N` accumulates inside pm.step
    max_grad_norm                     pm.clip_grad_norm_ (the whole model's norm over every rank's pieces)
    prediction_step                   pm.eval(); the loss-only forward under no_grad (pipelines: pm.evaluate)
    save_model                        pm.full_state_dict() gathered, save_pretrained on rank 0
    checkpoints (save_steps, resume)  planlang.save / planlang.load of the model, optimizer and scheduler

Data: every rank's loader yields the same global batch (per_device_train_batch_size is the plan's batch;
the sampler is seeded the same on every rank) and planlang keeps each rank's piece; each batch is checked
to be the same on every rank (one all-reduce of two checksums per tensor).
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import transformers
from torch import nn
from torch.distributed.fsdp import FSDPModule

from planlang.plan import types as T
from planlang.plan.data import batch_dim
from planlang.runtime.apply import PlanError, apply, load_plan
from planlang.runtime.save_load import load, save

IGNORE_INDEX = -100  # cross_entropy's default ignore_index, HF's label for "no loss here"
CHECKPOINT_DIR = "planlang"  # inside a Trainer checkpoint folder: the planlang.save directory
# TrainingArguments that would make Trainer or Accelerate do what the plan decides (field -> why refused)
_REFUSED = {
    "fp16": "the plan's `precision` sets dtypes, autocast and the loss scale",
    "bf16": "the plan's `precision` sets dtypes, autocast and the loss scale",
    "fsdp": "the plan's `zero` shards parameters, gradients and optimizer state",
    "deepspeed": "the plan's `zero` shards parameters, gradients and optimizer state",
    "gradient_checkpointing": "the plan's `checkpoint` statements choose what is recomputed",
    "activation_checkpointing": "the plan's `checkpoint` statements choose what is recomputed",
    "label_smoothing_factor": "the loss is the plan's",
    "neftune_noise_alpha": "the forward is the plan's program",
    "torch_compile": "the forward is the plan's program",
    "load_best_model_at_end": "Trainer would load the whole tensors into this rank's pieces; resume from "
                              "trainer.state.best_model_checkpoint instead (planlang.load)",
}


def _as_is(*objs: Any, **_: Any) -> Any:
    """Accelerate's prepare / prepare_model under a plan: nothing is wrapped or moved."""
    return objs[0] if len(objs) == 1 else objs


class PlanTrainer(transformers.Trainer):
    """`transformers.Trainer` running `model` under `plan` (a .plan path or a Plan value) on this rank.

    `model` is the single-process model, built the same way (same seed or weights) on every rank;
    torch.distributed must be initialised (`planlang run`, torchrun). `label_names` (TrainingArguments,
    default Trainer's: `labels` for HF models) are the batch keys passed as the loss's targets after the
    plan's inputs (by name). The other Trainer arguments are Trainer's; those the plan decides instead
    (precision, FSDP, DeepSpeed, checkpointing, label smoothing, gradient accumulation) are refused."""

    def __init__(self, model: nn.Module, plan: T.Plan | str | Path, args: transformers.TrainingArguments,
                 *, loss_fn=None, targets: tuple[torch.Tensor, ...] | None = None, **kwargs: Any) -> None:
        _refuse(args, kwargs)
        self.plan = load_plan(plan)
        first = self.plan.inputs[0]
        self.plan_batch = first.shape[batch_dim(first)]
        if args.per_device_train_batch_size != self.plan_batch:
            raise PlanError(f"per_device_train_batch_size is {args.per_device_train_batch_size}; under a plan every "
                            f"rank reads the global batch (planlang keeps its piece): set it to the plan's "
                            f"batch, {self.plan_batch} (input `{first.name}`)")
        # Accelerate's state first (args.device): under torchrun it starts the process group when the script
        # did not, and on GPUs picks this rank's (cuda:LOCAL_RANK), where apply then places the pieces
        device = args.device
        nccl = dist.is_initialized() and dist.get_backend() == "nccl"
        self.pm = apply(model, plan, loss_fn=loss_fn, targets=targets, device=device if nccl else None)
        self.input_names = [i.name for i in self.plan.inputs]
        super().__init__(model=model, args=args, **kwargs)
        self.gather_function = _as_is

    # ------------------------------------------------------------------ no Accelerate wrapping
    def create_accelerator_and_postprocess(self) -> None:
        super().create_accelerator_and_postprocess()
        # the model is planlang's (its pieces placed, its gradients summed by the plan), the optimizer
        # the plan's (ZeroRedundancyOptimizer's state_dict cannot be read per rank as Accelerate does), the
        # loaders give every rank the global batch, and every rank's loss is already the global one
        self.accelerator.prepare = _as_is
        self.accelerator.prepare_model = _as_is
        self.accelerator.gather_for_metrics = _as_is

    def _move_model_to_device(self, model: nn.Module, device: torch.device) -> None:
        pass  # apply placed each piece on this rank's device

    def _wrap_model(self, model: nn.Module, training: bool = True, dataloader=None) -> nn.Module:
        return model

    def get_total_train_batch_size(self, args: transformers.TrainingArguments) -> int:
        return self._train_batch_size  # the global batch: every rank reads all of it

    def _get_train_sampler(self, train_dataset=None):
        strategy = self.args.train_sampling_strategy
        if strategy == "sequential":
            return super()._get_train_sampler(train_dataset)
        if strategy != "random":
            raise PlanError(f"train_sampling_strategy={strategy!r}: under a plan every rank reads the same global "
                            "batches; use 'random' (seeded alike on every rank) or 'sequential'")
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        if dataset is None or not hasattr(dataset, "__len__"):
            return None
        seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
        return torch.utils.data.RandomSampler(dataset, generator=torch.Generator().manual_seed(seed))

    # ------------------------------------------------------------------ optimizer
    def create_optimizer(self, model=None) -> torch.optim.Optimizer:
        if self.optimizer is None:
            if self.optimizer_cls_and_kwargs is not None:
                cls, kw = self.optimizer_cls_and_kwargs
                self.optimizer = self.pm.optimizer(cls, **kw)
            else:
                self.optimizer = self.pm.optimizer()
                if self.is_world_process_zero():
                    transformers.logging.get_logger(__name__).warning(
                        "PlanTrainer: the plan's optimizer %s steps (TrainingArguments' optim, learning_rate, "
                        "weight_decay and adam_* do not apply; pass optimizer_cls_and_kwargs= to replace it)",
                        self.plan.optimizer)
        return self.optimizer

    # ------------------------------------------------------------------ a step
    def plan_args(self, inputs: Mapping[str, Any], step: bool = True) -> list[torch.Tensor]:
        """The collator's batch as the plan's step arguments: its inputs by name, then the label keys.
        `step`: for pm.step (the plan's microbatches), else for one forward (evaluation)."""
        missing = [n for n in self.input_names if n not in inputs]
        if missing:
            raise PlanError(f"the batch has keys {sorted(inputs)}; the plan's input(s) {missing} are not among them")
        # a label the plan declares as an input (the model computes its own loss) is passed as that input
        labels = [k for k in self.label_names if inputs.get(k) is not None and k not in self.input_names]
        extra = [k for k in inputs if k not in self.input_names and k not in labels]
        for k in extra:
            t = inputs[k]
            # HF's default attention mask is all ones: a mask of ones is the model's own default
            if k == "attention_mask" and isinstance(t, torch.Tensor) and bool((t == 1).all()):
                continue
            raise PlanError(f"batch key `{k}` is neither one of the plan's inputs ({', '.join(self.input_names)}) "
                            f"nor a label ({', '.join(self.label_names) or 'none'}): declare it as a plan "
                            f"`input`, or leave it out of the collator's batch"
                            + (" (an attention mask with zeros: padding needs the mask as a plan input)"
                               if k == "attention_mask" else ""))
        # (a pipeline's evaluation runs the schedule's microbatches too; another plan's, one forward)
        m = self.plan.microbatches if step or self.plan.pipeline is not None else 1
        for k in [k for k in self.label_names if inputs.get(k) is not None] if m > 1 else []:
            t = inputs[k]
            # the lowered cross_entropy divides by the tokens not ignored in the batch it runs: one microbatch,
            # and the step is the mean of its microbatches' means, not the batch's token mean
            if isinstance(t, torch.Tensor) and not t.is_floating_point() and bool((t == IGNORE_INDEX).any()):
                raise PlanError(f"label `{k}` holds {IGNORE_INDEX} (ignored tokens: padding, masked prompts) and the "
                                f"plan runs a step as {m} microbatches: its loss is the mean of their means, not "
                                "the batch's mean over its tokens; give every token a label, or use a plan "
                                "without microbatches")
        out = [inputs[n] for n in self.input_names] + [inputs[k] for k in labels]
        same_on_every_rank(out)
        return out

    def training_step(self, model: nn.Module, inputs: dict[str, Any], num_items_in_batch=None) -> torch.Tensor:
        """pm.step on the batch: forward, backward and the gradient sums; the global loss."""
        self.pm.train()
        self.pm.zero_grad()  # (a pipeline's stages hold other tensors than `model`: Trainer zeroes `model`)
        loss = self.pm.step(*self.plan_args(inputs))
        return loss.detach().to(self.args.device)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        raise PlanError("under a plan the loss is the plan's: PlanTrainer runs pm.step (training_step) and "
                        "pm.evaluate (prediction_step), not compute_loss")

    def _clip_grad_norm(self, model: nn.Module) -> torch.Tensor:
        return self.pm.clip_grad_norm_(self.args.max_grad_norm)

    def _get_grad_norm(self, model: nn.Module, grad_norm=None):
        return self.pm.clip_grad_norm_(float("inf")) if grad_norm is None else grad_norm

    def prediction_step(self, model: nn.Module, inputs: dict[str, Any], prediction_loss_only: bool,
                        ignore_keys: list[str] | None = None):
        """The plan's loss of the batch, forward only, in eval mode: (loss, None, None)."""
        if not prediction_loss_only:
            raise PlanError("under a plan evaluation gives the loss only (the plan's program returns no logits): "
                            "drop compute_metrics (or set prediction_loss_only=True); predict() is not supported")
        self.pm.eval()
        return eval_loss(self.pm, self.plan_args(inputs, step=False)).detach().to(self.args.device), None, None

    # ------------------------------------------------------------------ saving
    def _resharded(self) -> None:
        """ZeRO-2/3: every FSDP2 unit back to its shards. A forward outside a training step (evaluate)
        leaves the root unit (never resharded after forward) holding its gathered parameters as plain
        tensors, which the gathers below would read as if they were its shards (and alias)."""
        for m in self.pm.modules() if isinstance(self.pm, nn.Module) else ():
            if isinstance(m, FSDPModule):
                m.reshard()

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """save_pretrained of the whole model on rank 0: the parameters gathered from every rank's pieces."""
        self._resharded()
        full = self.pm.full_state_dict()  # every rank takes part; rank 0 gets the tensors
        super()._save(output_dir, state_dict=full if self.args.should_save else None)

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        """A Trainer checkpoint's training state: planlang.save of the model, optimizer and scheduler
        (DCP: every rank writes its pieces; loads under any plan of the same model)."""
        self._resharded()
        save(self.pm, self.optimizer, os.path.join(output_dir, CHECKPOINT_DIR), scheduler=self.lr_scheduler)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        # the parameters come back with the optimizer (_load_optimizer_and_scheduler): the checkpoint's
        # safetensors hold whole tensors, this rank's model its pieces
        if not os.path.isdir(os.path.join(resume_from_checkpoint, CHECKPOINT_DIR)):
            raise PlanError(f"{resume_from_checkpoint} has no `{CHECKPOINT_DIR}` directory: PlanTrainer resumes "
                            "from checkpoints PlanTrainer wrote (save_only_model=False)")

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        if checkpoint is None:
            return
        load(self.pm, self.optimizer, os.path.join(checkpoint, CHECKPOINT_DIR), scheduler=self.lr_scheduler)


def eval_loss(pm, args: list[torch.Tensor]) -> torch.Tensor:
    """The global loss of one batch, forward only: a pipeline's forward-only schedule (`pm.evaluate`), else
    the loss-only program (`step_loss`, which keeps no output alive) under no_grad, else `pm(...)`'s loss."""
    if hasattr(pm, "evaluate"):
        return pm.evaluate(*args)
    with torch.no_grad():
        out = pm.step_loss(*args) if hasattr(pm, "step_loss") else pm(*args)
    return out if isinstance(out, torch.Tensor) else out.loss


def _refuse(args: transformers.TrainingArguments, kwargs: Mapping[str, Any]) -> None:
    """A PlanError for each Trainer setting the plan decides instead."""
    wrong = [f"{k}={getattr(args, k)!r}: {why}" for k, why in _REFUSED.items() if getattr(args, k, None)]
    if args.gradient_accumulation_steps != 1:
        wrong.append(f"gradient_accumulation_steps={args.gradient_accumulation_steps}: write `microbatches "
                     f"{args.gradient_accumulation_steps}` in the plan (pm.step accumulates over them) and give "
                     "per_device_train_batch_size the whole step's batch")
    if kwargs.get("compute_loss_func") is not None:
        wrong.append("compute_loss_func: the loss is the plan's (the model module's `loss`, or apply's loss_fn=)")
    if kwargs.get("model_init") is not None:
        wrong.append("model_init: pass the model built the same way on every rank")
    if wrong:
        raise PlanError("PlanTrainer: the plan decides these, not TrainingArguments:\n  " + "\n  ".join(wrong))


def same_on_every_rank(tensors: list[torch.Tensor]) -> None:
    """A PlanError unless every rank holds the same tensors (two checksums each, one all-reduce): every
    rank must read the same global batch, or planlang's pieces come from different samples."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    sums = []
    for t in tensors:
        flat = t.detach().reshape(-1).double()
        sums += [flat.sum(), (flat * torch.arange(1, flat.numel() + 1, dtype=torch.float64,
                                                 device=flat.device)).sum()]
    local = torch.stack(sums)
    both = torch.cat([local, -local]).to("cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    n = local.numel()
    if not torch.equal(both[:n], -both[n:]):
        raise PlanError("the ranks read different batches: under a plan every rank's data loader must yield the "
                        "same global batch (the same dataset, sampler seed and order on every rank)")


__all__ = ["PlanTrainer", "same_on_every_rank", "CHECKPOINT_DIR"]
