"""Per-rank Python from a lowered `Program` — what `planlang lower PLAN --rank R` prints and what runs.

The generated `step(rt, p, <inputs>, <targets>)` reads every parameter's local piece from `p` (by
FQN), runs each op through `rt.run(name, ...)` (the op's strategy on local pieces, planlang.runtime.
local_ops) and each layout change through `rt.convert(name, x)` (the cost model's conversion path,
planlang.runtime.redistribute), and returns the loss. A checkpoint group becomes a nested function
called through `rt.checkpoint` (torch.utils.checkpoint, non-reentrant). Comments give global shapes,
layouts and local shapes for the rank, so the code reads as the plan's meaning on that rank.

Each value the step computes is deleted (`del`) right after its last use, as torch.fx's own code
generator does: a local variable would otherwise keep every intermediate alive until the step returns,
on top of what autograd saves (measured by bench/runtime_overhead.py: GPT-2 tensor parallel held 1.26x
the native peak before this).

ZeRO-2/3 with one FSDP2 unit per block (planlang.runtime.zero_blocks): each block's instructions become a
nested function `block_k(p, ...)` called through `rt.block(k, block_k, ...)`, which runs it as the
forward of the block's own module, so FSDP2's hooks gather that block's parameters just before and
reshard them just after; the function reads the block's parameters from its own `p`, the step reads
only the others.
"""
from __future__ import annotations

import builtins
import dataclasses
import keyword
import re

from collections.abc import Sequence, Set

from planlang.cost.layout import local_shape
from planlang.model.program.lowering import Convert, Program
from planlang.model.program.pipeline_program import ProgramCut


# Names a value may not take as they are: Python's keywords (and `__debug__`, which cannot be bound),
# builtins (the program may call one), the step's own parameters and the functions it defines. A value
# named so gets a `_` (`lambda` -> `lambda_`).
_RESERVED = frozenset(keyword.kwlist) | frozenset(dir(builtins)) | {"__debug__", "rt", "p", "step", "tail"}
_GENERATED_FUNCTION = re.compile(r"(?:checkpoint|stage)_\d+|block_\w+")


def ident(name: str) -> str:
    """The Python name of a value of the program: `name` itself when it can be one, else with a `_`
    appended. The escape is one-to-one: the `_` goes on every reserved word followed by any number of
    `_`, so `lambda` (-> `lambda_`) and a value named `lambda_` (-> `lambda__`) stay two names."""
    s = re.sub(r"\W", "_", name)
    if not s or s[0].isdigit():
        return "v_" + s
    return s + "_" if _reserved_or_underscored(s) else s


def _reserved_or_underscored(s: str) -> bool:
    """Whether `s` is a reserved name with zero or more `_` after it."""
    while True:
        if s in _RESERVED or _GENERATED_FUNCTION.fullmatch(s):
            return True
        if not s.endswith("_"):
            return False
        s = s[:-1]


def _loc(shape, spec, mesh) -> str:
    return str(list(local_shape(tuple(shape), spec, mesh)))


def generate(prog: Program, rank: int | None = None, coords: dict[str, int] | None = None,
             title: str = "", blocks: Sequence[tuple[int, int, str]] = ()) -> str:
    """Python source of the step for one rank (local shapes depend only on the mesh, not the rank).
    `blocks`: instruction ranges [start, end) run as one module's forward each (the module's dotted
    name; its parameters are read inside), in order, disjoint, each holding whole checkpoint groups."""
    g, mesh = prog.graph, prog.mesh
    inputs = [v for v in g.values.values() if v.kind == "input"]
    params = [v for v in g.values.values() if v.kind == "param"]
    consts = [v for v in g.values.values() if v.kind == "const"]
    lines: list[str] = []
    where = f"rank {rank}" + (f" ({', '.join(f'{a}={c}' for a, c in coords.items())})" if coords else "") \
        if rank is not None else "every rank"
    lines.append(f"# planlang lower{': ' + title if title else ''} — {where}; mesh {mesh}")
    lines.append("# parameters: global shape, layout -> local shape; gradient summed after backward over")
    for v in params:
        spec = prog.param_specs[v.ref]
        sync = prog.grad_sync.get(v.ref, ())
        lines.append(f"#   {v.ref:<32} {str(list(v.shape)):<14} {str(spec):<14} -> {_loc(v.shape, spec, mesh):<14}"
                     + (f" sum over {', '.join(sync)}" if sync else "")
                     + (f"; per head: {prog.blocked[v.ref]}" if v.ref in prog.blocked else ""))
    lines.append("")
    args = ", ".join(["rt", "p"] + [ident(v.name) for v in inputs])
    lines.append(f"def step({args}):")
    for v in inputs:
        spec = prog.input_specs[v.name]
        lines.append(f"    # {v.name}: {v.dtype}{list(v.shape)} {spec} -> local {_loc(v.shape, spec, mesh)}")
    owned = {v.name: name for v in params for _, _, name in blocks if v.ref.startswith(name + ".")}
    for v in params:
        if v.name not in owned:
            lines.append(f"    {ident(v.name)} = p[{v.ref!r}]")
    for v in consts:
        lines.append(f"    {ident(v.name)} = rt.const({v.name!r})")
    body = _statements(prog, 0, len(prog.instructions), {a: (b, name) for a, b, name in blocks}, owned,
                       "    ", {prog.loss, *prog.outputs}, [0])
    lines.extend(body)
    if prog.outputs:  # `pm(...)`'s program: the loss and the model output's leaves (this rank's pieces)
        leaves = "".join(f"{ident(o)}, " for o in prog.outputs)
        lines.append(f"    return {ident(prog.loss)}, ({leaves})")
    else:
        lines.append(f"    return {ident(prog.loss)}")
    return "\n".join(lines) + "\n"


def _statements(prog: Program, start: int, end: int, blocks: dict[int, tuple[int, str]], owned: dict[str, str],
                pad: str, keep: set[str], counter: list[int]) -> list[str]:
    """The statements for instructions [start, end) at indentation `pad`: one line per instruction, a
    nested function per checkpoint group and per block, each value deleted after its last use (`keep`
    stays). `counter` numbers the checkpoint functions across the step."""
    groups = {a: b for a, b in prog.checkpoint_groups}
    units: list[tuple[int, int, str]] = []  # one instruction, a checkpoint group, or a block
    i = start
    while i < end:
        if i in blocks:
            units.append((i, blocks[i][0], "block"))
        elif i in groups:
            units.append((i, groups[i], "checkpoint"))
        else:
            units.append((i, i + 1, "one"))
        i = units[-1][1]
    uses = [_uses(prog.instructions[a:b]) for a, b, _ in units]
    # what each statement binds: a group or block binds only its outputs (the rest is its function's)
    made = [_group_outs(prog, a, b, keep) if kind != "one" else _in_order(prog.instructions[a:b]) for a, b, kind in units]
    free = _frees(uses, made, keep=keep)
    out: list[str] = []
    for k, (a, b, kind) in enumerate(units):
        if kind == "block":
            out.extend(_block(prog, a, b, blocks[a][1], owned, made[k], pad, counter))
        elif kind == "checkpoint":
            out.extend(_checkpoint(prog, a, b, counter[0], made[k], pad))
            counter[0] += 1
        else:
            out.append(pad + _line(prog, prog.instructions[a]))
        if free[k]:
            out.append(f"{pad}del {', '.join(ident(v) for v in free[k])}")
    return out


def _block(prog: Program, start: int, end: int, name: str, owned: dict[str, str], outs: list[str], pad: str,
           counter: list[int]) -> list[str]:
    """A nested function for the block [start, end) of module `name` and its call through `rt.block`."""
    used = [u for u in _uses(prog.instructions[start:end]) if owned.get(u) != name]
    mine = [v for v in prog.graph.values.values() if v.kind == "param" and owned.get(v.name) == name
            and v.name in _uses(prog.instructions[start:end])]
    fn = f"block_{ident(name)}"
    lines = [f"{pad}def {fn}({', '.join(['p'] + [ident(u) for u in used])}):  # {name}: one FSDP2 unit"]
    lines += [f"{pad}    {ident(v.name)} = p[{v.ref!r}]" for v in mine]
    lines += _statements(prog, start, end, {}, owned, pad + "    ", set(outs), counter)
    lines.append(f"{pad}    return {', '.join(ident(o) for o in outs)}{',' if len(outs) == 1 else ''}")
    lines.append(f"{pad}{', '.join(ident(o) for o in outs)}{',' if len(outs) == 1 else ''} = "
                 f"rt.block({name!r}, {fn}{''.join(', ' + ident(u) for u in used)})")
    return lines


def _uses(block) -> list[str]:
    """Values a block of instructions reads that it does not make itself, in order."""
    made: set[str] = set()
    out: list[str] = []
    for ins in block:
        for a in ([ins.value] if isinstance(ins, Convert) else list(ins.args)):
            if a not in made and a not in out:
                out.append(a)
        made.add(ins.out if isinstance(ins, Convert) else ins.node.name)
    return out


def _frees(uses: list[list[str]], made: list[list[str]], keep: set[str]) -> list[list[str]]:
    """For each statement, the values made by the statements that can be dropped after it: those whose
    last use it is (or that it makes and nothing uses). Parameters, inputs and constants are not made
    here and stay; `keep` (the loss, a block's outputs) stays too."""
    ours = {v for m in made for v in m}
    last: dict[str, int] = {}
    for k, m in enumerate(made):
        for v in m:
            last[v] = k
    for k, u in enumerate(uses):
        for v in u:
            if v in ours:
                last[v] = k
    out: list[list[str]] = [[] for _ in made]
    for k, m in enumerate(made):  # keep the order in which values were made
        for v in m:
            if v not in keep:
                out[last[v]].append(v)
    order = [x for m in made for x in m]
    return [sorted(set(f), key=order.index) for f in out]


def _line(prog: Program, ins) -> str:
    mesh = prog.mesh
    if isinstance(ins, Convert):
        steps = ", ".join(str(s) for s in ins.path.steps)
        return (f"{ident(ins.out)} = rt.convert({ins.out!r}, {ident(ins.value)})"
                f"  # {ins.src} -> {ins.dst}: {steps}; local {_loc(ins.shape, ins.dst, mesh)}")
    node = ins.node
    args = ", ".join(ident(a) for a in ins.args)
    how = "opaque, replicated" if ins.strategy is None else ins.strategy.name
    extra = "".join(f"; grad of arg {i} summed over {', '.join(a)}" for i, a in ins.grad_reduce)
    gathered = next((fb for fb in prog.fallbacks if fb.node == ins.node.name), None)
    if gathered is not None:
        extra += f"; PL364: the batch gathered over {', '.join(gathered.axes)}"
    target = dict(node.op.attrs).get("target", "") if node.op.kind == "opaque" else ""
    kind = f"{node.op.kind}:{target}" if target else node.op.kind
    return (f"{ident(node.name)} = rt.run({node.name!r}, {args})"
            f"  # {kind} [{how}] -> {ins.output} local {_loc(node.op.output, ins.output, mesh)}{extra}")


def _checkpoint(prog: Program, start: int, end: int, k: int, outs: list[str], pad: str = "    ") -> list[str]:
    """A nested function for instructions [start, end) and its checkpointed call."""
    block = prog.instructions[start:end]
    used = _uses(block)
    fn = f"checkpoint_{k}"
    lines = [f"{pad}def {fn}({', '.join(ident(u) for u in used)}):  # recomputed in backward"]
    free = _frees([_uses([ins]) for ins in block], [_in_order([ins]) for ins in block], keep=set(outs))
    for ins, drop in zip(block, free):
        lines.append(f"{pad}    " + _line(prog, ins))
        if drop:
            lines.append(f"{pad}    del {', '.join(ident(v) for v in drop)}")
    lines.append(f"{pad}    return {', '.join(ident(o) for o in outs)}{',' if len(outs) == 1 else ''}")
    lines.append(f"{pad}{', '.join(ident(o) for o in outs)}{',' if len(outs) == 1 else ''} = "
                 f"rt.checkpoint({fn}, {', '.join(ident(u) for u in used)})")
    return lines


def _group_outs(prog: Program, start: int, end: int, keep: Set[str] = frozenset()) -> list[str]:
    """The values a checkpoint group (or a block) makes that later instructions, the loss or `keep` (a
    pipeline stage's outputs) read."""
    later = {prog.loss} | set(keep)
    for ins in prog.instructions[end:]:
        later.update([ins.value] if isinstance(ins, Convert) else ins.args)
    return [m for m in _in_order(prog.instructions[start:end]) if m in later]


def _in_order(block) -> list[str]:
    return [ins.out if isinstance(ins, Convert) else ins.node.name for ins in block]


def generate_pipeline(prog: Program, cut: ProgramCut, rank: int | None = None,
                      coords: dict[str, int] | None = None, title: str = "",
                      stages: Sequence[int] | None = None) -> str:
    """Python source of a pipeline plan's stages for one rank (planlang.model.program.pipeline_program): a
    function `stage_<s>(rt, p, <received>)` per stage (those in `stages`, default all) returning the
    values it sends on, and `tail(rt, p, <last stage's outputs>, <targets>)` returning the local loss.
    The program is one microbatch's; every value keeps its lowered layout across stage boundaries."""
    g, mesh = prog.graph, prog.mesh
    where = f"rank {rank}" + (f" ({', '.join(f'{a}={c}' for a, c in coords.items())})" if coords else "") \
        if rank is not None else "every rank"
    lines = [f"# planlang lower{': ' + title if title else ''} — {where}; one microbatch on mesh {mesh} (the "
             "pipeline axis counted 1: its ranks run other stages)"]
    wanted = list(range(len(cut.stages))) if stages is None else list(stages)
    last = len(cut.stages) - 1
    for st in cut.stages:
        if st.index in wanted:
            lines.append("")
            lines.extend(_stage_function(prog, f"stage_{st.index}", list(st.instructions), st.inputs, st.outputs,
                                         st.params))
    if last in wanted:
        lines.append("")
        tail_params = tuple(v.ref for k in cut.tail for a in _uses([prog.instructions[k]])
                            if (v := g.values.get(a)) is not None and v.kind == "param")
        lines.extend(_stage_function(prog, "tail", list(cut.tail), cut.tail_inputs + cut.targets, (prog.loss,),
                                     tuple(dict.fromkeys(tail_params))))
    return "\n".join(lines) + "\n"


def _stage_function(prog: Program, name: str, indices: list[int], inputs: Sequence[str], outputs: Sequence[str],
                    params: Sequence[str]) -> list[str]:
    """`def name(rt, p, *inputs)`: the instructions `indices` (a subsequence of the program, with the
    checkpoint groups inside it) returning `outputs`."""
    mesh = prog.mesh
    sub_groups = []
    pos = {k: i for i, k in enumerate(indices)}
    for a, b in prog.checkpoint_groups:
        if a in pos and all(k in pos for k in range(a, b)):
            sub_groups.append((pos[a], pos[b - 1] + 1))
    sub = dataclasses.replace(prog, instructions=[prog.instructions[k] for k in indices],
                              checkpoint_groups=sub_groups, loss="")
    lines = [f"def {name}({', '.join(['rt', 'p'] + [ident(v) for v in inputs])}):"]
    for v in inputs:
        spec = prog.layouts.get(v)
        val = prog.graph.values.get(v)
        if spec is not None and val is not None:
            lines.append(f"    # {v}: {val.dtype}{list(val.shape)} {spec} -> local {_loc(val.shape, spec, mesh)}")
    by_ref = {v.ref: v for v in prog.graph.params()}
    for ref in params:
        lines.append(f"    {ident(by_ref[ref].name)} = p[{ref!r}]")
    for c in prog.graph.values.values():
        if c.kind == "const" and any(c.name in _uses([ins]) for ins in sub.instructions):
            lines.append(f"    {ident(c.name)} = rt.const({c.name!r})")
    lines.extend(_statements(sub, 0, len(sub.instructions), {}, {}, "    ", set(outputs) | set(inputs), [0]))
    outs = ", ".join(ident(o) for o in outputs)
    lines.append(f"    return {outs}{',' if len(outputs) == 1 and name != 'tail' else ''}")
    return lines
