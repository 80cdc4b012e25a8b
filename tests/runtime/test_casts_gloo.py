"""Explicit casts survive the f32 trace (planlang.model.capture.export_graph `_to`): HF Mistral's RMSNorm upcasts
with `hidden.to(torch.float32)`, the identity when the program is traced in f32. Dropped, the norm ran in
f16 under an f16 plan and its rsqrt's backward made every layer's gradient NaN (verify: an overflow under
the plan only, whatever the loss scale). 4 gloo ranks, dp4, f16 with a dynamic loss scale."""
from __future__ import annotations

import re

import pytest

pytest.importorskip("transformers", reason="HF Mistral needs transformers")

from tests.runtime.verify_cli import ROOT, verify_text  # noqa: E402
from tests.zoo.plans import plan_text  # noqa: E402

F16_DEVICE = ('device cpu_f16 {\n    memory = 24 GiB\n    flops.f32 = 100 GFLOPS\n    flops.f16 = 50 GFLOPS\n'
              '    backend = "gloo"\n}\n')


def in_f16(text: str) -> str:
    """A plan on hardware.cpu with an optimizer line and no block, in f16 with a dynamic loss scale."""
    text = text.replace("use hardware\n", "use hardware\n" + F16_DEVICE, 1).replace("x hardware.cpu", "x cpu_f16")
    out = re.sub(r"^(optimizer \w+\([^)]*\)) *$", r"\1 {\n    precision = f16\n    loss_scale = dynamic\n}", text,
                 count=1, flags=re.M)
    assert "precision = f16" in out
    return out


def f16_plan(model: str, layout: str) -> str:
    return in_f16(plan_text(model, layout))


def test_the_rms_norm_upcast_is_a_cast_op():
    import torch
    from transformers.models.mistral.modeling_mistral import MistralRMSNorm

    from planlang.model.capture.export_graph import export_op_graph

    g = export_op_graph(MistralRMSNorm(8), {"x": torch.randn(2, 4, 8)})
    casts = [n for n in g.nodes if n.op.kind == "cast"]
    # the upcast before the variance and the cast back before the weight, both f32 in an f32 trace
    assert len(casts) == 2 and all(n.op.attr("dtype") == "f32" for n in casts)
    kinds = [n.op.kind for n in g.nodes]
    assert kinds.index("cast") < kinds.index("rsqrt")


@pytest.mark.parametrize("case", ["mistral_dp4", "hf_gpt2_dp2_tp2"])
def test_trains_in_f16_like_one_process(tmp_path, case):
    """HF Mistral (its RMSNorm's upcast), and HF GPT-2 under dp x tp, whose `position_embeds.to(device)`
    exports as a `to` with the trace's f32 filled in: not a cast (made one, the residual stream went f32
    beside f16 LayerNorm weights and every rank raised "mixed dtype")."""
    text = f16_plan("mistral", "dp4") if case == "mistral_dp4" else \
        in_f16((ROOT / "tests/runtime/plans/hf_gpt2_dp2_tp2.plan").read_text())
    assert "overflow" not in verify_text(text, tmp_path, f"{case}_f16")
