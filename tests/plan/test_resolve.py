"""Resolver: templates, loops, use, and the plan it produces."""
from pathlib import Path

import pytest

from planlang.plan.checker import check_text
from planlang.plan.resolve import resolve_text
from planlang.plan.types import Hole, Spec

HW = """
device d { memory = 80 GiB; flops.bf16 = 312 TFLOPS }
link l { bandwidth = 300 GB/s; latency = 2 us }
"""


def codes(res):
    return [d.code for d in res.diagnostics]


def test_template_and_for_expansion_with_origin():
    text = HW + """
mesh m of 4 x d {
    dp = 2 over l
    tp = 2 over l
}
template mlp(axis: axis) {
    shard c_fc.weight : [_, axis]
    shard c_proj.weight : [axis, _]
}
for block in h[0:2] {
    apply mlp(tp) to block.mlp
}
"""
    res = resolve_text(text, "t.plan")
    assert codes(res) == []
    shards = [str(r) for r in res.plan.shards]
    assert shards == ["shard h[0:2].mlp.c_fc.weight : [_, tp]", "shard h[0:2].mlp.c_proj.weight : [tp, _]"]
    r = res.plan.shards[0]
    assert r.span.line == 10  # the template line
    assert r.site.line == 10  # same file: point at the statement itself (labelled with the apply site)
    assert r.origin[-1].line == 14  # the innermost expansion site: the apply inside the for


def test_rules_from_another_file_point_at_the_apply_site(tmp_path):
    (tmp_path / "t.plan").write_text("template mlp(a: axis) {\n    shard fc.weight : [a, a]\n}\n")
    root = tmp_path / "root.plan"
    root.write_text(HW + 'use "t.plan"\nmesh m of 2 x d { tp = 2 over l }\nfor b in h[*] {\n    apply t.mlp(tp) to b\n}\n')
    res = check_text(root.read_text(), str(root))
    (d,) = res.diagnostics
    assert d.code == "PL303" and d.span.file == str(root) and d.span.line == 7
    assert d.labels[0].span.file == str(tmp_path / "t.plan") and d.labels[0].span.line == 2


def test_for_loop_checkpoint_is_one_group_per_module():
    res = resolve_text(HW + "for b in h[*] {\n    checkpoint b.attn, b.mlp\n}\n", "t.plan")
    (g,) = res.plan.checkpoints
    assert str(g.per) == "h[*]" and [str(m) for m in g.modules] == ["h[*].attn", "h[*].mlp"]


def test_nested_template_params_and_int_param():
    text = HW + """
mesh m of 2 x d { tp = 2 over l }
template inner(a: axis) { shard w : [a] }
template outer(b: axis, n: int) {
    apply inner(b) to sub
    checkpoint blocks[*] every n
}
apply outer(tp, 3) to top
"""
    res = resolve_text(text, "t.plan")
    assert codes(res) == []
    assert str(res.plan.shards[0]) == "shard top.sub.w : [tp]"
    assert str(res.plan.checkpoints[0]) == "checkpoint top.blocks[*] every 3"


def test_hole_arguments_become_holes():
    text = HW + """
mesh m of 2 x d { tp = ? over l }
template t(a: axis) { shard w : [a, _] }
apply t(?) to x
"""
    res = resolve_text(text, "t.plan")
    spec = res.plan.shards[0].spec
    assert isinstance(spec, Spec) and isinstance(spec.dims[0], Hole)
    assert len(res.plan.holes()) == 2


def test_template_errors():
    text = HW + """
template t(a: axis, n: int) { shard w : [a] }
apply t(tp) to x
apply t(2, tp) to x
apply u(tp) to x
"""
    assert codes(resolve_text(text, "t.plan")) == ["PL206", "PL207", "PL205"]


def test_recursion_is_bounded():
    text = "template t(a: axis) { apply t(a) to x }\napply t(tp) to y\n"
    assert "PL219" in codes(resolve_text(text, "t.plan"))


def test_use_relative_file_and_cycle(tmp_path: Path):
    (tmp_path / "a.plan").write_text('use "b.plan"\n')
    (tmp_path / "b.plan").write_text('use "a.plan"\n')
    (tmp_path / "root.plan").write_text('use "a.plan"\n')
    from planlang.plan.resolve import resolve_file

    res = resolve_file(str(tmp_path / "root.plan"))
    assert "PL204" in codes(res)


def test_used_module_declarations_and_mesh_preset(tmp_path: Path):
    (tmp_path / "hw.plan").write_text(HW + "mesh pair of 2 x d { tp = 2 over l }\n")
    (tmp_path / "root.plan").write_text('use "hw.plan"\nmesh m = hw.pair\nshard w : [tp]\n')
    res = check_text((tmp_path / "root.plan").read_text(), str(tmp_path / "root.plan"))
    assert [d.code for d in res.diagnostics] == []
    assert res.plan.mesh.names == ("tp",) and res.plan.mesh.device.memory == 80 * 2**30


def test_stdlib_module_not_found_lists_available():
    res = resolve_text("use sharding.tools\n", "t.plan")
    assert codes(res) == ["PL203"]
    assert "patterns.megatron" in res.diagnostics[0].help


@pytest.mark.parametrize("typo, meant", [("hardwre", "hardware"), ("megatorn", "patterns.megatron"),
                                         ("patterns.megatorn", "patterns.megatron")])
def test_a_misspelt_module_gets_did_you_mean(typo, meant):
    res = resolve_text(f"use {typo}\n", "t.plan")
    assert codes(res) == ["PL203"] and res.diagnostics[0].help == f"did you mean `use {meant}`?"


def test_quantities_resolve_to_base_units():
    res = resolve_text(HW + "mesh m of 1 x d { dp = 1 over l }\nbudget 40 GiB per device\n", "t.plan")
    assert codes(res) == []
    assert res.plan.budget.bytes == 40 * 2**30
    assert res.plan.links[0].bandwidth == 300e9 and res.plan.links[0].latency == 2e-6
    assert res.plan.devices[0].flops_for("bf16") == 312e12


def test_axis_of_size_zero_is_reported_not_divided_by():
    # found by bench/fuzz.py: a size-0 pipeline axis used to raise ZeroDivisionError in the schedule rule
    text = HW + """
mesh m of 8 x d {
    pp = 0 over l
    tp = 4 over l
}
pipeline over pp schedule interleaved chunks 2 microbatches 4 {
    stage h[0:6]
    stage h[6:12]
}
"""
    res = check_text(text, "t.plan")
    assert [d.code for d in res.diagnostics] == ["PL302"]


def test_a_device_says_its_backend():
    mesh = "\nmesh m of 2 x d { dp = 2 over l }\n"
    assert resolve_text(HW + mesh, "t.plan").plan.mesh.device.backend == "nccl"  # the default
    gloo = HW.replace("flops.bf16 = 312 TFLOPS", 'flops.bf16 = 312 TFLOPS; backend = "gloo"')
    assert resolve_text(gloo + mesh, "t.plan").plan.mesh.device.backend == "gloo"
    bad = resolve_text(HW.replace("flops.bf16 = 312 TFLOPS", 'backend = "mpi"') + mesh, "t.plan")
    assert codes(bad) == ["PL221"] and "`backend` is one of 'nccl', 'gloo'" in bad.diagnostics[0].message
    assert resolve_text("use hardware\nmesh m of 2 x hardware.cpu { dp = 2 over hardware.loopback }\n",
                        "t.plan").plan.mesh.device.backend == "gloo"
