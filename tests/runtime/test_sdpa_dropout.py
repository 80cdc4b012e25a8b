"""Attention with dropout (`dropout_p` > 0) has a rule (planlang.cost.ops.rules.sdpa_rule): each device runs
the fused kernel's own dropout on its piece, drawn from the step's seed and its coordinates on the axes
that split the output (planlang.runtime.local_ops). On one process, without a process group: pieces of
different heads draw different masks, replicas of one piece the same, a recomputation (the same seed) the
same, and the caller's random state is left as it was."""
from __future__ import annotations

import torch

from planlang.cost.layout import local_slices
from planlang.cost.ops import OpSpec, strategies
from planlang.plan.types import Axis, Link, Mesh
from planlang.runtime.local_ops import run_local

MESH = Mesh("m", None, (Axis("dp", 2, Link("ib", 25e9, 5e-6)), Axis("tp", 2, Link("nv", 300e9, 2e-6))))
SHAPE = (4, 4, 8, 4)  # batch, heads, sequence, head dim


def _op(seed: int) -> OpSpec:
    return OpSpec("scaled_dot_product_attention", (SHAPE,) * 3, SHAPE, "f32",
                  (("dropout_p", 0.5), ("is_causal", False), ("seed", seed)), ("f32",) * 3)


def _strategy(op: OpSpec, dims: tuple):
    """The strategy whose output splits exactly `dims` (per dim: its axes)."""
    return next(s for s in strategies(op, MESH) if s.output.dims == dims and not s.output.partial)


def _piece(op, strategy, coords, x):
    xs = [x[local_slices(SHAPE, spec, MESH, coords)] for spec in strategy.inputs]
    return run_local(op, strategy, xs, coords, MESH, lambda axis: None)


def test_pieces_draw_their_own_masks_and_replicas_the_same():
    torch.manual_seed(0)
    x = torch.randn(1, 1, 8, 4).expand(SHAPE).contiguous()  # every head and sample alike: only masks differ
    op = _op(seed=11)
    heads = _strategy(op, (("dp",), ("tp",), (), ()))  # batch over dp, heads over tp
    a = _piece(op, heads, {"dp": 0, "tp": 0}, x)
    b = _piece(op, heads, {"dp": 0, "tp": 1}, x)
    assert not torch.equal(a, b)  # other heads: another draw
    batch = _strategy(op, (("dp",), (), (), ()))  # replicated over tp
    r0 = _piece(op, batch, {"dp": 1, "tp": 0}, x)
    r1 = _piece(op, batch, {"dp": 1, "tp": 1}, x)
    assert torch.equal(r0, r1)  # replicas of one piece: one draw, or they would drift apart
    assert not torch.equal(r0, torch.nn.functional.scaled_dot_product_attention(*(x[2:],) * 3))  # dropped


def test_the_same_seed_draws_the_same_mask_and_leaves_the_random_state():
    torch.manual_seed(1)
    x = torch.randn(SHAPE)
    heads = _strategy(_op(3), (("dp",), ("tp",), (), ()))
    state = torch.get_rng_state()
    once = _piece(_op(3), heads, {"dp": 1, "tp": 1}, x)
    again = _piece(_op(3), heads, {"dp": 1, "tp": 1}, x)  # a checkpoint's recomputation
    other = _piece(_op(4), heads, {"dp": 1, "tp": 1}, x)  # the next step
    assert torch.equal(once, again) and not torch.equal(once, other)
    assert torch.equal(torch.get_rng_state(), state)
