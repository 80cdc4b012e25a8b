"""Which of the model's repeated blocks ZeRO-2/3 can shard as FSDP2 units of their own, read off the lowered
program (planlang.runtime.zero_blocks runs them; `planlang check --model` reports the ones left in the
root unit, PL468, and the estimator prices the units).

A block is one of the model's repeated blocks (planlang.model.capture.trace.module_list_blocks: an outermost
entry of an `nn.ModuleList`, GPT-2's `h.N`, Llama's `model.layers.N`, the modules a plan's `for` loops
over) whose instructions are contiguous in the program, whose parameters are used only there and shared
with no other module, and whose range holds whole checkpoint groups; the others (and everything outside
blocks) stay in the root unit. `block_ranges` says why a candidate was left out.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from planlang.model.program.lowering import Convert, Program, Run
from planlang.model.capture.trace import module_list_blocks


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
            for arg in ins.args:
                v = values.get(arg)
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
