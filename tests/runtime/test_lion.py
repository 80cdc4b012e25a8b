"""`optimizer lion` (planlang/runtime/lion.py) against Algorithm 2 of Chen et al. 2023, written out by hand."""
import pytest
import torch

from planlang.plan import types as T
from planlang.runtime.lion import Lion
from planlang.runtime.zero import build_optimizer


def test_three_steps_follow_the_papers_update():
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(5))
    ref, m = p.detach().clone(), torch.zeros(5)
    lr, (b1, b2), wd = 0.01, (0.9, 0.99), 0.1
    opt = Lion([p], lr=lr, betas=(b1, b2), weight_decay=wd)
    for _ in range(3):
        g = torch.randn(5)
        p.grad = g.clone()
        opt.step()
        c = b1 * m + (1 - b1) * g
        ref = ref - lr * (torch.sign(c) + wd * ref)
        m = b2 * m + (1 - b2) * g
        assert torch.allclose(p.detach(), ref, atol=1e-7) and torch.allclose(opt.state[p]["exp_avg"], m)


def test_the_plans_lion_is_built_with_its_arguments():
    params = [torch.nn.Parameter(torch.zeros(3))]
    opt = build_optimizer(params, T.Optimizer("lion", (("lr", 3e-4), ("weight_decay", 0.01))))
    assert isinstance(opt, Lion) and opt.defaults["lr"] == 3e-4 and opt.defaults["weight_decay"] == 0.01
    with pytest.raises(ValueError, match="lr > 0"):
        Lion(params, lr=0)
