"""Per-rank Python from a lowered `Program` — what `planlang lower PLAN --rank R` prints and what runs.

The generated `step(rt, p, <inputs>, <targets>)` reads every parameter's local piece from `p` (by
FQN), runs each op through `rt.run(name, ...)` (the op's strategy on local pieces, planlang.runtime.
local_ops) and each layout change through `rt.convert(name, x)` (the cost model's conversion path,
planlang.runtime.redistribute), and returns the loss. A checkpoint group becomes a nested function
called through `rt.checkpoint` (torch.utils.checkpoint, non-reentrant). Comments give global shapes,
layouts and local shapes for the rank, so the code reads as the plan's meaning on that rank.
"""
from __future__ import annotations

import keyword
import re

from planlang.cost.layout import local_shape
from planlang.runtime.lowering import Convert, Program


def ident(name: str) -> str:
    s = re.sub(r"\W", "_", name)
    if not s or s[0].isdigit() or keyword.iskeyword(s):
        s = "v_" + s
    return s


def _loc(shape, spec, mesh) -> str:
    return str(list(local_shape(tuple(shape), spec, mesh)))


def generate(prog: Program, rank: int | None = None, coords: dict[str, int] | None = None,
             title: str = "") -> str:
    """Python source of the step for one rank (local shapes depend only on the mesh, not the rank)."""
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
                     + (f" sum over {', '.join(sync)}" if sync else ""))
    lines.append("")
    args = ", ".join(["rt", "p"] + [ident(v.name) for v in inputs])
    lines.append(f"def step({args}):")
    for v in inputs:
        spec = prog.input_specs[v.name]
        lines.append(f"    # {v.name}: {v.dtype}{list(v.shape)} {spec} -> local {_loc(v.shape, spec, mesh)}")
    for v in params:
        lines.append(f"    {ident(v.name)} = p[{v.ref!r}]")
    for v in consts:
        lines.append(f"    {ident(v.name)} = rt.const({v.name!r})")
    groups = {start: end for start, end in prog.checkpoint_groups}
    body: list[str] = []
    i = 0
    n_groups = 0
    while i < len(prog.instructions):
        if i in groups:
            end = groups[i]
            body.extend(_checkpoint(prog, i, end, n_groups))
            n_groups += 1
            i = end
            continue
        body.append("    " + _line(prog, prog.instructions[i]))
        i += 1
    lines.extend(body)
    lines.append(f"    return {ident(prog.loss)}")
    return "\n".join(lines) + "\n"


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
    target = dict(node.op.attrs).get("target", "") if node.op.kind == "opaque" else ""
    kind = f"{node.op.kind}:{target}" if target else node.op.kind
    return (f"{ident(node.name)} = rt.run({node.name!r}, {args})"
            f"  # {kind} [{how}] -> {ins.output} local {_loc(node.op.output, ins.output, mesh)}{extra}")


def _checkpoint(prog: Program, start: int, end: int, k: int) -> list[str]:
    """A nested function for instructions [start, end) and its checkpointed call."""
    block = prog.instructions[start:end]
    made = set()
    for ins in block:
        made.add(ins.out if isinstance(ins, Convert) else ins.node.name)
    used: list[str] = []
    for ins in block:
        for a in ([ins.value] if isinstance(ins, Convert) else list(ins.args)):
            if a not in made and a not in used:
                used.append(a)
    later = set()
    for ins in prog.instructions[end:]:
        later.update([ins.value] if isinstance(ins, Convert) else ins.args)
    later.add(prog.loss)
    outs = [m for m in _in_order(block) if m in later]
    fn = f"checkpoint_{k}"
    lines = [f"    def {fn}({', '.join(ident(u) for u in used)}):  # recomputed in backward"]
    for ins in block:
        lines.append("        " + _line(prog, ins))
    lines.append(f"        return {', '.join(ident(o) for o in outs)}{',' if len(outs) == 1 else ''}")
    lines.append(f"    {', '.join(ident(o) for o in outs)}{',' if len(outs) == 1 else ''} = "
                 f"rt.checkpoint({fn}, {', '.join(ident(u) for u in used)})")
    return lines


def _in_order(block) -> list[str]:
    return [ins.out if isinstance(ins, Convert) else ins.node.name for ins in block]
