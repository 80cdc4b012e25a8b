"""Lowering op strategies to local torch ops: each device computes its piece of the output.

`run_local(op, strategy, local_inputs, coords, mesh, groups_for_axis)` takes this device's local inputs
(already in the layouts `strategy.inputs` asks for) and returns its local output in layout
`strategy.output` (a partial sum over `strategy.output.partial`). Each op kind of the registry
(planlang.cost.ops) has its implementation here, registered with `@implements(kind)`; importing this
module fails while one lacks it. Mostly the plain torch op on local shards; the special cases are:

* bias-like inputs: added only on coordinate 0 of any partial output axis they are not partial over
  (rules hand them over partial already, so this only guards hand-built strategies);
* embedding with the vocab dim split: masked lookup of the rows this device holds (partial output);
* cross-entropy with the vocab dim split: all-reduce(max) and all-reduce(sum) over the vocab axes;
* mean: local sum divided by the *global* count, so a split reduced dim leaves an exact partial sum;
* causal attention with the query sequence split: the mask is offset by the chunk start;
* attention with fewer key/value heads than query heads: each local query head reads its own key/value
  head (selected by the global head index), so a split of the query heads needs no split of k and v;
* dropout: each device draws the piece of the global mask it holds from `seed` and the elements' global
  indices (`dropout_keep`, a counter-based hash): the same mask as one process, without the whole of it.
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from planlang.cost.layout import local_shape, local_slices
from planlang.cost.ops import registry
from planlang.cost.ops.base import OpSpec, Strategy
from planlang.cost.ops.rules import dims_attr, slice_bounds
from planlang.model.capture.graph_values import DTYPES
from planlang.plan.types import Mesh, Spec

UNARY = {"gelu": F.gelu, "relu": torch.relu, "silu": F.silu, "tanh": torch.tanh, "exp": torch.exp, "neg": torch.neg,
         "rsqrt": torch.rsqrt, "sqrt": torch.sqrt, "sigmoid": torch.sigmoid, "sin": torch.sin, "cos": torch.cos}
BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}


_LOW32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash of each element of `x` (int64 holding values in [0, 2^32)): the finalizer of
    MurmurHash3 (fmix32). Each product is cut back to 32 bits, so no int64 arithmetic overflows into the
    sign and every shift is a logical one."""
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & _LOW32
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & _LOW32
    return x ^ (x >> 16)


_KEEP_CHUNK = 1 << 22  # elements hashed at once (whole rows of the leading dim): int64 temporaries of ~100 MB


def dropout_keep(shape: tuple[int, ...], piece: tuple[slice, ...], p: float, seed: int,
                 device: torch.device | str = "cpu") -> torch.Tensor:
    """The keep-mask of a dropout op's output of global `shape`, for the `piece` of it a device holds.

    Element i of the global tensor (row-major index) is kept when hash(seed, i) / 2^32 >= p, so every
    device computes its own piece and nothing else, on its own device, and two devices holding the same
    elements (replicas over a tensor-parallel axis) draw the same mask - as the whole tensor in one process
    would. Memory: the piece's bool mask, and int64 temporaries for one block of rows of its leading dim
    at a time (_KEEP_CHUNK elements, or one row where a row is larger)."""
    bounds = [(sl.start or 0, n if sl.stop is None else sl.stop) for n, sl in zip(shape, piece)]
    out = torch.empty([b - a for a, b in bounds], dtype=torch.bool, device=device)
    if out.numel() == 0:
        return out
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    rows = max(1, _KEEP_CHUNK // max(1, out[0].numel())) if out.dim() else 1
    key = _mix32(torch.tensor(int(seed) & _LOW32, dtype=torch.int64, device=device))
    threshold = int(math.ceil(p * 2**32))
    start = bounds[0][0] if bounds else 0
    for first in range(0, max(1, out.shape[0] if out.dim() else 1), rows):
        index = torch.zeros((), dtype=torch.int64, device=device)
        for d in reversed(range(len(bounds))):
            a, b = bounds[d]
            if d == 0:
                a, b = start + first, min(b, start + first + rows)
            along = torch.arange(a, b, dtype=torch.int64, device=device) * strides[d]
            index = index.unsqueeze(0) + along.view(-1, *([1] * index.dim()))
        low, high = index & _LOW32, index >> 32  # global indices past 2^32 keep their high bits
        keep = _mix32(low ^ _mix32(high ^ key)) >= threshold
        if out.dim():
            out[first:first + rows] = keep
        else:
            out.copy_(keep)
    return out


def dropout_mask(shape: tuple[int, ...], p: float, seed: int) -> torch.Tensor:
    """The global keep-mask of a dropout op (the same on every device and in a single process): the whole
    of `dropout_keep`."""
    return dropout_keep(tuple(shape), tuple(slice(0, n) for n in shape), p, seed)


def _axis_size(mesh: Mesh, axis: str) -> int:
    """The size of a mesh axis the program runs on (every size is known by then)."""
    size = mesh.axis_size(axis)
    if size is None:
        raise ValueError(f"mesh axis {axis!r} has no size")
    return size


def chunk(n: int, axes: tuple[str, ...], mesh: Mesh, coords: dict[str, int]) -> tuple[int, int]:
    """(start, length) of the chunk of a dim of size n split by `axes` that this device holds."""
    index, count = 0, 1
    for a in axes:
        size = _axis_size(mesh, a)
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


IGNORE_INDEX = -100  # torch.nn.functional.cross_entropy's default ignore_index


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


LocalFn = Callable[..., torch.Tensor]
_LOCAL: dict[str, LocalFn] = {}


def implements(*kinds: str):
    """Register the local implementation of op kinds (the registry's `OpKind`, planlang.cost.ops):
    fn(op, strategy, xs, ctx) -> this device's local output."""

    def deco(fn: LocalFn) -> LocalFn:
        for k in kinds:
            if k in _LOCAL:
                raise ValueError(f"op kind {k!r} already has a local implementation")
            _LOCAL[k] = fn
        return fn

    return deco


@dataclass(frozen=True)
class _Device:
    """Where a local op runs: this device's coordinates, the mesh and its process groups by axis."""

    coords: dict[str, int]
    mesh: Mesh
    groups_for_axis: Callable[[str], object]


def run_local(op: OpSpec, strategy: Strategy, local_inputs: list[torch.Tensor], coords: dict[str, int],
              mesh: Mesh, groups_for_axis: Callable[[str], object]) -> torch.Tensor:
    fn = _LOCAL.get(op.kind)
    if fn is None:
        raise KeyError(f"no local lowering for op kind {op.kind!r}")
    return fn(op, strategy, list(local_inputs), _Device(coords, mesh, groups_for_axis))


@implements("linear")
def _linear(op, strategy, xs, dev):
    b = _affine(strategy, 2, xs[2], dev.coords) if len(xs) > 2 else None
    return F.linear(xs[0], xs[1], b)


@implements("matmul")
def _matmul(op, strategy, xs, dev):
    return torch.matmul(xs[0], xs[1])


@implements("bmm")
def _bmm(op, strategy, xs, dev):
    return torch.bmm(xs[0], xs[1])


@implements("addmm")
def _addmm(op, strategy, xs, dev):
    bias = _affine(strategy, 0, xs[0], dev.coords)
    return torch.addmm(bias, xs[1], xs[2], beta=op.attr("beta", 1), alpha=op.attr("alpha", 1))


@implements("conv2d")
def _conv2d(op, strategy, xs, dev):
    b = _affine(strategy, 2, xs[2], dev.coords) if len(xs) > 2 else None
    return F.conv2d(xs[0], xs[1], b, stride=op.attr("stride", 1), padding=op.attr("padding", 0),
                    dilation=op.attr("dilation", 1), groups=op.attr("groups", 1))


@implements("layer_norm")
def _layer_norm(op, strategy, xs, dev):
    x = xs[0]
    nd = op.attr("normalized_ndim", xs[1].dim() if len(xs) > 1 else 1)
    w = xs[1] if len(xs) > 1 else None
    b = xs[2] if len(xs) > 2 else None
    return F.layer_norm(x, tuple(x.shape[x.dim() - nd:]), w, b, op.attr("eps", 1e-5))


@implements("rms_norm")
def _rms_norm(op, strategy, xs, dev):  # torch's own kernel (eps None: the dtype's epsilon, as nn.RMSNorm)
    x = xs[0]
    nd = op.attr("normalized_ndim", xs[1].dim() if len(xs) > 1 else 1)
    return F.rms_norm(x, tuple(x.shape[x.dim() - nd:]), xs[1] if len(xs) > 1 else None, op.attr("eps"))


def _dtype(name: str | None) -> torch.dtype | None:
    """A dtype attr (the op graph's names: "f32", "bf16", ...) as torch's."""
    return None if name is None else next(t for t, n in DTYPES.items() if n == name)


@implements("cast")
def _cast(op, strategy, xs, dev):
    return xs[0].to(_dtype(op.attr("dtype")))


@implements("softmax")
def _softmax(op, strategy, xs, dev):  # dtype: softmax(..., dtype=torch.float32) computes in (and returns) it
    return torch.softmax(xs[0], op.attr("dim", -1), dtype=_dtype(op.attr("dtype")))


@implements("log_softmax")
def _log_softmax(op, strategy, xs, dev):
    return torch.log_softmax(xs[0], op.attr("dim", -1), dtype=_dtype(op.attr("dtype")))


@implements(*UNARY)
def _unary(op, strategy, xs, dev):
    if op.kind == "gelu":
        return F.gelu(xs[0], approximate=op.attr("approximate", "none"))
    return UNARY[op.kind](xs[0])


@implements(*BINARY)
def _binary(op, strategy, xs, dev):
    return BINARY[op.kind](xs[0], xs[1])


@implements("sum", "mean", "amax")
def _reduce(op, strategy, xs, dev):
    x = xs[0]
    dims = dims_attr(op.attr("dim"), x.dim())
    keep = op.attr("keepdim", False)
    if op.kind == "amax":
        return torch.amax(x, dim=dims, keepdim=keep)
    if not dims:  # a reduction over no dim is the identity (torch.sum(dim=()) would sum them all)
        return x
    y = torch.sum(x, dim=dims, keepdim=keep)
    if op.kind == "mean":  # the *global* count, so a split reduced dim leaves an exact partial sum
        y = y / math.prod([op.inputs[0][d] for d in dims])
    return y


@implements("view", "reshape", "flatten", "unflatten")
def _reshape(op, strategy, xs, dev):
    return xs[0].reshape(local_shape(op.output, strategy.output, dev.mesh))


@implements("expand")
def _expand(op, strategy, xs, dev):
    return xs[0].expand(local_shape(op.output, strategy.output, dev.mesh))


@implements("transpose")
def _transpose(op, strategy, xs, dev):
    return xs[0].transpose(op.attr("dim0", 0), op.attr("dim1", 1))


@implements("permute")
def _permute(op, strategy, xs, dev):
    return xs[0].permute(*op.attr("dims"))


@implements("cat")
def _cat(op, strategy, xs, dev):
    return torch.cat(xs, dim=op.attr("dim", 0))


@implements("split", "slice", "getitem")
def _slice(op, strategy, xs, dev):
    x = xs[0]
    d, start, length = slice_bounds(op)
    blocks = op.attr("blocks")
    if blocks:  # a piece of a value stored per block (planlang.model.program.head_blocks)
        factor = math.prod([dev.mesh.axis_size(a) for a in op.attr("block_axes")])
        index = start // length
        if strategy.output.axes_of(d):  # this device's share of the piece: its share of the block
            return x.narrow(d, index * (length // factor), length // factor)
        shape = list(x.shape)  # the whole value in block order: every device's share of the block
        y = x.reshape(shape[:d] + [factor, blocks, length // factor] + shape[d + 1:]).select(d + 1, index)
        return y.reshape(shape[:d] + [length] + shape[d + 1:])
    step = op.attr("step", 1) or 1
    if step != 1:  # x[..., start::step]: the cut dim is whole here (the rule keeps it so)
        return x[(slice(None),) * d + (slice(start, start + step * (length - 1) + 1, step),)]
    return x.narrow(d, start, length)


@implements("stack")
def _stack(op, strategy, xs, dev):
    return torch.stack(xs, dim=op.attr("dim", 0))


@implements("roll")
def _roll(op, strategy, xs, dev):  # rolled dims are whole on every device (the rule keeps them so)
    return torch.roll(xs[0], tuple(op.attr("shifts")), tuple(op.attr("dims")))


@implements("index_select")
def _index_select(op, strategy, xs, dev):  # negative indices count from the end, as x[..., [-2], :] does
    x, index = xs
    n = x.shape[op.attr("dim", 0)]
    return x.index_select(op.attr("dim", 0), torch.where(index < 0, index + n, index).to(x.device))


@implements("einsum")
def _einsum(op, strategy, xs, dev):  # the split letters split every operand alike: the local einsum is the piece
    return torch.einsum(op.attr("equation"), *xs)


@implements("dropout")
def _dropout(op, strategy, xs, dev):
    x, p = xs[0], op.attr("p", 0.5)
    if not op.attr("training", True) or p == 0:
        return x  # the identity, as torch's dropout is: a copy would only cost memory
    if x.device.type == "meta":
        # shapes only (the estimate runs the program on meta): the piece's mask in x's dtype, as the
        # device holds it for backward (its hashing temporaries are bounded, dropout_keep)
        return x * torch.empty_like(x) / (1 - p)
    piece = local_slices(op.output, strategy.output, dev.mesh, dev.coords)
    m = dropout_keep(tuple(op.output), piece, p, op.attr("seed", 0), x.device).to(x.dtype)
    return x * m / (1 - p)


@implements("embedding")
def _embedding(op, strategy, xs, dev):
    coords, mesh = dev.coords, dev.mesh
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


@implements("scaled_dot_product_attention")
def _sdpa(op, strategy, xs, dev):
    coords, mesh = dev.coords, dev.mesh
    q, k, v = xs
    if op.inputs[1][1] != op.inputs[0][1]:  # fewer key/value heads (whole here): each query head's own
        k, v = _kv_heads(op, strategy, dev, k), _kv_heads(op, strategy, dev, v)
    causal = op.attr("is_causal", False)
    scale = op.attr("scale")
    p = float(op.attr("dropout_p", 0.0) or 0.0)
    saxes = strategy.inputs[0].dims[2]
    mask = None
    if causal and saxes:  # a chunk of the query sequence: its rows of torch's top-left aligned tril
        start, n = chunk(op.inputs[0][2], saxes, mesh, coords)
        rows = torch.arange(start, start + n).unsqueeze(1)
        mask, causal = rows >= torch.arange(k.shape[-2]).unsqueeze(0), False
    if not p or q.device.type == "meta":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal, scale=scale)
    # the kernel's own dropout, drawn from the step's seed and this device's coordinates on the axes that
    # split the output: distinct pieces get independent masks, replicas of one piece the same mask, and a
    # recomputation (checkpointing) the mask of its forward
    split = sorted({a for d in range(strategy.output.rank) for a in strategy.output.axes_of(d)})
    where = ",".join(f"{a}={coords.get(a, 0)}" for a in split)  # the same text on every process (no hash())
    seed = zlib.crc32(f"{int(op.attr('seed', 0))}:{where}".encode())
    devices = [q.device] if q.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal, scale=scale)


def _kv_heads(op, strategy, dev, t: torch.Tensor) -> torch.Tensor:
    """k or v [B, G, T, D] (every key/value head) for this device's query heads: global query head i
    reads key/value head i // (H / G), as torch's enable_gqa (and a broadcast G = 1) does."""
    heads, groups = op.inputs[0][1], op.inputs[1][1]
    start, n = chunk(heads, strategy.inputs[0].dims[1], dev.mesh, dev.coords)
    index = torch.arange(start, start + n, device=t.device) // (heads // groups)
    return t.index_select(1, index)


@implements("cross_entropy")
def _cross_entropy(op, strategy, xs, dev):
    coords, mesh, groups_for_axis = dev.coords, dev.mesh, dev.groups_for_axis
    logits, target = xs
    red = op.attr("reduction", "mean")
    vaxes = strategy.inputs[0].dims[1]
    # torch's ignore_index (-100, the only one the readers accept): such a row's loss is 0, and a mean
    # is over the other rows; Hugging Face pads the shifted labels of a causal LM with it
    valid = target != IGNORE_INDEX
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
        loss = (stats[0].log() - stats[1]) * valid.to(logits.dtype)
    if red == "none":
        return loss
    total = loss.sum()
    if red == "sum":
        return total
    # the mean over the whole batch's counted rows: this device's sum over their global number (summed
    # over the axes splitting the rows: one integer; cost.ops.rules prices it), a partial sum as before
    count = valid.sum()
    naxes = strategy.inputs[1].dims[0] if strategy.inputs[1].dims else ()
    if naxes:
        count = all_reduce(count, naxes, groups_for_axis)
    return total / count.to(total.dtype)


# the registry's every kind has a local implementation here, and nothing else does: adding an op kind
# without one fails on import, not on the first plan that uses it
if set(_LOCAL) != set(registry()):
    raise ImportError(f"op kinds without a local implementation: {sorted(set(registry()) - set(_LOCAL))}; "
                      f"local implementations of unknown kinds: {sorted(set(_LOCAL) - set(registry()))}")


def partial_pieces(value: torch.Tensor, spec: Spec, mesh: Mesh, coords: dict[str, int], seed: int = 0) -> torch.Tensor:
    """Split `value` (this device's slice) into pieces over `spec.partial` that sum to it, different on
    every coordinate (a test helper: deterministic in `seed`, the same on every device)."""
    piece = value
    for j, a in enumerate(spec.partial):
        n = _axis_size(mesh, a)
        g = torch.Generator().manual_seed(seed * 1009 + j)
        noise = torch.randn((n,) + tuple(value.shape), generator=g, dtype=value.dtype)
        piece = piece / n + noise[coords[a]] - noise.mean(0)
    return piece
