"""planlang.runtime.call_outputs without processes: binding a call's arguments to the plan's inputs and
targets (and the PlanErrors that say how to fix a call), building the model's output from pieces, and
`whole` gathering exactly the registered pieces."""
from __future__ import annotations

import pytest
import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

from planlang.plan.types import Spec
from planlang.runtime.call_outputs import (CallSignature, Piece, PlanOutput, bind_call, build_output, flatten_output,
                                           piece_of, target_names, whole)
from planlang.runtime.programs import PlanError

HF = CallSignature(("input_ids", "labels"), (), ((8, 16), (8, 16)), (0, 0))
LOSS_FN = CallSignature(("idx",), (("target", "labels"),), ((8, 16),), (0,))


def test_keywords_and_positionals_bind_in_the_programs_order():
    x, y = torch.zeros(8, 16, dtype=torch.long), torch.ones(8, 16, dtype=torch.long)
    assert bind_call(HF, (), {"labels": y, "input_ids": x}) == (x, y)
    assert bind_call(HF, (x,), {"labels": y}) == (x, y)
    # a target by the loss' parameter name or its Value's name
    assert bind_call(LOSS_FN, (), {"idx": x, "labels": y}) == (x, y)
    assert bind_call(LOSS_FN, (x, y), {}) == (x, y)
    assert bind_call(LOSS_FN, (x,), {"target": y}) == (x, y)


def test_a_shorter_batch_and_sequence_bind():
    for x in (torch.zeros(4, 16, dtype=torch.long), torch.zeros(8, 12, dtype=torch.long)):
        assert bind_call(HF, (), {"input_ids": x, "labels": x}) == (x, x)


@pytest.mark.parametrize("args, kwargs, says", [
    ((), {"input_ids": "x", "labels": "x", "attention_mask": "x"}, "`attention_mask`, which is none of the plan's inputs"),
    ((), {"input_ids": "x", "lables": "x"}, "did you mean `labels`?"),
    ((), {"input_ids": "x"}, "missing `labels`"),
    (("x",), {"input_ids": "x", "labels": "x"}, "`input_ids` twice"),
    (("x", "x", "x"), {}, "takes 2 tensors (input_ids, labels), got 3"),
    ((), {"input_ids": "x", "labels": 3}, "`labels` is a int, not a tensor"),
    ((), {"input_ids": "big", "labels": "big"}, "batch of 16 (shape [16, 16]), larger than the plan's 8"),
    ((), {"input_ids": "long", "labels": "long"}, "longer than the plan's [8, 16] in dim 1"),
])
def test_a_wrong_call_is_a_plan_error_saying_the_fix(args, kwargs, says):
    made = {"x": torch.zeros(8, 16, dtype=torch.long), "big": torch.zeros(16, 16, dtype=torch.long),
            "long": torch.zeros(8, 32, dtype=torch.long)}

    def t(v):
        return made.get(v, v) if isinstance(v, str) else v
    with pytest.raises(PlanError) as e:
        bind_call(HF, tuple(t(a) for a in args), {k: t(v) for k, v in kwargs.items()})
    assert says in str(e.value)
    if "none of the plan's inputs" in says:
        assert "declare it as an `input attention_mask" in str(e.value)


def test_target_names_are_the_values_and_the_loss_parameters():
    def loss(output, labels):
        return output

    assert target_names(loss, ["target"]) == (("target", "labels"),)
    assert target_names(None, ["target0", "target1"]) == (("target0",), ("target1",))


def test_the_models_output_class_comes_back_with_the_global_loss_and_pieces():
    logits = torch.randn(8, 16, 32)
    _, tree = flatten_output(CausalLMOutputWithPast(loss=torch.tensor(0.0), logits=logits))
    loss = torch.tensor(2.0, requires_grad=True)
    piece = Piece((8, 16, 64), Spec(((), (), ("tp",))))
    out = build_output(tree, [torch.tensor(1.0), logits.requires_grad_()], loss, [None, piece])
    assert type(out) is CausalLMOutputWithPast and list(out.keys()) == ["loss", "logits"]
    assert out.loss is loss and not out.logits.requires_grad
    assert piece_of(out.logits) == piece and piece_of(out.loss) is None
    # whole: only the pieces are gathered, the loss kept
    full = whole(out, lambda t, p: torch.cat([t, t], dim=-1))
    assert type(full) is CausalLMOutputWithPast and full.loss is loss and full.logits.shape == (8, 16, 64)


def test_a_tensor_output_is_a_plan_output():
    _, tree = flatten_output(torch.zeros(2, 3))
    loss = torch.tensor(1.0)
    out = build_output(tree, [torch.ones(2, 3)], loss, [Piece((4, 3), Spec((("dp",), ())))])
    assert isinstance(out, PlanOutput) and out.loss is loss and out.output.shape == (2, 3)
    assert whole(out, lambda t, p: torch.cat([t, t])).output.shape == (4, 3)
