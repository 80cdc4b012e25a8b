"""Cutting a lowered program into pipeline stages (planlang.model.program.pipeline_program), on meta: GPT-2
(hidden 64) under pp2 x tp2 with Megatron attention and MLP. No processes."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from planlang.model.capture.load import build_model
from planlang.model.program.lowering import Convert, LoweringError, Run
from planlang.model.program.pipeline_program import cut_program, microbatch_plan
from planlang.runtime.apply import load_plan, lower_plan

PLANS = Path(__file__).resolve().parents[1] / "runtime" / "plans"


@pytest.fixture(scope="module")
def lowered():
    plan = load_plan(PLANS / "gpt2_pp2_tp2_interleaved.plan")  # 4 stages, checkpoint groups, tied wte
    micro = microbatch_plan(plan)
    prog = lower_plan(build_model(plan.model, plan.path), micro)
    return plan, micro, prog


def _made(ins) -> str:
    return ins.out if isinstance(ins, Convert) else ins.node.name


def test_the_program_is_lowered_for_one_microbatch(lowered):
    plan, micro, prog = lowered
    assert plan.inputs[0].shape == (8, 16) and micro.inputs[0].shape == (2, 16)  # 4 microbatches
    bad = dataclasses.replace(plan, pipeline=dataclasses.replace(plan.pipeline, microbatches=3))
    with pytest.raises(LoweringError, match="batch 8 does not split into 3 microbatches"):
        microbatch_plan(bad)


def test_no_op_splits_its_work_over_the_pipeline_axis(tmp_path):
    # a pipeline rank's neighbours along pp run other stages: the program is lowered with pp counted 1
    # (lowered on the whole mesh, this GPT-2 split 23 values over pp - its attention projection's batch
    # among them - and the two stages waited on each other's all-gather for ever)
    (tmp_path / "p.plan").write_text("""use hardware
use patterns.megatron
model m = "examples.gpt2.model:build"(layers = 4, hidden = 256, heads = 8, vocab = 2048, seq = 64)
input idx : i64[batch = 8, seq = 64]
mesh ranks of 4 x hardware.cpu {
    pp = 2 over hardware.loopback
    tp = 2 over hardware.loopback
}
for block in h[*] {
    apply megatron.attention(tp) to block.attn
    apply megatron.mlp(tp) to block.mlp
}
pipeline over pp schedule 1f1b microbatches 4 {
    stage wte, wpe, drop, h[0:2]
    stage h[2:4], ln_f, lm_head
}
""")
    plan = load_plan(tmp_path / "p.plan")
    model = build_model(plan.model, plan.path)
    prog = lower_plan(model, microbatch_plan(plan))
    assert not [v for v, spec in prog.layouts.items() if "pp" in spec.used_axes() or "pp" in spec.partial]
    cut_program(prog, plan)
    whole_mesh = dataclasses.replace(microbatch_plan(plan), mesh=plan.mesh)  # what the lowering did before
    assert [v for v, spec in lower_plan(model, whole_mesh).layouts.items() if "pp" in spec.used_axes()]


def test_every_instruction_runs_once_in_order_and_in_its_modules_stage(lowered):
    plan, _, prog = lowered
    cut = cut_program(prog, plan)
    where = cut.stage_of()
    assert sorted(where) == list(range(len(prog.instructions)))  # each once (stages and tail)
    for st in cut.stages:
        assert list(st.instructions) == sorted(st.instructions)
    selected = {0: "h.0", 1: "h.1", 2: "h.2", 3: "h.3"}
    for k, ins in enumerate(prog.instructions):
        if isinstance(ins, Run) and ins.node.module.startswith("h."):
            block = ".".join(ins.node.module.split(".")[:2])
            assert selected[where[k]] == block, (ins.node.name, ins.node.module, where[k])
    # the loss (it reads the target) is the tail of the last stage
    tail = [prog.instructions[k] for k in cut.tail]
    assert [i.node.op.kind for i in tail][-1] == "cross_entropy" and cut.targets == ("target",)


def test_values_cross_each_boundary_in_their_lowered_layout(lowered):
    plan, _, prog = lowered
    cut = cut_program(prog, plan)
    where = cut.stage_of()
    made_in = {_made(prog.instructions[k]): s for k, s in where.items()}
    assert cut.stages[0].inputs == ("idx",)  # the model's input
    for a, b in zip(cut.stages, cut.stages[1:]):
        assert a.outputs == b.inputs
        for v in b.inputs:  # made before b (or a model input passed on)
            assert made_in.get(v, -1) < b.index
    # block 0's output reaches stage 1 partial over tp: its all-reduce runs where the value is read
    (boundary,) = cut.stages[1].inputs
    assert prog.layouts[boundary].partial == ("tp",)
    first = next(prog.instructions[k] for k in cut.stages[1].instructions)
    assert isinstance(first, Convert) and first.value == boundary


def test_each_stage_reads_its_own_parameters_and_the_tied_embedding_twice(lowered):
    plan, _, prog = lowered
    cut = cut_program(prog, plan)
    assert {p.split(".")[1] for p in cut.stages[1].params} == {"1"}  # h.1.* only
    holders = [st.index for st in cut.stages if "wte.weight" in st.params]
    assert holders == [0, 3]  # the embedding and the head share wte


def test_a_checkpoint_group_across_stages_is_refused(lowered):
    plan, _, prog = lowered
    spanning = dataclasses.replace(prog, checkpoint_groups=[(0, len(prog.instructions) - 1)])
    with pytest.raises(LoweringError, match="spans pipeline stages"):
        cut_program(spanning, plan)


def test_stages_out_of_execution_order_are_refused(lowered):
    plan, _, prog = lowered
    stages = plan.pipeline.stages
    swapped = (dataclasses.replace(stages[1], modules=stages[2].modules),
               dataclasses.replace(stages[2], modules=stages[1].modules))
    bad = dataclasses.replace(plan, pipeline=dataclasses.replace(plan.pipeline, stages=(stages[0], *swapped, stages[3])))
    with pytest.raises(LoweringError, match="stages must follow the model's execution order"):
        cut_program(prog, bad)


def test_check_reports_a_cut_the_runtime_cannot_make(monkeypatch):
    # `check --model` cuts the same program the runtime runs: its refusal is PL467 before any launch
    import planlang.model.validation as checks
    from planlang.model.validation import check_with_model

    assert not check_with_model(str(PLANS / "gpt2_pp2_tp2.plan")).errors

    def refuse(prog, plan):
        raise LoweringError("a checkpoint group spans pipeline stages 0, 1; keep each checkpoint group inside one stage")

    monkeypatch.setattr(checks, "cut_program", refuse)
    found = [d for d in check_with_model(str(PLANS / "gpt2_pp2_tp2.plan")).diagnostics if d.code == "PL467"]
    assert len(found) == 1 and "spans pipeline stages" in found[0].message and "planlang lower" in found[0].help
