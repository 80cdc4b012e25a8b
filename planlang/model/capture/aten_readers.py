"""How each op kind reads an ATen call's arguments (torch.export front end:
planlang.model.capture.export_graph).

The op table (planlang.cost.ops) says which ATen overloads lower to a kind; a reader here says how the
call gives the kind's tensor inputs and attributes, and returns False for a call the kind does not
express, which then stays an opaque call (the runtime runs the ATen op on gathered inputs). `READERS`
are by kind; `TARGET_READERS` by overload, where one kind has overloads read differently (`x.T` is a
permute, `select` a slice and a reshape, `pow(x, 2)` a product); a kind with neither gets `read_plain`
(every positional argument a tensor input, keywords as attributes). `IDENTITY_READERS` and
`COMPOSITE_READERS` read the targets of planlang.model.capture.targets that are no one op.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import fx

from planlang.cost.ops.rules import sdpa_heads_fit
from planlang.cost.ops.tensor_ops import einsum_fits
from planlang.model.capture import lazy_consts
from planlang.model.capture.export_builder import ExportBuilder, is_tensor, val_of
from planlang.model.capture.lazy_consts import Deferred
from planlang.model.capture.fx_builder import arg, node_of
from planlang.model.capture.graph_values import dtype_name

Reader = Callable[[ExportBuilder, fx.Node, str], bool]


def _x(b: ExportBuilder, node: fx.Node, i: int = 0) -> str:
    return b.tensor(node.args[i], node)


def _list(node: fx.Node, i: int) -> list[Any]:
    xs = node.args[i]
    if not isinstance(xs, (list, tuple)):
        raise TypeError(f"{node.format_node()}: argument {i} is not a list")
    return list(xs)


def read_plain(b: ExportBuilder, node: fx.Node, kind: str) -> bool:
    """Every positional argument a tensor input (in order), every keyword an attribute."""
    if not all(isinstance(a, fx.Node) for a in node.args):
        return False
    b.emit(node, kind, [_x(b, node, i) for i in range(len(node.args))], dict(node.kwargs))
    return True


def _same(n_tensors: int, **fixed: Any) -> Reader:
    """An op whose first `n_tensors` arguments are its tensor inputs and whose other arguments must
    have the given defaults (anything else: opaque)."""
    def read(b: ExportBuilder, node: fx.Node, kind: str) -> bool:
        for i, (k, v) in enumerate(fixed.items()):
            if arg(node, n_tensors + i, k, v) != v:
                return False
        b.emit(node, kind, [b.tensor(a, node) for a in node.args[:n_tensors] if a is not None])
        return True
    return read


def _binary(b: ExportBuilder, node: fx.Node, kind: str) -> bool:
    if node.kwargs.get("alpha", 1) != 1:
        return False
    x, y = node.args[0], node.args[1]
    if isinstance(x, fx.Node) and x.name in b.env:
        xs = b.tensor(x, node)
        ys = b.tensor(y, node, like=xs)
    else:
        ys = b.tensor(y, node)
        xs = b.tensor(x, node, like=ys)
    b.emit(node, kind, [xs, ys])
    return True


def _unary(b: ExportBuilder, node: fx.Node, kind: str) -> bool:
    attrs = {}
    if kind == "gelu" and node.kwargs.get("approximate", "none") != "none":
        attrs["approximate"] = node.kwargs["approximate"]
    b.emit(node, kind, [_x(b, node)], attrs)
    return True


def _one(b: ExportBuilder, node: fx.Node, kind: str) -> bool:
    b.emit(node, kind, [_x(b, node)])
    return True


def _expand(b: ExportBuilder, node: fx.Node, kind: str) -> bool:
    return not node.kwargs.get("implicit", False) and _one(b, node, kind)


def identity(b: ExportBuilder, node: fx.Node) -> bool:
    v = b.tensor(node.args[0], node)
    val = node.meta["val"]
    if tuple(val.shape) != b.values[v].shape or dtype_name(val.dtype) != b.values[v].dtype:
        return False
    b.env[node.name] = v
    return True


def _to(b: ExportBuilder, node: fx.Node, kind: str) -> bool:
    """`x.to(dtype)` / `_to_copy(x, dtype=...)`: an explicit floating cast is a `cast` op even where it is
    the identity here. The program is traced in f32 and run in the plan's precision, so RMSNorm's
    `hidden.to(torch.float32)` (HF Llama, Mistral, Qwen2, Gemma) is a no-op at trace time and the upcast
    that keeps its rsqrt finite in f16 at run time; dropping it ran the norm in f16 (NaN gradients).
    A cast back to the input's dtype (`.to(input_dtype)`) was f32 at trace time too and stays f32: the
    next matmul's autocast casts again, and one norm's output is kept in f32, not f16. Only `aten.to.dtype`
    (`x.to(torch.float32)`, `x.float()`, `x.to(y.dtype)`) is a cast: `x.to(device)` exports as
    `to.dtype_layout` with the trace's dtype filled in, which says nothing of the run's (HF GPT-2's
    position embeddings: cast to f32, they made the residual stream f32 beside f16 LayerNorm weights)."""
    dtype = node.args[1] if len(node.args) > 1 else node.kwargs.get("dtype")
    v = b.tensor(node.args[0], node)
    val = node.meta["val"]
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point and val.dtype.is_floating_point) \
            or tuple(val.shape) != b.values[v].shape:
        return identity(b, node)
    b.emit(node, kind, [v], {"dtype": dtype_name(dtype)})
    return True


def _type_as(b: ExportBuilder, node: fx.Node, kind: str) -> bool:
    """`x.type_as(other)`: x itself where the dtypes agree at trace time (other's dtype follows the
    plan's at run time, as x's does: Gemma2's norm casting back to its input's dtype), a `cast` to
    other's dtype where they differ."""
    v = b.tensor(node.args[0], node)
    out = dtype_name(node.meta["val"].dtype)
    if out == b.values[v].dtype:
        b.env[node.name] = v
        return True
    b.emit(node, kind, [v], {"dtype": out})
    return True


def _transpose(b: ExportBuilder, node: fx.Node, kind: str) -> bool:
    x = _x(b, node)
    d0, d1 = (node.args[1], node.args[2]) if len(node.args) > 2 else (0, 1)
    b.emit(node, kind, [x], {"dim0": d0, "dim1": d1})
    return True


def _permute(b: ExportBuilder, node: fx.Node, kind: str) -> bool:
    b.emit(node, kind, [_x(b, node)], {"dims": tuple(_list(node, 1))})
    return True


def _numpy_t(b: ExportBuilder, node: fx.Node, kind: str) -> bool:
    # x.T (HF FalconLinear's `input @ self.weight.T`): its dims reversed
    x = _x(b, node)
    b.emit(node, kind, [x], {"dims": tuple(range(len(b.values[x].shape)))[::-1]})
    return True


def _embedding(b: ExportBuilder, node: fx.Node, kind: str) -> bool:
    # aten.embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False)
    if arg(node, 3, "scale_grad_by_freq", False) or arg(node, 4, "sparse", False):
        return False
    pad = arg(node, 2, "padding_idx", -1)
    b.emit(node, kind, [_x(b, node, 1), _x(b, node, 0)], {"padding_idx": pad} if pad is not None and pad >= 0 else None)
    return True


def _pair(v: Any) -> tuple[Any, ...]:
    return tuple(v) if isinstance(v, (list, tuple)) else (v, v)


def _conv2d(b: ExportBuilder, node: fx.Node, kind: str) -> bool:
    # aten.conv2d(input, weight, bias=None, stride=[1, 1], padding=[0, 0], dilation=[1, 1], groups=1)
    bias = arg(node, 2, "bias")
    ins = [_x(b, node, 0), _x(b, node, 1)] + ([b.tensor(bias, node)] if bias is not None else [])
    b.emit(node, kind, ins, {"stride": _pair(arg(node, 3, "stride", 1)), "padding": _pair(arg(node, 4, "padding", 0)),
                             "dilation": _pair(arg(node, 5, "dilation", 1)), "groups": arg(node, 6, "groups", 1)})
    return True


def _select(b: ExportBuilder, node: fx.Node, kind: str) -> bool:
    # aten.select(x, dim, index): the length-1 slice at `index`, then that dim dropped (a reshape)
    x = _x(b, node)
    shape = b.values[x].shape
    d = int(arg(node, 1, "dim")) % len(shape)
    i = int(arg(node, 2, "index")) % shape[d]
    val = node.meta["val"]
    piece = torch.empty(shape[:d] + (1,) + shape[d + 1:], dtype=val.dtype, device="meta")
    s = b.emit(node, kind, [x], {"dim": d, "start": i, "end": i + 1}, out=piece, name=b.fresh(f"{node.name}_piece"))
    b.emit(node, "reshape", [s])
    return True


def _addmm(b: ExportBuilder, node: fx.Node, kind: str) -> bool:
    if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
        return False
    b.emit(node, kind, [b.tensor(a, node) for a in node.args[:3]])
    return True


def _linear(b: ExportBuilder, node: fx.Node, kind: str) -> bool:
    b.emit(node, kind, [b.tensor(a, node) for a in node.args[:3] if a is not None])
    return True


def _layer_norm(b: ExportBuilder, node: fx.Node, kind: str) -> bool:
    # aten.layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True)
    w, bias = arg(node, 2, "weight"), arg(node, 3, "bias")
    if w is None or bias is None:
        return False
    b.emit(node, kind, [b.tensor(a, node) for a in (node.args[0], w, bias)],
           {"eps": arg(node, 4, "eps", 1e-5), "normalized_ndim": len(_list(node, 1))})
    return True


def _dropout(b: ExportBuilder, node: fx.Node, kind: str) -> bool:
    p, train = arg(node, 1, "p", 0.5), arg(node, 2, "train", True)
    b.emit(node, kind, [_x(b, node)], {"p": p, "training": bool(train and b.training)})
    return True


def _softmax(b: ExportBuilder, node: fx.Node, kind: str) -> bool:
    x = _x(b, node)
    attrs = {"dim": node.args[1]}
    out = dtype_name(node.meta["val"].dtype)
    explicit = len(node.args) > 2 and isinstance(node.args[2], torch.dtype) or "dtype" in node.kwargs
    # softmax(x, dim, dtype=torch.float32) or _softmax's half_to_float; an explicit dtype is kept even
    # where the trace's f32 made it the identity (see `_to`): at run time in bf16 it is the upcast
    if out != b.values[x].dtype or explicit:
        attrs["dtype"] = out
    b.emit(node, kind, [x], attrs)
    return True


def _dims(d: Any) -> Any:
    if d is None or isinstance(d, int):
        return d
    d = tuple(d)
    return d[0] if len(d) == 1 else (None if not d else d)


def _reduce(b: ExportBuilder, node: fx.Node, kind: str) -> bool:
    if node.kwargs.get("dtype") is not None:
        return False
    x = _x(b, node)
    if node.target in (torch.ops.aten.sum.default, torch.ops.aten.mean.default):
        attrs = {"dim": None, "keepdim": False}
    else:
        attrs = {"dim": _dims(arg(node, 1, "dim")), "keepdim": bool(arg(node, 2, "keepdim", False))}
    b.emit(node, kind, [x], attrs)
    return True


def _stack_or_cat(b: ExportBuilder, node: fx.Node, kind: str) -> bool:
    b.emit(node, kind, [b.tensor(a, node) for a in _list(node, 0)], {"dim": arg(node, 1, "dim", 0)})
    return True


def _slice(b: ExportBuilder, node: fx.Node, kind: str) -> bool:
    # aten.slice(x, dim=0, start=None, end=None, step=1)
    x = _x(b, node)
    shape = b.values[x].shape
    step = arg(node, 4, "step", 1)
    d = arg(node, 1, "dim", 0) % len(shape)
    start, end = arg(node, 2, "start"), arg(node, 3, "end")
    start = 0 if start is None else start
    end = shape[d] if end is None else min(end, shape[d])
    if start in (0, -shape[d]) and end == shape[d] and step == 1:
        b.env[node.name] = x  # the whole dim
        return True
    b.emit(node, kind, [x], {"dim": d, "start": start, "end": end, **({"step": step} if step != 1 else {})})
    return True


def _index(b: ExportBuilder, node: fx.Node, kind: str) -> bool:
    """x[..., idx, ...] with one 1-D integer index (Falcon's `qkv[..., [-2], :]`: a constant) is
    index_select along that dim; indexing dim 0 (the batch: not per sample) or with several indices
    stays an opaque call."""
    x = _x(b, node)
    idx = _list(node, 1)
    used = [d for d, i in enumerate(idx) if i is not None]
    if len(used) != 1 or used[0] == 0 or not isinstance(idx[used[0]], fx.Node):
        return False
    t = idx[used[0]].meta.get("val")
    if not is_tensor(t) or t.dim() != 1 or t.dtype not in (torch.int64, torch.int32):
        return False
    b.emit(node, kind, [x, b.tensor(idx[used[0]], node)], {"dim": used[0]})
    return True


def _index_select(b: ExportBuilder, node: fx.Node, kind: str) -> bool:
    # aten.index_select(x, dim, index)
    x = _x(b, node)
    d = int(arg(node, 1, "dim")) % len(b.values[x].shape)
    if d == 0:
        return False
    b.emit(node, kind, [x, _x(b, node, 2)], {"dim": d})
    return True


def _roll(b: ExportBuilder, node: fx.Node, kind: str) -> bool:
    # aten.roll(x, shifts, dims=[]): along dim 0 (the batch) or flattened (no dims) it is not per sample
    x = _x(b, node)
    rank = len(b.values[x].shape)
    shifts, dims = arg(node, 1, "shifts"), arg(node, 2, "dims", ())
    shifts = (shifts,) if isinstance(shifts, int) else tuple(shifts)
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    if not dims or len(dims) != len(shifts) or any(d % rank == 0 for d in dims):
        return False
    b.emit(node, kind, [x], {"shifts": shifts, "dims": tuple(d % rank for d in dims)})
    return True


def _einsum(b: ExportBuilder, node: fx.Node, kind: str) -> bool:
    # aten.einsum(equation, tensors, path=None)
    xs = [b.tensor(a, node) for a in _list(node, 1)]
    eq = node.args[0]
    if not isinstance(eq, str) or not einsum_fits(eq, tuple(b.values[v].shape for v in xs),
                                                  tuple(node.meta["val"].shape)):
        return False
    b.emit(node, kind, xs, {"equation": eq})
    return True


def _split(b: ExportBuilder, node: fx.Node, kind: str) -> bool:
    b.pieces[node.name] = node
    return True


def piece(b: ExportBuilder, node: fx.Node, split: fx.Node, index: int) -> None:
    x = b.tensor(split.args[0], node)
    n = b.values[x].shape
    dim = arg(split, 2, "dim", 0) % len(n)
    size = -(-n[dim] // arg(split, 1, "chunks")) if split.target is torch.ops.aten.chunk.default else split.args[1]
    b.emit(node, "split", [x], {"dim": dim, "split_size": tuple(size) if isinstance(size, list) else size,
                                "index": index})


def _pow(b: ExportBuilder, node: fx.Node, kind: str) -> bool:
    """x ** 2 and x ** 3 as products (what ATen computes for these exponents), so they keep layouts."""
    n = node.args[1]
    if n not in (2, 3):
        return False
    x = _x(b, node)
    if n == 2:
        b.emit(node, kind, [x, x])
        return True
    sq = b.emit(node, kind, [x, x], out=node.meta["val"], name=b.fresh(f"{node.name}_sq"))
    b.emit(node, kind, [sq, x])
    return True


def _cross_entropy(b: ExportBuilder, node: fx.Node, kind: str) -> bool:
    # aten.cross_entropy_loss(self, target, weight=None, reduction=Mean, ignore_index=-100, label_smoothing=0)
    logits = val_of(node.args[0], node)
    red = {0: "none", 1: "mean", 2: "sum"}.get(arg(node, 3, "reduction", 1))
    if (logits.dim() != 2 or arg(node, 2, "weight") is not None or red is None
            or arg(node, 4, "ignore_index", -100) != -100 or arg(node, 5, "label_smoothing", 0.0) != 0.0):
        return False
    b.emit(node, kind, [_x(b, node, 0), _x(b, node, 1)], {"reduction": red})
    return True


def mse(b: ExportBuilder, node: fx.Node) -> bool:
    """mse_loss(a, t) = mean((a - t)^2), as the fx path lowers it (sub, mul, mean or sum)."""
    red = {1: "mean", 2: "sum"}.get(arg(node, 2, "reduction", 1))
    if red is None:
        return False
    a, t = _x(b, node, 0), _x(b, node, 1)
    meta = val_of(node.args[0], node)
    d = b.emit(node, "sub", [a, t], out=meta, name=b.fresh(f"{node.name}_diff"))
    sq = b.emit(node, "mul", [d, d], out=meta, name=b.fresh(f"{node.name}_sq"))
    b.emit(node, red, [sq], {"dim": None, "keepdim": False})
    return True


def causal_mask(mask: torch.Tensor | Deferred, s: int, t: int) -> bool:
    """Whether an SDPA mask (bool: keep; float: added) is torch's `is_causal` mask for every batch
    and head: keep key j for query i iff j <= i (top-left aligned). A Deferred mask (too large to
    compute while the graph is built) is read off what is known of its elements (lazy_consts.causal)."""
    if mask.shape[-2:] != (s, t) and not all(m == 1 or m == n for m, n in zip(mask.shape[-2:], (s, t))):
        return False
    if isinstance(mask, Deferred):
        return lazy_consts.causal(mask.sym, mask.dtype)
    keep = torch.ones(s, t, dtype=torch.bool).tril()
    m = mask.expand(*mask.shape[:-2], s, t)
    if mask.dtype == torch.bool:
        return bool((m == keep).all())
    if mask.is_floating_point():
        return bool(((m == 0) == keep).all() and torch.isneginf(m[..., ~keep]).all())
    return False


def keeps_all(mask: torch.Tensor | Deferred) -> bool:
    """Whether an SDPA mask (bool: keep; float: added) masks nothing."""
    if isinstance(mask, Deferred):
        return lazy_consts.keeps_all(mask.sym, mask.dtype)
    if mask.dtype == torch.bool:
        return bool(mask.all())
    return bool(mask.is_floating_point() and (mask == 0).all())


def _sdpa(b: ExportBuilder, node: fx.Node, kind: str) -> bool:
    # aten.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *,
    #                                   scale=None, enable_gqa=False)
    q, k, v = (val_of(a, node) for a in node.args[:3])
    mask = arg(node, 3, "attn_mask")
    dropout_p = arg(node, 4, "dropout_p", 0.0)
    if q.dim() != 4 or not isinstance(dropout_p, (int, float)):
        return False
    if not sdpa_heads_fit(tuple(q.shape), tuple(k.shape), tuple(v.shape), bool(node.kwargs.get("enable_gqa", False))):
        return False
    causal = bool(arg(node, 5, "is_causal", False))
    if mask is not None:
        m = b.folded.get(mask.name) if isinstance(mask, fx.Node) else None
        if not causal and isinstance(m, (torch.Tensor, Deferred)) and keeps_all(m):
            pass  # a mask that keeps every key (HF's default without an attention mask) is no mask
        elif causal or not isinstance(m, (torch.Tensor, Deferred)) or not causal_mask(m, q.shape[2], k.shape[2]):
            return False  # a mask from the data (padding) or not causal: opaque, with the mask as input
        else:
            causal = True
    attrs = {"is_causal": causal, "scale": node.kwargs.get("scale")}
    if dropout_p:  # the kernel drops attention weights itself (sdpa_rule: each device its piece's mask)
        attrs["dropout_p"] = float(dropout_p)
    b.emit(node, kind, [b.tensor(a, node) for a in node.args[:3]], attrs)
    return True


READERS: dict[str, Reader] = {
    "linear": _linear, "addmm": _addmm, "matmul": _same(2), "bmm": _same(2), "embedding": _embedding,
    "layer_norm": _layer_norm, "dropout": _dropout, "softmax": _softmax, "log_softmax": _softmax,
    **{k: _unary for k in ("gelu", "relu", "silu", "tanh", "exp", "neg", "rsqrt", "sqrt", "sigmoid", "sin", "cos")},
    **{k: _binary for k in ("add", "sub", "mul", "div")},
    "expand": _expand, "conv2d": _conv2d, "sum": _reduce, "mean": _reduce, "amax": _reduce,
    "view": _one, "reshape": _one, "flatten": _one, "transpose": _transpose, "permute": _permute,
    "cat": _stack_or_cat, "stack": _stack_or_cat, "index_select": _index_select, "roll": _roll, "einsum": _einsum,
    "cast": _type_as, "slice": _slice, "split": _split, "cross_entropy": _cross_entropy,
    "scaled_dot_product_attention": _sdpa,
}
TARGET_READERS: dict[str, Reader] = {
    "aten.numpy_T.default": _numpy_t, "aten.select.int": _select, "aten.index.Tensor": _index,
    "aten.to.dtype": _to, "aten.pow.Tensor_Scalar": _pow,
}
IDENTITY_READER: Callable[[ExportBuilder, fx.Node], bool] = identity
COMPOSITE_READERS: dict[str, Callable[[ExportBuilder, fx.Node], bool]] = {"aten.mse_loss.default": mse}
