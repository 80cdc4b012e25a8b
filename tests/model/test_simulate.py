"""The simulated step (planlang.model.simulate) against eager PyTorch on CPU: the same live bytes."""
from __future__ import annotations

import warnings

import pytest
import torch

from planlang.model.simulate import Existing, LiveBytes, simulate_step

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
