"""Parameter-gradient sums over the data axes, overlapped with backward.

The lowering defers each parameter's gradient sum to once per step, over the axes every use of the
parameter leaves its gradient partial on (`Program.grad_sync`: data parallelism). Gradients are packed
into flat buckets, as DDP does (Li et al., PyTorch Distributed, VLDB 2020, §3.2.3): parameters that sum
over the same axes, in reverse registration order (roughly the order backward produces them), cut at a
byte cap — a small first bucket so communication starts early, then larger ones. A bucket's all-reduce
starts (async) as soon as backward has accumulated every gradient in it (a post-accumulate-grad hook),
so it runs while backward computes the earlier layers; `finish` waits for them, copies the sums back and
reduces whatever did not start (parameters that got no gradient this step, or all of them inside
`no_sync`, for gradient accumulation).

`buckets` is a pure function: planlang.runtime.traffic predicts the same collectives from it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from planlang.cost.comm import Collective

FIRST_BUCKET = 1 << 20  # bytes; DDP's first bucket
BUCKET = 25 << 20  # bytes; DDP's bucket_cap_mb default


@dataclass
class Bucket:
    axes: tuple[str, ...]
    names: list[str]
    nbytes: int = 0
    arrived: int = 0
    flat: object = None
    work: object = None
    members: list = field(default_factory=list)  # the gradients packed into `flat`, in order


def buckets(params: list[tuple[str, int, tuple[str, ...]]], first: int = FIRST_BUCKET,
            cap: int = BUCKET) -> list[Bucket]:
    """Buckets for `(name, gradient bytes, axes)` in registration order: per distinct axes, the parameters
    in reverse order, a bucket closed once it holds at least its cap (the first bucket `first`, then
    `cap`). Parameters without axes need no sum and are left out."""
    out: list[Bucket] = []
    open_: dict[tuple[str, ...], Bucket] = {}
    started: set[tuple[str, ...]] = set()
    for name, nbytes, axes in reversed(params):
        if not axes:
            continue
        b = open_.get(axes)
        if b is None:
            b = open_[axes] = Bucket(axes, [])
            out.append(b)
        b.names.append(name)
        b.nbytes += nbytes
        if b.nbytes >= (cap if axes in started else first):
            started.add(axes)
            del open_[axes]
    return out


class GradSync:
    """The bucketed, overlapped gradient sums of one ParallelModel (see the module docstring)."""

    def __init__(self, named_params: list[tuple[str, object]], sync: dict[str, tuple[str, ...]], groups,
                 recorder=None, overlap: bool = True) -> None:
        self.params = dict(named_params)
        self.groups = groups
        self.recorder = recorder
        self.overlap = overlap
        self.no_sync = False
        rows = [(n, p.numel() * p.element_size(), tuple(sync.get(n, ()))) for n, p in named_params]
        self.buckets = buckets(rows)
        self._handles = []
        if overlap:
            for b in self.buckets:
                for n in b.names:
                    self._handles.append(self.params[n].register_post_accumulate_grad_hook(
                        lambda p, b=b: self._arrived(b)))

    def _arrived(self, b: Bucket) -> None:
        # counts across backwards: inside `no_sync` a full round launches nothing, and the next full
        # round (the step that syncs) launches the bucket with the accumulated gradients
        b.arrived += 1
        if b.arrived % len(b.names) == 0 and not self.no_sync and b.flat is None:
            self._launch(b, async_op=True)

    def _launch(self, b: Bucket, async_op: bool) -> None:
        # lazy: torch loads only when this runs
        import torch
        import torch.distributed as dist

        b.members = [self._local(self.params[n].grad) for n in b.names if self.params[n].grad is not None]
        if not b.members:
            return
        b.flat = torch.cat([g.reshape(-1) for g in b.members])
        for k, a in enumerate(b.axes):
            if self.recorder is not None:
                self.recorder.record(Collective.ALL_REDUCE, (a,), b.flat.numel() * b.flat.element_size())
            last = k == len(b.axes) - 1
            if async_op and last:  # a sum over several axes runs axis after axis; the last one overlaps
                b.work = dist.all_reduce(b.flat, group=self.groups.group(a), async_op=True)
            else:
                dist.all_reduce(b.flat, group=self.groups.group(a))

    @staticmethod
    def _local(g):
        # lazy: torch loads only when this runs
        from torch.distributed.tensor import DTensor

        return g.to_local() if isinstance(g, DTensor) else g

    def finish(self) -> None:
        """Wait for the bucket sums in flight, reduce the buckets that did not start, and write the sums
        back into the gradients."""
        for b in self.buckets:
            if b.flat is None:
                self._launch(b, async_op=False)
            if b.work is not None:
                b.work.wait()
            off = 0
            for g in b.members:
                n = g.numel()
                g.copy_(b.flat[off:off + n].view_as(g))
                off += n
            b.flat, b.work, b.members, b.arrived = None, None, [], 0

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
