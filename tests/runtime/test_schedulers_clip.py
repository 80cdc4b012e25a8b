"""torch's lr schedulers drive the optimizers `pm.optimizer()` may return (planlang's MasterWeights and
ScaledOptimizer wrappers: the same lrs and the same steps as the plain optimizer), and
planlang.runtime.clip on one rank is torch.nn.utils.clip_grad_norm_ (the gloo suite, with sharded
models: tests/runtime/test_clip_save_gloo.py)."""
from __future__ import annotations

import copy
import math

import pytest
import torch

from planlang.runtime.clip import clip_grad_norm_, copy_weights
from planlang.runtime.precision import LossScale, MasterWeights, ScaledOptimizer
from tests.runtime.one_process import one_process_group


def _warmup_then_halve(step: int) -> float:
    return min(1.0, (step + 1) / 2) * 0.5 ** step


def test_lambda_lr_drives_the_wrappers_like_the_plain_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    models = [copy.deepcopy(model) for _ in range(3)]
    opts = [torch.optim.AdamW(models[0].parameters(), lr=0.1),
            MasterWeights(list(models[1].parameters()), torch.float32, lambda ps: torch.optim.AdamW(ps, lr=0.1)),
            ScaledOptimizer(torch.optim.AdamW(models[2].parameters(), lr=0.1), LossScale(4.0))]
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, _warmup_then_halve) for o in opts]
    x = torch.randn(5, 4)
    for _ in range(4):
        for i, (m, o, sc) in enumerate(zip(models, opts, scheds)):
            o.zero_grad()
            loss = m(x).pow(2).sum()
            (loss * 4.0 if i == 2 else loss).backward()  # ScaledOptimizer divides by its scale
            o.step()
            sc.step()
        lrs = [sc.get_last_lr()[0] for sc in scheds]
        assert lrs[0] == lrs[1] == lrs[2]
        assert opts[1].inner.param_groups[0]["lr"] == lrs[0]  # what the inner optimizer steps with
        for m in models[1:]:
            assert torch.allclose(m.weight, models[0].weight, rtol=0, atol=1e-7)
    assert scheds[1].state_dict()["last_epoch"] == 4


@pytest.mark.parametrize("norm_type", [1.0, 2.0, math.inf])
def test_clip_on_one_rank_is_torchs(norm_type):
    torch.manual_seed(0)
    a, b = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)
    b.load_state_dict(a.state_dict())
    x = torch.randn(3, 8)
    for m in (a, b):
        m(x).pow(2).sum().backward()
    want = torch.nn.utils.clip_grad_norm_(a.parameters(), 0.5, norm_type)
    with one_process_group():
        named = list(b.named_parameters())
        weights = copy_weights(named, {}, groups=None)  # no layouts: no axis is read
        got = clip_grad_norm_(named, weights, 0.5, norm_type)
    assert weights == {n: 1.0 for n, _ in named}
    assert torch.allclose(got, want, rtol=1e-6)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-6)


def test_loss_scale_is_taken_out_of_the_norm():
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 4)
    lin(torch.randn(3, 8)).pow(2).sum().backward()
    grads = [p.grad.clone() for p in lin.parameters()]
    want = torch.nn.utils.get_total_norm(grads)
    for p in lin.parameters():
        p.grad.mul_(1024.0)
    named = list(lin.named_parameters())
    got = clip_grad_norm_(named, {n: 1.0 for n, _ in named}, 0.1, loss_scale=1024.0)
    assert torch.allclose(got, want, rtol=1e-6)
    # the gradients keep the scale, times torch's factor: the optimizer's unscale gives clipped ones
    coef = 0.1 / (float(want) + 1e-6)
    for p, g in zip(lin.parameters(), grads):
        assert torch.allclose(p.grad / 1024.0, g * coef, rtol=1e-6)
