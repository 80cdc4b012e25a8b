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
    names = module_list_blocks(model)
    # each block's instructions and each value's last reader, in one pass each (a scan per block was
    # O(blocks x instructions): 80 blocks of Llama-3-70B over ~4,700 instructions, twice per check)
    runs_of: dict[str, list[int]] = {name: [] for name in names}
    run_count = [0]  # Run instructions before index i
    for i, ins in enumerate(prog.instructions):
        if isinstance(ins, Run):
            for name in _enclosing(ins.node.module, runs_of):
                runs_of[name].append(i)
        run_count.append(run_count[-1] + isinstance(ins, Run))
    last_read = _last_reads(prog)
    blocks, skipped = [], {}
    for name in names:
        own = [f for f, _ in model.get_submodule(name).named_parameters(prefix=name, remove_duplicate=False)]
        runs = runs_of[name]
        if not own:
            skipped[name] = "no parameters"
            continue
        if not runs:
            skipped[name] = "no instruction of the program runs it"
            continue
        a, b = runs[0], runs[-1] + 1
        stray = None
        if run_count[b] - run_count[a] != len(runs):  # a Run in [a, b) not of this block: the first one
            stray = next((ins for ins in prog.instructions[a:b] if isinstance(ins, Run)
                          and not _inside(ins.node.module, name)), None)
        own_set = set(own)
        shared = next((f for f in own for p in [model.get_parameter(f)] if aliases[id(p)] - own_set), None)
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
        elif not _reads_after(prog, a, b, last_read):
            skipped[name] = "nothing after it reads what it computes"
        else:
            blocks.append(Block(a, b, name))
    blocks.sort(key=lambda blk: blk.start)
    return blocks, skipped


def _enclosing(module: str, names: dict[str, list[int]]) -> list[str]:
    """The names among `names` that `module` is inside (`_inside`): the module and its dotted prefixes."""
    parts = module.split(".")
    prefixes = (".".join(parts[:k]) for k in range(len(parts), 0, -1))
    return [p for p in prefixes if p in names]


def _last_reads(prog: Program) -> dict[str, int]:
    """Each value's last reader: the index of the last instruction reading it."""
    last: dict[str, int] = {}
    for i, ins in enumerate(prog.instructions):
        for v in ([ins.value] if isinstance(ins, Convert) else ins.args):
            last[v] = i
    return last


def _reads_after(prog: Program, start: int, end: int, last_read: dict[str, int]) -> bool:
    """Whether something from `end` on (or the loss) reads a value the instructions [start, end) make."""
    made = {ins.out if isinstance(ins, Convert) else ins.node.name for ins in prog.instructions[start:end]}
    return prog.loss in made or any(last_read.get(v, -1) >= end for v in made)
