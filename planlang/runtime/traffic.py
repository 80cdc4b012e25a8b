"""What collectives a real training step issues, measured in the units planlang.model.price.traffic predicts
(`Transfer`, `Traffic`), and the per-step traffic table `planlang lower --traffic` prints.

Measurement (`CollectiveSpy`) is a TorchDispatchMode: it sees every c10d and functional-collective op
the step dispatches (eager `dist.*` calls, `_functional_collectives`, and those autograd runs in
backward), whoever issues them, and maps each call's process group to the mesh axes it spans.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import GroupName, _resolve_process_group
from torch.utils._python_dispatch import TorchDispatchMode

from planlang.cost.comm import Collective, collective_time, group
from planlang.model.capture.load import build_model
from planlang.model.program.pipeline_program import microbatch_plan
from planlang.model.price.accumulation import step_traffic
from planlang.plan.microbatches import accumulation_microbatch
from planlang.plan.stage_meshes import describe, heterogeneous, shape_plans, stage_shapes
from planlang.model.price.traffic import (PHASES, Traffic, Transfer, stage_traffic, transfer,  # noqa: F401 - API
                                    multi_axis_sums, predict_step_traffic, program_zero_units, unsupported)
from planlang.plan.complete import CompleteMesh
from planlang.plan.types import Mesh
from planlang.runtime.apply import load_plan, lower_plan
from planlang.plan.complete import CompletePlan, plan_mesh, plan_model
from planlang.runtime.launch import coords_of


# ------------------------------------------------------------------------------ measurement
# op name (c10d eager ops, functional collectives) -> (kind, how to get S from the call's arguments)
def _tensors(a) -> list:
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
        self._mode: TorchDispatchMode | None = None

    def _axes(self, pg) -> tuple[str, ...] | None:
        if isinstance(pg, str):
            name = pg
            if name in self._by_name:
                return self._by_name[name]
            pg = _resolve_process_group(GroupName(name))
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
            n *= self.mesh.size_of(a)
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
        spy = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if func.namespace in ("c10d", "_c10d_functional", "_c10d_functional_autograd"):
                    spy._record(func, args, kwargs or {}, out)
                return out

        self._mode = mode = _Mode()
        mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        mode, self._mode = self._mode, None
        if mode is not None:  # entered
            mode.__exit__(*exc)


def _is_pg(a) -> bool:
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
    head = (f"{'phase':<13} {'collective':<15} {'axes':<8} {'calls':>5} {'S (full size)':>14} "
            f"{'sent per rank':>14} {'time':>10}")
    lines = [f"collective traffic of one training step{': ' + title if title else ''} (mesh {mesh})", head,
             "-" * len(head)]
    for (phase, kind, axes), (n, full, sent, sec) in sorted(rows.items(),
                                                            key=lambda kv: (order.get(kv[0][0], 9), kv[0][1:])):
        lines.append(f"{phase:<13} {kind:<15} {axes:<8} {n:>5} {_size(full):>14} {_size(sent):>14} "
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


    plan = load_plan(plan_path)
    if unsupported(plan):
        raise ValueError(f"{plan_path}: {unsupported(plan)}")
    title = os.path.relpath(plan.path) if plan.path else str(plan_path)
    if plan.pipeline is not None:  # pipeline x tensor parallelism: each stage's collectives, on its own sizes
        model, m = build_model(plan_model(plan), plan.path), plan.pipeline.microbatches
        own = heterogeneous(plan)  # stages of their own degrees: each on the plan of its sizes
        shapes: dict[tuple[tuple[str, int], ...], CompletePlan] = shape_plans(plan) if own else {(): plan}
        lowered = {sizes: None if unsupported(sp) else stage_traffic(sp, lower_plan(model, microbatch_plan(sp)))
                   for sizes, sp in shapes.items()}
        parts: list[str] = []
        for s, sizes in enumerate(stage_shapes(plan) if own else [()] * len(plan.pipeline.stages)):
            said, got = f" ({describe(plan, sizes)})" if own else "", lowered[sizes]
            if got is None:  # a stage of its own degrees without tensor parallelism: its sums only
                parts.append(f"# {title}, stage {s}{said}: no tensor parallelism; its gradient sums over the data "
                             "axes are priced by `planlang estimate` (not listed here)\n")
                continue
            parts.append(render_traffic(got[s], plan_mesh(shapes[sizes]), f"{title}, stage {s}{said} ({m} microbatches)"))
        if own:
            parts.append("note: at a boundary between stages of different degrees each stage also gathers its "
                         "inputs' rows over its non-data axes (forward) and its outputs' gradients (backward)\n")
        return "".join(parts)
    model = build_model(plan_model(plan), plan.path)
    # with `microbatches N` the program is one microbatch's, its collectives issued N times (step_traffic)
    prog = lower_plan(model, accumulation_microbatch(plan))
    traffic = step_traffic(plan, prog, program_zero_units(model, prog, plan))
    out = render_traffic(traffic, prog.mesh, os.path.relpath(plan.path) if plan.path else str(plan_path))
    multi = multi_axis_sums(prog)
    if multi:
        out += (f"note: {len(multi)} sums span several axes; the runtime issues one all-reduce per axis, which "
                "sends more than the one collective over their product group the op rules price\n")
    return out
