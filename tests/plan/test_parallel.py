"""planlang.plan.parallel: a complete plan's parallel dimensions, computed once, and FSDP2's arrangement of
the data axes, the one rule the checker's PL507 and the runtime both read."""
import dataclasses
import textwrap

import pytest

from planlang.plan.checker import check_text
from planlang.plan.complete import complete
from planlang.plan.parallel import ParallelDims, fsdp_mesh_axes


def _checked(mesh: str, data: str, zero: str = "", extra: str = "", devices: int = 8):
    text = textwrap.dedent(f"""\
        device gpu {{ memory = 80 GiB }}
        link nv {{ bandwidth = 300 GB/s }}
        model m = "examples.gpt2.model:build"(layers = 4, hidden = 64, heads = 4, vocab = 128, seq = 16)
        input idx : i64[batch = 16, seq = 16]
        mesh ranks of {devices} x gpu {{
        """) + "".join(f"    {a} over nv\n" for a in mesh.split(", ")) + textwrap.dedent(f"""\
        }}
        budget 40 GiB per device
        optimizer adamw(lr = 0.001){(' { zero = ' + zero + ' }') if zero else ''}
        data idx : {data}
        """) + extra
    return check_text(text, "p.plan")


def _dims(mesh: str, data: str, zero: str = "", extra: str = "", devices: int = 8) -> ParallelDims:
    res = _checked(mesh, data, zero, extra, devices)
    assert res.plan is not None and not res.errors, [str(d) for d in res.diagnostics]
    return complete(res.plan).dims


def test_a_3d_plan_names_each_dimension():
    dims = _dims("pp = 2, dp = 2, tp = 2", "[dp, _]", "1 over dp", textwrap.dedent("""\
        shard wte.weight : [tp, _]
        pipeline over pp schedule 1f1b microbatches 4 {
            stage wte, wpe, drop, h[0:2]
            stage h[2:4], ln_f, lm_head
        }
        """))
    assert dims.sizes == (("pp", 2), ("dp", 2), ("tp", 2))
    assert (dims.data, dims.batch, dims.tensor, dims.pipeline) == (("dp",), ("dp",), ("tp",), "pp")
    assert (dims.pipeline_size, dims.data_degree, dims.zero_stage, dims.zero_axis) == (2, 2, 1, "dp")
    assert dims.zero_shards == 2 and dims.fsdp == () and dims.replicate == ()  # ZeRO-1: no FSDP2


def test_fsdp_axes_under_zero_2_and_3():
    assert _dims("dp = 8", "[dp, _]", "3 over dp", devices=8).fsdp == ("dp",)
    # a size-1 data axis is a data axis (the runtime's process groups count it) but splits no batch
    ones = _dims("rep = 2, one = 1, fs = 4", "[(rep, one, fs), _]")
    assert ones.data == ("rep", "one", "fs") and ones.batch == ("rep", "fs") and ones.data_degree == 8
    # HSDP: one more data axis before the ZeRO axis replicates
    two = _dims("rep = 2, fs = 4", "[(rep, fs), _]", "2 over fs")
    assert two.fsdp == ("rep", "fs") and two.replicate == ("rep",) and two.zero_shards == 4
    # a ZeRO axis of one device: FSDP2 has nothing to shard
    assert _dims("dp = 1, tp = 8", "[dp, _]", "2 over dp").fsdp == ()


def test_the_checker_and_the_dims_read_one_arrangement():
    # PL507 is raised exactly where fsdp_mesh_axes finds no arrangement, and the dims of every plan the
    # checker accepts hold the arrangement it found
    cases = [("rep = 2, fs = 4", "[(rep, fs), _]"), ("fs = 4, rep = 2", "[(rep, fs), _]"),
             ("a = 2, b = 2, fs = 2", "[(a, b, fs), _]"), ("a = 2, fs = 4", "[fs, _]"),
             ("a = 1, b = 2, fs = 4", "[(a, b, fs), _]")]
    for mesh, data in cases:
        res = _checked(mesh, data, "2 over fs")
        names = tuple(part.split(" = ")[0] for part in mesh.split(", "))
        split = tuple(a for a in names if a in data)
        arranged = fsdp_mesh_axes(names, split, "fs")
        assert ("PL507" in {d.code for d in res.diagnostics}) == (arranged is None), (mesh, data)
        if arranged is not None:
            assert complete(res.plan).dims.fsdp == arranged


def test_fsdp_mesh_axes():
    assert fsdp_mesh_axes(("dp",), ("dp",), "dp") == ("dp",)
    assert fsdp_mesh_axes(("r", "z"), ("r", "z"), "z") == ("r", "z")
    assert fsdp_mesh_axes(("z", "r"), ("r", "z"), "z") is None  # the replicate axis must come first
    assert fsdp_mesh_axes(("a", "b", "z"), ("a", "b", "z"), "z") is None  # at most one replicate axis


def test_the_dims_are_computed_once_per_plan():
    plan = complete(_checked("dp = 8", "[dp, _]", "2 over dp").plan)
    assert plan.dims is plan.dims
    other = dataclasses.replace(plan, optimizer=dataclasses.replace(plan.optimizer, zero_stage=1))
    assert other.dims is not plan.dims and (other.dims.zero_stage, other.dims.fsdp) == (1, ())


def test_an_unvalidated_plan_whose_axes_fsdp2_cannot_arrange_is_refused():
    res = _checked("fs = 4, rep = 2", "[(rep, fs), _]", "2 over fs")
    assert "PL507" in {d.code for d in res.diagnostics}
    with pytest.raises(ValueError, match=r"PL507.*planlang check"):
        complete(res.plan).dims  # noqa: B018 - computing it is the test
