"""ZeRO-2/3 with one FSDP2 unit per repeated block (ZeRO §5.3; torchtitan's `fully_shard` per layer).

`planlang.apply` does not run the model's modules: it runs the lowered program, a flat list of
instructions (planlang.runtime.codegen). FSDP2 gathers a unit's parameters in the forward pre-hook of
the unit's module and frees them in its forward hook, so a block module wrapped by `fully_shard` would
never see a call. Here each block's slice of the program is run *as that module's forward*:

    instructions   0..4     wte, wpe, add, drop              root unit (`fully_shard(pm)`)
                   5..31    h.0.*  -> block_h_0(p, x)        unit `h.0`: rt.block("h.0", block_h_0, x)
                   32..58   h.1.*  -> block_h_1(p, x)        unit `h.1`
                   59..65   ln_f, lm_head, loss              root unit

`rt.block(name, fn, *xs)` calls the block module with `fn` standing in for its `forward` for that one
call: FSDP2's pre-hook all-gathers the block's parameters (and, with the prefetch set here, issues the
next block's all-gather), `fn` reads the block's gathered parameters from the module and runs its
instructions, the post-hook reshards (ZeRO-3) and registers the pre-backward hook on the outputs, which
gathers the block again in backward (prefetching the block before it), and the block's gradients are
reduce-scattered as soon as its backward ends. So at most about two blocks' parameters are whole at once
instead of the model's.

Which blocks qualify, and why the others stay in the root unit, is planlang.model.program.zero_units.block_ranges
(`planlang check --model` reports those left out: PL468).
"""
from __future__ import annotations

from typing import Callable

from torch import nn

from planlang.model.program.zero_units import Block, block_ranges  # noqa: F401 - part of this module's API


class BlockCaller:
    """`rt.block`: runs a block's function as its module's forward, so FSDP2's module hooks gather and
    free the block's parameters around it. `scale(fqn, p)` wraps a parameter as the step reads it
    (ParallelModel's gradient scale)."""

    def __init__(self, model: nn.Module, scale: Callable) -> None:
        self.model = model
        self.scale = scale

    def __call__(self, name: str, fn: Callable, *xs):
        module = self.model.get_submodule(name)

        def forward(*args):
            # inside the hooks: the block's parameters are the gathered ones now
            p = {f"{name}.{n}": self.scale(f"{name}.{n}", t)
                 for n, t in module.named_parameters(remove_duplicate=False)}
            return fn(p, *args)

        module.forward = forward  # an instance attribute: nn.Module.__call__ runs it between the hooks
        try:
            return module(*xs)
        finally:
            del module.forward
