"""What one rank's lowered program holds in memory, measured by running it on the meta device.

The estimator (planlang.model.price.estimate) simulates the model's own code with local parameter shapes. The
planlang runtime runs something else: the lowered per-rank program, which may split ops the plan leaves
open over any axis (a language-model head and its loss over the batch across tp), convert layouts, free
values after their last use and sum gradients in buckets. To estimate what runs, `measure` runs that
program: `planlang.apply` of the plan on rank 0 of its world under torch's fake process group (its
collectives do nothing; torchtitan's dry runs use the same), with the model, inputs and targets on the
meta device (no memory, no compute), for three training steps (forward, loss, backward, gradient sums,
the plan's optimizer step, zero_grad) under planlang.model.capture.simulate's live-bytes tracker. The last step
is the figure, as bench/memory_measure.py measures a real step after two warm-up steps.

Where the program cannot run so, `measure` returns the reason and the estimator keeps its simulation of
the model's code, saying which (a pipeline: its stages run the model's own modules, which the simulation
follows; ZeRO-2/3: FSDP2 does not run on meta; a process group already in this process).
"""
from __future__ import annotations

import contextlib
import io
import threading
import warnings
from dataclasses import dataclass
from typing import Callable

from planlang.lang.parser import no_cycle_collection
from planlang.plan.complete import CompletePlan, plan_model, world_size

# the runtime's imports (torch.distributed's FSDP, DTensor, pipelining: ~0.3 CPU-s more of a model command's
# start) make many objects and almost no garbage: no cycle collections while they load (as validation's)
with no_cycle_collection():
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from planlang.model.capture.load import build_model, plan_loss
    from planlang.model.program.lowering import Program
    from planlang.model.capture.simulate import Existing, LiveBytes, fused_attention

    from .apply import apply
    from .verify import make_batch, plan_optimizer

STEPS = 3
_LOCK = threading.Lock()  # one fake process group at a time (the language server checks on threads)


@dataclass(frozen=True)
class ProgramMemory:
    """Rank 0's bytes in the last of the measured steps."""

    parameters: int  # the rank's parameters as they rest between steps
    kept: int  # what else lives between steps: optimizer state, module buffers, persistent runtime buffers
    activations: int  # what the forward adds and keeps until backward (saved tensors, the loss)
    peak: int  # parameters + kept + the most the step adds at once
    phase: str = "backward"  # where that is: "backward" (forward, backward, gradient sums) or "optimizer step"


def reason_not_measured(plan: CompletePlan) -> str | None:
    """Why `measure` cannot run the plan's program (None when it can)."""
    if plan.pipeline is not None and plan.dims.tensor:
        return ("a pipeline x tensor-parallel plan's stage programs are not run on meta yet (the simulation "
                "uses each stage's tensor-parallel local shapes)")
    if plan.pipeline is not None:
        return "a pipeline's stages run the model's own modules"
    if plan.dims.fsdp:
        return "ZeRO-2/3 runs as FSDP2, which does not run on the meta device"
    if dist.is_available() and dist.is_initialized():
        return "this process already has a process group"
    return None


def measure(plan: CompletePlan, lowered: Program | Callable[[], Program] | None = None) -> ProgramMemory | str:
    """Run rank 0's program of `plan` on meta (see the module docstring): its memory, or why not.
    `lowered`: the plan's program when the caller lowered it (validation), so it is not lowered again, or
    a function making it (a copy: made only when the program runs)."""
    why = reason_not_measured(plan)
    if why is not None:
        return why
    if callable(lowered):
        lowered = lowered()
    world = world_size(plan)
    with _LOCK, warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
        try:
            return _run(plan, lowered)
        except Exception as err:  # noqa: BLE001 - the estimate falls back to the model's code, saying why
            return f"rank 0's program did not run on meta ({type(err).__name__}: {str(err)[:160]})"
        finally:
            dist.destroy_process_group()


def _run(plan: CompletePlan, lowered: Program | None = None) -> ProgramMemory:
    model = build_model(plan_model(plan), plan.path, device="meta")
    loss_fn = plan_loss(plan)
    inputs, targets = make_batch(model, plan, loss_fn, 0)
    inputs = [t.to("meta") for t in inputs]
    targets = tuple(t.to("meta") for t in targets)
    pm = apply(model, plan, loss_fn=loss_fn, targets=targets or None, device="meta", strict=False, program=lowered)
    if pm.microbatches > 1:  # gradient accumulation: the program is one microbatch's, the batch its first
        inputs, targets = _first_microbatch(pm, [*inputs, *targets], len(inputs))
    opt = plan_optimizer(pm, plan)
    params = list(pm.parameters())
    buffers = list(pm.buffers())
    existing = Existing([*params, *buffers, *inputs, *targets])
    mode = LiveBytes(existing)
    fwd = 0
    with fused_attention(), mode:
        for step in range(STEPS):
            if step == STEPS - 1:
                mode.reset_peak()
                start = mode.live
            loss = pm.step_loss(*inputs, *targets)  # step's program: no output kept alive
            fwd = mode.live
            loss.backward()
            del loss
            pm.sync_grads()
            backward_peak = mode.peak
            opt.step()
            opt.zero_grad(set_to_none=True)
    param_bytes = sum(p.numel() * p.element_size() for p in {id(p): p for p in params}.values())
    buffer_bytes = sum(b.numel() * b.element_size() for b in buffers)
    return ProgramMemory(param_bytes, buffer_bytes + start, max(0, fwd - start),
                         param_bytes + buffer_bytes + mode.peak,
                         "backward" if backward_peak >= mode.peak else "optimizer step")


def _first_microbatch(pm, args: list, n_inputs: int) -> tuple[list, tuple]:
    """The first microbatch of a step's inputs and targets (ParallelModel.microbatch_inputs): a step of
    several runs one at a time, each to its peak, the gradients in their persistent buckets between."""
    first = pm.microbatch_inputs(args)[0]
    return list(first[:n_inputs]), tuple(first[n_inputs:])
