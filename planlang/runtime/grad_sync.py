"""Parameter-gradient sums over the data axes, overlapped with backward.

The lowering defers each parameter's gradient sum to once per step, over the axes every use of the
parameter leaves its gradient partial on (`Program.grad_sync`: data parallelism). Gradients are packed
into flat buckets, as DDP does (Li et al., PyTorch Distributed, VLDB 2020, §3.2.3): parameters that sum
over the same axes, in reverse registration order (roughly the order backward produces them), cut at a
byte cap — a small first bucket so communication starts early, then larger ones. A bucket's all-reduce
starts (async) as soon as backward has accumulated every gradient in it (a post-accumulate-grad hook),
so it runs while backward computes the earlier layers; `finish` waits for them and reduces whatever did
not start (parameters that got no gradient this step, or all of them inside `no_sync`, for gradient
accumulation).

Buckets are persistent and the gradients are views into them (DDP's `gradient_as_bucket_view`): when a
parameter's gradient arrives it is copied into its slice of the bucket once and `.grad` becomes that
slice, so the sum lands in the gradients with no copy back, later backwards (gradient accumulation, or
`zero_grad(set_to_none=False)`) accumulate into the bucket in place, and no flat copy of the gradients is
allocated per step: a step holds the gradients once. A gradient that cannot be a view (an FSDP2 DTensor,
a dtype other than its bucket's) is copied in before the sum and back after it. A bucket whose dtype is not
the plan's `reduce` dtype (bf16 gradients summed in f32) is cast for its all-reduce and copied back.

`buckets` is a pure function: planlang.runtime.traffic predicts the same collectives from it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from planlang.cost.buckets import BUCKET, FIRST_BUCKET, cut_buckets
from planlang.cost.comm import Collective

if TYPE_CHECKING:  # torch loads only when a sum runs (see the lazy imports below)
    import torch
    import torch.distributed as dist

@dataclass
class Bucket:
    axes: tuple[str, ...]
    names: list[str]
    nbytes: int = 0
    # the parameters whose gradients arrived since the bucket last started, outside `no_sync`: it starts
    # once every one has (a set, not a count: a parameter that gets no gradient, or gets one inside
    # `no_sync` only, never starts it early; `finish` sums it then)
    ready: set = field(default_factory=set)
    flat: torch.Tensor | None = None  # the persistent buffer, made at the first sum
    work: dist.Work | None = None
    # (gradient, slice) pairs summed by copy, not as a view
    copied: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    launched: bool = False
    wire: torch.Tensor | None = None  # the bucket cast to the reduce dtype for its all-reduce (None: summed in place)
    summed: bool = False  # the buffer holds (or is receiving) a sum that a later backward accumulates onto


def buckets(params: list[tuple[str, int, tuple[str, ...]]], first: int = FIRST_BUCKET,
            cap: int = BUCKET) -> list[Bucket]:
    """The runtime's buckets for `(name, gradient bytes, axes)` in registration order, cut as
    planlang.cost.buckets cuts them (which the step-time model prices)."""
    return [Bucket(b.axes, b.names, b.nbytes) for b in cut_buckets(params, first, cap)]


class GradSync:
    """The bucketed, overlapped gradient sums of one ParallelModel (see the module docstring)."""

    def __init__(self, named_params: list[tuple[str, torch.Tensor]], sync: dict[str, tuple[str, ...]], groups,
                 recorder=None, overlap: bool = True, reduce_dtype=None, mean: bool = False) -> None:
        self.params = dict(named_params)
        # `mean`: each bucket's sum divided by its ranks once complete (a pipeline replica's loss is its
        # own batch's mean: the step's gradient is the mean over the data replicas, as DDP averages)
        self.mean = mean
        self.reduce_dtype = reduce_dtype  # the plan's precision `reduce`: a bucket in another dtype is cast
        self.groups = groups
        self.recorder = recorder
        self.overlap = overlap
        self.no_sync = False
        rows = [(n, p.numel() * p.element_size(), tuple(sync.get(n, ()))) for n, p in named_params]
        self.buckets = buckets(rows)
        self._slices: dict[str, tuple[int, int]] = {}  # name -> (offset, numel) in its bucket
        self._handles = []
        for b in self.buckets:
            for n in b.names:
                # before a gradient accumulates into a bucket holding an earlier backward's sum
                self._handles.append(self.params[n].register_hook(lambda g, b=b: self._before(b, g)))
                if overlap:
                    self._handles.append(self.params[n].register_post_accumulate_grad_hook(
                        lambda p, b=b, n=n: self._arrived(b, n)))

    def _before(self, b: Bucket, grad):
        """A backward after the bucket's sum (gradient accumulation without `no_sync`, or two steps before
        the optimizer's): the buffer holds the sum S over the bucket's axes, the same on each of their N
        ranks, and this backward adds its local gradients to it. Summing that again would give N.S plus
        the new sum; dividing the buffer by N first gives S + the new sum, as DDP's averaging does."""
        if b.summed and not any(self.params[n].grad is not None for n in b.names):
            b.summed = False  # zero_grad(set_to_none=True) since: every gradient is copied in afresh
        if b.summed:
            self._settle(b)
            if not self.mean:  # a mean is already S / N: the next sum gives S + the new sum, then / N
                self._buffer(b).div_(self._ranks(b))
            for g, view in b.copied:  # gradients kept apart from the buffer take their share too
                g.copy_(view)
            b.copied, b.launched, b.summed = [], False, False
            b.ready = set()
        return grad

    def _ranks(self, b: Bucket) -> int:
        n = 1
        for a in b.axes:
            n *= self.groups.size(a)
        return n

    def _settle(self, b: Bucket, divide: int = 1) -> None:
        """The bucket's sum complete in its buffer: waited for, divided by `divide` (a mean: in the
        reduce dtype, before an f16 buffer could overflow), and copied back from the reduce dtype."""
        if b.work is not None:
            b.work.wait()
            b.work = None
        if divide > 1:
            (b.wire if b.wire is not None else self._buffer(b)).div_(divide)
        if b.wire is not None:  # made from the buffer, which therefore exists
            self._buffer(b).copy_(b.wire)
            b.wire = None

    def _arrived(self, b: Bucket, name: str) -> None:
        # the gradient goes into the bucket as it arrives (a view from then on: a later backward
        # accumulates into the bucket). Inside `no_sync` nothing starts; the backward that syncs starts
        # the bucket once each of its parameters' gradients has arrived in it
        if not self.no_sync or self.params[name].grad is not None:
            self._into_bucket(b, name)
        if self.no_sync:
            return
        b.ready.add(name)
        if len(b.ready) == len(b.names) and not b.launched:
            self._launch(b, async_op=True)

    def _buffer(self, b: Bucket) -> torch.Tensor:
        """The bucket's persistent buffer (made at its first sum, in its first gradient's dtype) and each
        parameter's (offset, numel) in it."""
        # lazy: torch loads only when this runs
        import torch

        if b.flat is None:
            first = next(self._local(self.params[n].grad) for n in b.names if self.params[n].grad is not None)
            sizes = [self._local_numel(self.params[n]) for n in b.names]
            b.flat = torch.zeros(sum(sizes), dtype=first.dtype, device=first.device)
            offsets = [sum(sizes[:i]) for i in range(len(sizes))]
            self._slices.update({n: (o, s) for n, o, s in zip(b.names, offsets, sizes)})
        return b.flat

    @staticmethod
    def _local_numel(p) -> int:
        # lazy: torch loads only when this runs
        from torch.distributed.tensor import DTensor

        return p.to_local().numel() if isinstance(p, DTensor) else p.numel()

    def _into_bucket(self, b: Bucket, name: str) -> None:
        """Put `name`'s gradient in its slice of the bucket: as a view from now on where it can be."""
        # lazy: torch loads only when this runs
        from torch.distributed.tensor import DTensor

        p = self.params[name]
        g = p.grad
        if g is None:  # callers put only gradients that arrived
            raise RuntimeError(f"{name} has no gradient to put in its bucket")
        flat = self._buffer(b)
        off, n = self._slices[name]
        view = flat[off:off + n].view_as(self._local(g))
        if g.untyped_storage()._cdata == flat.untyped_storage()._cdata and g.storage_offset() == off:
            # already the view: backward accumulated into the bucket (compared by storage, not data_ptr,
            # which is 0 for every meta tensor: program_memory runs this on meta)
            return
        if isinstance(g, DTensor) or g.dtype != flat.dtype:
            view.copy_(self._local(g))
            b.copied.append((self._local(g), view))
            return
        view.copy_(g)
        p.grad = view

    def _launch(self, b: Bucket, async_op: bool) -> None:
        # lazy: torch loads only when this runs
        import torch.distributed as dist

        present = [n for n in b.names if self.params[n].grad is not None]
        if not present:
            return
        flat = self._buffer(b)
        b.copied = []
        for n in b.names:
            if self.params[n].grad is None:  # no gradient this step: its slice holds an earlier one
                off, size = self._slices[n]
                flat[off:off + size].zero_()
            else:
                self._into_bucket(b, n)
        b.launched = b.summed = True
        wire = flat
        if self.reduce_dtype is not None and flat.dtype != self.reduce_dtype:
            wire = b.wire = flat.to(self.reduce_dtype)  # summed in the plan's reduce dtype, copied back after
        for k, a in enumerate(b.axes):
            if self.recorder is not None:
                self.recorder.record(Collective.ALL_REDUCE, (a,), wire.numel() * wire.element_size())
            last = k == len(b.axes) - 1
            if async_op and last:  # a sum over several axes runs axis after axis; the last one overlaps
                b.work = dist.all_reduce(wire, group=self.groups.group(a), async_op=True)
            else:
                dist.all_reduce(wire, group=self.groups.group(a))

    @staticmethod
    def _local(g):
        # lazy: torch loads only when this runs
        from torch.distributed.tensor import DTensor

        return g.to_local() if isinstance(g, DTensor) else g

    def finish(self) -> None:
        """Wait for the bucket sums in flight and reduce the buckets that did not start; the gradients
        (views of the buckets) then hold the sums, and the few that are copies get them copied back."""
        for b in self.buckets:
            if not b.launched:
                self._launch(b, async_op=False)
            self._settle(b, self._ranks(b) if self.mean and b.launched else 1)
            for g, view in b.copied:  # (kept: a later backward's `_before` gives them their share)
                g.copy_(view)
            b.launched, b.ready = False, set()

    def launch_complete(self, pending: set[int]) -> None:
        """When the last backward of a pipeline rank's last stage to run begins: the gradients of every
        parameter not in `pending` (ids; the rank's other stages, whose backwards are all done) are
        complete. A bucket of those alone starts now (async); one that also holds `pending` parameters
        counts the complete ones as arrived, and starts once the pending ones have."""
        if not self.overlap:  # (FSDP2 units: everything is summed by `finish`, on the default stream)
            return
        for b in self.buckets:
            done = [n for n in b.names if id(self.params[n]) not in pending]
            if b.launched or not any(self.params[n].grad is not None for n in done):
                continue
            if len(done) == len(b.names):
                self._launch(b, async_op=True)
            else:
                b.ready.update(n for n in done if self.params[n].grad is not None)

    def adopt(self, pending: set[int]) -> None:
        """Before a weight gradient that torch assigns to `.grad` itself (a split backward's W, on model
        stages other than the first: `grad = dw` when None, else `grad += dw`, no hook): the parameters
        in `pending` (ids) without a gradient get their zeroed bucket slice as `.grad`, so the W
        accumulates into the bucket in place, as a hooked backward would, instead of allocating the
        stage's gradients a second time beside the buckets."""
        # lazy: torch loads only when this runs
        import torch
        from torch.distributed.tensor import DTensor

        for b in self.buckets:
            names = [n for n in b.names if id(self.params[n]) in pending and self.params[n].grad is None
                     and not isinstance(self.params[n], DTensor)]
            if not names:
                continue
            if b.summed and not any(self.params[n].grad is not None for n in b.names):
                b.summed, b.ready = False, set()  # zero_grad(set_to_none=True) since the last sum
            if b.flat is None and not any(self.params[n].grad is not None for n in b.names):
                first = self.params[b.names[0]]
                sizes = [self._local_numel(self.params[n]) for n in b.names]
                b.flat = torch.zeros(sum(sizes), dtype=first.dtype, device=first.device)
                offsets = [sum(sizes[:i]) for i in range(len(sizes))]
                self._slices.update({n: (o, k) for n, o, k in zip(b.names, offsets, sizes)})
            flat = self._buffer(b)
            for n in names:
                p = self.params[n]
                if p.dtype != flat.dtype:
                    continue
                off, k = self._slices[n]
                p.grad = flat[off:off + k].view_as(p).zero_()

    def new_buffers(self) -> None:
        """The next step's gradients in new buckets: gradients taken out of `.grad` are views of the current
        ones (`gradient_as_bucket_view`) and keep them; each parameter's slice stays the same."""
        for b in self.buckets:
            b.flat = None

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
