"""A ParallelModel's programs, one per input shape and mode (planlang.runtime.apply).

`apply` lowers the plan for the plan's `input` shapes with the model in its mode then. A batch of
another size (an epoch's last, shorter batch) or the other mode (`pm.eval()`: dropout off, BatchNorm's
running statistics; the trace bakes `self.training` into the graph) needs a program of its own: it is
lowered again from a copy of the model on the meta device (the live model's parameters are this rank's
pieces by then, FSDP2 shards under ZeRO-2/3), once per (shapes, mode), and kept.

The batch dim may change, to a size no larger than the plan's that splits into the step's
microbatches, each over the data degree (the ranks its batch dim is split over); another dim (a
sequence) may be shorter, splitting as the plan splits it; anything else is a PlanError saying what
divides what. The new program must place every parameter as the plan's does
(the parameters are already placed); the lowering follows the plan's specs, so it does.
"""
from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any, Callable

import torch
from torch import nn

from planlang.cost.layout import local_shape
from planlang.model.program.lowering import Program
from planlang.plan.complete import CompletePlan
from planlang.plan.data import batch_dim
from planlang.runtime.codegen import generate

# `pm` below is planlang.runtime.apply's ParallelModel (apply imports this module: no import back)
# one microbatch's global shapes of every step input, training, and whether the program returns the model's
# output too (`pm(...)`; `step` runs the loss-only program, which keeps no output alive)
Key = tuple[tuple[tuple[int, ...], ...], bool, bool]
Lower = Callable[..., Program]  # (model, plan, loss_fn, targets, outputs) -> Program


def meta_copy(model: nn.Module) -> nn.Module:
    """`model` with every parameter and buffer on the meta device (nothing allocated): what re-lowering
    traces once the live model holds only this rank's pieces."""
    memo: dict[int, object] = {}
    for p in model.parameters():
        memo[id(p)] = nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device="meta"), requires_grad=p.requires_grad)
    for b in model.buffers():
        memo[id(b)] = torch.empty(b.shape, dtype=b.dtype, device="meta")
    return copy.deepcopy(model, memo)


class PlanError(ValueError):
    """The plan cannot run: it has errors, holes, or does not fit this world (message says how to fix).
    (planlang.runtime.apply.PlanError: defined here, where the program cache raises it too.)"""


@dataclasses.dataclass
class Compiled:
    program: Program
    code: str
    step: Callable
    blocks: tuple


class Programs:
    """The programs of one ParallelModel by (shapes, mode); `select` installs the one a call needs."""

    def __init__(self, meta: nn.Module, plan: CompletePlan, loss_fn: Callable | None, lower: Lower,
                 compile_program: Callable[[Program], Compiled]) -> None:
        self.meta, self.plan, self.loss_fn = meta, plan, loss_fn
        self.lower, self.compile = lower, compile_program
        self.cache: dict[Key, Compiled] = {}
        self.base: Program | None = None  # the program apply lowered (its constants are the live model's)

    def add(self, key: Key, c: Compiled) -> None:
        self.base = self.base or c.program
        self.cache[key] = c

    def select(self, pm: Any, args: tuple[torch.Tensor, ...], m: int, outputs: bool = False) -> None:
        """Install on `pm` the program for `args` (a step's inputs then targets, `m` microbatches) in
        pm's mode, returning the model's output too when `outputs`: the current one when they fit it,
        else a cached or newly lowered one."""
        b = batch_dim(self.plan.inputs[0])
        # (a step of m of the current program's microbatches: no more than the plan's step batch, which a
        # forward of the whole plan's batch, one program, would allow m times over)
        within = m * pm.program_key[0][0][b] <= pm.plan_shapes[0][b] * pm.microbatches
        fits = within and _fits(pm, args, m)
        if pm.program_key[1:] == (pm.training, outputs) and fits:
            return
        # args that fit the current program (global or this rank's pieces) keep its shapes
        key = (pm.program_key[0] if fits else _micro_shapes(pm, self.plan, args, m), pm.training, outputs)
        if key == pm.program_key:
            return
        c = self.cache.get(key)
        if c is None:
            c = self.cache[key] = self.compile(self._lower(pm, key, args, m))
        pm.install(c, key)

    def _lower(self, pm: Any, key: Key, args, m: int) -> Program:
        shapes, training, outputs = key
        k = len(self.plan.inputs)
        inputs = tuple(dataclasses.replace(inp, dims=tuple((name, s) for (name, _), s in zip(inp.dims, shape)))
                       for inp, shape in zip(self.plan.inputs, shapes[:k]))
        plan = dataclasses.replace(self.plan, inputs=inputs, accumulation=None if m > 1 else self.plan.accumulation)
        targets = tuple(torch.empty(s, dtype=t.dtype, device="meta") for s, t in zip(shapes[k:], args[k:]))
        self.meta.train(training)
        prog = self.lower(self.meta, plan, self.loss_fn, targets, outputs)
        assert self.base is not None
        if prog.param_specs != self.base.param_specs or prog.blocked != self.base.blocked:
            changed = sorted(n for n in set(prog.param_specs) | set(self.base.param_specs)
                             if prog.param_specs.get(n) != self.base.param_specs.get(n))
            raise PlanError(f"the program for input shapes {list(shapes)} places parameters otherwise than the "
                            f"plan's ({', '.join(changed[:3]) or 'per-head blocks'}); the parameters are placed "
                            "already: run batches of the plan's shape")
        return live_consts(prog, self.base, shapes, pm.module)


def live_consts(prog: Program, base: Program, shapes, model: nn.Module | None = None) -> Program:
    """`prog` (lowered from the meta copy) with the constants the graph reads from buffers taken from the
    live model's, through `base`, the program apply lowered from it, else from `model`'s buffers by name
    (a buffer the live trace folded into constants computed from it, which the meta trace cannot: HF
    Llama's rotary `inv_freq`, whose cos/sin tables are constants of `base`)."""
    by_name: dict[str, torch.Tensor] = {}
    for fqn, buf in (model.named_buffers() if model is not None else ()):
        flat = fqn.replace(".", "_")  # torch.export's placeholder names (b_ + the step's path), fx's
        by_name.update({f"b_model_{flat}": buf, f"b_{flat}": buf, flat: buf})
    for name, c in prog.graph.consts.items():
        if c.device.type != "meta":
            continue
        live = base.graph.consts.get(name)
        if live is None or live.shape != c.shape:
            v = prog.graph.values.get(name)
            live = by_name.get(v.ref) if v is not None else None
        if live is None or live.shape != c.shape:
            raise PlanError(f"constant `{name}` {list(c.shape)} of the program for input shapes "
                            f"{list(shapes)} is not one of the model's buffers; run batches of the plan's shape")
        prog.graph.consts[name] = live
    return prog


def _fits(pm: Any, args, m: int) -> bool:
    """Whether `args` are a step of `m` of pm's current program's microbatches (global or local)."""
    if len(args) != len(pm._inputs):
        return True  # forward's own check says what is wrong
    for v, t in zip(pm._inputs, args):
        spec = pm.program.input_specs[v.name]
        if not any(_scaled(tuple(t.shape), tuple(w), m)
                   for w in (v.shape, local_shape(v.shape, spec, pm.mesh))):
            return False
    return True


def _scaled(got: tuple[int, ...], want: tuple[int, ...], m: int) -> bool:
    if len(got) != len(want):
        return False
    diff = [d for d in range(len(got)) if got[d] != want[d]]
    return diff == [] if m == 1 or not want else len(diff) == 1 and got[diff[0]] == m * want[diff[0]]


def _micro_shapes(pm: Any, plan: CompletePlan, args, m: int) -> tuple[tuple[int, ...], ...]:
    """One microbatch's global shapes for `args` given as a whole batch of another size; a PlanError when
    more than the batch dim differs, the batch is larger than the plan's, or it does not divide."""
    k = len(plan.inputs)
    base = pm.plan_shapes  # the first program's: the plan's microbatch
    n_first = None
    out = []
    for i, (v, t) in enumerate(zip(pm._inputs, args)):
        old = base[i]
        if i < k:
            b = batch_dim(plan.inputs[i])
        else:  # a target: its dim as long as the first input's batch (none: a scalar, unchanged)
            b = next((d for d, s in enumerate(old) if s == base[0][batch_dim(plan.inputs[0])]), -1)
        shape = tuple(t.shape)
        if b < 0:
            if shape != old:
                raise PlanError(f"`{v.ref}` has shape {list(shape)}; the plan's program takes {list(old)}")
            out.append(old)
            continue
        if len(shape) != len(old) or any(shape[d] > old[d] for d in range(len(old)) if d != b):
            raise PlanError(f"`{v.ref}` has shape {list(shape)}; the plan declares {list(_whole(old, b, m))} "
                            "(a dim may be shorter, none longer: the memory the plan was checked for holds "
                            "the plan's shapes)")
        n, full = shape[b], old[b] * pm.microbatches  # the plan's step batch (forward takes it whole too)
        spec = pm.program.input_specs[v.name]
        entry = spec.dims[b] if b < len(spec.dims) else ()
        axes = entry if isinstance(entry, tuple) else ()  # a complete program's spec has no holes
        degree = math.prod(pm.groups.size(a) for a in axes)
        if n > full:
            raise PlanError(f"`{v.ref}` has a batch of {n}, larger than the plan's {full}: a larger batch needs "
                            "a plan that declares it (the memory the plan was checked for holds the plan's batch)")
        if n % (m * degree):
            into = f"into {m} microbatches, each " if m > 1 else ""
            raise PlanError(f"`{v.ref}` has a batch of {n}: it must split {into}over {degree} ranks "
                            f"({', '.join(axes) or 'no data axis'}), so a multiple of {m * degree}")
        if n_first is not None and n != n_first:
            raise PlanError(f"`{v.ref}` has a batch of {n}, the other inputs {n_first}")
        n_first = n
        for d in range(len(old)):  # a shorter other dim (a sequence) must still split as the plan splits it
            split = spec.dims[d] if d != b and d < len(spec.dims) and isinstance(spec.dims[d], tuple) else ()
            k = math.prod(pm.groups.size(a) for a in split)
            if shape[d] < old[d] and shape[d] % k:
                raise PlanError(f"`{v.ref}` has {shape[d]} in dim {d}: it must split over {k} ranks "
                                f"({', '.join(split)}), so a multiple of {k}")
        out.append(shape[:b] + (n // m,) + shape[b + 1:])
    return tuple(out)


def _whole(shape: tuple[int, ...], b: int, m: int) -> tuple[int, ...]:
    return shape[:b] + (shape[b] * m,) + shape[b + 1:]


def fsdp_grad_scale(prog: Program, fsdp_axes: tuple[str, ...], groups: Any) -> dict[str, float]:
    """ZeRO-2/3: the factor on each parameter's gradient before FSDP2's reduce-scatter. A gradient the
    lowering already sums over an FSDP axis during backward (an activation's GradSum: e.g. the position
    embedding, whose lookup is replicated over the batch axes) is complete on every rank of that axis;
    the reduce-scatter would add the copies, so it is scaled by 1/size first. Per program: a shorter
    sequence may move such a sum (lowering._defer_to_parameters weighs the table against the activation)."""
    out = {}
    for fqn in prog.param_specs:
        done = [a for a in fsdp_axes if a not in prog.grad_sync.get(fqn, ())]
        if done:
            out[fqn] = 1.0 / math.prod(groups.size(a) for a in done)
    return out


def compiler(pm_args: dict) -> Callable[[Program], Compiled]:
    """`Programs.compile` for apply: the program's per-rank code and its ZeRO blocks."""
    model, plan, rank, coords, zero_blocks = (pm_args[k] for k in ("model", "plan", "rank", "coords", "zero_blocks"))

    def run(prog: Program) -> Compiled:
        blocks = zero_blocks(model, prog, plan)
        code = generate(prog, rank, coords, title=plan.path, blocks=[(b.start, b.end, b.name) for b in blocks])
        scope: dict = {}
        exec(compile(code, f"<planlang rank {rank}>", "exec"), scope)  # noqa: S102 - our codegen
        return Compiled(prog, code, scope["step"], tuple(blocks))
    return run
