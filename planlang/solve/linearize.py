"""From a model to a chain for rotor (planlang.solve.rotor), and from a solved chain back to the plan's
`checkpoint` groups.

* `linearize` is map-memory-aware-auto-parallel's Algorithm 2 (§5.2.2–5.2.4) over an fx graph: nodes in
  topological order join the current group; a node ends its group when it leaves no other dependency
  pending (every earlier node's consumers have run) and none of its consumers is an in-place or a
  communication op (those stay with their producer, §5.2.4). Common nodes (Definition 5.3, Lemma 5.4:
  non-differentiable values such as integer or boolean inputs, masks, sizes, `getattr`, and whatever is
  computed only from them) never enter the pool of pending dependencies, so an attention mask used by
  every layer does not glue the whole network into one group.
* `chain_for_graph` measures each group of `linearize` and builds the chain; `chain_for_modules` does the
  same for stages given as modules (GPT-2's blocks `h.0` .. `h.11`, plus everything before and after
  them as two end stages) — the form the plan language can checkpoint, and what the plan-level solver
  uses for `checkpoint ?`.
* `group_modules` / `checkpoint_lines` turn the groups of a solved chain (rotor.solve_groups, or
  rotor.top_level_groups of a rotor schedule) into module paths and `checkpoint h[2:5]` lines.

Measurement: one forward + loss + backward on the meta device (planlang.model.capture.simulate.LiveBytes follows
every storage's life; planlang.model.capture.profile's flop counter counts each op's flops), with the running
stage switched at stage boundaries — in forward when a stage's first node or module starts, in backward
when the gradient of a stage's input is complete (a tensor hook). Per stage:

    x      bytes of its input (the storages flowing in from earlier stages; the model inputs for the first)
    xbar   bytes created in its forward and still alive when the next stage starts: what autograd keeps
           for its backward plus its output (at least x of the next stage)
    ftmp   its forward's peak of created bytes beyond xbar
    btmp   its backward's peak of created bytes beyond its input gradient and the parameter gradients it
           produces (those are counted with the parameters, outside the chain)
    fw/bw  forward / backward flops divided by `throughput` (flop/s), plus the caller's communication
           seconds; ops flop_counter has no formula for (elementwise, norms) count zero

The loss (index L) is everything after the model's forward: x[L] the output's bytes, xbar[L] what the loss
keeps, btmp[L] its transient peak, bw[L] its forward and backward flops.
"""
from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import torch
import torch.fx as fx
from torch.utils._pytree import tree_flatten

from planlang.model.capture.profile import _FlopMode
from planlang.model.capture.simulate import Existing, LiveBytes, fused_attention
from planlang.model.capture.trace import bind_inputs, trace_graph
from planlang.model.capture.valueless import meta_or_fake

from .checkpoint_values import checkpoint_value
from .rotor import Chain

_SDPA = torch.nn.functional.scaled_dot_product_attention  # as traced graphs captured it (see _Run)

COLLECTIVES = frozenset({
    "all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
    "all_to_all", "all_to_all_single", "broadcast", "wait_tensor", "send", "recv", "isend", "irecv",
})


# ---------------------------------------------------------------------------------------------------------
# Algorithm 2


@dataclass(frozen=True)
class GraphNode:
    """What Algorithm 2 reads of one fx node."""

    name: str
    op: str  # fx op: placeholder, get_attr, call_function, call_method, call_module, output
    args: tuple[str, ...]  # names of the input nodes
    float_output: bool  # its output holds a floating-point tensor (something gradients can flow through)
    has_params: bool = False  # a module call owning parameters, or get_attr of a parameter
    inplace: bool = False
    comm: bool = False
    module: str = ""  # innermost module path it runs in

    def __str__(self) -> str:
        return f"{self.name} ({self.op})"


def common_nodes(nodes: Sequence[GraphNode], seeds: Iterable[str] = ()) -> set[str]:
    """Definition 5.3 / Lemma 5.4: a node is common when it is non-differentiable — its output holds no
    floating-point tensor (integer or boolean inputs and masks, sizes, `getattr` values), it is a get_attr
    (parameters and buffers are not activations), it is a `seeds` input — or when every node it reads is
    common and it owns no parameters (a parameter read counts as differentiable: `embedding(idx, weight)`
    is not common)."""
    seeds = set(seeds)
    by_name = {n.name: n for n in nodes}
    common: set[str] = set()
    for n in nodes:
        if n.op == "output":
            continue
        if n.name in seeds or not n.float_output or n.op == "get_attr":
            common.add(n.name)
        elif n.op == "placeholder":
            continue
        elif not n.has_params and all(a in common and not by_name[a].has_params for a in n.args):
            common.add(n.name)
    return common


def linearize(nodes: Sequence[GraphNode], seeds: Iterable[str] = ()) -> list[tuple[str, ...]]:
    """Algorithm 2: the node groups (in order) of a graph in topological order. `seeds` names inputs that
    are common although floating-point (an additive attention mask). One step beyond the paper: a group
    made only of common nodes (which Algorithm 2 cuts after, since they leave nothing pending) is merged
    into the group after it, as it holds no activation a stage boundary could keep."""
    common = common_nodes(nodes, seeds)
    users: dict[str, list[GraphNode]] = {n.name: [] for n in nodes}
    for n in nodes:
        for a in n.args:
            users[a].append(n)
    pending: dict[str, int] = {}  # the dependency pool: consumers not yet run, per tracked node
    groups: list[tuple[str, ...]] = []
    current: list[str] = []
    for n in nodes:
        if n.op in ("placeholder", "output"):
            continue
        for a in set(n.args):
            if a in pending:
                pending[a] -= 1
                if pending[a] <= 0:
                    del pending[a]
        current.append(n.name)
        glued = any(u.inplace or u.comm for u in users[n.name])
        if not pending and not glued:
            groups.append(tuple(current))
            current = []
        if n.name not in common and n.op != "get_attr":
            # consumers that are real ops (the graph's output node is not one)
            count = len({u.name for u in users[n.name] if u.op != "output"})
            if count:
                pending[n.name] = count
    if current:
        groups.append(tuple(current))
    # a group of common nodes only (sizes, positions, masks made up front) carries no activation: it
    # joins the next group instead of becoming a stage of its own
    merged: list[tuple[str, ...]] = []
    carry: tuple[str, ...] = ()
    for g in groups:
        if all(name in common for name in g):
            carry += g
        else:
            merged.append(carry + g)
            carry = ()
    if carry:
        if merged:
            merged[-1] += carry
        else:
            merged.append(carry)
    return merged


def _has_float(meta) -> bool:
    """Whether shape propagation's record of a node's output (a tensor, fx's TensorMetadata — itself a
    named tuple — or nested tuples, lists and dicts of them) holds a floating-point tensor."""
    dtype = getattr(meta, "dtype", None)
    if isinstance(dtype, torch.dtype):
        return dtype.is_floating_point or dtype.is_complex
    if isinstance(meta, dict):
        return any(_has_float(v) for v in meta.values())
    if isinstance(meta, (tuple, list)):
        return any(_has_float(v) for v in meta)
    return False


def graph_nodes(facts) -> list[GraphNode]:
    """The graph of planlang.model.capture.trace.trace_graph (GraphFacts: fx graph with shapes propagated and
    module paths) as GraphNodes for `linearize`."""
    gm = facts.graph_module
    module_of = {info.name: info.module for info in facts.nodes}
    params = {name for name, _ in gm.named_parameters(remove_duplicate=False)}
    out = []
    for node in gm.graph.nodes:
        meta = node.meta.get("tensor_meta", node.meta.get("val"))
        has_params = inplace = False
        if node.op == "call_module":
            mod = gm.get_submodule(str(node.target))
            has_params = any(True for _ in mod.parameters())
            inplace = bool(getattr(mod, "inplace", False))
        elif node.op == "get_attr":
            has_params = str(node.target) in params
        name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target))
        if node.op in ("call_function", "call_method"):
            inplace = (name.endswith("_") and not name.endswith("__")) or bool(node.kwargs.get("inplace", False))
        comm = name.split(".")[-1] in COLLECTIVES
        out.append(GraphNode(node.name, node.op, tuple(a.name for a in node.all_input_nodes), _has_float(meta),
                             has_params, inplace, comm, module_of.get(node.name, "")))
    return out


# ---------------------------------------------------------------------------------------------------------
# measuring stages on the meta device


@dataclass(frozen=True)
class StageFacts:
    """One stage of a linearized model, measured (bytes, flops)."""

    name: str
    modules: tuple[str, ...]  # the modules it runs (module stages: exactly what a plan can checkpoint)
    fwd_flops: int
    bwd_flops: int
    x: int
    xbar: int
    ftmp: int
    btmp: int

    def __str__(self) -> str:
        return f"{self.name}: in {self.x} B, keeps {self.xbar} B, {self.fwd_flops + self.bwd_flops} flop"


@dataclass(frozen=True)
class LinearChain:
    """A model as a chain: its stages (the loss last) and the Chain rotor solves."""

    stages: tuple[StageFacts, ...]
    chain: Chain

    def __str__(self) -> str:
        return f"{len(self.stages) - 1} stages + loss: " + ", ".join(s.name for s in self.stages)

    @property
    def checkpointable(self) -> tuple[bool, ...]:
        """Per stage (loss excluded): whether a `checkpoint` line can name it (it runs modules)."""
        return tuple(bool(s.modules) for s in self.stages[:-1])


class _Counting(LiveBytes):
    """LiveBytes that also counts the ops each owner runs (an end stage that runs none is dropped)."""

    def __init__(self, ignore: Existing):
        super().__init__(ignore)
        self.ops: dict[object, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[self.owner] = self.ops.get(self.owner, 0) + 1
        return super().__torch_dispatch__(func, types, args, kwargs)


def _storage_bytes(tensors, floating_only: bool = False) -> tuple[int, list[torch.Tensor]]:
    seen, total, flat = set(), 0, []
    for t in tree_flatten(tensors)[0]:
        if isinstance(t, torch.Tensor) and (t.is_floating_point() or not floating_only):
            flat.append(t)
            key = t.untyped_storage()._cdata
            if key not in seen:
                seen.add(key)
                total += t.untyped_storage().nbytes()
    return total, flat


class _Stages:
    """Switches the running stage in forward and backward and collects what each stage did."""

    def __init__(self, mode: _Counting):
        self.mode = mode
        self.current = -1
        self.x: dict[int, int] = {}
        self.kept: dict[int, int] = {}
        self.grad_input: dict[int, bool] = {}
        self.flops: dict[object, int] = {}

    def count(self, flops: int, moved: int = 0) -> None:
        self.flops[self.mode.owner] = self.flops.get(self.mode.owner, 0) + flops

    def start(self, i: int, inputs) -> None:
        """Stage i's forward starts; `inputs` are the tensors flowing into it."""
        if i <= self.current:
            raise ValueError(f"stage {i} starts after stage {self.current}: list the stages in execution order")
        self.close()
        self.current = i
        self.mode.owner = ("f", i)
        # past the model's own inputs, integer and boolean arguments (masks, positions) are common values
        # (map Definition 5.3), held anyway, not activations passed along the chain
        self.x[i], flat = _storage_bytes(inputs, floating_only=i > 0)
        grads = [t for t in flat if t.requires_grad]
        self.grad_input[i] = bool(grads)
        for t in grads:
            t.register_hook(lambda _g, i=i: self._input_grad_done(i))

    def close(self) -> None:
        if self.current >= 0:
            self.kept[self.current] = self.mode.owner_live.get(("f", self.current), 0)

    def _input_grad_done(self, i: int) -> None:
        # the gradient of stage i's input is complete: stage i's backward is over, stage i-1's begins
        owner = self.mode.owner
        if isinstance(owner, tuple) and owner[0] == "b" and owner[1] >= i:
            self.mode.owner = ("b", i - 1)


def _measure(module: torch.nn.Module, run_forward: Callable[[_Stages], object], n_stages: int, inputs,
             loss, names: list[str], modules: list[tuple[str, ...]], throughput: float,
             comm_fw=None, comm_bw=None, recompute_comm: bool = True,
             droppable: frozenset = frozenset()) -> LinearChain:
    """Run forward (run_forward calls stages.start(i, inputs) for i = 0 .. n_stages-1), loss and backward
    on meta, then assemble the stages' facts and the chain (stages in `droppable` that ran no op are
    dropped)."""
    if not (isinstance(throughput, (int, float)) and throughput > 0):
        raise ValueError(f"throughput {throughput!r} must be a positive number of flop/s")
    # what exists before the step (and views of it) is not an activation, and its views run no flops
    existing = Existing([*module.parameters(), *module.buffers(), *inputs.values()])
    for p in module.parameters():
        p.grad = None
    mode = _Counting(existing)
    st = _Stages(mode)
    L = n_stages

    with fused_attention(), _FlopMode(st.count, existing, traffic=False), mode, torch.enable_grad():
        out = run_forward(st)
        if st.current != L - 1:
            raise ValueError(f"only {st.current + 1} of {L} stages ran: is every listed module called?")
        first = next((t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)), None)
        if first is None or not first.requires_grad:
            raise ValueError("the model's output does not require grad: there is nothing to checkpoint")
        st.start(L, first)
        scalar = loss(out, inputs) if loss is not None else first.float().sum()
        del out, first
        st.close()
        mode.owner = ("b", L)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            scalar.backward()
        del scalar
    grad_owner: dict[object, int] = {}
    for p in module.parameters():
        if p.grad is not None:
            key = p.grad.untyped_storage()._cdata
            o = mode.owners.get(key)
            grad_owner[o] = grad_owner.get(o, 0) + p.grad.untyped_storage().nbytes()
    for p in module.parameters():
        p.grad = None

    facts = []
    for i in range(L + 1):
        fpeak = mode.owner_peak.get(("f", i), 0)
        bpeak = mode.owner_peak.get(("b", i), 0) - grad_owner.get(("b", i), 0)
        x = st.x[i]
        kept = st.kept.get(i, 0)
        if i < L:
            ftmp = max(0, fpeak - kept)
            btmp = max(0, bpeak - (x if st.grad_input[i] else 0))
        else:  # the loss: one op in the chain, forward and backward
            ftmp = 0
            btmp = max(0, fpeak - kept - x, bpeak - x)
        facts.append(StageFacts(names[i], modules[i], st.flops.get(("f", i), 0), st.flops.get(("b", i), 0),
                                x, kept, ftmp, btmp))
    # an end stage that ran no op (a model whose listed modules cover its whole forward) is dropped
    keep = [i for i in range(L + 1) if i not in droppable or mode.ops.get(("f", i), 0)]
    facts = [facts[i] for i in keep]
    if comm_fw is not None and len(comm_fw) != len(facts) - 1:
        raise ValueError(f"comm_fw has {len(comm_fw)} entries for {len(facts) - 1} stages")
    if comm_bw is not None and len(comm_bw) != len(facts):
        raise ValueError(f"comm_bw has {len(comm_bw)} entries for {len(facts) - 1} stages and the loss")
    return LinearChain(tuple(facts), _chain(facts, throughput, comm_fw, comm_bw, recompute_comm))


def _chain(facts: list[StageFacts], throughput: float, comm_fw, comm_bw, recompute_comm: bool) -> Chain:
    n = len(facts) - 1
    xs = [f.x for f in facts]
    # what a stage keeps includes its output (the next stage's input): at least those bytes
    xbar = [max(f.xbar, xs[i + 1]) for i, f in enumerate(facts[:n])] + [facts[n].xbar]
    fw = [f.fwd_flops / throughput for f in facts[:n]]
    bw = [f.bwd_flops / throughput for f in facts[:n]] + [(facts[n].fwd_flops + facts[n].bwd_flops) / throughput]
    return Chain(tuple(fw), tuple(bw), tuple(xs), tuple(xbar), tuple(f.ftmp for f in facts[:n]),
                 tuple(f.btmp for f in facts),
                 tuple(comm_fw or ()), tuple(comm_bw or ()), recompute_comm)


def chain_for_modules(module: torch.nn.Module, inputs: dict[str, torch.Tensor],
                      stages: Sequence[str | Sequence[str]], *, throughput: float, loss=None,
                      comm_fw: Sequence[float] | None = None, comm_bw: Sequence[float] | None = None,
                      recompute_comm: bool = True) -> LinearChain:
    """The chain whose stages are the given modules in execution order (an entry may be a list of modules
    run one after the other: one stage), plus an end stage for whatever runs before the first of them
    and one for whatever runs after the last (dropped when nothing does), then the loss.

    `module` and `inputs` on the meta device; `loss(output, inputs)` as in planlang.model.capture.load.model_loss
    (default: the sum of the output); `throughput` in flop/s; comm_fw / comm_bw seconds per stage as in
    rotor.Chain (end stages included)."""
    groups = [(s,) if isinstance(s, str) else tuple(s) for s in stages]
    if not groups or any(not g for g in groups):
        raise ValueError("give at least one module per stage")
    known = dict(module.named_modules(remove_duplicate=False))
    listed = [m for g in groups for m in g]
    for m in listed:
        if m not in known or not m:
            raise ValueError(f"no module {m!r} in the model (names as model.named_modules() gives them)")
    if len(set(listed)) != len(listed):
        raise ValueError("a module is listed twice")
    for a in listed:
        for b in listed:
            if a != b and b.startswith(a + "."):
                raise ValueError(f"{b!r} is inside {a!r}: list disjoint modules")
    names = (["(before " + groups[0][0] + ")"] + [" + ".join(g) for g in groups]
             + ["(after " + groups[-1][-1] + ")", "loss"])
    mods = [()] + groups + [(), ()]
    first_of = {g[0]: k + 1 for k, g in enumerate(groups)}
    last = groups[-1][-1]
    L = len(groups) + 2

    inside_listed = tuple(m + "." for m in listed)

    def run(st: _Stages):
        handles = []
        seen: set[str] = set()
        ends: dict[int, list[str]] = {0: [], L - 1: []}  # modules the end stages call

        def pre(name):
            def hook(mod, args, kwargs):
                if name not in seen:
                    seen.add(name)
                    st.start(first_of[name], (args, kwargs))
            return hook

        def post(mod, args, kwargs, output):
            if st.current == L - 2:  # the last listed stage ends: the end stage starts
                st.start(L - 1, output)

        def record(name):
            def hook(mod, args):
                if st.current in ends and name not in ends[st.current]:
                    ends[st.current].append(name)
            return hook

        for name, k in first_of.items():
            handles.append(known[name].register_forward_pre_hook(pre(name), with_kwargs=True))
        handles.append(known[last].register_forward_hook(post, with_kwargs=True))
        for name, mod in known.items():
            if name and name not in first_of and not name.startswith(inside_listed):
                handles.append(mod.register_forward_pre_hook(record(name)))
        try:
            st.start(0, inputs)
            args, kwargs = bind_inputs(module, inputs)
            return module(*args, **kwargs)
        finally:
            for h in handles:
                h.remove()
            for k, called in ends.items():  # the outermost modules each end stage ran
                mods[k] = tuple(n for n in called if not any(n.startswith(o + ".") for o in called))

    return meta_or_fake(lambda: _measure(module, run, L, inputs, loss, names, mods, throughput, comm_fw, comm_bw,
                                         recompute_comm, frozenset({0, L - 1})))


def chain_for_graph(module: torch.nn.Module, inputs: dict[str, torch.Tensor], *, throughput: float, loss=None,
                    seeds: Iterable[str] = (), facts=None) -> LinearChain:
    """The chain of Algorithm 2's node groups of the model's fx graph (planlang.model.capture.trace.trace_graph
    unless its GraphFacts are given), each group measured as a stage. Stage names are the groups' first
    and last nodes; `modules` lists the modules each group's nodes run in (for information: a group may
    hold ops of a parent module, such as a residual add, that no `checkpoint` line can name)."""
    if facts is None:
        facts = trace_graph(module, inputs)
    gm = facts.graph_module
    nodes = graph_nodes(facts)
    groups = linearize(nodes, seeds)
    common = common_nodes(nodes, seeds)
    by_name = {n.name: n for n in nodes}
    fx_node = {n.name: n for n in gm.graph.nodes}
    starts = {g[0]: k for k, g in enumerate(groups) if k > 0}
    feeds: dict[int, list[str]] = {}
    for k, g in enumerate(groups):
        members = set(g)
        feeds[k] = sorted({a for n in g for a in by_name[n].args
                           if a not in members and a not in common and by_name[a].op != "get_attr"})
    names = [f"{g[0]} .. {g[-1]}" for g in groups] + ["loss"]
    mods = []
    for g in groups:
        seen: dict[str, None] = {}
        for n in g:
            if by_name[n].module:
                seen.setdefault(by_name[n].module)
        mods.append(tuple(seen))
    mods.append(())
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]

    class _Run(fx.Interpreter):
        def __init__(self, st: _Stages):
            super().__init__(gm)
            self.st = st

        def run_node(self, n: fx.Node):
            k = starts.get(n.name)
            if k is not None:
                self.st.start(k, [self.env[fx_node[a]] for a in feeds[k]])
            return super().run_node(n)

        def call_function(self, target, args, kwargs):
            # the graph holds the function object it was traced with; call the one fused_attention
            # installs, so attention saves what a device's fused kernel saves (as chain_for_modules does)
            if target is _SDPA:
                target = torch.nn.functional.scaled_dot_product_attention
            return super().call_function(target, args, kwargs)

    def run(st: _Stages):
        values = list(inputs.values())
        args = [inputs.get(p.target, values[i] if i < len(values) else None) for i, p in enumerate(placeholders)]
        st.start(0, values)
        return _Run(st).run(*args)

    return meta_or_fake(lambda: _measure(gm, run, len(groups), inputs, loss, names, mods, throughput))


# ---------------------------------------------------------------------------------------------------------
# back to the plan: checkpoint groups


def group_modules(groups: Sequence[tuple[int, int]], linear: LinearChain) -> list[tuple[str, ...]]:
    """The modules of each checkpoint group [a, b) of stages (rotor.solve_groups / top_level_groups), in
    execution order. Raises ValueError for a group containing a stage that runs no module (no
    `checkpoint` line can name it; pass `checkpointable=linear.checkpointable` to solve_groups). An end
    stage is named by the modules it runs; ops it runs in the root module itself (GPT-2's `wte(idx) +
    wpe(pos)`) belong to the group only as far as the runtime's grouping of consecutive modules takes
    them in."""
    out = []
    for a, b in groups:
        mods: list[str] = []
        for i in range(a, b):
            st = linear.stages[i]
            if not st.modules:
                raise ValueError(f"stage {st.name} runs ops outside any module: a plan cannot checkpoint it")
            mods += st.modules
        out.append(tuple(mods))
    return out


def plan_path(name: str) -> str:
    """A torch module name as a plan path: `h.0.attn` -> `h[0].attn`."""
    return re.sub(r"\.(\d+)(?=\.|$)", r"[\1]", name)


def checkpoint_lines(groups: Sequence[Sequence[str]]) -> list[str]:
    """`checkpoint ...` statements for groups of module names: consecutive items of one container are
    written as a range (`h.2`, `h.3`, `h.4` -> `checkpoint h[2:5]`)."""
    return [str(g) for g in checkpoint_value(groups).groups]
