"""Lowering a plan onto a model's op graph: a layout for every value, a strategy for every op, and the
conversions between them — the per-rank program before code generation (map §6.2).

Parameters take the layouts the plan's `shard` rules give (replicated otherwise); inputs take their
`data` specs (targets follow the input whose batch they share). Ops are visited in topological order;
each takes the strategy of planlang.cost.ops that minimises

    compute (flops / device throughput) + the strategy's own communication
    + the conversion of every input from its current layout to what the strategy needs
    + the conversion of the output to the layout an `output of MODULE` rule pins (if any)

with conversions priced by planlang.cost.layout (forward + backward). The plan's pins and parameter
specs are constraints; everything between them is this greedy choice, which reproduces Megatron's
placement of the all-reduce for the stdlib patterns. Every choice is data (`Program`), so the solver,
`planlang lower` and the bytes-moved check all read the same thing.

Gradient convention (planlang.cost.layout): the gradient of a local piece is the piece of the global
gradient, partial axes read as replicated. A strategy that splits work over an axis an input is not
split on leaves that input's local gradient partial over the axis (`grad_partial`); activations are
reduced at the use, parameters once per step over the axes every use shares (`Program.grad_sync`),
which is where data-parallel gradient averaging lives.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from planlang.cost.layout import Path, is_valid, local_shape, normalize
from planlang.cost.ops.base import DTYPE_BYTES, Strategy, UnknownOp
from planlang.cost.ops.einsum import INT_DTYPES
from planlang.cost.ops.per_sample import call_name, has_batch_statistics, is_per_sample
from planlang.model.program import shared_lowering
from planlang.model.program.fallbacks import (  # noqa: F401 - Fallback, Replicated: this module's API too
    Fallback, Replicated, gathered_over_data, gathered_over_model_axes)
from planlang.model.program.head_blocks import Blocked, find_blocked, mark_blocked
from planlang.model.program.pricer import Pricer
from planlang.model.capture.opgraph import OpGraph, OpNode
from planlang.plan.checkpoints import checkpoint_groups
from planlang.plan.complete import CompleteMesh, CompletePlan
from planlang.plan.data import with_data_axes
from planlang.plan.types import Mesh, Spec


class LoweringError(ValueError):
    """The plan cannot be lowered onto this model (the message names the cause and the fix)."""


@dataclass(frozen=True)
class Convert:
    """Change `value` (global shape `shape`) from layout `src` to `dst`; the result is `out`."""

    value: str
    out: str
    shape: tuple[int, ...]
    src: Spec
    dst: Spec
    path: Path
    itemsize: int = 4

    def __str__(self) -> str:
        steps = ", ".join(str(s) for s in self.path.steps) or "no-op"
        return f"{self.out} = convert({self.value}: {self.src} -> {self.dst})  # {steps}"


@dataclass(frozen=True)
class Run:
    """Run op `node` with `strategy` on the local pieces `args` (values after conversion)."""

    node: OpNode
    strategy: Strategy | None  # None for opaque ops (replicated inputs, replicated output)
    args: tuple[str, ...]
    grad_reduce: tuple[tuple[int, tuple[str, ...]], ...] = ()  # (input, axes) reduced at this use

    @property
    def output(self) -> Spec:
        if self.strategy is None:
            return Spec(tuple(() for _ in self.node.op.output))
        return self.strategy.output


@dataclass
class Program:
    """The lowered step: layouts, instructions in order, per-parameter gradient reductions."""

    graph: OpGraph
    mesh: CompleteMesh
    param_specs: dict[str, Spec]  # param FQN -> layout
    input_specs: dict[str, Spec]  # input Value name -> layout
    instructions: list[Convert | Run]
    layouts: dict[str, Spec]  # every value (incl. converted ones) -> layout
    grad_sync: dict[str, tuple[str, ...]]  # param FQN -> axes its gradient is summed over after backward
    loss: str = ""
    checkpoint_groups: list[tuple[int, int]] = field(default_factory=list)  # instruction index ranges
    fallbacks: list[Fallback] = field(default_factory=list)  # ops that gather the batch (PL364)
    replicated: list[Replicated] = field(default_factory=list)  # opaque ops run whole over tp (PL367)
    blocked: dict[str, Blocked] = field(default_factory=dict)  # param FQN -> stored per head (head_blocks.py)
    # a program lowered with the model's output (`pm(...)`): the values of its tensor leaves, in order (a
    # leaf the plan pins is read after its pin's conversion), and how they build it (graph.output_tree)
    outputs: tuple[str, ...] = ()


# ------------------------------------------------------------------------------ plan facts
def plan_mesh(plan: CompletePlan) -> CompleteMesh:
    """The mesh the plan lowers onto; LoweringError when it declares none."""
    if plan.mesh is None:
        raise LoweringError("the plan declares no mesh")
    return plan.mesh


def _without_unit_axes(spec: Spec, mesh: CompleteMesh | None = None) -> Spec:
    """The spec without axes of size 1 (splitting over one device is no split)."""
    def keep(a: str) -> bool:
        return mesh is None or mesh.size_of(a) > 1

    return Spec(tuple(tuple(a for a in spec.axes_of(i) if keep(a)) for i in range(spec.rank)),
                tuple(a for a in spec.partial if keep(a)))


def param_specs(plan: CompletePlan, graph: OpGraph) -> dict[str, Spec]:
    """The plan's layout of every parameter; replicated by default. Two statements that select one
    parameter with different specs are PL310 (no precedence: planlang.plan.shard_overlaps), so a checked
    plan gives each parameter at most one spec."""
    params = {v.ref: v for v in graph.params()}
    names = list(params)
    out = {n: Spec(tuple(() for _ in params[n].shape)) for n in names}
    for rule in plan.shards:
        if rule.kind != "param":
            continue
        for hit in rule.target.select(names):
            spec = _without_unit_axes(rule.spec, plan.mesh)
            if spec.rank != len(params[hit].shape):
                raise LoweringError(f"`{rule}`: {hit} has {len(params[hit].shape)} dims; fix the spec "
                                    "(`planlang check --model` reports this as PL361)")
            out[hit] = spec
    return out


def input_specs(plan: CompletePlan, graph: OpGraph) -> dict[str, Spec]:
    specs: dict[str, Spec] = {}
    inputs = [v for v in graph.values.values() if v.kind == "input"]
    declared = {d.input: _without_unit_axes(d.spec, plan.mesh) for d in plan.data}
    for v in inputs:
        if v.ref in declared:
            specs[v.name] = declared[v.ref]
    batch = {plan_in.shape[0]: specs[plan_in.name] for plan_in in plan.inputs
             if plan_in.name in specs and plan_in.shape}
    for v in inputs:
        if v.name in specs:
            continue
        lead = batch.get(v.shape[0]) if v.shape else None
        if lead is not None and lead.axes_of(0):
            specs[v.name] = Spec((lead.axes_of(0),) + tuple(() for _ in v.shape[1:]))  # a target: same batch split
        else:
            specs[v.name] = Spec(tuple(() for _ in v.shape))
    return specs


def output_pins(plan: CompletePlan, graph: OpGraph) -> dict[str, Spec]:
    """Value name -> layout an `output of MODULE` rule requires (data axes added on the batch dim)."""
    mesh = plan_mesh(plan)
    outs = graph.module_outputs()
    names = list(outs)
    axes = plan.dims.batch  # the data axes of more than one device (a split over one device is none)
    pins: dict[str, Spec] = {}
    for rule in plan.shards:
        if rule.kind != "output":
            continue
        for hit in rule.target.select(names):
            pin = with_data_axes(_without_unit_axes(rule.spec, mesh), axes)
            shape = graph.values[outs[hit]].shape
            if len(shape) == pin.rank and not is_valid(shape, pin, mesh):
                # said here, at the statement: otherwise the op making it finds no strategy and names neither
                raise LoweringError(f"`{rule}`: the output of `{hit}` {list(shape)} cannot be laid out as {pin} "
                                    f"on {mesh} (the data axes are implicit on its batch dim; a dim does not "
                                    "divide): `planlang check --model` reports this as PL362")
            pins[outs[hit]] = pin
    return pins


# ------------------------------------------------------------------------------ lowering
def lower(graph: OpGraph, plan: CompletePlan) -> Program:
    """The plan's program on `graph` (the module docstring); inside planlang.model.program.shared_lowering's
    scope, a program already lowered from what this one reads is shared."""
    shared = shared_lowering.active()
    return _lower(graph, plan) if shared is None else shared.lower(graph, plan, _lower)


def _lower(graph: OpGraph, plan: CompletePlan) -> Program:
    mesh = plan_mesh(plan)
    pricer = Pricer(mesh)
    pspecs = param_specs(plan, graph)
    # fused projections cut into heads: stored per head, so the cut needs no gather (head_blocks.py)
    blocked, marked = find_blocked(graph, pspecs, mesh)
    graph = mark_blocked(graph, marked)
    ispecs = input_specs(plan, graph)
    pins = output_pins(plan, graph)
    daxes = set(plan.dims.batch)
    pricer.daxes = daxes
    layouts: dict[str, Spec] = {}
    for v in graph.values.values():
        if v.kind == "param":
            layouts[v.name] = pspecs[v.ref]
        elif v.kind == "input":
            layouts[v.name] = ispecs[v.name]
        elif v.kind == "const":
            layouts[v.name] = Spec(tuple(() for _ in v.shape))
    for name, spec in layouts.items():
        shape = graph.values[name].shape
        if not is_valid(shape, spec, mesh):
            raise LoweringError(f"`{graph.values[name].ref or name}` {list(shape)} cannot be laid out as {spec} "
                                f"on mesh {mesh} (a dim does not divide); fix the spec")
    instructions: list[Convert | Run] = []
    counter = [0]
    converted: dict[tuple[str, Spec], str] = {}  # reuse a conversion within the step
    current: dict[str, str] = {}  # value -> the local value consumers read (after a pin's conversion)
    base_of: dict[str, str] = {}  # converted value -> graph value

    def convert(value: str, dst: Spec) -> str:
        value = current.get(value, value)
        src = layouts[value]
        if normalize(src, mesh) == normalize(dst, mesh):
            return value
        key = (value, normalize(dst, mesh))
        if key in converted:
            return converted[key]
        v = graph.values[base_of.get(value, value)]
        item = DTYPE_BYTES.get(v.dtype, 4)
        path = pricer.path(v.shape, src, dst, item)
        if path is None:
            raise LoweringError(f"no conversion of `{value}` {list(v.shape)} from {src} to {dst} on {mesh}")
        counter[0] += 1
        out = f"{value}__{counter[0]}"
        instructions.append(Convert(value, out, v.shape, src, dst, path, item))
        layouts[out] = dst
        converted[key] = out
        base_of[out] = v.name
        return out

    fallbacks: list[Fallback] = []
    replicated: list[Replicated] = []
    batch_sizes = {graph.values[n].shape[0] for n, s in ispecs.items() if s.dims and daxes & set(s.axes_of(0))}
    batch_axes = next((tuple(a for a in s.axes_of(0) if a in daxes and mesh.size_of(a) > 1)
                       for s in ispecs.values() if s.dims and daxes & set(s.axes_of(0))), ())
    for node in graph.nodes:
        in_vals = [graph.values[i] for i in node.inputs]
        if node.op.kind == "opaque":
            now = [layouts[current.get(v.name, v.name)] for v in in_vals]
            per_sample = per_sample_strategy(node, in_vals, now, mesh, batch_axes if node.op.output and
                                             node.op.output[0] in batch_sizes else ())
            target = str(node.op.attr("target", "?"))
            if per_sample is None:
                wanted = [Spec(tuple(() for _ in v.shape)) for v in in_vals]
                args = tuple(convert(i, want) for i, want in zip(node.inputs, wanted))
                run = Run(node, None, args)
                gathered = gathered_over_data(in_vals, now, daxes, mesh)
                if gathered:
                    fallbacks.append(Fallback(node.name, node.module, target,
                                              tuple(a for a in mesh.names if a in gathered[0]), gathered[1]))
            else:
                wanted = list(per_sample.inputs)
                args = tuple(convert(i, want) for i, want in zip(node.inputs, wanted))
                run = Run(node, per_sample, args, _grad_reduce(per_sample))
            whole = gathered_over_model_axes(in_vals, now, wanted, daxes, mesh)
            if whole:
                replicated.append(Replicated(node.name, node.module, target, *whole))
        else:
            pin = pins.get(node.name)
            # parameters are used in the layout the plan stores them in (a bias may still be added on one
            # coordinate of a partial axis): the plan's specs are the parallelisation, not a suggestion;
            # and the batch stays split over the data axes: no activation is converted over a data axis
            # (the language's rule: data axes are implicit on the batch dim of every activation)
            fixed = [k for k, v in enumerate(in_vals) if v.kind == "param"]
            now = [layouts[current.get(v.name, v.name)] for v in in_vals]
            try:
                cands, faithful, keeps_data = pricer.kept(
                    node.op, in_vals, [layouts[v.name] if k in fixed else now[k] for k, v in enumerate(in_vals)],
                    now, fixed)
            except UnknownOp as e:
                raise LoweringError(str(e)) from e
            # an output whose dim 0 is the batch is split over the data axes wherever a strategy can: after
            # an op that had to gather the batch, and where whole values (a parameter) grow a batch dim
            resplit = [s for s in keeps_data if _splits_batch(s.output, daxes)] \
                if node.op.output and node.op.output[0] in batch_sizes else []
            pool = resplit or keeps_data or faithful or cands
            if pin is not None:
                # a pinned output is computed in its layout where a strategy can make it so (the module
                # runs as the plan says, as parallelize_module runs it); converted after the op otherwise
                pool = [s for s in pool if normalize(s.output, mesh) == normalize(pin, mesh)] or pool
            best, best_cost = None, math.inf
            for s in pool:
                c = s.flops / pricer.peak + s.comm_seconds
                for v, want in zip(in_vals, s.inputs):
                    c += pricer.cost(v.shape, layouts[current.get(v.name, v.name)], want, DTYPE_BYTES.get(v.dtype, 4))
                    if c >= best_cost:
                        break
                if pin is not None and c < best_cost:
                    c += pricer.cost(node.op.output, s.output, pin, node.op.itemsize)
                if c < best_cost:
                    best, best_cost = s, c
            if best is None:
                raise LoweringError(f"no strategy of `{node.op.kind}` at {node.module or 'top level'} fits the "
                                    f"layouts {', '.join(str(layouts[i]) for i in node.inputs)}")
            args = tuple(convert(i, want) for i, want in zip(node.inputs, best.inputs))
            run = Run(node, best, args, _grad_reduce(best))
        instructions.append(run)
        layouts[node.name] = run.output
        if node.name in pins:
            current[node.name] = convert(node.name, pins[node.name])

    instructions = _defer_to_parameters(graph, instructions, layouts, mesh)
    origin = _origins(instructions)
    grad_sync = _param_grad_sync(graph, instructions, origin, mesh)
    instructions = [_drop_deferred(ins, graph, origin, grad_sync) for ins in instructions]
    loss = current.get(graph.outputs[0], graph.outputs[0]) if graph.outputs else ""
    outputs: tuple[str, ...] = ()
    if graph.output_tree is not None:
        if len(graph.outputs) != 1 + graph.output_tree.n_tensors:
            raise LoweringError(f"the model's output has {graph.output_tree.n_tensors} tensors, of which "
                                f"{len(graph.outputs) - 1} are computed in the step; `pm(...)` returns outputs "
                                "computed from the inputs and parameters only (use `pm.step`)")
        outputs = tuple(current.get(o, o) for o in graph.outputs[1:])
    return Program(graph, mesh, pspecs, ispecs, instructions, layouts, grad_sync, loss, fallbacks=fallbacks,
                   blocked=blocked, outputs=outputs, replicated=replicated)


def _grad_reduce(strategy: Strategy) -> tuple[tuple[int, tuple[str, ...]], ...]:
    """The inputs whose local gradient `strategy` leaves partial, with the axes (its `grad_partial`:
    (input, axes) pairs), those over no axis left out: `Run.grad_reduce`."""
    grad = dict(strategy.extra).get("grad_partial", ())
    if not isinstance(grad, tuple):
        raise TypeError(f"{strategy.name}: grad_partial is a {type(grad).__name__}, not (input, axes) pairs")
    return tuple((i, axes) for i, axes in grad if axes)


def per_sample_strategy(node, in_vals, layouts: list[Spec], mesh: CompleteMesh,
                        batch_axes: tuple[str, ...] = ()) -> Strategy | None:
    """The local-batch strategy of an opaque op known to act per sample (planlang.cost.ops.per_sample):
    dim 0 of the output and of every activation input of the output's rank that has the output's dim 0
    split as the first such input is now; lower-rank and size-1 inputs (broadcast), parameters and
    constants whole, except a constant with the output's dim 0 (an attention mask expanded to the
    batch), split as the activations are (a local slice); every other dim whole. `batch_axes`: the data
    axes of the batch when the output's dim 0 is the batch; if no activation input is split there, inputs
    with that dim 0 are split over them. None when the op is not known per-sample, the batch is not
    split, or an activation input has another leading size."""
    target = str(node.op.attr("target", ""))
    if not (is_per_sample(target) or has_batch_statistics(target)) or not node.op.output:
        return None
    out = node.op.output

    def leading(kinds) -> list[int]:
        return [k for k, v in enumerate(in_vals)
                if v.kind not in kinds and len(v.shape) == len(out) and v.shape and v.shape[0] == out[0]]

    acts = leading(("param", "const"))
    axes = tuple(a for a in layouts[acts[0]].axes_of(0) if mesh.size_of(a) > 1) if acts else ()
    if not axes and batch_axes:
        axes = batch_axes
    # a constant with the batch's leading size (an attention mask expanded to the batch: BERT's and T5's)
    # is split with the activations, a local slice: whole, it would meet the local batch (a shape error)
    batch = leading(("param",)) if axes else acts
    if not batch or not axes:
        return None
    for v in in_vals:
        if v.kind not in ("param", "const") and len(v.shape) == len(out) and v.shape and v.shape[0] not in (1, out[0]):
            return None
    specs = tuple(Spec((axes,) + tuple(() for _ in v.shape[1:])) if k in batch else Spec(tuple(() for _ in v.shape))
                  for k, v in enumerate(in_vals))
    ospec = Spec((axes,) + tuple(() for _ in out[1:]))
    # whole inputs used on every rank's own samples: their gradients are partial sums over the axes
    grad = tuple((k, axes) for k in range(len(in_vals)) if k not in batch)
    name = "batch statistics over " + ", ".join(axes) if has_batch_statistics(target) else "per sample"
    return Strategy(f"{name} ({call_name(target)})", specs, ospec, extra=(("grad_partial", grad),))


def _splits_batch(spec: Spec, daxes: set[str]) -> bool:
    """Whether dim 0 of a layout is split over every data axis."""
    return bool(spec.dims) and daxes <= set(spec.axes_of(0))


def _origins(instructions) -> dict[str, tuple[str, set[str]]]:
    """Converted value -> (the value it was converted from originally, the axes the conversions touch)."""
    origin: dict[str, tuple[str, set[str]]] = {}
    for ins in instructions:
        if isinstance(ins, Convert):
            base, axes = origin.get(ins.value, (ins.value, set()))
            origin[ins.out] = (base, axes | {st.axis for st in ins.path.steps})
    return origin


def _defer_to_parameters(graph: OpGraph, instructions: list, layouts: dict[str, Spec], mesh: Mesh) -> list:
    """Move an at-use gradient sum of an activation made from parameters alone to those parameters.

    GPT-2's position embedding is looked up with replicated positions from a replicated table, then
    added to the batch-split token embeddings: its gradient is partial over the data axes, summed in
    backward by a blocking all-reduce where the add reads it. A gradient's backward through an op is
    linear in the gradient and, when every input of the op is the same on every rank of the axes,
    the same function on each rank: sum(vjp(x, g_r)) = vjp(x, sum(g_r)). So the sum can be taken of the
    parameters' gradients instead, once per step in the overlapped buckets (Program.grad_sync), off
    backward's critical path. Done when the activation has that one use, its op's inputs are parameters
    (no conversion) or integer values (no gradient), all replicated over the axes, and the parameters are
    no larger than the activation (the bucket then sends no more than the blocking sum did)."""
    readers: dict[str, int] = {}
    for ins in instructions:
        for a in ([ins.value] if isinstance(ins, Convert) else ins.args):
            readers[a] = readers.get(a, 0) + 1
    made = {ins.node.name: k for k, ins in enumerate(instructions) if isinstance(ins, Run)}
    out = list(instructions)

    def replicated(name: str, axes) -> bool:
        spec = layouts.get(name)
        return spec is not None and not (set(spec.used_axes()) | set(spec.partial)) & set(axes)

    def local_bytes(name: str) -> int:
        v = graph.values[name]
        return math.prod(local_shape(v.shape, layouts[name], mesh)) * DTYPE_BYTES.get(v.dtype, 4)

    for k, ins in enumerate(instructions):
        if not isinstance(ins, Run) or not ins.grad_reduce:
            continue
        keep = []
        for i, axes in ins.grad_reduce:
            a = ins.args[i]
            src = out[made[a]] if a in made else None
            params = [j for j, b in enumerate(src.args) if graph.values.get(b) is not None
                      and graph.values[b].kind == "param"] if src is not None else []
            others = [b for j, b in enumerate(src.args) if j not in params] if src is not None else []
            if (src is None or readers.get(a) != 1 or not params
                    or any(graph.values.get(b) is None or graph.values[b].dtype not in INT_DTYPES for b in others)
                    or not all(replicated(b, axes) for b in src.args) or not replicated(a, axes)
                    or sum(local_bytes(src.args[j]) for j in params) > local_bytes(a)):
                keep.append((i, axes))
                continue
            have = dict(src.grad_reduce)
            out[made[a]] = src = Run(src.node, src.strategy, src.args, tuple(sorted(
                {**have, **{j: tuple(x for x in mesh.names if x in set(have.get(j, ())) | set(axes))
                            for j in params}}.items())))
        out[k] = Run(ins.node, ins.strategy, ins.args, tuple(keep))
    return out


def _param_grad_sync(graph: OpGraph, instructions, origin, mesh: Mesh) -> dict[str, tuple[str, ...]]:
    """Axes each parameter's gradient is summed over once per step, after backward: those every use
    leaves partial and no conversion of the parameter crosses (a sum over an axis commutes with the
    linear backward of collectives over other axes, so deferring it is exact)."""
    uses: dict[str, list[set[str]]] = {v.name: [] for v in graph.params()}
    touched: dict[str, set[str]] = {v.name: set() for v in graph.params()}
    for ins in instructions:
        if not isinstance(ins, Run):
            continue
        red = dict(ins.grad_reduce)
        for i, a in enumerate(ins.args):
            base, axes = origin.get(a, (a, set()))
            if base in uses:
                uses[base].append(set(red.get(i, ())))
                touched[base] |= axes
    out = {}
    names = mesh.names  # a property that builds its tuple: read once, not once per parameter
    for v, per_use in uses.items():
        if not per_use:
            continue
        common = set.intersection(*per_use) - touched[v]
        out[graph.values[v].ref] = tuple(a for a in names if a in common)
    return out


def _drop_deferred(ins, graph: OpGraph, origin, grad_sync: dict[str, tuple[str, ...]]):
    """Remove the per-step parameter reductions from the at-use reductions of a Run."""
    if not isinstance(ins, Run) or not ins.grad_reduce:
        return ins
    new = []
    for i, axes in ins.grad_reduce:
        v = graph.values.get(origin.get(ins.args[i], (ins.args[i], set()))[0])
        if v is not None and v.kind == "param":
            axes = tuple(a for a in axes if a not in grad_sync.get(v.ref, ()))
        if axes:
            new.append((i, axes))
    return Run(ins.node, ins.strategy, ins.args, tuple(new))


def mark_checkpoints(prog: Program, plan: CompletePlan) -> list[tuple[int, int]]:
    """Each checkpoint group as the range of instructions from its first op to its last."""
    modules = list(prog.graph.module_outputs())  # a dict keeps the order modules first appear in
    groups = list(checkpoint_groups(plan.checkpoints, modules, modules))
    # an instruction is a group's when one of the group's modules is its module or a dotted prefix of it:
    # each instruction's prefixes looked up once (a scan of the program per group was O(groups x program))
    of_module: dict[str, set[int]] = {}
    for k, group in enumerate(groups):
        for m in group:
            of_module.setdefault(m, set()).add(k)
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, ins in enumerate(prog.instructions):
        if isinstance(ins, Run):
            parts = ins.node.module.split(".")
            for n in range(len(parts), 0, -1):
                for k in of_module.get(".".join(parts[:n]), ()):
                    first.setdefault(k, i)
                    last[k] = i
    ranges = [(first[k], last[k] + 1) for k in range(len(groups)) if k in first]
    ranges.sort()
    for (a, b), (c, d) in zip(ranges, ranges[1:]):
        if c < b:
            raise LoweringError(f"checkpoint groups overlap in execution (instructions {a}-{b} and {c}-{d}); "
                                "make the groups disjoint")
    return ranges


# ------------------------------------------------------------------------------ gradient flow
def gradient_flow(prog: Program) -> tuple[dict[str, bool], set[str]]:
    """(value -> requires grad, the values that receive a gradient in backward) of a lowered step:
    floating parameters require grad, and a value does when any input of the op making it does; the
    gradient flows back from the loss through what requires it."""
    g = prog.graph
    req: dict[str, bool] = {}
    for v in g.values.values():
        if v.kind == "param":
            req[v.name] = v.dtype not in INT_DTYPES
        elif v.kind in ("input", "const"):
            req[v.name] = False
    for ins in prog.instructions:
        if isinstance(ins, Convert):
            req[ins.out] = req.get(ins.value, False)
        else:
            out = g.values.get(ins.node.name)
            req[ins.node.name] = (out.dtype if out else ins.node.op.dtype) not in INT_DTYPES and any(
                req.get(a, False) for a in ins.args)
    grad: set[str] = {prog.loss} if req.get(prog.loss, False) else set()
    for ins in reversed(prog.instructions):
        if isinstance(ins, Convert):
            if ins.out in grad and req.get(ins.value, False):
                grad.add(ins.value)
        elif ins.node.name in grad:
            grad.update(a for a in ins.args if req.get(a, False))
    return req, grad


def trained_parameters(prog: Program) -> set[str]:
    """The FQNs of the parameters backward gives a gradient (those the loss depends on): the runtime's
    gradient sums cover these alone (planlang.runtime.grad_sync's buckets, and traffic's prediction)."""
    origin = {ins.out: base for ins, base in _conversion_bases(prog.instructions)}
    got = {origin.get(v, v) for v in gradient_flow(prog)[1]}
    return {v.ref for v in prog.graph.params() if v.name in got}


def _conversion_bases(instructions):
    base: dict[str, str] = {}
    for ins in instructions:
        if isinstance(ins, Convert):
            base[ins.out] = base.get(ins.value, ins.value)
            yield ins, base[ins.out]
