"""A BatchNorm CNN in bf16 (precision.cast_buffers): the running statistics are kept in the dtype of the
module's weight, under the plan and in verify's one-process reference alike (the reference raised
"expected scalar type BFloat16 but found Float" when it cast the weight and not the statistics). 4 gloo
ranks: data parallel (BatchNorm synced over dp) and a GPipe pipeline over pp2 x dp2 (torch's own
batch_norm inside the stages)."""
from __future__ import annotations

import pytest
import torch

from planlang.plan.types import Precision
from planlang.runtime.precision import cast_buffers, reference_model
from tests.runtime.verify_cli import verify_text
from tests.zoo.plans import plan_text


def test_buffers_follow_their_modules_parameters():
    from examples.zoo.cnn import resnet

    class WithTable(torch.nn.Module):  # a parameter-less module's buffer (a rotary table) stays as built
        def __init__(self):
            super().__init__()
            self.register_buffer("inv_freq", torch.rand(4))

    model = torch.nn.Sequential(resnet(), WithTable())
    ref = reference_model(model, Precision("bf16", "bf16", "f32", "f32"))
    bn = ref[0].bn
    assert bn.weight.dtype == bn.running_mean.dtype == bn.running_var.dtype == torch.bfloat16
    assert ref[1].inv_freq.dtype == torch.float32
    assert bn.num_batches_tracked.dtype == torch.int64  # integer buffers untouched
    f32 = resnet()
    cast_buffers(f32, Precision())
    assert f32.bn.running_mean.dtype == torch.float32


@pytest.mark.parametrize("layout", ["dp4", "pp2dp2"])
def test_a_batch_norm_cnn_trains_in_bf16_like_one_process(tmp_path, layout):
    text = plan_text("resnet", layout).replace("optimizer adamw(lr = 1e-3) ",
                                               "optimizer adamw(lr = 1e-3) { precision = bf16 }")
    assert "precision = bf16" in text
    verify_text(text, tmp_path, f"resnet_{layout}_bf16")


def test_a_convolution_with_a_bias_trains_in_bf16_like_one_process(tmp_path):
    # HF ConvNeXt's patch embedding: an f32 image into a bf16 convolution with a bias. verify's reference
    # guessed the loss's targets without the plan's autocast and raised "Input type (float) and bias type
    # (c10::BFloat16) should be the same" (bench/model_zoo.py, convnext bf16)
    verify_text(plan_text("convnext", "bf16"), tmp_path, "convnext_bf16")
