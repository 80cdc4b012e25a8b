"""The simulated step (planlang.model.capture.simulate) against eager PyTorch on CPU: the same live bytes."""
from __future__ import annotations

import warnings

import pytest
import torch

from planlang.model.capture.simulate import Existing, LiveBytes, simulate_step

pytest.importorskip("transformers")


def _eager_saved(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> int:
    """Bytes live at the end of forward (what autograd saved, plus the loss) on real CPU tensors."""
    mode = LiveBytes(Existing([*model.parameters(), *model.buffers(), *inputs.values()]))
    with mode:
        out = model(**inputs)
        first = out.logits if hasattr(out, "logits") else out
        loss = first.float().sum()
        del out, first
    assert loss.requires_grad
    return mode.live


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_fake_tensor_simulation_counts_no_parameter_as_an_activation(name):
    # Hugging Face models read values during mask creation, so the simulation runs them under
    # FakeTensorMode, which converts each meta parameter to a fresh fake tensor per op: a view of one
    # (`weight.t()`, saved by autograd for the matmul's backward) once counted as a new tensor of the
    # parameter's size, doubling the saved bytes of Llama
    from examples.zoo import causal_lm

    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    model = getattr(causal_lm, name)()
    ids = torch.randint(0, 100, (2, 16))
    eager = _eager_saved(model, {"input_ids": ids})
    sim = simulate_step(model.to("meta"), {"input_ids": ids.to("meta")})
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert sim.saved < eager + param_bytes / 4, (sim.saved, eager, param_bytes)
    assert sim.saved == pytest.approx(eager, rel=0.12)


def test_root_code_between_stage_modules_belongs_to_the_stage_before():
    # ResNet's forward runs relu and max_pool2d in the root module after `bn` (stage 0): the pipeline
    # cuts stage 1 at the beginning of `blocks[1]`, so those activations are stage 0's
    from examples.zoo.cnn import resnet

    model = resnet().to("meta")
    stage_of = {"stem": 0, "bn": 0, "blocks": 0, "blocks.0": 0, "pool": 1, "fc": 1}
    for n, _ in model.named_modules():
        if n.startswith("blocks.0."):
            stage_of[n] = 0
        elif n.startswith(("blocks.1", "fc", "pool")):
            stage_of[n] = 1
    stage_of.pop("blocks")
    sim = simulate_step(model, {"images": torch.empty(2, 3, 16, 16, device="meta")}, stage_of=stage_of)
    assert None not in sim.stage_saved or sim.stage_saved[None] == 0
    assert sum(sim.stage_saved.values()) == sim.saved
    # the relu output (2 x 16 x 16 x 16 f32) and the max-pool indices are saved by code of the root
    assert sim.stage_saved[0] > sim.stage_saved[1]


def test_a_stage_backward_peak_is_that_of_the_stage_run_alone():
    # the last stage of ResNet (blocks[1], pool, fc) run alone on a leaf input, as the pipeline runs it:
    # its backward peak equals the one the whole-model simulation attributes to stage 1. Module backward
    # hooks once kept each module's output gradient alive until its backward ended (+9 KB here, +5 % of
    # the stage's peak against MemTracker)
    import torch.nn.functional as F

    from examples.zoo.cnn import resnet

    torch.manual_seed(0)
    model = resnet()
    stage_of = {n: (1 if n.startswith(("blocks.1", "pool", "fc")) else 0) for n, _ in model.named_modules()
                if n and n != "blocks"}
    images, labels = torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))
    sim = simulate_step(model, {"images": images}, loss=lambda out, _: F.cross_entropy(out, labels),
                        stage_of=stage_of)

    x = torch.randn(4, 16, 8, 8, requires_grad=True)
    stage = [model.blocks[1], model.pool, model.fc]
    for p in model.parameters():
        p.grad = None
    mode = LiveBytes(Existing([*model.parameters(), *model.buffers(), x, labels]))
    with mode:
        out = stage[2](torch.flatten(stage[1](stage[0](x)), 1))
        loss = F.cross_entropy(out, labels)
    assert mode.live == sim.stage_saved[1]
    mode.reset_peak()
    with mode:
        loss.backward()
    assert mode.peak == sim.stage_backward_peak[1]


def test_block_parts_of_the_step_are_measured_for_zero3_per_block():
    # the estimator prices ZeRO-3 per block from each part of the step at its own peak
    # (estimate._zero3_blocks_peak): every block's forward and backward is a part, the peaks are the
    # step's (the largest is the step's backward peak), and the blocks' gradients add up to those inside
    from tests.model.tinynet import build

    model = build(hidden=32, layers=3).to("meta")
    blocks = ("h.0", "h.1", "h.2")
    sim = simulate_step(model, {"idx": torch.zeros(4, 8, dtype=torch.long, device="meta")}, blocks=blocks)
    parts = set(sim.segments)
    assert {("F", -1), ("B", 3)} <= parts
    assert all(("F", i) in parts and ("F+", i) in parts and ("B", i) in parts for i in range(3))
    assert max(v for (kind, _), v in sim.segments.items() if kind == "B") == sim.backward_peak
    assert max(v for (kind, _), v in sim.segments.items() if kind != "B") == sim.forward_peak
    inside = sum(p.numel() * 4 for n, p in model.named_parameters() if n.startswith("h."))
    assert sum(sim.block_grads) == inside and len(set(sim.block_grads)) == 1
