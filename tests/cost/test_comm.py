import math

import pytest

from planlang.cost.comm import Collective, bytes_sent, collective_time, compute_time, group, price
from planlang.plan.types import Axis, Device, Link, Mesh

NV = Link("nv", 300e9, 2e-6)
IB = Link("ib", 25e9, 5e-6)
MESH = Mesh("m", Device("gpu", 80 * 2**30, (("bf16", 312e12), ("f32", 19.5e12))),
            (Axis("dp", 4, IB), Axis("tp", 8, NV)))


def test_ring_formulas():
    g = group(MESH, ["tp"])
    S = 1e9
    assert collective_time(Collective.ALL_REDUCE, g, S) == pytest.approx(2e-6 + 2 * 7 / 8 * S / 300e9)
    assert collective_time(Collective.ALL_GATHER, g, S) == pytest.approx(2e-6 + 7 / 8 * S / 300e9)
    assert collective_time(Collective.REDUCE_SCATTER, g, S) == pytest.approx(2e-6 + 7 / 8 * S / 300e9)
    assert collective_time(Collective.ALL_TO_ALL, g, S) == pytest.approx(2e-6 + 7 / 8 * S / 300e9)
    assert collective_time(Collective.BROADCAST, g, S) == pytest.approx(2e-6 + S / 300e9)
    assert bytes_sent(Collective.ALL_REDUCE, 8, S) == pytest.approx(2 * 7 / 8 * S)


def test_multi_axis_group_uses_slowest_link():
    g = group(MESH, ["dp", "tp"])
    assert g.size == 32 and g.bandwidth == 25e9 and g.latency == 5e-6


def test_single_device_group_is_free():
    m = Mesh("m", None, (Axis("dp", 1, IB),))
    assert price(Collective.ALL_REDUCE, m, ["dp"], 1e9).seconds == 0.0


def test_compute_time():
    assert compute_time(312e12, MESH, "bf16", efficiency=1.0) == pytest.approx(1.0)
    assert compute_time(19.5e12, MESH, "f16", efficiency=0.5) == pytest.approx(2.0)  # falls back to f32


def test_unknown_axis_and_hole():
    with pytest.raises(KeyError):
        group(MESH, ["pp"])
    from planlang.plan.types import Hole

    with pytest.raises(ValueError):
        group(Mesh("m", None, (Axis("dp", Hole("size"), IB),)), ["dp"])
    assert math.isfinite(group(MESH, []).bandwidth) is False
