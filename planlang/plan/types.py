"""The resolved plan: small frozen value types, all torch-free.

Vocabulary: an *axis* is a mesh axis, a *dim* is a tensor dimension. A `Spec` has one entry per dim
(the axes that split it, major to minor) plus the axes over which the value is a partial sum; its
`placements(mesh)` view gives DTensor's per-axis vocabulary (Shard(dim) / Replicate / Partial).
Spans never take part in equality. The types a plan has one of per statement (and per expansion of a
template or loop) have `__slots__` and keep their spans as the parser packed them (`ast.pack_span`):
reading `.span` (or `dim_spans`, ...) gives `Span`s, `ast.raw_span` what is stored.
"""
from __future__ import annotations

import math
from dataclasses import field
from typing import Union

from planlang.lang.ast import NO_SPAN, as_span, lazy_span_field, raw_span
from planlang.lang.frozen import value_type
from planlang.lang.source import Span

from .selection import Selection
from .units import format_bytes


def _span():
    return field(default=NO_SPAN, compare=False, repr=False, kw_only=True)


def user_site(span: Span, origin: tuple[Span, ...]) -> Span:
    """Where to point a user at a statement produced by `apply`/`for`: the innermost expansion site in
    the file where the expansion started (the plan being checked), else the statement itself."""
    if not origin or span.file == origin[0].file:
        return span
    return [s for s in origin if s.file == origin[0].file][-1]


@value_type(slots=True)
class Hole:
    """A value left for the solver (`?` in the plan)."""

    what: str  # e.g. "mesh axis size", "spec", "schedule"
    span: Span = _span()

    def __str__(self) -> str:
        return "?"


lazy_span_field(Hole)


def is_hole(x) -> bool:
    return isinstance(x, Hole)


# ------------------------------------------------------------------------------ hardware
#: the torch.distributed backends a device's ranks can run (a device's `backend` field)
BACKENDS = ("nccl", "gloo")


@value_type
class Device:
    name: str
    memory: int  # bytes
    flops: tuple[tuple[str, float], ...] = ()  # dtype -> FLOP/s
    # the torch.distributed backend its ranks run: what the estimator assumes collectives allocate
    backend: str = "nccl"
    span: Span = _span()
    # bytes per second between the device's memory and its cores (HBM); when given, compute is priced
    # by a roofline (planlang.cost.comm.work_time)
    memory_bandwidth: float | None = None

    def __str__(self) -> str:
        return f"{self.name}({format_bytes(self.memory)})"

    def flops_for(self, dtype: str) -> float | None:
        return dict(self.flops).get(dtype)


@value_type
class Link:
    name: str
    bandwidth: float  # bytes per second, one direction
    latency: float  # seconds
    span: Span = _span()

    def __str__(self) -> str:
        return f"{self.name}({self.bandwidth / 1e9:g} GB/s, {self.latency * 1e6:g} us)"


@value_type
class Axis:
    name: str
    size: Union[int, Hole]
    link: Link | None = None
    span: Span = _span()
    link_ref: str | None = field(default=None, compare=False, repr=False, kw_only=True)  # as written

    def __str__(self) -> str:
        return f"{self.name}={self.size}"


@value_type
class Mesh:
    name: str
    device: Device | None
    axes: tuple[Axis, ...]
    device_count: int | None = None  # declared with `of N x device`; else the product of the sizes
    span: Span = _span()

    def __str__(self) -> str:
        return f"{self.name}[" + ", ".join(str(a) for a in self.axes) + "]"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.axes)

    @property
    def shape(self) -> tuple[Union[int, Hole], ...]:
        return tuple(a.size for a in self.axes)

    @property
    def has_holes(self) -> bool:
        return any(is_hole(a.size) for a in self.axes)

    @property
    def size(self) -> int | None:
        """Number of devices: the declared count, else the product of the axis sizes (None with holes)."""
        if self.device_count is not None:
            return self.device_count
        sizes = [a.size for a in self.axes if not isinstance(a.size, Hole)]
        return math.prod(sizes) if len(sizes) == len(self.axes) else None

    def axis(self, name: str) -> Axis | None:
        for a in self.axes:
            if a.name == name:
                return a
        return None

    def axis_size(self, name: str) -> int | None:
        """The size of an axis; None when unknown (a hole) or invalid (< 1, reported as PL302)."""
        a = self.axis(name)
        return a.size if a is not None and isinstance(a.size, int) and a.size >= 1 else None


# ------------------------------------------------------------------------------ placements and specs
@value_type
class Shard:
    dim: int

    def __str__(self) -> str:
        return f"S({self.dim})"


@value_type
class Replicate:
    def __str__(self) -> str:
        return "R"


@value_type
class Partial:
    def __str__(self) -> str:
        return "P"


Placement = Union[Shard, Replicate, Partial]


@value_type(slots=True)
class Spec:
    """One entry per tensor dim: the axes that split it (major to minor; () = replicated) or a Hole."""

    dims: tuple[Union[tuple[str, ...], Hole], ...]
    partial: tuple[str, ...] = ()
    span: Span = _span()
    dim_spans: tuple[Span, ...] = field(default=(), compare=False, repr=False, kw_only=True)
    partial_spans: tuple[Span, ...] = field(default=(), compare=False, repr=False, kw_only=True)

    def __str__(self) -> str:
        def entry(d):
            if is_hole(d):
                return "?"
            if not d:
                return "_"
            return d[0] if len(d) == 1 else "(" + ", ".join(d) + ")"

        s = "[" + ", ".join(entry(d) for d in self.dims) + "]"
        return s + (f" partial({', '.join(self.partial)})" if self.partial else "")

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def has_holes(self) -> bool:
        return any(is_hole(d) for d in self.dims)

    def axes_of(self, dim: int) -> tuple[str, ...]:
        d = self.dims[dim]
        return () if isinstance(d, Hole) else d

    def used_axes(self) -> list[str]:
        """Every axis named, in order, repeats included (the checker reports repeats)."""
        out: list[str] = []
        for d in self.dims:
            if not isinstance(d, Hole):
                out.extend(d)
        return out + list(self.partial)

    def shard_factor(self, dim: int, mesh: Mesh) -> int | None:
        """Product of the sizes of the axes splitting `dim` (None when a size is a hole)."""
        f = 1
        for ax in self.axes_of(dim):
            size = mesh.axis_size(ax)
            if size is None:
                return None
            f *= size
        return f

    def placements(self, mesh: Mesh) -> tuple[Placement, ...]:
        """DTensor's per-axis view. An axis splitting a dim after another (a tuple) is still Shard(dim);
        the order of the tuple is the order of the mesh axes for DTensor's default layout."""
        out: list[Placement] = []
        for ax in mesh.names:
            p: Placement = Replicate()
            for i, d in enumerate(self.dims):
                if not isinstance(d, Hole) and ax in d:
                    p = Shard(i)
            if ax in self.partial:
                p = Partial()
            out.append(p)
        return tuple(out)

    def local_shape(self, shape: tuple[int, ...], mesh: Mesh) -> tuple[int, ...] | None:
        """The per-device shape of a tensor of global `shape` under this spec: each split dim is
        `local_size(n, f)`. None when it cannot be known (a rank mismatch, an axis size that is a hole)."""
        if len(shape) != self.rank:
            return None
        factors: list[int] = []
        for i in range(self.rank):
            f = self.shard_factor(i, mesh)
            if f is None:
                return None
            factors.append(f)
        return tuple(local_size(n, f) for n, f in zip(shape, factors))


lazy_span_field(Spec)


def _entry_spans(name: str, of_node):
    """`dim_spans` / `partial_spans`: stored as a tuple of spans (packed or not), or as the parsed spec
    (`ast.Spec`) whose entries they are the spans of -- read from it only when asked for."""
    slot = Spec.__dict__[name]
    get = slot.__get__

    def read(spec: Spec) -> tuple[Span, ...]:
        v = get(spec)
        if not isinstance(v, tuple):
            v = of_node(v)
        return tuple(as_span(s) for s in v)

    setattr(Spec, name, property(read, slot.__set__))


_entry_spans("dim_spans", lambda node: tuple(raw_span(e) for e in node.entries))
_entry_spans("partial_spans", lambda node: tuple(raw_span(p) for p in node.partial))


def local_size(n: int, factor: int) -> int:
    """The one rounding rule for a dim of size `n` split `factor` ways: the largest piece, ceil(n / f)
    (torch.chunk's and DTensor's). The checker refuses uneven splits of parameters and inputs (PL305,
    PL361), so on a valid plan this is n / f exactly; the estimator prices an uneven candidate by its
    largest piece."""
    return -(-n // factor)


# ------------------------------------------------------------------------------ model and inputs
@value_type
class ModelRef:
    name: str
    factory: str  # "package.module:callable"
    kwargs: tuple[tuple[str, object], ...] = ()
    span: Span = _span()

    def __str__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs)
        return f"{self.factory}({args})"

    @property
    def module(self) -> str:
        return self.factory.split(":", 1)[0]

    @property
    def attr(self) -> str:
        return self.factory.split(":", 1)[1] if ":" in self.factory else ""


@value_type
class Input:
    name: str
    dtype: str
    dims: tuple[tuple[str, int], ...]
    span: Span = _span()

    def __str__(self) -> str:
        return f"{self.name}: {self.dtype}[" + ", ".join(f"{k}={v}" for k, v in self.dims) + "]"

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(v for _, v in self.dims)


@value_type(slots=True)
class DataSpec:
    input: str
    spec: Union[Spec, Hole]
    span: Span = _span()

    def __str__(self) -> str:
        return f"data {self.input} : {self.spec}"


@value_type(slots=True)
class ShardRule:
    """`shard TARGET : SPEC` after template and loop expansion.

    `kind` is "param" (a parameter or module path), "output" or "input" (activations). `origin` is the
    chain of apply/for sites that produced it, outermost first; `site` is where to point a user.
    """

    target: Selection
    spec: Union[Spec, Hole]
    kind: str = "param"
    span: Span = _span()
    origin: tuple[Span, ...] = field(default=(), compare=False, repr=False, kw_only=True)

    def __str__(self) -> str:
        tgt = str(self.target) if self.kind == "param" else f"{self.kind} of {self.target}"
        return f"shard {tgt} : {self.spec}"

    @property
    def site(self) -> Span:
        return user_site(self.span, self.origin)


_cls: type  # each loop below walks its own classes
for _cls in (DataSpec, ShardRule):
    lazy_span_field(_cls)


# ------------------------------------------------------------------------------ schedule
# the schedules' names, kinds and placement: planlang.plan.placement (the one definition), re-exported here
from .placement import (CHUNKED, MIN_CHUNKS, SCHEDULES, SPLIT_BACKWARD, V_SHAPED,  # noqa: E402,F401 - re-exported
                        stage_ranks, stages_on, stages_per_rank)


@value_type
class Schedule:
    kind: str  # one of SCHEDULES
    chunks: Union[int, Hole] = 1
    span: Span = _span()

    def __str__(self) -> str:
        shown = self.kind in CHUNKED and not (self.chunks == 1 and MIN_CHUNKS[self.kind] == 1)
        return self.kind + (f" chunks {self.chunks}" if shown else "")


@value_type(slots=True)
class Stage:
    index: int
    modules: tuple[Selection, ...]
    degrees: tuple[tuple[str, Union[int, Hole]], ...] = ()
    span: Span = _span()

    def __str__(self) -> str:
        s = f"stage {self.index}: " + ", ".join(str(m) for m in self.modules)
        if self.degrees:
            s += " with " + ", ".join(f"{k}={v}" for k, v in self.degrees)
        return s


@value_type
class Pipeline:
    axis: Union[str, Hole]
    schedule: Union[Schedule, Hole]
    microbatches: Union[int, Hole]
    stages: Union[tuple[Stage, ...], Hole]
    span: Span = _span()

    def __str__(self) -> str:
        n = "?" if isinstance(self.stages, Hole) else len(self.stages)
        return f"pipeline over {self.axis}: {self.schedule}, {self.microbatches} microbatches, {n} stages"


@value_type
class Accumulation:
    """`microbatches N` at the top level: a step without a pipeline runs each rank's batch as
    `microbatches` equal slices in sequence, forward and backward each, and sums the gradients over the
    data axes once, after the last (gradient accumulation, as Megatron-LM and DeepSpeed run it). A plan
    with a pipeline says its microbatches in the pipeline statement instead (PL318)."""

    microbatches: Union[int, Hole]
    span: Span = _span()

    def __str__(self) -> str:
        return f"{self.microbatches} microbatches per step"


@value_type(slots=True)
class CheckpointGroup:
    """Consecutive modules recomputed together in backward. With `every`, the selection is cut into
    consecutive groups of that many modules once the model is known (the last group holds the rest).
    With `per` (a `for` loop or an `apply` over a pattern), the statement stands once for each module
    `per` matches: one group (or one run of `every` groups) inside each of them."""

    modules: tuple[Selection, ...]
    every: Union[int, Hole, None] = None
    per: Selection | None = None
    span: Span = _span()
    origin: tuple[Span, ...] = field(default=(), compare=False, repr=False, kw_only=True)

    def __str__(self) -> str:
        s = "checkpoint " + ", ".join(str(m) for m in self.modules)
        s += f" every {self.every}" if self.every is not None else ""
        return s + (f" (per {self.per})" if self.per is not None else "")

    @property
    def site(self) -> Span:
        return user_site(self.span, self.origin)


for _cls in (Stage, CheckpointGroup):
    lazy_span_field(_cls)


@value_type
class Budget:
    bytes: int
    span: Span = _span()

    def __str__(self) -> str:
        return f"{format_bytes(self.bytes)} per device"


OPTIMIZERS = ("sgd", "momentum", "adam", "adamw", "adagrad", "rmsprop", "adafactor", "lion")


#: bytes per element of each dtype the language names (planlang.plan.resolve.DTYPES' canonical names)
DTYPE_BYTES = {"f64": 8, "f32": 4, "tf32": 4, "bf16": 2, "f16": 2, "fp8": 1, "i64": 8, "i32": 4, "i16": 2,
               "i8": 1, "u8": 1, "bool": 1}
#: the dtypes training state and compute may be kept in (`precision`, `params`, ... of the optimizer block)
PRECISION_DTYPES = ("f32", "bf16", "f16")
#: the optimizer block's precision fields, in the order the docs and the language server list them
PRECISION_FIELDS = ("precision", "params", "compute", "reduce", "master", "loss_scale")


@value_type
class Precision:
    """The dtypes of one training step's state and compute (the precision fields of the optimizer block).

    params   the dtype parameters are stored and run in (and so their gradients, which autograd makes in it)
    compute  the dtype matmuls and activations run in: `torch.autocast(dtype=compute)` when below f32
    reduce   the dtype gradients are summed across ranks in (DDP-style buckets, FSDP2's reduce_dtype)
    master   the dtype of the optimizer's copy of the weights and of its state; a copy exists when it
             differs from `params` (bf16 parameters, f32 master weights)
    loss_scale  None, "dynamic" (start at 2**16, halve on an overflow, double after 2000 clean steps) or a
             constant: the loss is multiplied by it before backward and the gradients divided after
    """

    params: str = "f32"
    compute: str = "f32"
    reduce: str = "f32"
    master: str = "f32"
    loss_scale: Union[str, float, None] = None
    span: Span = _span()  # the block's first precision field
    field_spans: tuple[tuple[str, Span], ...] = field(default=(), compare=False, repr=False)

    def __str__(self) -> str:
        scale = "" if self.loss_scale is None else f", loss scale {self.loss_scale}"
        return f"params {self.params}, compute {self.compute}, reduce {self.reduce}, master {self.master}{scale}"

    @property
    def master_copy(self) -> bool:
        """The optimizer steps a separate copy of the weights (in `master`) and copies it back to them."""
        return self.master != self.params

    @property
    def autocast(self) -> bool:
        """Compute runs under `torch.autocast(dtype=compute)` (any compute dtype below f32)."""
        return self.compute != "f32"

    @property
    def mixed(self) -> bool:
        """Anything but the default all-f32 step."""
        return (self.params, self.compute, self.reduce, self.master, self.loss_scale) != ("f32",) * 4 + (None,)

    def span_of(self, key: str) -> Span:
        """Where field `key` is written (the first precision field when it is not written)."""
        return dict(self.field_spans).get(key, self.span)

    def bytes(self, which: str) -> int:
        """Bytes per element of `which` (params, compute, reduce or master)."""
        return DTYPE_BYTES[getattr(self, which)]


@value_type
class Optimizer:
    name: str
    kwargs: tuple[tuple[str, object], ...] = ()
    zero_stage: Union[int, Hole] = 0
    zero_axis: Union[str, Hole, None] = None
    span: Span = _span()
    precision: Precision | None = None  # None: the model's own dtypes (f32), as before precision fields

    def __str__(self) -> str:
        z = f", zero {self.zero_stage} over {self.zero_axis}" if self.zero_stage else ""
        p = f", {self.precision}" if self.precision is not None else ""
        return f"{self.name}{z}{p}"


@value_type
class Plan:
    """A whole resolved plan: what `check`, `solve`, `estimate` and the runtime consume."""

    path: str
    model: ModelRef | None = None
    inputs: tuple[Input, ...] = ()
    mesh: Mesh | None = None
    budget: Budget | None = None
    optimizer: Optimizer | None = None
    data: tuple[DataSpec, ...] = ()
    shards: tuple[ShardRule, ...] = ()
    pipeline: Pipeline | None = None
    checkpoints: tuple[CheckpointGroup, ...] = ()
    checkpoint_hole: Hole | None = None  # `checkpoint ?`: the solver chooses every group
    accumulation: Accumulation | None = None  # top-level `microbatches N` (no pipeline)
    devices: tuple[Device, ...] = ()  # every device/link visible to the plan (own and imported)
    links: tuple[Link, ...] = ()

    def __str__(self) -> str:
        return f"plan {self.path}: mesh {self.mesh}, {len(self.shards)} shard rules"

    @property
    def precision(self) -> Precision:
        """The plan's precision (the optimizer block's fields); all f32 when it gives none."""
        p = self.optimizer.precision if self.optimizer is not None else None
        return p if p is not None else Precision()

    def input(self, name: str) -> Input | None:
        for i in self.inputs:
            if i.name == name:
                return i
        return None

    def holes(self) -> list[Hole]:
        """Every hole in the plan, in a stable order."""
        out: list[Hole] = []
        if self.mesh:
            out += [a.size for a in self.mesh.axes if isinstance(a.size, Hole)]
        if self.optimizer:
            out += [x for x in (self.optimizer.zero_stage, self.optimizer.zero_axis) if isinstance(x, Hole)]
        for d in self.data:
            out += _spec_holes(d.spec)
        for r in self.shards:
            out += _spec_holes(r.spec)
        if self.pipeline:
            p = self.pipeline
            out += [x for x in (p.axis, p.schedule, p.microbatches, p.stages) if isinstance(x, Hole)]
            if isinstance(p.schedule, Schedule) and isinstance(p.schedule.chunks, Hole):
                out.append(p.schedule.chunks)
            if not isinstance(p.stages, Hole):
                for st in p.stages:
                    out += [v for _, v in st.degrees if isinstance(v, Hole)]
        for g in self.checkpoints:
            if isinstance(g.every, Hole):
                out.append(g.every)
        if self.accumulation is not None and isinstance(self.accumulation.microbatches, Hole):
            out.append(self.accumulation.microbatches)
        if self.checkpoint_hole:
            out.append(self.checkpoint_hole)
        return out


def _spec_holes(spec) -> list[Hole]:
    if is_hole(spec):
        return [spec]
    return [d for d in spec.dims if is_hole(d)]
