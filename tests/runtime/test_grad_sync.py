"""Bucketing of the per-step gradient sums (planlang.runtime.grad_sync): pure, no process group."""
from __future__ import annotations

from planlang.runtime.grad_sync import buckets


def test_buckets_reverse_order_per_axes_with_a_small_first_bucket():
    mib = 1 << 20
    params = [(f"p{i}", mib // 2, ("dp",)) for i in range(6)] + [("t", 3 * mib, ("dp", "fs")), ("r", mib, ())]
    got = buckets(params, first=mib, cap=2 * mib)
    assert [(b.axes, b.names) for b in got] == [
        (("dp", "fs"), ["t"]),
        (("dp",), ["p5", "p4"]),  # the first bucket closes at 1 MiB
        (("dp",), ["p3", "p2", "p1", "p0"]),  # then at 2 MiB
    ]
    # every parameter with axes is in exactly one bucket; one without axes in none
    names = [n for b in got for n in b.names]
    assert sorted(names) == sorted(n for n, _, a in params if a)
    assert sum(b.nbytes for b in got) == sum(s for _, s, a in params if a)


def test_small_models_make_one_bucket_per_axes():
    params = [("a", 100, ("dp",)), ("b", 200, ("dp",)), ("c", 50, ("tp",))]
    got = buckets(params)
    assert {b.axes: b.names for b in got} == {("dp",): ["b", "a"], ("tp",): ["c"]}
