from planlang.plan.types import Axis, Mesh, Partial, Replicate, Shard, Spec, Hole
from planlang.plan.units import Kind, to_base, unit_kind, format_bytes


def mesh():
    return Mesh("m", None, (Axis("dp", 2), Axis("tp", 4)))


def test_spec_placements_and_local_shape():
    s = Spec(((), ("tp",)))
    assert s.placements(mesh()) == (Replicate(), Shard(1))
    assert s.local_shape((8, 16), mesh()) == (8, 4)
    both = Spec((("dp", "tp"), ()))
    assert both.placements(mesh()) == (Shard(0), Shard(0))
    assert both.shard_factor(0, mesh()) == 8
    assert both.local_shape((12, 3), mesh()) == (2, 3)  # uneven: the largest piece, ceil(12 / 8) (local_size)
    p = Spec((("dp",), (), ()), ("tp",))
    assert p.placements(mesh()) == (Shard(0), Partial())
    assert str(p) == "[dp, _, _] partial(tp)"
    assert str(both) == "[(dp, tp), _]"


def test_mesh_size_and_holes():
    m = mesh()
    assert m.size == 8 and not m.has_holes
    h = Mesh("m", None, (Axis("dp", Hole("size")), Axis("tp", 2)), device_count=8)
    assert h.has_holes and h.size == 8
    assert Mesh("m", None, (Axis("dp", Hole("size")),)).size is None


def test_units():
    assert to_base(80, "GiB") == 80 * 2**30
    assert to_base(40, "GB") == 40e9
    assert to_base(200, "Gb/s") == 25e9
    assert to_base(2, "us") == 2e-6
    assert unit_kind("TFLOPS") is Kind.THROUGHPUT
    assert unit_kind("GiB/s") is Kind.BANDWIDTH
    assert unit_kind("gib") is None
    assert format_bytes(40 * 2**30) == "40 GiB"
