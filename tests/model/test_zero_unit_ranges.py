"""zero_units.block_ranges finds each block's instructions in one pass (it scanned the whole program once per
block: O(blocks x instructions)); its answer is the scan's, compared here with the scan itself on GPT-2's
program and on programs changed to hit each reason a block stays in the root unit."""
from __future__ import annotations

import dataclasses

import pytest

from planlang.model.capture.trace import module_list_blocks
from planlang.model.program.lowering import Convert, Run
from planlang.model.program.zero_units import Block, _inside, block_ranges
from planlang.model.validation import validate_file

PLAN = "tests/runtime/plans/gpt2_dp2_tp2_ckpt.plan"


def _scanned(model, prog):
    """The scan block_ranges replaced, as it was."""
    values = prog.graph.values
    aliases: dict[int, set[str]] = {}
    for fqn, p in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), set()).add(fqn)
    uses: dict[str, list[int]] = {}
    for i, ins in enumerate(prog.instructions):
        if isinstance(ins, Run):
            for arg in ins.args:
                v = values.get(arg)
                if v is not None and v.kind == "param":
                    uses.setdefault(v.ref, []).append(i)
    blocks, skipped = [], {}
    for name in module_list_blocks(model):
        own = [f for f, _ in model.get_submodule(name).named_parameters(prefix=name, remove_duplicate=False)]
        runs = [i for i, ins in enumerate(prog.instructions) if isinstance(ins, Run) and _inside(ins.node.module, name)]
        if not own:
            skipped[name] = "no parameters"
            continue
        if not runs:
            skipped[name] = "no instruction of the program runs it"
            continue
        a, b = min(runs), max(runs) + 1
        stray = next((ins for ins in prog.instructions[a:b] if isinstance(ins, Run)
                      and not _inside(ins.node.module, name)), None)
        shared = next((f for f in own for p in [model.get_parameter(f)] if aliases[id(p)] - set(own)), None)
        outside = next((f for f in own for i in uses.get(f, ()) if not a <= i < b), None)
        crossing = next(((c, d) for c, d in prog.checkpoint_groups
                         if c < b and a < d and not (a <= c and d <= b)), None)
        made = {ins.out if isinstance(ins, Convert) else ins.node.name for ins in prog.instructions[a:b]}
        later = {prog.loss}
        for ins in prog.instructions[b:]:
            later.update([ins.value] if isinstance(ins, Convert) else ins.args)
        if stray is not None:
            skipped[name] = f"its instructions are interleaved with `{stray.node.module}`'s"
        elif shared is not None:
            skipped[name] = f"its parameter `{shared}` is shared with another module"
        elif outside is not None:
            skipped[name] = f"its parameter `{outside}` is read outside its instructions"
        elif crossing is not None:
            skipped[name] = "a checkpoint group crosses its boundary"
        elif not made & later:
            skipped[name] = "nothing after it reads what it computes"
        else:
            blocks.append(Block(a, b, name))
    blocks.sort(key=lambda blk: blk.start)
    return blocks, skipped


@pytest.fixture(scope="module")
def lowered():
    from planlang.model.capture.load import build_model

    v = validate_file(PLAN)
    assert v.program is not None and v.complete is not None
    return build_model(v.complete.model, v.complete.path), v.program


def _variants(prog):
    ins = prog.instructions
    runs = [i for i, x in enumerate(ins) if isinstance(x, Run) and x.node.module.startswith("h.")]
    first, last = runs[0], runs[-1]
    yield prog
    yield dataclasses.replace(prog, checkpoint_groups=[(first + 1, last)])  # across both blocks
    # an instruction of h.1 moved into h.0's range: interleaved
    moved = next(i for i in runs if ins[i].node.module.startswith("h.1"))
    swapped = list(ins)
    swapped.insert(first + 1, swapped.pop(moved))
    yield dataclasses.replace(prog, instructions=swapped)
    yield dataclasses.replace(prog, instructions=ins[:last + 1])  # nothing after the last block
    yield dataclasses.replace(prog, instructions=[x for x in ins if not (isinstance(x, Run)
                                                                         and x.node.module.startswith("h.0"))])


def test_block_ranges_answer_as_the_scan_did(lowered):
    model, prog = lowered
    reasons = set()
    for variant in _variants(prog):
        got = block_ranges(model, variant)
        assert got == _scanned(model, variant)
        reasons.update(r.split(" ")[0] + r.split(" ")[1] for r in got[1].values())
    assert len(reasons) >= 3  # the variants reached several reasons, not only the blocks kept


def test_checkpoint_ranges_are_the_scans():
    """lowering.mark_checkpoints looks each instruction's module up once; its ranges are those of the scan
    of the program per group it replaced (GPT-2 with each block checkpointed, and with both blocks in one)."""
    from planlang.model.program.lowering import checkpoint_groups, mark_checkpoints

    v = validate_file(PLAN)
    assert v.program is not None and v.complete is not None
    prog, plan = v.program, v.complete
    both = dataclasses.replace(plan.checkpoints[0], modules=tuple(m for g in plan.checkpoints for m in g.modules),
                               per=None, every=None)
    for cp in (plan, dataclasses.replace(plan, checkpoints=(both,))):
        modules = list(prog.graph.module_outputs())
        scanned = []
        for group in checkpoint_groups(cp.checkpoints, modules, modules):
            idx = [i for i, ins in enumerate(prog.instructions) if isinstance(ins, Run)
                   and any(ins.node.module == m or ins.node.module.startswith(m + ".") for m in group)]
            if idx:
                scanned.append((min(idx), max(idx) + 1))
        assert mark_checkpoints(prog, cp) == sorted(scanned) and scanned
