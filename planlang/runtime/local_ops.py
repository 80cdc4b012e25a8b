"""Lowering op strategies to local torch ops: each device computes its piece of the output.

`run_local(op, strategy, local_inputs, coords, mesh, groups_for_axis)` takes this device's local inputs
(already in the layouts `strategy.inputs` asks for) and returns its local output in layout
`strategy.output` (a partial sum over `strategy.output.partial`). Mostly the plain torch op on local
shards; the special cases are:

* bias-like inputs: added only on coordinate 0 of any partial output axis they are not partial over
  (rules hand them over partial already, so this only guards hand-built strategies);
* embedding with the vocab dim split: masked lookup of the rows this device holds (partial output);
* cross-entropy with the vocab dim split: all-reduce(max) and all-reduce(sum) over the vocab axes;
* mean: local sum divided by the *global* count, so a split reduced dim leaves an exact partial sum;
* causal attention with the query sequence split: the mask is offset by the chunk start;
* dropout: the global mask is drawn from `seed` (`dropout_mask`) and sliced, as single-process.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from planlang.cost.layout import local_shape, local_slices
from planlang.cost.ops.base import OpSpec, Strategy
from planlang.cost.ops.rules import dims_attr, slice_bounds
from planlang.plan.types import Mesh, Spec

UNARY = {"gelu": F.gelu, "relu": torch.relu, "silu": F.silu, "tanh": torch.tanh, "exp": torch.exp, "neg": torch.neg,
         "rsqrt": torch.rsqrt, "sqrt": torch.sqrt, "sigmoid": torch.sigmoid, "sin": torch.sin, "cos": torch.cos}
BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}


def dropout_mask(shape: tuple[int, ...], p: float, seed: int) -> torch.Tensor:
    """The global keep-mask of a dropout op (the same on every device and in a single process)."""
    g = torch.Generator().manual_seed(int(seed))
    return torch.rand(tuple(shape), generator=g, dtype=torch.float64) >= p


def chunk(n: int, axes: tuple[str, ...], mesh: Mesh, coords: dict[str, int]) -> tuple[int, int]:
    """(start, length) of the chunk of a dim of size n split by `axes` that this device holds."""
    index, count = 0, 1
    for a in axes:
        size = mesh.axis_size(a)
        index = index * size + coords[a]
        count *= size
    return index * (n // count), n // count


class _SumToReplicated(torch.autograd.Function):
    """All-reduce (sum) forward; identity backward. The sum is replicated over the group, and by the
    gradient convention of planlang.cost.layout every rank already holds the whole gradient of a
    replicated value (layout.py's all_reduce step: backward free). torch.distributed.nn's all_reduce
    would sum the gradients again: n times the gradient and one more all-reduce per use."""

    @staticmethod
    def forward(ctx, t, group):
        t = t.clone()
        dist.all_reduce(t, group=group)
        return t

    @staticmethod
    def backward(ctx, g):
        return g, None


def all_reduce(t: torch.Tensor, axes, groups_for_axis, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """Reduce over every axis in turn (a reduction over several axes is one over their product)."""
    for a in axes:
        g = groups_for_axis(a)
        if t.requires_grad and op == dist.ReduceOp.SUM:
            t = _SumToReplicated.apply(t, g)
        else:
            t = t.clone()
            dist.all_reduce(t, op=op, group=g)
    return t


def _affine(strategy: Strategy, i: int, t: torch.Tensor | None, coords) -> torch.Tensor | None:
    """A bias-like input: zero where the output is partial over an axis it is not partial over, except
    on coordinate 0 (layout.py's to_partial)."""
    if t is None:
        return None
    missing = [a for a in strategy.output.partial if a not in strategy.inputs[i].partial]
    return torch.zeros_like(t) if any(coords[a] != 0 for a in missing) else t


def run_local(op: OpSpec, strategy: Strategy, local_inputs: list[torch.Tensor], coords: dict[str, int],
              mesh: Mesh, groups_for_axis: Callable[[str], object]) -> torch.Tensor:
    k = op.kind
    xs = list(local_inputs)
    x = xs[0] if xs else None
    if k == "linear":
        b = _affine(strategy, 2, xs[2], coords) if len(xs) > 2 else None
        return F.linear(x, xs[1], b)
    if k == "matmul":
        return torch.matmul(xs[0], xs[1])
    if k == "bmm":
        return torch.bmm(xs[0], xs[1])
    if k == "addmm":
        bias = _affine(strategy, 0, xs[0], coords)
        return torch.addmm(bias, xs[1], xs[2], beta=op.attr("beta", 1), alpha=op.attr("alpha", 1))
    if k == "conv2d":
        b = _affine(strategy, 2, xs[2], coords) if len(xs) > 2 else None
        return F.conv2d(x, xs[1], b, stride=op.attr("stride", 1), padding=op.attr("padding", 0),
                        dilation=op.attr("dilation", 1), groups=op.attr("groups", 1))
    if k == "embedding":
        return _embedding(op, strategy, xs, coords, mesh)
    if k == "layer_norm":
        nd = op.attr("normalized_ndim", xs[1].dim() if len(xs) > 1 else 1)
        w = xs[1] if len(xs) > 1 else None
        b = xs[2] if len(xs) > 2 else None
        return F.layer_norm(x, tuple(x.shape[x.dim() - nd:]), w, b, op.attr("eps", 1e-5))
    if k == "rms_norm":  # torch's own kernel (eps None: the dtype's epsilon, as nn.RMSNorm)
        nd = op.attr("normalized_ndim", xs[1].dim() if len(xs) > 1 else 1)
        return F.rms_norm(x, tuple(x.shape[x.dim() - nd:]), xs[1] if len(xs) > 1 else None, op.attr("eps"))
    if k == "softmax":
        return torch.softmax(x, op.attr("dim", -1))
    if k == "log_softmax":
        return torch.log_softmax(x, op.attr("dim", -1))
    if k == "gelu":
        return F.gelu(x, approximate=op.attr("approximate", "none"))
    if k in UNARY:
        return UNARY[k](x)
    if k in BINARY:
        return BINARY[k](xs[0], xs[1])
    if k in ("sum", "mean", "amax"):
        dims = dims_attr(op.attr("dim"), x.dim())
        keep = op.attr("keepdim", False)
        if k == "amax":
            return torch.amax(x, dim=dims, keepdim=keep)
        if not dims:  # a reduction over no dim is the identity (torch.sum(dim=()) would sum them all)
            return x
        y = torch.sum(x, dim=dims, keepdim=keep)
        if k == "mean":
            y = y / math.prod(op.inputs[0][d] for d in dims)
        return y
    if k in ("view", "reshape", "flatten", "unflatten"):
        return x.reshape(local_shape(op.output, strategy.output, mesh))
    if k == "expand":
        return x.expand(local_shape(op.output, strategy.output, mesh))
    if k == "transpose":
        return x.transpose(op.attr("dim0", 0), op.attr("dim1", 1))
    if k == "permute":
        return x.permute(*op.attr("dims"))
    if k == "cat":
        return torch.cat(xs, dim=op.attr("dim", 0))
    if k in ("split", "slice", "getitem"):
        d, start, length = slice_bounds(op)
        blocks = op.attr("blocks")
        if blocks:  # a piece of a value stored per block (planlang.model.head_blocks)
            factor = math.prod(mesh.axis_size(a) for a in op.attr("block_axes"))
            index = start // length
            if strategy.output.axes_of(d):  # this device's share of the piece: its share of the block
                return x.narrow(d, index * (length // factor), length // factor)
            shape = list(x.shape)  # the whole value in block order: every device's share of the block
            y = x.reshape(shape[:d] + [factor, blocks, length // factor] + shape[d + 1:]).select(d + 1, index)
            return y.reshape(shape[:d] + [length] + shape[d + 1:])
        return x.narrow(d, start, length)
    if k == "scaled_dot_product_attention":
        return _sdpa(op, strategy, xs, coords, mesh)
    if k == "cross_entropy":
        return _cross_entropy(op, strategy, xs, coords, mesh, groups_for_axis)
    if k == "dropout":
        p = op.attr("p", 0.5)
        if not op.attr("training", True) or p == 0:
            return x  # the identity, as torch's dropout is: a copy would only cost memory
        mask = dropout_mask(op.output, p, op.attr("seed", 0))
        m = mask[local_slices(op.output, strategy.output, mesh, coords)].to(x.dtype)
        return x * m / (1 - p)
    raise KeyError(f"no local lowering for op kind {k!r}")


def _embedding(op, strategy, xs, coords, mesh):
    idx, w = xs
    vaxes = strategy.inputs[1].dims[0]
    pad = op.attr("padding_idx")  # that row gets no gradient (nn.Embedding's padding_idx)
    if not vaxes:
        return F.embedding(idx, w, padding_idx=pad)
    lo, n = chunk(op.inputs[1][0], vaxes, mesh, coords)
    inside = (idx >= lo) & (idx < lo + n)
    local_pad = pad - lo if pad is not None and lo <= pad < lo + n else None
    out = F.embedding(torch.where(inside, idx - lo, torch.zeros_like(idx)), w, padding_idx=local_pad)
    return out * inside.unsqueeze(-1).to(out.dtype)


def _sdpa(op, strategy, xs, coords, mesh):
    q, k, v = xs
    causal = op.attr("is_causal", False)
    scale = op.attr("scale")
    saxes = strategy.inputs[0].dims[2]
    if not causal:
        return F.scaled_dot_product_attention(q, k, v, scale=scale)
    if not saxes:  # whole sequence on this rank: torch's own causal path, no mask tensor
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    start, n = chunk(op.inputs[0][2], saxes, mesh, coords)
    t = k.shape[-2]
    rows = torch.arange(start, start + n).unsqueeze(1)
    mask = rows >= torch.arange(t).unsqueeze(0)  # torch's is_causal: top-left aligned tril
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def _cross_entropy(op, strategy, xs, coords, mesh, groups_for_axis):
    logits, target = xs
    red = op.attr("reduction", "mean")
    n_global = op.inputs[0][0]
    vaxes = strategy.inputs[0].dims[1]
    if not vaxes:
        loss = F.cross_entropy(logits, target, reduction="none")
    else:
        lo, n = chunk(op.inputs[0][1], vaxes, mesh, coords)
        mx = all_reduce(logits.detach().amax(dim=1), vaxes, groups_for_axis, dist.ReduceOp.MAX)
        shifted = logits - mx.unsqueeze(1)
        inside = (target >= lo) & (target < lo + n)
        local_t = torch.where(inside, target - lo, torch.zeros_like(target))
        tgt = shifted.gather(1, local_t.unsqueeze(1)).squeeze(1) * inside.to(logits.dtype)
        stats = torch.stack([shifted.exp().sum(dim=1), tgt])
        stats = all_reduce(stats, vaxes, groups_for_axis)
        loss = stats[0].log() - stats[1]
    if red == "none":
        return loss
    total = loss.sum()
    return total / n_global if red == "mean" else total


def partial_pieces(value: torch.Tensor, spec: Spec, mesh: Mesh, coords: dict[str, int], seed: int = 0) -> torch.Tensor:
    """Split `value` (this device's slice) into pieces over `spec.partial` that sum to it, different on
    every coordinate (a test helper: deterministic in `seed`, the same on every device)."""
    piece = value
    for j, a in enumerate(spec.partial):
        n = mesh.axis_size(a)
        g = torch.Generator().manual_seed(seed * 1009 + j)
        noise = torch.randn((n,) + tuple(value.shape), generator=g, dtype=value.dtype)
        piece = piece / n + noise[coords[a]] - noise.mean(0)
    return piece
