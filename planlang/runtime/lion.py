"""Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms", Algorithm 2): the plan's
`optimizer lion`, which torch.optim does not have. One state tensor per parameter (the momentum):

    c = β1·m + (1 − β1)·g          the update direction interpolates momentum and gradient
    p ← p − lr·(sign(c) + λ·p)     a sign update, decoupled weight decay λ
    m ← β2·m + (1 − β2)·g          the momentum tracks the gradient with the slower β2
"""
from __future__ import annotations

import torch


class Lion(torch.optim.Optimizer):
    def __init__(self, params, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0) -> None:
        if lr <= 0 or not all(0.0 <= b < 1.0 for b in betas) or weight_decay < 0:
            raise ValueError(f"Lion: lr > 0, 0 <= betas < 1, weight_decay >= 0 (got {lr}, {betas}, {weight_decay})")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                m = state["exp_avg"]
                direction = (m * b1).add_(p.grad, alpha=1 - b1).sign_()
                p.mul_(1 - group["lr"] * group["weight_decay"]).add_(direction, alpha=-group["lr"])
                m.mul_(b2).add_(p.grad, alpha=1 - b2)
        return loss
