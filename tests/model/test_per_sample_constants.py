"""An opaque call run per sample (planlang.model.program.lowering.per_sample_strategy) gets every input with
the batch's leading size split as the batch is, constants included: Hugging Face BERT's attention with
dropout (`dropout_p` > 0 makes scaled-dot-product attention opaque) takes a mask expanded to the global
batch, which ran whole beside the local batch and raised a shape error on every rank (dp 2 x tp 2). The
gloo run of the same plan: tests/runtime/test_verify_dropout_gloo.py."""
from __future__ import annotations

from pathlib import Path

from planlang.model.capture.load import build_model
from planlang.model.program.lowering import Run
from planlang.plan.complete import complete
from planlang.runtime.apply import load_plan, lower_plan
from tests.runtime.dropout_worker import CONFIGS


def test_a_constant_of_the_batch_size_is_split_with_the_batch(tmp_path: Path):
    path = tmp_path / "bert.plan"
    path.write_text(CONFIGS["bert_dp2_tp2"])
    plan = complete(load_plan(str(path)))
    prog = lower_plan(build_model(plan.model, plan.path), plan)
    per_sample = [i for i in prog.instructions if isinstance(i, Run) and i.strategy is not None
                  and i.strategy.name.startswith("per sample")]
    assert per_sample, "the attention with dropout is an opaque call run per sample"
    for run in per_sample:
        batch = run.node.op.output[0]
        consts = 0
        for value, spec in zip((prog.graph.values[n] for n in run.node.inputs), run.strategy.inputs):
            if len(value.shape) == len(run.node.op.output) and value.shape[0] == batch:
                assert "dp" in spec.axes_of(0), f"{run.node.name}: {value.name} {value.shape} whole: {spec}"
                consts += value.kind == "const"
        assert consts == 1  # the attention mask, expanded to the batch


def test_the_attention_run_whole_over_tp_is_reported(tmp_path: Path):
    """The same attention keeps the batch split but has no rule for heads split over tp: its inputs are
    gathered over tp and every tp rank runs all heads, which the program lists for PL367."""
    path = tmp_path / "bert.plan"
    path.write_text(CONFIGS["bert_dp2_tp2"])
    plan = complete(load_plan(str(path)))
    prog = lower_plan(build_model(plan.model, plan.path), plan)
    assert {(r.target.split(".")[-1], r.axes) for r in prog.replicated} == {("scaled_dot_product_attention", ("tp",))}
    assert len(prog.replicated) == 2 and all(r.gathered_bytes > 0 for r in prog.replicated)  # one per layer
    assert not prog.fallbacks  # the batch itself stays split: not PL364
