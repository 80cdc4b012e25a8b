"""How a step's parameter-gradient sums are cut into buckets: DDP's scheme (Li et al., PyTorch
Distributed, VLDB 2020, §3.2.3), defined once for the runtime that issues them
(planlang.runtime.grad_sync) and the step-time model that prices them (planlang.model.price.traffic).

Parameters that sum over the same axes are packed in reverse registration order (roughly the order
backward produces their gradients), a bucket closed once it holds at least its cap: a small first bucket
so that communication starts early, then larger ones. A bucket's all-reduce starts as soon as backward
has produced every gradient in it, so all but the last bucket to fill run while backward computes the
earlier layers."""
from __future__ import annotations

from dataclasses import dataclass, field

FIRST_BUCKET = 1 << 20  # bytes; DDP's first bucket
BUCKET = 25 << 20  # bytes; DDP's bucket_cap_mb default


@dataclass
class BucketSpec:
    """One bucket: the parameters (names, in the order backward fills them) that share `axes`, their
    gradient bytes, and `ready`, the position in backward's order of the gradient that completes it."""

    axes: tuple[str, ...]
    names: list[str] = field(default_factory=list)
    nbytes: int = 0
    ready: int = 0

    def __str__(self) -> str:
        return f"bucket[{','.join(self.axes)}] {len(self.names)} gradients {self.nbytes} B"


def cut_buckets(params: list[tuple[str, int, tuple[str, ...]]], first: int = FIRST_BUCKET,
                cap: int = BUCKET) -> list[BucketSpec]:
    """Buckets for `(name, gradient bytes, axes)` in registration order: per distinct axes, the
    parameters in reverse order, a bucket closed once it holds at least its cap (the first bucket
    `first`, then `cap`), in the order they were opened. Parameters without axes need no sum and are
    left out."""
    out: list[BucketSpec] = []
    open_: dict[tuple[str, ...], BucketSpec] = {}
    started: set[tuple[str, ...]] = set()
    for i, (name, nbytes, axes) in enumerate(reversed(params)):
        if not axes:
            continue
        b = open_.get(axes)
        if b is None:
            b = open_[axes] = BucketSpec(axes)
            out.append(b)
        b.names.append(name)
        b.nbytes += nbytes
        b.ready = i
        if b.nbytes >= (cap if axes in started else first):
            started.add(axes)
            del open_[axes]
    return out


def launch_order(buckets: list[BucketSpec]) -> list[BucketSpec]:
    """`buckets` in the order their sums start during backward: by the gradient that completes each (the
    last one holds the first-registered parameters, whose gradients backward produces last)."""
    return sorted(buckets, key=lambda b: b.ready)
