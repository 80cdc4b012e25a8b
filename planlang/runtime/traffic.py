"""Bytes moved by collectives in one training step: the cost model's prediction for a lowered plan, and
a measurement of the torch.distributed calls a real step makes, in the same units.

Prediction (`predict_step_traffic`) reads only the lowered `Program` and planlang.cost (nothing runs).
One step = forward, backward, parameter-gradient sums; it issues

    forward    each `Convert`'s path.forward and each op strategy's own collectives (e.g. vocab-parallel
               cross-entropy), in program order;
    loss       the all-reduce that makes the loss global over the axes it is partial on;
    recompute  the forward collectives of every checkpoint group again, when backward recomputes it, up
               to the group's last instruction that saves a tensor (torch's early stop, `recomputed`);
    backward   each `Convert`'s path.backward (only where a gradient flows back through it) and every
               partial-sum reduction at a use (`Run.grad_reduce`);
    grad_sync  each parameter's gradient summed over `Program.grad_sync` (parameters with the same axes as
               one transfer; the runtime's buckets split it into several calls of the same total bytes).

Every collective is a `Transfer`: kind, mesh axes, the full size S and the bytes each rank sends,
`planlang.cost.comm.bytes_sent(kind, n, S)` with the definition of S given there (gathered output of an
all-gather, input of a reduce-scatter, the tensor of an all-reduce, the local tensor of an all-to-all).
A sum over several axes is issued by the runtime as one all-reduce per axis (hierarchically), so it is
predicted that way; the cost model's op rules price such a sum as one collective over the product group,
which sends less (2(n-1)/n S instead of the sum over the axes) — `multi_axis_sums` lists where that
happens.

Measurement (`CollectiveSpy`) is a TorchDispatchMode: it sees every c10d and functional-collective op
the step dispatches (eager `dist.*` calls, `_functional_collectives`, and those autograd runs in
backward), whoever issues them, and maps each call's process group to the mesh axes it spans.
"""
from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field

from planlang.cost.comm import Collective, bytes_sent, collective_time, group
from planlang.cost.layout import local_numel
from planlang.cost.ops.base import DTYPE_BYTES
from planlang.plan.complete import CompleteMesh, CompletePlan
from planlang.plan.data import tensor_axes
from planlang.plan.types import Mesh
from planlang.runtime.launch import coords_of

PHASES = ("forward", "loss", "recompute", "backward", "grad_sync")


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


def transfer(kind: Collective, axes: tuple[str, ...], full_bytes: int, mesh: Mesh, phase: str = "",
             what: str = "") -> Transfer:
    n = 1
    for a in axes:
        n *= mesh.axis_size(a) or 1
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
def _per_axis(kind: Collective, axes, full: int, mesh: Mesh, phase: str, what: str) -> list[Transfer]:
    """A sum over several axes as the runtime issues it: one collective per axis, in mesh order."""
    if kind == Collective.ALL_REDUCE:
        return [transfer(kind, (a,), full, mesh, phase, what) for a in mesh.names if a in axes]
    return [transfer(kind, tuple(axes), full, mesh, phase, what)]


def _gradient_flow(prog) -> tuple[dict[str, bool], set[str]]:
    # lazy: torch loads only when this runs
    from planlang.model.lowering import gradient_flow

    return gradient_flow(prog)


def trained_parameters(prog) -> set[str]:
    # lazy: torch loads only when this runs
    from planlang.model.lowering import trained_parameters as trained

    return trained(prog)


# op kinds whose autograd saves no tensor for backward (as planlang.runtime.local_ops runs them): sums,
# differences, views, slices and concatenation; the identity of a dropout with p = 0
_SAVES_NOTHING = frozenset({"add", "sub", "neg", "sum", "mean", "view", "reshape", "flatten", "unflatten",
                            "transpose", "permute", "cat", "split", "slice", "getitem"})


def _saves_tensors(ins, req: dict[str, bool]) -> bool:
    """Whether running `ins` records a tensor for backward (what torch's checkpoint counts)."""
    # lazy: torch loads only when this runs
    from planlang.model.lowering import Convert

    if isinstance(ins, Convert) or not any(req.get(a, False) for a in ins.args):
        return False  # conversions are autograd Functions that keep no tensors; no grad, no graph
    op = ins.node.op
    if ins.strategy is not None and op.kind in _SAVES_NOTHING:
        return False
    if op.kind == "dropout" and (not op.attr("training", True) or op.attr("p", 0.0) == 0):
        return False
    return True


def recomputed(prog, start: int, end: int, req: dict[str, bool], grad: set[str]) -> list:
    """The instructions of checkpoint group [start, end) that backward runs again.

    torch.utils.checkpoint (non-reentrant) recomputes when backward first unpacks a tensor the group
    saved, and with early stop (its default) stops as soon as every saved tensor is back: the trailing
    instructions after the last one that saves a tensor are not rerun, nor their collectives."""
    # lazy: torch loads only when this runs
    from planlang.model.lowering import Run

    block = prog.instructions[start:end]
    saving = [k for k, b in enumerate(block) if _saves_tensors(b, req)]
    if not saving or not any(isinstance(block[k], Run) and block[k].node.name in grad for k in saving):
        return []
    return block[:saving[-1] + 1]


def _forward_of(ins, prog, phase: str) -> list[Transfer]:
    # lazy: torch loads only when this runs
    from planlang.model.lowering import Convert

    mesh = prog.mesh
    out: list[Transfer] = []
    if isinstance(ins, Convert):
        for c in ins.path.forward:
            out.append(transfer(c.kind, c.axes, int(c.size_bytes), mesh, phase, ins.out))
    elif ins.strategy is not None:
        for c in ins.strategy.forward:  # op-internal collectives (vocab-parallel cross-entropy)
            out.extend(_per_axis(c.kind, c.axes, int(c.size_bytes), mesh, phase, ins.node.name))
    return out


def _origin(prog) -> dict[str, str]:
    # lazy: torch loads only when this runs
    from planlang.model.lowering import Convert

    base: dict[str, str] = {}
    for ins in prog.instructions:
        if isinstance(ins, Convert):
            base[ins.out] = base.get(ins.value, ins.value)
    return base


def unsupported(plan: CompletePlan) -> str:
    """Why the prediction does not cover `plan` ("" when it does): pipelines and ZeRO-2/3 (FSDP2's
    parameter all-gathers and gradient reduce-scatters) are not modelled."""
    if plan.pipeline is not None and not tensor_axes(plan):
        return ("the plan's pipeline runs the model's own modules; per-step traffic is predicted for plans "
                "without one, or with tensor parallelism in its stages (remove `pipeline`)")
    stage = plan.optimizer.zero_stage if plan.optimizer is not None else 0
    if stage >= 2:
        return (f"the plan uses ZeRO-{stage}, whose FSDP2 collectives the prediction does not model; "
                "predict with `zero = 1` or without ZeRO")
    return ""


def predict_step_traffic(plan: CompletePlan, graph_or_program, only: set[int] | None = None,
                         loss: bool = True, sums: bool = True) -> Traffic:
    """The collectives one training step issues under `plan` (forward, loss, recomputation, backward,
    parameter-gradient sums), priced by planlang.cost. `graph_or_program` is an OpGraph (lowered here,
    with the plan's checkpoint groups) or an already lowered Program. `only`: the instructions of one
    pipeline stage (with `loss` where it runs the loss, `sums` False for a microbatch without the step's
    gradient sums; see `stage_traffic`)."""
    # lazy: torch loads only when this runs
    from planlang.model.opgraph import OpGraph
    from planlang.model.lowering import Convert, lower, mark_checkpoints

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
    req, grad = _gradient_flow(prog)
    origin = _origin(prog)
    traffic = Traffic()

    def mine(i: int) -> bool:
        return only is None or i in only

    for i, ins in enumerate(prog.instructions):
        if mine(i):
            for t in _forward_of(ins, prog, "forward"):
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
    for i in range(len(prog.instructions) - 1, -1, -1):
        if not mine(i):
            continue
        if i in group_at:
            for b in recomputed(prog, *group_at[i], req, grad):
                for t in _forward_of(b, prog, "recompute"):
                    traffic.add(t)
        ins = prog.instructions[i]
        if isinstance(ins, Convert):
            if ins.out in grad:
                for c in reversed(ins.path.backward):
                    traffic.add(transfer(c.kind, c.axes, int(c.size_bytes), mesh, "backward", ins.out))
            continue
        if ins.node.name not in grad:
            continue
        for k, axes in ins.grad_reduce:  # executor.GradSum: one all-reduce per axis of the local gradient
            a = ins.args[k]
            if not req.get(a, False):
                continue
            base = g.values[origin.get(a, a)]
            nbytes = local_numel(base.shape, prog.layouts[a], mesh) * DTYPE_BYTES.get(base.dtype, 4)
            traffic.transfers += _per_axis(Collective.ALL_REDUCE, axes, nbytes, mesh, "backward", a)

    # ParallelModel.sync_grads: the gradients of the parameters that share the same axes, summed by one
    # all-reduce per axis. The runtime cuts them into DDP-style buckets (planlang.runtime.grad_sync) so the
    # sums overlap backward; an all-reduce's bytes are linear in its size, so the bytes per kind and axes
    # are those of one flat buffer (listed here as one transfer per axes)
    if sums:
        traffic.transfers += gradient_sums(plan, prog, only)
    return traffic


def gradient_sums(plan: CompletePlan, prog, only: set[int] | None = None) -> list[Transfer]:
    """The parameter-gradient sums of one step (ParallelModel.sync_grads, a pipeline stage's GradSync):
    one all-reduce per axes of the gradients that share them - of the parameters instructions `only`
    read, when given (a pipeline stage)."""
    # lazy: torch loads only when this runs
    from planlang.model.lowering import Convert

    g, mesh = prog.graph, prog.mesh
    trained = trained_parameters(prog)
    if only is not None:
        origin = _origin(prog)
        read = {a for i in only for a in ([prog.instructions[i].value] if isinstance(prog.instructions[i], Convert)
                                          else prog.instructions[i].args)}
        read |= {origin.get(a, a) for a in read}
        trained = {v.ref for v in g.params() if v.ref in trained and v.name in read}
    # The runtime cuts them into DDP-style buckets (planlang.runtime.grad_sync) so the sums overlap
    # backward; an all-reduce's bytes are linear in its size, so the bytes per kind and axes are those of
    # one flat buffer (listed here as one transfer per axes)
    buckets: dict[tuple[str, ...], list[int]] = {}
    # with precision fields the buckets are summed in the plan's `reduce` dtype (grad_sync casts them)
    reduce = DTYPE_BYTES.get(plan.precision.reduce, 4) if plan.precision.mixed else None
    for v in g.params():
        axes = prog.grad_sync.get(v.ref, ())
        if axes and v.ref in trained:
            item = reduce if reduce is not None and v.dtype in ("f32", "bf16", "f16") else DTYPE_BYTES.get(v.dtype, 4)
            nbytes = local_numel(v.shape, prog.param_specs[v.ref], mesh) * item
            buckets.setdefault(axes, []).append(nbytes)
    out: list[Transfer] = []
    for axes, sizes in buckets.items():
        out += _per_axis(Collective.ALL_REDUCE, axes, sum(sizes), mesh, "grad_sync", f"{len(sizes)} parameter gradients")
    return out


def stage_traffic(plan: CompletePlan, prog) -> list[Traffic]:
    """Per pipeline stage of a pipeline x tensor-parallel plan, the collectives of one step: `prog` is the
    program of one microbatch (planlang.model.pipeline_program), cut into the plan's stages; each stage
    issues its instructions' collectives once per microbatch (the last stage also its loss's), then sums
    its parameters' gradients once (the point-to-point sends between stages are not listed)."""
    # lazy: torch loads only when this runs
    from planlang.model.pipeline_program import cut_program

    cut = cut_program(prog, plan)
    m = plan.pipeline.microbatches if plan.pipeline is not None else 1
    last = len(cut.stages) - 1
    out = []
    for st in cut.stages:
        only = set(st.instructions) | (set(cut.tail) if st.index == last else set())
        micro = predict_step_traffic(plan, prog, only, loss=st.index == last, sums=False)
        out.append(Traffic([t for _ in range(m) for t in micro.transfers] + gradient_sums(plan, prog, only)))
    return out


def multi_axis_sums(prog) -> list[tuple[str, tuple[str, ...]]]:
    """(what, axes) of every sum the runtime splits into one all-reduce per axis where the cost model's
    op rule prices one collective over the product group (see the module docstring)."""
    # lazy: torch loads only when this runs
    from planlang.model.lowering import Run

    out = [(ins.args[k], axes) for ins in prog.instructions if isinstance(ins, Run)
           for k, axes in ins.grad_reduce if len(axes) > 1]
    out += [(p, axes) for p, axes in prog.grad_sync.items() if len(axes) > 1]
    return out


# ------------------------------------------------------------------------------ measurement
# op name (c10d eager ops, functional collectives) -> (kind, how to get S from the call's arguments)
def _tensors(a) -> list:
    # lazy: torch loads only when this runs
    import torch

    if isinstance(a, torch.Tensor):
        return [a]
    if isinstance(a, (list, tuple)):
        return [t for x in a for t in _tensors(x)]
    return []


def _nbytes(ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


class CollectiveSpy:
    """Records every collective dispatched while active: `with CollectiveSpy(groups) as spy: step()`.

    `groups` is the run's planlang.runtime.redistribute.MeshGroups; a call's process group is mapped to
    the mesh axes whose groups it equals (a group over several axes is matched by its ranks). Each call
    becomes a `Transfer` with S computed from the call's own tensors (the output of an all-gather, the
    input of a reduce-scatter or all-to-all, the tensor(s) of an all-reduce) and the phase the caller
    names by setting `spy.phase` ("forward", "backward", "grad_sync") as the step goes on."""

    def __init__(self, groups) -> None:
        # lazy: torch loads only when this runs
        import torch.distributed as dist

        self.mesh: CompleteMesh = groups.mesh
        self._by_name: dict[str, tuple[str, ...]] = {}
        self._by_ranks: dict[tuple[int, ...], tuple[str, ...]] = {}
        for a in self.mesh.names:
            pg = groups.group(a)
            self._by_name[pg.group_name] = (a,)
            self._by_ranks[tuple(sorted(dist.get_process_group_ranks(pg)))] = (a,)
        self.traffic = Traffic()
        self.phase = "measured"
        self.unknown: list[str] = []  # collectives on groups that are no mesh axis
        self._mode = None

    def _axes(self, pg) -> tuple[str, ...] | None:
        # lazy: torch loads only when this runs
        import torch.distributed as dist

        if isinstance(pg, str):
            name = pg
            if name in self._by_name:
                return self._by_name[name]
            # lazy: torch loads only when this runs
            from torch.distributed.distributed_c10d import _resolve_process_group

            pg = _resolve_process_group(name)
        if not isinstance(pg, dist.ProcessGroup):
            pg = dist.ProcessGroup.unbox(pg)
        if pg.group_name in self._by_name:
            return self._by_name[pg.group_name]
        ranks = tuple(sorted(dist.get_process_group_ranks(pg)))
        if ranks in self._by_ranks:
            return self._by_ranks[ranks]
        # a group over several axes: the axes whose coordinates vary within it

        cs = [coords_of(r, self.mesh) for r in ranks]
        axes = tuple(a for a in self.mesh.names if len({c[a] for c in cs}) > 1)
        n = 1
        for a in axes:
            n *= self.mesh.axis_size(a) or 1
        return axes if n == len(ranks) else None

    def _record(self, func, args, kwargs, out) -> None:
        name = func._schema.name.split("::")[-1] if hasattr(func, "_schema") else str(func)
        ns = func.namespace
        kind, full, pg = None, 0, None
        if ns == "_c10d_functional" or ns == "_c10d_functional_autograd":
            # (input, [...,] group_size?, group_name) with the group name the last str argument
            pg = next((a for a in reversed(args) if isinstance(a, str)), None)
            if name.startswith("all_reduce"):
                kind, full = Collective.ALL_REDUCE, _nbytes(_tensors(args[0]))
            elif name.startswith("all_gather_into_tensor"):
                kind, full = Collective.ALL_GATHER, _nbytes(_tensors(out))
            elif name.startswith("reduce_scatter_tensor"):
                kind, full = Collective.REDUCE_SCATTER, _nbytes(_tensors(args[0]))
            elif name.startswith("all_to_all_single"):
                kind, full = Collective.ALL_TO_ALL, _nbytes(_tensors(args[0]))
            elif name.startswith("broadcast"):
                kind, full = Collective.BROADCAST, _nbytes(_tensors(args[0]))
        elif ns == "c10d":
            pg = next((a for a in args if not isinstance(a, (list, tuple, bool, int, type(None)))
                       and not _tensors(a) and _is_pg(a)), None)
            if name in ("allreduce_", "allreduce_coalesced_"):
                kind, full = Collective.ALL_REDUCE, _nbytes(_tensors(args[0]))
            elif name in ("_allgather_base_", "allgather_into_tensor_coalesced_", "allgather_"):
                kind, full = Collective.ALL_GATHER, _nbytes(_tensors(args[0]))  # outputs come first
            elif name in ("_reduce_scatter_base_", "reduce_scatter_tensor_coalesced_", "reduce_scatter_"):
                kind, full = Collective.REDUCE_SCATTER, _nbytes(_tensors(args[1]))
            elif name in ("alltoall_base_", "alltoall_"):
                kind, full = Collective.ALL_TO_ALL, _nbytes(_tensors(args[1]))
            elif name == "broadcast_":
                kind, full = Collective.BROADCAST, _nbytes(_tensors(args[0]))
            elif name in ("send", "recv_"):
                kind, full = Collective.SEND_RECV, _nbytes(_tensors(args[0]))
        if kind is None:
            return
        axes = self._axes(pg) if pg is not None else None
        if axes is None:
            self.unknown.append(f"{ns}.{name}")
            return
        self.traffic.add(transfer(kind, axes, full, self.mesh, self.phase, f"{ns}.{name}"))

    def __enter__(self) -> "CollectiveSpy":
        # lazy: torch loads only when this runs
        from torch.utils._python_dispatch import TorchDispatchMode

        spy = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if func.namespace in ("c10d", "_c10d_functional", "_c10d_functional_autograd"):
                    spy._record(func, args, kwargs or {}, out)
                return out

        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)
        self._mode = None


def _is_pg(a) -> bool:
    # lazy: torch loads only when this runs
    import torch
    import torch.distributed as dist

    if isinstance(a, dist.ProcessGroup):
        return True
    return isinstance(a, torch.ScriptObject) and "ProcessGroup" in str(a._type())


# ------------------------------------------------------------------------------ table
def _size(b: float) -> str:
    for unit, k in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if b >= k:
            return f"{b / k:.2f} {unit}"
    return f"{b:.0f} B"


def render_traffic(traffic: Traffic, mesh: Mesh, title: str = "") -> str:
    """The per-step traffic as a text table: one row per (phase, kind, axes), then totals per kind and
    per axes, with the cost model's time for the collectives (planlang.cost.comm.collective_time)."""

    def seconds(t: Transfer) -> float:
        return collective_time(t.kind, group(mesh, t.axes), t.full_bytes)

    rows: dict[tuple[str, str, str], list] = {}
    for t in traffic.transfers:
        r = rows.setdefault((t.phase, t.kind.value, ",".join(t.axes)), [0, 0, 0.0, 0.0])
        r[0] += 1
        r[1] += t.full_bytes
        r[2] += t.bytes
        r[3] += seconds(t)
    order = {p: i for i, p in enumerate(PHASES)}
    head = (f"{'phase':<10} {'collective':<15} {'axes':<8} {'calls':>5} {'S (full size)':>14} "
            f"{'sent per rank':>14} {'time':>10}")
    lines = [f"collective traffic of one training step{': ' + title if title else ''} (mesh {mesh})", head,
             "-" * len(head)]
    for (phase, kind, axes), (n, full, sent, sec) in sorted(rows.items(),
                                                            key=lambda kv: (order.get(kv[0][0], 9), kv[0][1:])):
        lines.append(f"{phase:<10} {kind:<15} {axes:<8} {n:>5} {_size(full):>14} {_size(sent):>14} "
                     f"{sec * 1e3:>8.3f} ms")
    lines.append("-" * len(head))
    for label, totals in (("kind", {k.value: v for k, v in traffic.by_kind.items()}),
                          ("axes", {",".join(a): v for a, v in traffic.by_axes.items()})):
        listed = ", ".join(f"{k} {_size(v)}" for k, v in sorted(totals.items()))
        lines.append(f"per {label}: {listed or 'none'}")
    total_s = sum(seconds(t) for t in traffic.transfers)
    lines.append(f"total: {len(traffic)} collectives, {traffic.total:,.0f} B ({_size(traffic.total)}) sent per rank "
                 f"per step, {total_s * 1e3:.3f} ms by the cost model (not overlapped with compute)")
    return "\n".join(lines) + "\n"


def traffic_table(plan_path: str) -> str:
    """`planlang lower PLAN --traffic`: the predicted collective traffic of one step of the plan (the model
    is built on meta and lowered; nothing runs)."""

    # lazy: torch loads only when this runs
    from planlang.model.load import build_model
    from planlang.runtime.apply import load_plan, lower_plan

    plan = load_plan(plan_path)
    if unsupported(plan):
        raise ValueError(f"{plan_path}: {unsupported(plan)}")
    title = os.path.relpath(plan.path) if plan.path else str(plan_path)
    if plan.pipeline is not None:  # pipeline x tensor parallelism: each stage's collectives
        # lazy: torch loads only when this runs
        from planlang.model.pipeline_program import microbatch_plan

        prog = lower_plan(build_model(plan.model, plan.path), microbatch_plan(plan))
        return "".join(render_traffic(t, plan.mesh, f"{title}, stage {s} ({plan.pipeline.microbatches} microbatches)")
                       for s, t in enumerate(stage_traffic(plan, prog)))
    prog = lower_plan(build_model(plan.model, plan.path), plan)
    traffic = predict_step_traffic(plan, prog)
    out = render_traffic(traffic, prog.mesh, os.path.relpath(plan.path) if plan.path else str(plan_path))
    multi = multi_axis_sums(prog)
    if multi:
        out += (f"note: {len(multi)} sums span several axes; the runtime issues one all-reduce per axis, which "
                "sends more than the one collective over their product group the op rules price\n")
    return out


# ------------------------------------------------------------------------------ for the solver
_GRAPHS: dict[tuple, object] = {}


def _graph_of(plan: CompletePlan):
    """The op graph of the plan's model with its loss, traced once per (model, inputs, loss)."""
    # lazy: torch loads only when this runs
    from planlang.model.load import build_model, guess_targets, meta_inputs, plan_loss
    from planlang.model.opgraph import op_graph

    key = (repr(plan.model), plan.path, tuple(repr(i) for i in plan.inputs))
    if key not in _GRAPHS:
        model = build_model(plan.model, plan.path)
        inputs = meta_inputs(plan.inputs)
        loss = plan_loss(plan)
        targets = guess_targets(model, loss, inputs) if loss else None
        _GRAPHS[key] = op_graph(model, inputs, loss, targets) if targets is not None else op_graph(model, inputs)
    return _GRAPHS[key]


def step_comm_seconds(plan: CompletePlan) -> float:
    """Seconds one step spends in collectives under `plan` by the cost model's alpha-beta prices (the
    traffic `predict_step_traffic` predicts, not overlapped with compute): the `comm_time` hook
    `planlang solve` prices candidates with. Raises ValueError for plans the prediction does not cover
    (pipelines, ZeRO-2/3)."""

    why = unsupported(plan)
    if why:
        raise ValueError(why)

    def seconds(traffic: Traffic) -> float:
        return sum(collective_time(t.kind, group(plan.mesh, t.axes), t.full_bytes) for t in traffic.transfers)

    if plan.pipeline is not None:  # pipeline x tensor parallelism: the busiest stage's collectives
        # lazy: torch loads only when this runs
        from planlang.model.lowering import lower, mark_checkpoints
        from planlang.model.pipeline_program import microbatch_plan

        micro = microbatch_plan(plan)
        prog = lower(_graph_of(micro), micro)
        prog.checkpoint_groups = mark_checkpoints(prog, micro)
        return max(seconds(t) for t in stage_traffic(plan, prog))
    return seconds(predict_step_traffic(plan, _graph_of(plan)))
