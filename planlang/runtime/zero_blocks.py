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

A block is one of the model's repeated blocks (planlang.model.trace.module_list_blocks: an outermost
entry of an `nn.ModuleList`, GPT-2's `h.N`, Llama's `model.layers.N`, the modules a plan's `for` loops
over) whose instructions are contiguous in the program, whose parameters
are used only there and shared with no other module, and whose range holds whole checkpoint groups;
the others (and everything outside blocks) stay in the root unit. `block_ranges` says why a candidate
was left out.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch import nn

from planlang.model.lowering import Convert, Program, Run
from planlang.model.trace import module_list_blocks


@dataclass(frozen=True)
class Block:
    """A block's instructions [start, end) and its module's dotted name."""

    start: int
    end: int
    name: str


def _inside(module: str, name: str) -> bool:
    return module == name or module.startswith(name + ".")


def block_ranges(model: nn.Module, prog: Program) -> tuple[list[Block], dict[str, str]]:
    """The blocks the program can run one FSDP2 unit each, in execution order, and for every other
    candidate module the reason it stays in the root unit."""
    values = prog.graph.values
    aliases: dict[int, set[str]] = {}
    for fqn, p in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), set()).add(fqn)
    uses: dict[str, list[int]] = {}  # parameter FQN -> instructions reading it
    for i, ins in enumerate(prog.instructions):
        if isinstance(ins, Run):
            for a in ins.args:
                v = values.get(a)
                if v is not None and v.kind == "param":
                    uses.setdefault(v.ref, []).append(i)
    blocks, skipped = [], {}
    for name in module_list_blocks(model):
        own = [f for f, _ in model.get_submodule(name).named_parameters(prefix=name, remove_duplicate=False)]
        runs = [i for i, ins in enumerate(prog.instructions) if isinstance(ins, Run) and _inside(ins.node.module, name)]
        if not own:
            skipped[name] = "no parameters"
            continue
        if not runs:
            skipped[name] = "no instruction of the program runs it"
            continue
        a, b = min(runs), max(runs) + 1
        stray = next((ins for ins in prog.instructions[a:b] if isinstance(ins, Run)
                      and not _inside(ins.node.module, name)), None)
        shared = next((f for f in own for p in [model.get_parameter(f)] if aliases[id(p)] - set(own)), None)
        outside = next((f for f in own for i in uses.get(f, ()) if not a <= i < b), None)
        crossing = next(((c, d) for c, d in prog.checkpoint_groups
                         if c < b and a < d and not (a <= c and d <= b)), None)
        if stray is not None:
            skipped[name] = f"its instructions are interleaved with `{stray.node.module}`'s"
        elif shared is not None:
            skipped[name] = f"its parameter `{shared}` is shared with another module"
        elif outside is not None:
            skipped[name] = f"its parameter `{outside}` is read outside its instructions"
        elif crossing is not None:
            skipped[name] = "a checkpoint group crosses its boundary"
        elif not _reads_after(prog, a, b):
            skipped[name] = "nothing after it reads what it computes"
        else:
            blocks.append(Block(a, b, name))
    blocks.sort(key=lambda blk: blk.start)
    return blocks, skipped


def _reads_after(prog: Program, start: int, end: int) -> bool:
    made = {ins.out if isinstance(ins, Convert) else ins.node.name for ins in prog.instructions[start:end]}
    later = {prog.loss}
    for ins in prog.instructions[end:]:
        later.update([ins.value] if isinstance(ins, Convert) else ins.args)
    return bool(made & later)


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
