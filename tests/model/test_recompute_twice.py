"""planlang.model.program.recompute.checkpoint under a split backward: the zero_bubble schedule computes the
input gradient with the graph retained and the weight gradient from it later, so a checkpoint recomputes
its forward twice, and its recomputation context is entered twice."""
from __future__ import annotations

import torch

from planlang.model.program.recompute import checkpoint, is_recomputing


def test_a_checkpoint_recomputes_in_the_input_and_again_in_the_weight_gradient():
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8)
    seen = []

    def body(x):
        seen.append(is_recomputing())
        return torch.tanh(lin(x))

    x = torch.randn(4, 8, requires_grad=True)
    out = checkpoint(body, x).sum()
    (dx,) = torch.autograd.grad(out, x, retain_graph=True)  # B: the input gradient, graph kept
    dw, db = torch.autograd.grad(out, (lin.weight, lin.bias))  # W: recomputes again
    # the reference: the same function without a checkpoint
    x2 = x.detach().clone().requires_grad_(True)
    ref = torch.tanh(lin(x2)).sum()
    rdx, rdw, rdb = torch.autograd.grad(ref, (x2, lin.weight, lin.bias))
    assert torch.allclose(dx, rdx) and torch.allclose(dw, rdw) and torch.allclose(db, rdb)
    assert seen == [False, True, True]  # the forward, then one recomputation in each backward
