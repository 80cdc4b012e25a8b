"""Bytes moved by collectives in one training step: the cost model's prediction for a lowered plan.

Prediction (`predict_step_traffic`) reads only the lowered `Program` and planlang.cost (nothing runs).
One step = forward, backward, parameter-gradient sums; it issues

    forward    each `Convert`'s path.forward and each op strategy's own collectives (e.g. vocab-parallel
               cross-entropy), in program order;
    loss       the all-reduce that makes the loss global over the axes it is partial on;
    recompute  the forward collectives of every checkpoint group again, when backward recomputes it, up
               to the group's last instruction that saves a tensor (torch's early stop, `recomputed`);
    backward   each `Convert`'s path.backward (only where a gradient flows back through it) and every
               partial-sum reduction at a use (`Run.grad_reduce`);
    grad_sync  each parameter's gradient summed over `Program.grad_sync`, one transfer per bucket as the
               runtime cuts them (planlang.cost.buckets), in the order the buckets' sums start.

Every collective is a `Transfer`: kind, mesh axes, the full size S and the bytes each rank sends,
`planlang.cost.comm.bytes_sent(kind, n, S)` with the definition of S given there (gathered output of an
all-gather, input of a reduce-scatter, the tensor of an all-reduce, the local tensor of an all-to-all).
A sum over several axes is issued by the runtime as one all-reduce per axis (hierarchically), so it is
predicted that way; the cost model's op rules price such a sum as one collective over the product group,
which sends less (2(n-1)/n S instead of the sum over the axes) — `multi_axis_sums` lists where that
happens.

The runtime measures the same units (planlang.runtime.traffic.CollectiveSpy); planlang.model.price.step_time
prices this traffic into a step time.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from planlang.cost.buckets import cut_buckets, launch_order
from planlang.cost.comm import Collective, bytes_sent
from planlang.cost.layout import local_numel, local_shape
from planlang.cost.ops import registry
from planlang.cost.ops.base import DTYPE_BYTES
from planlang.plan.complete import CompleteMesh, CompletePlan
from planlang.plan.types import Plan

from planlang.model.capture.load import build_model, guess_targets, meta_inputs, plan_loss
from planlang.model.program.lowering import Convert, Run, gradient_flow, lower, mark_checkpoints, trained_parameters
from planlang.model.capture.fold import find_fold
from planlang.model.capture.fold_graph import op_graph_of
from planlang.model.capture.opgraph import OpGraph
from planlang.model.program.pipeline_program import cut_program
from planlang.model.program.zero_units import block_ranges

PHASES = ("forward", "loss", "recompute", "backward", "grad_sync", "zero_forward", "zero_backward", "zero_step")


@dataclass(frozen=True)
class Transfer:
    """One collective of the step: `full_bytes` is S of planlang.cost.comm, `bytes` what each rank sends."""

    kind: Collective
    axes: tuple[str, ...]
    full_bytes: int
    bytes: float
    phase: str = ""
    what: str = ""

    def __str__(self) -> str:
        where = f"{self.kind.value}[{','.join(self.axes)}]"
        return f"{self.phase} {where} S={self.full_bytes} B sent={self.bytes:g} B ({self.what})"


def transfer(kind: Collective, axes: tuple[str, ...], full_bytes: int, mesh: CompleteMesh, phase: str = "",
             what: str = "") -> Transfer:
    n = 1
    for a in axes:
        n *= mesh.size_of(a)
    return Transfer(Collective(kind), tuple(axes), int(full_bytes), bytes_sent(Collective(kind), n, full_bytes),
                    phase, what)


@dataclass
class Traffic:
    """The collectives of one step and their totals per kind, per axes and per phase."""

    transfers: list[Transfer] = field(default_factory=list)

    def add(self, t: Transfer) -> None:
        self.transfers.append(t)

    def _total(self, key) -> dict:
        out: dict = defaultdict(float)
        for t in self.transfers:
            out[key(t)] += t.bytes
        return dict(out)

    def _full(self, key) -> dict:
        out: dict = defaultdict(int)
        for t in self.transfers:
            out[key(t)] += t.full_bytes
        return dict(out)

    @property
    def by_kind(self) -> dict[Collective, float]:
        """Bytes each rank sends, per collective kind."""
        return self._total(lambda t: t.kind)

    @property
    def by_axes(self) -> dict[tuple[str, ...], float]:
        """Bytes each rank sends, per mesh axes (a group)."""
        return self._total(lambda t: t.axes)

    @property
    def by_kind_axes(self) -> dict[tuple[Collective, tuple[str, ...]], float]:
        return self._total(lambda t: (t.kind, t.axes))

    @property
    def full_by_kind_axes(self) -> dict[tuple[Collective, tuple[str, ...]], int]:
        """Sum of S (integers) per (kind, axes): equal sums here mean equal bytes sent, exactly."""
        return self._full(lambda t: (t.kind, t.axes))

    @property
    def by_phase(self) -> dict[str, float]:
        return self._total(lambda t: t.phase)

    @property
    def total(self) -> float:
        return sum(t.bytes for t in self.transfers)

    def __len__(self) -> int:
        return len(self.transfers)

    def __str__(self) -> str:
        return f"Traffic({len(self)} collectives, {self.total:g} B sent per rank)"


# ------------------------------------------------------------------------------ prediction
def _per_axis(kind: Collective, axes, full: int, mesh: CompleteMesh, phase: str, what: str) -> list[Transfer]:
    """A sum over several axes as the runtime issues it: one collective per axis, in mesh order."""
    if kind == Collective.ALL_REDUCE:
        return [transfer(kind, (a,), full, mesh, phase, what) for a in mesh.names if a in axes]
    return [transfer(kind, tuple(axes), full, mesh, phase, what)]


# op kinds whose autograd saves no tensor for backward (as planlang.runtime.local_ops runs them): sums,
# differences, views, slices, concatenation and casts (the op table's `saves_nothing`); an instance that
# is the identity (a dropout in eval or with p = 0: `OpKind.is_identity`) saves nothing either
_KINDS = registry()
_SAVES_NOTHING = frozenset(k for k, f in _KINDS.items() if f.saves_nothing)


def _saves_tensors(ins, req: dict[str, bool]) -> bool:
    """Whether running `ins` records a tensor for backward (what torch's checkpoint counts)."""

    if isinstance(ins, Convert) or not any(req.get(a, False) for a in ins.args):
        return False  # conversions are autograd Functions that keep no tensors; no grad, no graph
    op = ins.node.op
    if ins.strategy is not None and op.kind in _SAVES_NOTHING:
        return False
    kind = _KINDS.get(op.kind)  # None: an opaque call
    return not (kind is not None and kind.is_identity(op))


def recomputed(prog, start: int, end: int, req: dict[str, bool], grad: set[str]) -> list:
    """The instructions of checkpoint group [start, end) that backward runs again.

    torch.utils.checkpoint (non-reentrant) recomputes when backward first unpacks a tensor the group
    saved, and with early stop (its default) stops as soon as every saved tensor is back: the trailing
    instructions after the last one that saves a tensor are not rerun, nor their collectives."""

    block = prog.instructions[start:end]
    saving = [k for k, b in enumerate(block) if _saves_tensors(b, req)]
    if not saving or not any(isinstance(block[k], Run) and block[k].node.name in grad for k in saving):
        return []
    return block[:saving[-1] + 1]


def _activation_scale(plan: CompletePlan, prog, value: str, origin: dict[str, str]) -> float:
    """How the bytes of an f32 activation (or its gradient) the lowering priced scale in the step as it
    runs: with parameters stored below f32 (`precision = bf16`: planlang.runtime.precision casts them)
    every floating activation is made in their dtype. Under autocast alone (f32 parameters, `compute`
    below f32) activations are of mixed dtypes and stay priced in f32."""
    prec = plan.precision
    if not prec.mixed or prec.params == "f32":
        return 1.0
    v = prog.graph.values.get(origin.get(value, value))
    return prec.bytes("params") / 4 if v is not None and v.dtype == "f32" else 1.0


def _forward_of(ins, prog, phase: str, scale: float = 1.0) -> list[Transfer]:
    mesh = prog.mesh
    out: list[Transfer] = []
    if isinstance(ins, Convert):
        for c in ins.path.forward:
            out.append(transfer(c.kind, c.axes, int(c.size_bytes * scale), mesh, phase, ins.out))
    elif ins.strategy is not None:
        for c in ins.strategy.forward:  # op-internal collectives (vocab-parallel cross-entropy)
            out.extend(_per_axis(c.kind, c.axes, int(c.size_bytes), mesh, phase, ins.node.name))
    return out


def _origin(prog) -> dict[str, str]:
    base: dict[str, str] = {}
    for ins in prog.instructions:
        if isinstance(ins, Convert):
            base[ins.out] = base.get(ins.value, ins.value)
    return base


def unsupported(plan: CompletePlan) -> str:
    """Why the prediction from a lowered program does not cover `plan` ("" when it does): a pipeline
    without tensor parallelism runs the model's own modules, not a program (planlang.model.price.step_time
    prices its gradient sums from the stages' parameters)."""
    if plan.pipeline is not None and not plan.dims.tensor:
        return ("the plan's pipeline runs the model's own modules; per-step traffic is predicted for plans "
                "without one, or with tensor parallelism in its stages (remove `pipeline`)")
    return ""


@dataclass(frozen=True)
class _Flow:
    """What a program's traffic reads of its gradient flow, computed once per program (a pipeline's
    stages each read the same): which values require grad and receive one, each converted value's origin,
    the parameters backward gives a gradient (lowering.trained_parameters)."""

    req: dict[str, bool]
    grad: set[str]
    origin: dict[str, str]
    trained: set[str]


def _flow(prog) -> _Flow:
    req, grad = gradient_flow(prog)
    origin = _origin(prog)
    # as lowering.trained_parameters, from the same gradient flow and conversion bases
    got = {origin.get(v, v) for v in grad}
    return _Flow(req, grad, origin, {v.ref for v in prog.graph.params() if v.name in got})


def predict_step_traffic(plan: CompletePlan, graph_or_program, only: set[int] | None = None,
                         loss: bool = True, sums: bool = True, zero: list[ZeroUnit] | None = None,
                         flow: _Flow | None = None) -> Traffic:
    """The collectives one training step issues under `plan` (forward, loss, recomputation, backward,
    parameter-gradient sums), priced by planlang.cost. `graph_or_program` is an OpGraph (lowered here,
    with the plan's checkpoint groups) or an already lowered Program. `only`: the instructions of one
    pipeline stage (with `loss` where it runs the loss, `sums` False for a microbatch without the step's
    gradient sums; see `stage_traffic`). `zero`: the plan's ZeRO units (`program_zero_units`), whose
    collectives (`zero_transfers`) are added with the gradient sums."""

    if isinstance(graph_or_program, OpGraph):
        prog = lower(graph_or_program, plan)
        prog.checkpoint_groups = mark_checkpoints(prog, plan)
    else:
        prog = graph_or_program
    unmodelled = unsupported(plan)
    if unmodelled:
        raise ValueError(unmodelled)
    mesh = prog.mesh
    g = prog.graph
    flow = flow if flow is not None else _flow(prog)  # `flow`: the caller's, of this program
    req, grad, origin = flow.req, flow.grad, flow.origin
    traffic = Traffic()
    # the instructions this prediction covers, in program order (a pipeline stage's: `only`)
    count = len(prog.instructions)
    covered = range(count) if only is None else sorted(i for i in only if 0 <= i < count)

    def scale(ins) -> float:
        return _activation_scale(plan, prog, ins.value, origin) if isinstance(ins, Convert) else 1.0

    for i in covered:
        ins = prog.instructions[i]
        for t in _forward_of(ins, prog, "forward", scale(ins)):
            traffic.add(t)

    loss_axes = prog.layouts[prog.loss].partial if prog.loss and loss else ()
    if loss_axes:  # planlang.runtime.apply's _GlobalLoss: the local loss pieces summed over the axes
        lv = g.values.get(prog.loss) or g.values.get(origin.get(prog.loss, prog.loss))
        item = DTYPE_BYTES.get(lv.dtype, 4) if lv else 4
        nbytes = local_numel(lv.shape if lv else (), prog.layouts[prog.loss], mesh) * item
        traffic.transfers += _per_axis(Collective.ALL_REDUCE, loss_axes, nbytes, mesh, "loss", prog.loss)

    # backward, in the order autograd runs it: recompute a checkpoint group when backward reaches it,
    # then the group's own backward
    groups = sorted(prog.checkpoint_groups)
    group_at = {end - 1: (start, end) for start, end in groups}
    for i in reversed(covered):
        if i in group_at:
            for b in recomputed(prog, *group_at[i], req, grad):
                for t in _forward_of(b, prog, "recompute", scale(b)):
                    traffic.add(t)
        ins = prog.instructions[i]
        if isinstance(ins, Convert):
            if ins.out in grad:
                for c in reversed(ins.path.backward):
                    traffic.add(transfer(c.kind, c.axes, int(c.size_bytes * scale(ins)), mesh, "backward", ins.out))
            continue
        if ins.node.name not in grad:
            continue
        for k, axes in ins.grad_reduce:  # executor.GradSum: one all-reduce per axis of the local gradient
            a = ins.args[k]
            if not req.get(a, False):
                continue
            base = g.values[origin.get(a, a)]
            nbytes = local_numel(base.shape, prog.layouts[a], mesh) * DTYPE_BYTES.get(base.dtype, 4)
            nbytes = int(nbytes * _activation_scale(plan, prog, a, origin))
            traffic.transfers += _per_axis(Collective.ALL_REDUCE, axes, nbytes, mesh, "backward", a)

    # ParallelModel.sync_grads: the gradients of the parameters that share the same axes, summed by one
    # all-reduce per axis. The runtime cuts them into DDP-style buckets (planlang.runtime.grad_sync) so the
    # sums overlap backward; an all-reduce's bytes are linear in its size, so the bytes per kind and axes
    # are those of one flat buffer (listed here as one transfer per axes)
    if sums:
        traffic.transfers += gradient_sums(plan, prog, only, flow)
        traffic.transfers += zero_transfers(plan, zero or [])
    return traffic


def gradient_sums(plan: CompletePlan, prog, only: set[int] | None = None, flow: _Flow | None = None) -> list[Transfer]:
    """The parameter-gradient sums of one step (ParallelModel.sync_grads, a pipeline stage's GradSync):
    one all-reduce per axes of the gradients that share them - of the parameters instructions `only`
    read, when given (a pipeline stage). `flow`: the program's gradient flow when the caller has it."""

    g, mesh = prog.graph, prog.mesh
    trained = flow.trained if flow is not None else trained_parameters(prog)
    if only is not None:
        origin = flow.origin if flow is not None else _origin(prog)
        read = {a for i in only for a in ([prog.instructions[i].value] if isinstance(prog.instructions[i], Convert)
                                          else prog.instructions[i].args)}
        read |= {origin.get(a, a) for a in read}
        trained = {v.ref for v in g.params() if v.ref in trained and v.name in read}
    # cut into buckets as the runtime cuts them (planlang.cost.buckets), listed in the order their sums start
    # during backward: all but the last hide behind backward's compute (planlang.model.price.step_time)
    fsdp = set(plan.dims.fsdp)  # summed by FSDP2's reduce-scatter instead (zero_transfers)
    # with precision fields the buckets are summed in the plan's `reduce` dtype (grad_sync casts them)
    reduce = DTYPE_BYTES.get(plan.precision.reduce, 4) if plan.precision.mixed else None
    rows, wire = [], {}
    for v in g.params():
        axes = tuple(a for a in prog.grad_sync.get(v.ref, ()) if a not in fsdp)
        if axes and v.ref in trained:
            numel = local_numel(v.shape, prog.param_specs[v.ref], mesh)
            item = reduce if reduce is not None and v.dtype in ("f32", "bf16", "f16") else DTYPE_BYTES.get(v.dtype, 4)
            rows.append((v.ref, numel * DTYPE_BYTES.get(v.dtype, 4), axes))
            wire[v.ref] = numel * item
    out: list[Transfer] = []
    for b in launch_order(cut_buckets(rows)):
        out += _per_axis(Collective.ALL_REDUCE, b.axes, sum(wire[n] for n in b.names), mesh, "grad_sync",
                         f"{len(b.names)} parameter gradients")
    return out


def stage_traffic(plan: CompletePlan, prog) -> list[Traffic]:
    """Per pipeline stage of a pipeline x tensor-parallel plan, the collectives of one step: `prog` is the
    program of one microbatch (planlang.model.program.pipeline_program), cut into the plan's stages; each stage
    issues its instructions' collectives once per microbatch (the last stage also its loss's), then sums
    its parameters' gradients once (the point-to-point sends between stages are not listed)."""

    cut = cut_program(prog, plan)
    m = plan.pipeline.microbatches if plan.pipeline is not None else 1
    last = len(cut.stages) - 1
    flow = _flow(prog)  # the whole program's gradient flow, read by every stage
    out = []
    for st in cut.stages:
        only = set(st.instructions) | (set(cut.tail) if st.index == last else set())
        micro = predict_step_traffic(plan, prog, only, loss=st.index == last, sums=False, flow=flow)
        out.append(Traffic([t for _ in range(m) for t in micro.transfers] + gradient_sums(plan, prog, only, flow)))
    return out


def multi_axis_sums(prog) -> list[tuple[str, tuple[str, ...]]]:
    """(what, axes) of every sum the runtime splits into one all-reduce per axis where the cost model's
    op rule prices one collective over the product group (see the module docstring)."""

    out = [(ins.args[k], axes) for ins in prog.instructions if isinstance(ins, Run)
           for k, axes in ins.grad_reduce if len(axes) > 1]
    out += [(p, axes) for p, axes in prog.grad_sync.items() if len(axes) > 1]
    return out


_GRAPHS: dict[tuple, object] = {}


def graph_of(plan: Plan):
    """The op graph of the plan's model with its loss, traced once per process per (model, inputs, loss):
    what does not depend on a candidate's choices. A solve shares it between the intra-op ILP
    (planlang.solve.facts) and every candidate lowered at the same input shapes (the whole batch, or one
    microbatch of it), so a shape is traced once."""

    if plan.model is None:
        raise ValueError("the plan declares no model: it has no op graph")
    key = (repr(plan.model), plan.path, tuple(repr(i) for i in plan.inputs))
    if key not in _GRAPHS:
        model = build_model(plan.model, plan.path)
        inputs = meta_inputs(plan.inputs)
        loss = plan_loss(plan)
        # a model of N identical blocks runs cut to a few of them, its graph expanded (the same graph:
        # planlang.model.capture.fold_graph): a solve traces each microbatch shape it prices
        fold = find_fold(model)
        targets = guess_targets(model, loss, inputs, fold) if loss else None
        _GRAPHS[key] = op_graph_of(model, inputs, loss, targets, fold)[0] if targets is not None else \
            op_graph_of(model, inputs, None, (), fold)[0]
    return _GRAPHS[key]


# ------------------------------------------------------------------------------ ZeRO
@dataclass(frozen=True)
class ZeroUnit:
    """What ZeRO's collectives move for one group of parameters: an FSDP2 unit (ZeRO-2/3: a repeated
    block, or the root unit holding every other parameter; a pipeline stage is one unit), or, for ZeRO-1,
    the parameters whose updated values are broadcast after the step."""

    name: str
    # bytes of each local parameter (this rank's tensor-parallel piece) as gathered, in the `params`
    # dtype (under ZeRO-2/3 FSDP2 pads its dim 0 to a multiple of the ZeRO axis: `fsdp_numel`)
    params: tuple[int, ...]
    reduced: int  # bytes of the unit's gradients as reduce-scattered (the `reduce` dtype), padded alike
    root: bool = False

    @property
    def gathered(self) -> int:
        return sum(self.params)


def zero_transfers(plan: CompletePlan, units: list[ZeroUnit], microbatches: int = 1) -> list[Transfer]:
    """The collectives ZeRO adds to a step, besides the gradient sums the lowering plans
    (planlang.runtime.apply, pass 7; planlang.runtime.zero):

        ZeRO-1     ZeroRedundancyOptimizer: after its step every rank broadcasts the parameters it owns
                   to the ZeRO axis, one broadcast per parameter (S = the parameter)   phase zero_step
        ZeRO-2/3   FSDP2 over the ZeRO axis (HSDP: replicated over the one other data axis):
                   each unit all-gathers its parameters before its forward (S = the unit)  zero_forward
                   ZeRO-3 reshards every block after its forward and gathers it again for its
                   backward; the root unit stays gathered (planlang.runtime.apply, as FSDP2's
                   default for the root; a pipeline stage is gathered again)               zero_backward
                   each unit reduce-scatters its gradients (S = the unit's gradients), then under HSDP
                   all-reduces its shard over the replicate axis                          zero_backward

    In a pipeline every microbatch's forward and backward runs the stage's unit: ZeRO-3 gathers it
    `microbatches` times in each; the gradients are reduce-scattered once, after the last. A step that
    accumulates without a pipeline (planlang.model.price.accumulation) reshards every unit after each
    microbatch's backward (FSDP2's default): each unit is gathered in every microbatch's forward, ZeRO-3's
    blocks in every backward too; the reduce-scatters run once, after the last."""
    dims, mesh = plan.dims, plan.mesh
    z = dims.zero_axis
    if dims.zero_stage == 0 or z is None or mesh is None:
        return []
    n = dims.size(z)
    if n == 1:
        return []
    out: list[Transfer] = []
    if dims.zero_stage == 1:
        return [transfer(Collective.BROADCAST, (z,), b, mesh, "zero_step", u.name) for u in units for b in u.params]
    replicate = dims.replicate
    again = dims.zero_stage == 3
    gathers = microbatches if again or plan.pipeline is None else 1
    for u in units:
        out += [transfer(Collective.ALL_GATHER, (z,), u.gathered, mesh, "zero_forward", u.name)] * gathers
    if again:  # not the root: planlang.runtime.apply keeps it gathered from forward to backward
        for u in reversed([u for u in units if not u.root]):
            out += [transfer(Collective.ALL_GATHER, (z,), u.gathered, mesh, "zero_backward", u.name)] * gathers
    # backward reaches the last block first; the root unit's reduce-scatter runs last (FSDP2's final
    # callback at the end of backward)
    for u in [u for u in reversed(units) if not u.root] + [u for u in units if u.root]:
        out.append(transfer(Collective.REDUCE_SCATTER, (z,), u.reduced, mesh, "zero_backward", u.name))
        for a in replicate:
            out.append(transfer(Collective.ALL_REDUCE, (a,), u.reduced // n, mesh, "zero_backward", u.name))
    return out


def fsdp_numel(shape: tuple[int, ...], shards: int) -> int:
    """Elements FSDP2 gathers and reduce-scatters for a parameter of local `shape` over `shards` ranks: dim 0
    padded to a multiple of `shards` (its even chunks)."""
    if not shape:
        return shards
    rest = 1
    for d in shape[1:]:
        rest *= d
    return -(-shape[0] // shards) * shards * rest


def program_zero_units(model, prog, plan: CompletePlan) -> list[ZeroUnit]:
    """The plan's ZeRO units for a program run without a pipeline: under ZeRO-2/3 the blocks
    planlang.runtime.apply shards as FSDP2 units of their own (planlang.model.program.zero_units.block_ranges),
    in execution order, then the root unit; under ZeRO-1 one group of every trained parameter."""
    opt = plan.optimizer
    if opt is None or opt.zero_stage == 0:
        return []
    prec = plan.precision
    trained = trained_parameters(prog)
    sizes: dict[str, tuple[int, int]] = {}  # parameter -> (bytes gathered, bytes reduced)
    shards = plan.dims.zero_shards
    for v in prog.graph.params():
        if v.ref in sizes:
            continue
        local = local_shape(v.shape, prog.param_specs[v.ref], prog.mesh)
        numel = fsdp_numel(local, shards) if opt.zero_stage >= 2 else local_numel(v.shape, prog.param_specs[v.ref], prog.mesh)
        own = DTYPE_BYTES.get(v.dtype, 4)
        floating = v.dtype in ("f32", "bf16", "f16")
        gather = prec.bytes("params") if prec.mixed and floating else own
        reduce = prec.bytes("reduce") if prec.mixed and floating else own
        sizes[v.ref] = (numel * gather, numel * reduce if v.ref in trained else 0)
    if opt.zero_stage == 1:  # the optimizer holds every parameter
        return [ZeroUnit("parameters", tuple(g for g, _ in sizes.values()), sum(r for _, r in sizes.values()))]
    blocks = block_ranges(model, prog)[0]
    units, rest = [], dict(sizes)
    for b in blocks:
        mine = [n for n in sizes if n == b.name or n.startswith(b.name + ".")]
        units.append(ZeroUnit(b.name, tuple(sizes[n][0] for n in mine), sum(sizes[n][1] for n in mine)))
        for n in mine:
            rest.pop(n, None)
    units.append(ZeroUnit("root", tuple(g for g, _ in rest.values()), sum(r for _, r in rest.values()), root=True))
    return units
