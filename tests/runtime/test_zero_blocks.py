"""Which blocks ZeRO-2/3 run as FSDP2 units of their own (planlang.runtime.zero_blocks) and the code
generated for them, on the lowered program alone (no processes; tests/runtime/test_zero_blocks_gloo.py
trains them)."""
from __future__ import annotations

import dataclasses
import re

import pytest

from planlang.model.capture.load import build_model
from planlang.runtime.apply import load_plan, lower_plan, zero_blocks
from planlang.runtime.codegen import generate
from planlang.runtime.launch import lower_source
from planlang.runtime.zero_blocks import block_ranges

PLANS = "tests/runtime/plans"


@pytest.fixture(scope="module")
def ckpt():
    """GPT-2 (2 blocks) under dp 2 x tp 2 with each block checkpointed: its model and program."""
    plan = load_plan(f"{PLANS}/gpt2_dp2_tp2_ckpt.plan")
    model = build_model(plan.model, plan.path, device="cpu")
    return plan, model, lower_plan(model, plan)


def test_each_block_is_one_contiguous_range_holding_its_checkpoint_group(ckpt):
    _, model, prog = ckpt
    blocks, skipped = block_ranges(model, prog)
    assert [b.name for b in blocks] == ["h.0", "h.1"] and not skipped
    for b in blocks:
        mods = {ins.node.module for ins in prog.instructions[b.start:b.end] if hasattr(ins, "node")}
        assert all(m == b.name or m.startswith(b.name + ".") for m in mods)
        assert any(b.start <= c and d <= b.end for c, d in prog.checkpoint_groups)


def test_only_zero_2_and_3_over_several_devices_get_blocks(ckpt):
    plan, model, prog = ckpt
    assert zero_blocks(model, prog, plan) == []  # no ZeRO
    z3 = dataclasses.replace(plan, optimizer=dataclasses.replace(plan.optimizer, zero_stage=3, zero_axis="dp"))
    assert [b.name for b in zero_blocks(model, prog, z3)] == ["h.0", "h.1"]
    z1 = dataclasses.replace(z3, optimizer=dataclasses.replace(z3.optimizer, zero_stage=1))
    assert zero_blocks(model, prog, z1) == []


def test_a_checkpoint_group_across_blocks_keeps_them_in_the_root_unit(ckpt):
    _, model, prog = ckpt
    blocks, _ = block_ranges(model, prog)
    across = dataclasses.replace(prog, checkpoint_groups=[(blocks[0].start + 1, blocks[1].start + 2)])
    got, skipped = block_ranges(model, across)
    assert got == [] and set(skipped) == {"h.0", "h.1"}
    assert "checkpoint group" in skipped["h.0"]


def test_generated_code_reads_a_blocks_parameters_inside_its_function(ckpt):
    _, model, prog = ckpt
    blocks, _ = block_ranges(model, prog)
    plain = generate(prog, 0, None)
    assert generate(prog, 0, None, blocks=()) == plain and "rt.block" not in plain
    code = generate(prog, 0, None, blocks=[(b.start, b.end, b.name) for b in blocks])
    compile(code, "<test>", "exec")
    top = [line for line in code.splitlines() if line.startswith("    ") and not line.startswith("     ")]
    assert not any("p['h." in line for line in top)  # the step reads only the root's parameters
    assert "    def block_h_0(p, " in code and "rt.block('h.0', block_h_0, " in code
    assert re.search(r"\n        def checkpoint_0\(", code)  # the checkpoint group, nested in its block
    assert code.count("p['h.1.attn.c_attn.weight']") == 1


def test_lower_prints_the_blocks_of_a_zero3_plan():
    code = lower_source(load_plan(f"{PLANS}/gpt2_dp4_zero3.plan"), 0)
    assert "rt.block('h.0', block_h_0, " in code and "rt.block('h.1', block_h_1, " in code


def test_a_block_left_in_the_root_unit_is_reported_before_launch(tmp_path):
    """PL468: a checkpoint group over two blocks crosses both blocks' boundaries, so ZeRO-3 keeps them in
    the root unit; `check --model` (which every command that runs a plan calls first) says which and
    why, on the optimizer statement; the plan without the group has no PL468."""
    from planlang.model.validation import check_with_model

    base = open(f"{PLANS}/gpt2_dp2_zero3_blocks.plan").read()
    (tmp_path / "crossed.plan").write_text(base + "checkpoint h[0], h[1]\n")
    (tmp_path / "clean.plan").write_text(base)
    found = [d for d in check_with_model(str(tmp_path / "crossed.plan")).diagnostics if d.code == "PL468"]
    assert len(found) == 1 and found[0].span.line == 5
    assert "2 repeated block(s)" in found[0].message
    assert "`h[0]` (a checkpoint group crosses its boundary)" in found[0].message
    assert "PL468" not in {d.code for d in check_with_model(str(tmp_path / "clean.plan")).diagnostics}
