"""The intra-op sharding problem of a model: op graph + mesh -> ILP instance -> specs.

`build_problem(graph, mesh, ...)` turns a `planlang.model.capture.opgraph.OpGraph` into an `ilp.Instance`:

* every op is a node whose options are `planlang.cost.ops.strategies(op, mesh)` (an op without a rule,
  such as "opaque", gets one all-replicated option); compute = local forward flops x (1 + backward
  ratio) at the device's throughput, comm = the strategy's own forward and backward collectives;
* every parameter is a node whose options are its layouts (`enumerate_layouts`, no partial); its
  memory is the local bytes of the parameter, its gradient and the optimizer states;
* every model input is a node whose options are its layouts, or just the plan's `data` spec;
* every use of a value is an edge priced by `conversion_path`'s search (exact, forward + backward)
  from the producer's layout to the layout the consumer's strategy takes.

Repeated blocks repeat the same ops: strategies and priced options are computed once per distinct op,
edge matrices once per distinct (value shape, option lists), and conversions by one search per source
layout over a numbered graph of a shape's layouts (layout_graph.py), so building grows with the number of
distinct ops rather than with depth; the nodes of a block share their option tuples and matrices.

Data-parallel gradient synchronisation is charged once, by the op that uses the parameter: when a
strategy splits a letter the weight lacks (the batch) over an axis, the weight's local gradient is a
partial sum over that axis and the strategy's `backward` prices its all-reduce on the local gradient
bytes (planlang.cost.ops.einsum.grad_allreduces) - the ring all-reduce of size(W) per step that plain
data parallelism pays (min-memory-redundancy-ilp §2.2.1). The parameter node itself has no
communication, so nothing is counted twice. A parameter stored split over an axis its user needs it
replicated on pays the all-gather on the edge (ZeRO-3 style), and the op still all-reduces the whole
gradient (a reduce-scatter would do): that case is over-charged by at most the all-reduce/reduce-
scatter difference. A parameter used by several ops (tied weights) pays one all-reduce per use.

Memory (per device, at each step = each op in topological order):
  parameters + gradients + optimizer states (live throughout)
  + activations: a value is live from its producer to its last consumer; one a consumer saves for
    backward (`OpKind.saves`) stays live to the end of the forward pass, where the peak of a step without
    recomputation is (backward then frees saved activations in reverse order; activation gradients
    are not modelled)
  + converted copies: an input converted to the consumer's layout lives during the consumer, and to
    the end of forward when the consumer saves it.
Views (reshape, transpose, split, ...) alias their base: their outputs cost nothing and keep the base
alive. A tensor that is live and also saved in the same layout by a consumer is counted once; a saved
tensor whose consumer converts it counts in both layouts (an over-estimate of the producer's copy).
"""
from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from planlang.cost.comm import Collective, CommCost, compute_time, price
from planlang.cost.layout import conversion_path, enumerate_layouts, is_valid, local_numel, normalize
from planlang.cost.ops import OpKind, OpSpec, Strategy, UnknownOp, op_kind, strategies
from planlang.cost.ops.base import DTYPE_BYTES
from planlang.plan.types import Mesh, Spec, is_hole

from .ilp import Edge, Instance, Node, Option, Result, SolveOptions, Step, solve
from .layout_graph import (  # noqa: F401 - LayoutGraph, layout_graph and costs_from are part of this module's API
    LayoutGraph, comm_volume, costs_from, edge_matrices, layout_graph,
)

if TYPE_CHECKING:
    from planlang.model.capture.opgraph import OpGraph, Value

# what the solver assumes of an op without registered facts (an opaque call): it keeps every input
_OPAQUE = OpKind("opaque", lambda op, mesh: [])


def facts(kind: str) -> OpKind:
    """The registry's facts of `kind` (planlang.cost.ops.OpKind), or the opaque call's."""
    try:
        return op_kind(kind)
    except UnknownOp:
        return _OPAQUE


def saved_inputs(kind: str, n_inputs: int) -> tuple[int, ...]:
    """The input slots an op keeps for backward; an opaque call keeps every input, as far as the solver
    can tell."""
    f = facts(kind)
    return tuple(range(n_inputs)) if f is _OPAQUE else f.saves


class IntraOpError(ValueError):
    """The graph, mesh or a user-given spec cannot be turned into an ILP (message says why and how)."""


def optimizer_state_elements(name: str | None) -> float:
    """fp32 state elements per parameter element (Adam: 2 moments); the estimator's table."""
    if not name:
        return 0.0
    # lazy: torch loads only when this runs
    from planlang.model.price.estimate import STATE_ELEMENTS

    return float(STATE_ELEMENTS.get(name, 2))


# ------------------------------------------------------------------------------ problem
@dataclass
class Problem:
    """The instance plus what its options mean: specs for params/inputs, strategies for ops."""

    instance: Instance
    mesh: Mesh
    kinds: dict[str, str]  # node -> "param" | "input" | "op"
    layouts: dict[str, list[Spec]]  # param / input node -> its option layouts
    strategies: dict[str, list[Strategy]]  # op node -> its options
    refs: dict[str, str]  # node -> parameter FQN / input name
    build_seconds: float = 0.0

    def __str__(self) -> str:
        n = {k: sum(1 for v in self.kinds.values() if v == k) for k in ("op", "param", "input")}
        return (f"intra-op problem on {self.mesh}: {n['op']} ops, {n['param']} params, {n['input']} inputs; "
                f"{self.instance}")

    def output_spec(self, node: str, option: int) -> Spec:
        if self.kinds[node] == "op":
            return self.strategies[node][option].output
        return self.layouts[node][option]


@dataclass
class Solution:
    """The solved specs, by parameter FQN, input name and activation (op value) name."""

    params: dict[str, Spec]
    inputs: dict[str, Spec]
    activations: dict[str, Spec]
    strategies: dict[str, Strategy]  # op node -> chosen strategy (the layouts it takes its inputs in)
    result: Result
    problem: Problem = field(repr=False)

    def __str__(self) -> str:
        lines = [str(self.result)]
        lines += [f"shard {k} : {v}" for k, v in self.params.items()]
        return "\n".join(lines)

    def shard_lines(self) -> list[str]:
        """`shard` statements for every parameter in planlang syntax; parameters of repeated blocks
        that agree share one line with `[*]`."""
        by_pattern: dict[str, list[tuple[str, Spec]]] = {}
        for fqn, spec in self.params.items():
            by_pattern.setdefault(block_pattern(fqn), []).append((fqn, spec))
        lines = []
        for pattern, members in by_pattern.items():
            if len(members) > 1 and len({spec for _, spec in members}) == 1:
                lines.append(f"shard {plan_name(pattern)} : {members[0][1]}")
            else:
                lines += [f"shard {plan_name(fqn)} : {spec}" for fqn, spec in members]
        return lines


def _itemsize(dtype: str) -> int:
    return DTYPE_BYTES.get(dtype, 4)


def _replicated(rank: int) -> Spec:
    return Spec(tuple(() for _ in range(rank)))


def _fallback(op: OpSpec, mesh: Mesh) -> list[Strategy]:
    """One all-replicated option for an op without a sharding rule (run on gathered inputs)."""
    return [Strategy("replicate (no rule)", tuple(_replicated(len(s)) for s in op.inputs), _replicated(len(op.output)),
                     memory=math.prod(op.output) * op.itemsize)]



def block_key(path: str) -> tuple[str, tuple[str, ...]]:
    """("h.*.mlp.c_fc", ("0",)) for "h.0.mlp.c_fc": the path with integer segments (ModuleList
    indices) starred, and the indices."""
    parts = path.split(".")
    idx = tuple(p for p in parts if p.isdigit())
    return ".".join("*" if p.isdigit() else p for p in parts), idx


def build_problem(graph: "OpGraph", mesh: Mesh, *, budget: float | None = None,
                  data: dict[str, Spec] | None = None, fixed: dict[str, Spec] | None = None,
                  optimizer: str | None = "adamw", efficiency: float = 0.5, share_blocks: bool = True,
                  base_memory: float = 0.0) -> Problem:
    """The ILP instance of `graph` on `mesh` (see module docstring).

    `data`: input name -> Spec (the plan's `data` statements); `fixed`: parameter FQN, input name or
    activation (value) name -> Spec the user wrote (`shard ... : spec`); `share_blocks`: nodes of
    repeated blocks (`h.0...`, `h.1...`) with the same op choose alike (one variable)."""

    t0 = time.perf_counter()
    if mesh.has_holes:
        raise IntraOpError(f"mesh {mesh} has axis sizes left as holes; choose them before the intra-op solve")
    if mesh.device is None or not mesh.device.flops:
        raise IntraOpError(f"mesh {mesh.name} has no device throughput; declare `flops.<dtype>` on its device "
                           "(or use a device from stdlib/hardware.plan)")
    return _build(graph, mesh, budget, data or {}, fixed or {}, optimizer, efficiency, share_blocks, base_memory, t0)


def _build(graph, mesh, budget, data, fixed, optimizer, efficiency, share_blocks, base_memory, t0) -> Problem:
    ndev = math.prod(a.size for a in mesh.axes)
    states = optimizer_state_elements(optimizer)
    values = graph.values
    kinds: dict[str, str] = {}
    layouts: dict[str, list[Spec]] = {}
    strats: dict[str, list[Strategy]] = {}
    refs: dict[str, str] = {}
    nodes: dict[str, Node] = {}
    used = {i for n in graph.nodes for i in n.inputs}

    def check_spec(what: str, v: "Value", spec: Spec) -> Spec:
        if spec.rank != len(v.shape):
            raise IntraOpError(f"{what} {v.ref or v.name}: spec {spec} has {spec.rank} entries but the tensor has "
                               f"{len(v.shape)} dims {list(v.shape)}")
        if not is_valid(v.shape, spec, mesh):
            raise IntraOpError(f"{what} {v.ref or v.name}: spec {spec} does not fit shape {list(v.shape)} on mesh "
                               f"{mesh} (unknown axis, an axis used twice, or a dim not divisible)")
        return normalize(spec, mesh)

    # parameters and inputs: layouts (one shared list and option tuple per shape, dtype and kind)
    shared: dict[tuple, tuple[list[Spec], tuple[Option, ...]]] = {}
    for v in values.values():
        if v.kind not in ("param", "input") or v.name not in used:
            continue
        size = _itemsize(v.dtype)
        given = v.kind == "input" and v.ref in data and not _has_hole(data[v.ref])
        written = check_spec("data", v, data[v.ref]) if given else None
        layout_key = (tuple(v.shape), size, v.kind, written)
        if layout_key not in shared:
            specs = [written] if written is not None else enumerate_layouts(v.shape, mesh, partial=False)
            per_elem = size * 2 + states * 4 if v.kind == "param" else size  # param + grad + fp32 states
            priced = []
            for spec in specs:
                local = local_numel(v.shape, spec, mesh)
                priced.append(Option(spec, memory=local * per_elem,
                                     redundancy=(local - math.prod(v.shape) / ndev) * per_elem))
            shared[layout_key] = (specs, tuple(priced))
        specs, layout_opts = shared[layout_key]
        kinds[v.name], layouts[v.name], refs[v.name] = v.kind, specs, v.ref
        nodes[v.name] = Node(v.name, layout_opts)

    # ops: strategies. Repeated blocks repeat the same OpSpecs: strategies and priced options are
    # computed once per distinct (op, aliasing, inputs without gradient) and shared, so the build
    # grows with the distinct ops, not the depth.
    alias_of: dict[str, str] = {}
    op_strats: dict[OpSpec, list[Strategy]] = {}
    op_options: dict[tuple, tuple[Option, ...]] = {}
    for n in graph.nodes:
        ss = op_strats.get(n.op)
        if ss is None:
            try:
                ss = strategies(n.op, mesh)
            except UnknownOp:
                ss = _fallback(n.op, mesh)
            if not ss:
                ss = _fallback(n.op, mesh)
            op_strats[n.op] = ss
        f = facts(n.op.kind)
        alias = f.alias
        if alias and n.inputs and n.inputs[0] in values and values[n.inputs[0]].kind == "op":
            alias_of[n.name] = alias_of.get(n.inputs[0], n.inputs[0])
        no_grad = tuple(i for i, v in enumerate(n.inputs) if v in values and values[v].kind in ("input", "const"))
        op_key = (n.op, n.name in alias_of, no_grad)
        op_opts = op_options.get(op_key)
        if op_opts is None:
            op_opts = op_options[op_key] = _op_options(n.op, ss, n.name in alias_of, no_grad, mesh, efficiency, ndev)
        kinds[n.name], strats[n.name] = "op", ss
        nodes[n.name] = Node(n.name, op_opts, follower=f.follower or alias)

    # outputs must not stay partial sums: charge the cheapest conversion to a whole layout
    for out in graph.outputs:
        if kinds.get(out) != "op":
            continue
        shape, size = tuple(values[out].shape), _itemsize(values[out].dtype)
        whole = enumerate_layouts(shape, mesh, partial=False)
        node = nodes[out]
        opts = list(node.options)
        for i, s in enumerate(strats[out]):
            if s.output.partial:
                extra = min(conversion_path(shape, s.output, w, mesh, size).cost for w in whole)
                o = opts[i]
                opts[i] = Option(o.name, o.compute, o.comm + extra, o.memory, o.volume, o.redundancy)
        nodes[out] = Node(node.name, tuple(opts), node.follower)

    # edges: the matrices depend on the value's shape and dtype and on the two option lists, which
    # nodes of repeated blocks share (the lists are compared by identity: one list object per distinct
    # op or layout set), so each distinct edge is priced once
    step_of = {n.name: t for t, n in enumerate(graph.nodes)}
    edges: list[Edge] = []
    edge_live: list[tuple[int, int]] = []  # (first step, last step)
    T = len(graph.nodes)
    cache: dict = {}
    src_lists: dict[int, tuple[Spec, ...]] = {}
    dst_lists: dict[tuple[int, int], tuple[Spec, ...]] = {}
    for n in graph.nodes:
        saves = saved_inputs(n.op.kind, len(n.inputs))
        for slot, src in enumerate(n.inputs):
            if src not in nodes:
                continue  # constants: available in any layout locally
            v = values[src]
            src_list = layouts[src] if kinds[src] != "op" else strats[src]
            dst_list = strats[n.name]
            saved = slot in saves and v.dtype not in ("bool",)
            key = (tuple(v.shape), v.dtype, id(src_list), id(dst_list), slot)
            if key not in cache:
                if id(src_list) not in src_lists:
                    src_lists[id(src_list)] = tuple(layouts[src]) if kinds[src] != "op" else \
                        tuple(s.output for s in strats[src])
                if (id(dst_list), slot) not in dst_lists:
                    dst_lists[id(dst_list), slot] = tuple(s.inputs[slot] for s in dst_list)
                cache[key] = edge_matrices(tuple(v.shape), _itemsize(v.dtype), src_lists[id(src_list)],
                                            dst_lists[id(dst_list), slot], mesh)
            sec, vol, mem = cache[key]
            edges.append(Edge(src, n.name, slot, sec, vol, mem))
            t = step_of[n.name]
            edge_live.append((t, T - 1 if saved else t))

    steps = _steps(graph, nodes, kinds, alias_of, edge_live)

    # groups of repeated blocks, and user-fixed specs
    groups = _block_groups(graph, nodes, refs) if share_blocks else ()
    fixed_idx, allowed = _fixed_choices(graph, fixed, nodes, kinds, layouts, strats, refs, check_spec, mesh)
    inst = Instance(tuple(nodes.values()), tuple(edges), tuple(steps), groups, tuple(fixed_idx), tuple(allowed),
                    budget, base_memory)
    inst.validate()
    return Problem(inst, mesh, kinds, layouts, strats, refs, time.perf_counter() - t0)


def _op_options(op: OpSpec, ss: list[Strategy], alias: bool, no_grad: tuple[int, ...], mesh: Mesh,
                efficiency: float, ndev: int) -> tuple[Option, ...]:
    """The priced options of an op's strategies: compute = flops x (1 + backward ratio) at the
    device's throughput, comm = its collectives less the gradient all-reduces of `no_grad` inputs; a
    view (`alias`) holds no memory of its own."""
    ratio = facts(op.kind).backward_ratio
    opts = []
    for s in ss:
        mem = 0 if alias else s.memory
        flops = s.flops * (1.0 + ratio)
        comms = _without_no_grad_allreduces(op, s, list(no_grad), mesh)
        opts.append(Option(s.name, compute=compute_time(flops, mesh, op.dtype, efficiency) if flops else 0.0,
                           comm=sum(c.seconds for c in comms), memory=mem, volume=comm_volume(comms, mesh),
                           redundancy=(mem - math.prod(op.output) * op.itemsize / ndev) if mem else 0.0))
    return tuple(opts)


def _steps(graph, nodes, kinds, alias_of, edge_live) -> list[Step]:
    """One step per op in topological order, listing the values and converted copies live there
    (module docstring): parameters always; a value from its producer to its last consumer, or to the
    last step when a consumer saves it; a view's uses count as uses of its base."""
    T = len(graph.nodes)
    step_of = {n.name: t for t, n in enumerate(graph.nodes)}

    def root(name: str) -> str:
        return alias_of.get(name, name)

    last: dict[str, int] = {}
    saved_vals: set[str] = set()
    for t, n in enumerate(graph.nodes):
        saves = saved_inputs(n.op.kind, len(n.inputs))
        for slot, src in enumerate(n.inputs):
            if src in nodes:
                last[root(src)] = t
                if slot in saves and kinds[src] != "param":
                    saved_vals.add(root(src))
        if facts(n.op.kind).saves_output:
            saved_vals.add(root(n.name))
    saved_vals |= {root(out) for out in graph.outputs if out in nodes}
    live_range: dict[str, tuple[int, int]] = {}
    for name, k in kinds.items():
        if name in alias_of:
            continue  # costs nothing: its base carries the memory
        if k == "param":
            live_range[name] = (0, T - 1)
        else:
            start = step_of.get(name, 0)
            live_range[name] = (start, T - 1 if name in saved_vals else max(last.get(name, start), start))
    # one sweep over the steps: what starts at t joins, what ended at t - 1 leaves (an insertion-
    # ordered dict keeps the listing in a fixed order)
    node_start: dict[int, list[str]] = {}
    node_end: dict[int, list[str]] = {}
    for v, (a, b) in live_range.items():
        node_start.setdefault(a, []).append(v)
        node_end.setdefault(b, []).append(v)
    edge_start: dict[int, list[int]] = {}
    edge_end: dict[int, list[int]] = {}
    for i, (a, b) in enumerate(edge_live):
        edge_start.setdefault(a, []).append(i)
        edge_end.setdefault(b, []).append(i)
    live_nodes: dict[str, None] = {}
    live_edges: dict[int, None] = {}
    steps = []
    for t, n in enumerate(graph.nodes):
        live_nodes.update(dict.fromkeys(node_start.get(t, ())))
        live_edges.update(dict.fromkeys(edge_start.get(t, ())))
        steps.append(Step(n.name, tuple(live_nodes), tuple(live_edges)))
        for v in node_end.get(t, ()):
            del live_nodes[v]
        for i in edge_end.get(t, ()):
            del live_edges[i]
    return steps


def _without_no_grad_allreduces(op: OpSpec, s: Strategy, slots: list[int], mesh: Mesh) -> list[CommCost]:
    """The strategy's collectives less the input-gradient all-reduces of `slots` (model inputs and
    constants need no gradient). The einsum engine prices input i's gradient all-reduce over the axes
    that split a letter input i lacks, or pass a partial sum through another input
    (planlang.cost.ops.einsum.grad_allreduces); the same collective is recomputed here and removed
    when present, so a rule that prices differently only loses this refinement."""
    comms = list(s.forward) + list(s.backward)
    extra = dict(s.extra)
    if not slots or "equation" not in extra:
        return comms
    letters = str(extra["equation"]).split("->")[0].split(",")
    assign = extra["assign"]
    pairs = assign if isinstance(assign, tuple) else ()  # (axis, letter or "P" or (kind, input))
    for i in slots:
        axes = [a for a, ch in pairs if (isinstance(ch, str) and ch != "P" and ch not in letters[i])
                or (isinstance(ch, tuple) and ch[1] != i)]
        axes = [a for a in mesh.names if a in axes and a not in s.inputs[i].partial]
        if not axes:
            continue
        dtype = op.input_dtypes[i] if i < len(op.input_dtypes) and op.input_dtypes[i] else op.dtype
        nbytes = local_numel(op.inputs[i], s.inputs[i], mesh) * _itemsize(dtype)
        c = price(Collective.ALL_REDUCE, mesh, tuple(axes), nbytes)
        for k in range(len(s.forward), len(comms)):
            if (comms[k].kind, comms[k].axes, comms[k].size_bytes) == (c.kind, c.axes, c.size_bytes):
                del comms[k]
                break
    return comms


def keeps_written(layout: Spec, written: Spec, mesh: Mesh) -> bool:
    """Does `layout` agree with every entry `written` does not leave `?` (axes of size 1 aside)?"""
    def big(axes) -> tuple[str, ...]:
        return tuple(a for a in axes if (mesh.axis_size(a) or 1) > 1)

    if layout.rank != written.rank or big(layout.partial) != big(normalize(written, mesh).partial):
        return False
    return all(is_hole(w) or big(w) == layout.axes_of(d) for d, w in enumerate(written.dims))


def _has_hole(spec) -> bool:
    return is_hole(spec) or spec.has_holes


def _block_groups(graph, nodes, refs) -> tuple[tuple[str, ...], ...]:
    """Nodes of repeated blocks that correspond: same starred module path (or parameter FQN), same
    op and shapes, same occurrence within their block."""
    buckets: dict[tuple, list[str]] = {}
    seen: dict[tuple, int] = {}
    for n in graph.nodes:
        star, idx = block_key(n.module)
        if not idx:
            continue
        k = (star, idx, n.op)
        occ = seen.get(k, 0)
        seen[k] = occ + 1
        buckets.setdefault((star, n.op, occ), []).append(n.name)
    for name, ref in refs.items():
        v = graph.values[name]
        if v.kind != "param":
            continue
        star, idx = block_key(ref)
        if idx:
            buckets.setdefault((star, tuple(v.shape), v.dtype), []).append(name)
    out = []
    for members in buckets.values():
        members = [m for m in members if m in nodes]
        if len(members) > 1 and len({len(nodes[m].options) for m in members}) == 1:
            out.append(tuple(members))
    return tuple(out)


def _fixed_choices(graph, fixed, nodes, kinds, layouts, strats, refs, check_spec, mesh=None):
    """User specs -> fixed option indices (params, inputs) or allowed options (activations, and specs
    with `?` entries: the options that keep the written entries)."""
    by_ref = {ref: name for name, ref in refs.items()}
    fixed_idx, allowed = [], []
    for target, spec in fixed.items():
        if is_hole(spec) or (spec.has_holes and mesh is None):
            continue
        name = by_ref.get(target, target)
        if name not in nodes:
            known = sorted(by_ref)[:5]
            raise IntraOpError(f"fixed spec for {target!r}: no parameter, input or activation of that name in the "
                               f"graph (parameters look like {', '.join(known)})")
        if spec.has_holes:
            outs = [s.output for s in strats[name]] if kinds[name] == "op" else layouts[name]
            ks = tuple(i for i, s in enumerate(outs) if keeps_written(s, spec, mesh))
            if not ks:
                raise IntraOpError(f"shard {target} : {spec}: no layout keeps the written entries")
            allowed.append((name, ks))
            continue
        v = graph.values[name]
        spec = check_spec("shard", v, spec)
        if kinds[name] == "op":
            ks = tuple(i for i, s in enumerate(strats[name]) if s.output == spec)
            if not ks:
                raise IntraOpError(f"shard {target} : {spec}: no strategy of its op {graph.node(name).op.kind} "
                                   f"produces that layout; let the solver choose (`?`)")
            allowed.append((name, ks))
        else:
            fixed_idx.append((name, layouts[name].index(spec)))
    return fixed_idx, allowed


# ------------------------------------------------------------------------------ solve
def decode(problem: Problem, result: Result) -> Solution:
    params, inputs, acts, chosen = {}, {}, {}, {}
    for name, k in result.choice.items():
        kind = problem.kinds[name]
        if kind == "param":
            params[problem.refs[name]] = problem.layouts[name][k]
        elif kind == "input":
            inputs[problem.refs[name]] = problem.layouts[name][k]
        else:
            chosen[name] = problem.strategies[name][k]
            acts[name] = chosen[name].output
    return Solution(params, inputs, acts, chosen, result, problem)


def solve_intra_op(graph: "OpGraph", mesh: Mesh, *, objective: str = "time",
                   options: SolveOptions = SolveOptions(), **build) -> Solution:
    """Build the problem (`build_problem` keywords), solve it, and return the chosen specs."""
    problem = build_problem(graph, mesh, **build)
    return decode(problem, solve(problem.instance, objective, options))


def plan_name(fqn: str) -> str:
    """`h[0].attn.c_attn.weight` for `h.0.attn.c_attn.weight` (how plans write container children)."""
    return re.sub(r"\.(\d+|\*)(?=\.|$)", r"[\1]", fqn)


def problem_args(plan, graph: "OpGraph") -> dict:
    """`build_problem` keywords from a resolved plan (planlang.plan.types.Plan): its mesh, budget, data
    specs, optimizer, and the specs it fixes - parameters (`shard P : spec`) and module outputs
    (`shard output of M : spec`, the value the module's last op produces). Holes are left free."""
    if plan.mesh is None:
        raise IntraOpError("the plan declares no mesh; add a `mesh` block before solving the sharding")
    params = [v.ref for v in graph.values.values() if v.kind == "param"]
    last_op = graph.module_outputs()  # module path -> the last op inside it (its output)
    fixed: dict[str, Spec] = {}
    for r in plan.shards:
        if is_hole(r.spec):  # a spec with `?` entries constrains the entries written (_fixed_choices)
            continue
        if r.kind == "param":
            for fqn in r.target.select(params):
                fixed[fqn] = r.spec
        elif r.kind == "output":
            for module in r.target.select(list(last_op)):
                fixed[last_op[module]] = r.spec
    data = {d.input: d.spec for d in plan.data if not _has_hole(d.spec)}
    return {"mesh": plan.mesh, "budget": plan.budget.bytes if plan.budget else None, "data": data,
            "fixed": fixed, "optimizer": plan.optimizer.name if plan.optimizer else None}


def block_pattern(fqn: str) -> str:
    """`h.*.mlp.c_fc.weight` for `h.3.mlp.c_fc.weight` (the selection a shared choice applies to)."""
    return re.sub(r"(^|\.)\d+(?=\.|$)", r"\1*", fqn)
