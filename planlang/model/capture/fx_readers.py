"""How each op kind reads an fx call's arguments (torch.fx front end: planlang.model.capture.opgraph).

The op table (planlang.cost.ops) says which calls lower to a kind; a reader here says how that kind's
calls give its tensor inputs and attributes (the input conventions of planlang.cost.ops.rules), and
returns False for a call the kind does not express (an attention with a mask, an einsum the rule does
not fit ...), which the front end then runs as an opaque call. `READERS` are for call_function and
call_method nodes (a method's `self` is argument 0, as a function's first argument), `MODULE_READERS`
for call_module nodes (the module's parameters are its weights). A kind with no reader here gets
`read_plain` / `read_plain_module`: every positional argument a tensor input, keywords as attributes.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import fx, nn

from planlang.cost.ops.rules import sdpa_heads_fit
from planlang.cost.ops.tensor_ops import einsum_fits
from planlang.model.capture.fx_builder import TORCH_DTYPE, FxBuilder, arg, node_of
from planlang.model.capture.graph_values import dtype_name

Reader = Callable[[FxBuilder, fx.Node, str], bool]
ModuleReader = Callable[[FxBuilder, fx.Node, str, Any], bool]


def _x(b: FxBuilder, node: fx.Node, i: int = 0) -> str:
    return b.tensor_of(node.args[i], node, i)


def read_plain(b: FxBuilder, node: fx.Node, kind: str) -> bool:
    """Every positional argument a tensor input (in order), every keyword a static attribute."""
    if not all(b.is_tensor_value(a) for a in node.args):
        return False
    ins = [b.tensor_of(a, node, i) for i, a in enumerate(node.args)]
    b.set(node, b.emit(node, kind, ins, {k: b.static(v) for k, v in node.kwargs.items()}))
    return True


def read_plain_module(b: FxBuilder, node: fx.Node, kind: str, mod: Any) -> bool:
    """A module without parameters called on tensors: its positional arguments are the inputs."""
    if any(True for _ in mod.parameters()) or node.kwargs:
        return False
    return read_plain(b, node, kind)


# ------------------------------------------------------------------------------ function and method calls
def _one(b: FxBuilder, node: fx.Node, kind: str) -> bool:
    b.set(node, b.emit(node, kind, [_x(b, node)]))
    return True


def _two(b: FxBuilder, node: fx.Node, kind: str) -> bool:
    b.set(node, b.emit(node, kind, [_x(b, node, 0), _x(b, node, 1)]))
    return True


def _unary(b: FxBuilder, node: fx.Node, kind: str) -> bool:
    if kind == "gelu" and not set(node.kwargs) <= {"approximate"}:
        return False
    attrs = {}
    if kind == "gelu" and node.kwargs.get("approximate", "none") != "none":
        attrs["approximate"] = node.kwargs["approximate"]
    b.set(node, b.emit(node, kind, [_x(b, node)], attrs))
    return True


def _binary(b: FxBuilder, node: fx.Node, kind: str) -> bool:
    if len(node.args) != 2 or node.kwargs:
        return False
    ins = []
    for i, a in enumerate(node.args):
        if isinstance(a, fx.Node) and a.name in b.static_values:
            ins.append(b.tensor_of(b.static_values[a.name], node, i))
        else:
            ins.append(b.tensor_of(a, node, i))
    b.set(node, b.emit(node, kind, ins))
    return True


def _linear(b: FxBuilder, node: fx.Node, kind: str) -> bool:
    ins = [b.tensor_of(a, node, i) for i, a in enumerate(node.args[:3]) if a is not None]
    if node.kwargs.get("bias") is not None:
        ins.append(b.tensor_of(node.kwargs["bias"], node, 2))
    b.set(node, b.emit(node, kind, ins))
    return True


def _addmm(b: FxBuilder, node: fx.Node, kind: str) -> bool:
    if node.kwargs:
        return False
    b.set(node, b.emit(node, kind, [_x(b, node, i) for i in range(3)]))
    return True


def _embedding(b: FxBuilder, node: fx.Node, kind: str) -> bool:
    return len(node.args) == 2 and not node.kwargs and _two(b, node, kind)


def _layer_norm(b: FxBuilder, node: fx.Node, kind: str) -> bool:
    if not all(a is not None for a in node.args[2:4]):
        return False
    ins = [_x(b, node, i) for i in (0, 2, 3)]
    b.set(node, b.emit(node, kind, ins, {"eps": b.static(arg(node, 4, "eps", 1e-5)),
                                         "normalized_ndim": len(b.static(node.args[1]))}))
    return True


def _softmax(b: FxBuilder, node: fx.Node, kind: str) -> bool:
    """softmax/log_softmax over `dim`; with `dtype` (softmax(x, -1, dtype=torch.float32)) computed in it."""
    if node.op == "call_function" and not (set(node.kwargs) <= {"dim", "dtype", "_stacklevel"} and len(node.args) <= 2):
        return False
    x = _x(b, node)
    attrs = {"dim": b.static(arg(node, 1, "dim"))}
    out = dtype_name(b.meta(node).dtype)
    # an explicit dtype is kept where the f32 trace made it the identity (export_graph's `_softmax`): at
    # run time under bf16 it is the upcast
    if out != b.values[x].dtype or node.kwargs.get("dtype") is not None:
        attrs["dtype"] = out
    b.set(node, b.emit(node, kind, [x], attrs))
    return True


def _type_as(b: FxBuilder, node: fx.Node, kind: str) -> bool:
    """x.type_as(other): x itself where the dtypes agree at trace time (other's follows the plan's at
    run time, as x's does), a `cast` to other's dtype where they differ."""
    if not b.is_tensor_value(node.args[0]):
        return False
    x = b.env[node_of(node.args[0], node).name]
    out = dtype_name(b.meta(node).dtype)
    b.set(node, x if out == b.values[x].dtype else b.emit(node, kind, [x], {"dtype": out}))
    return True


def _roll(b: FxBuilder, node: fx.Node, kind: str) -> bool:
    """torch.roll along given dims other than dim 0 (the batch: not per sample); anything else opaque."""
    x = _x(b, node)
    rank = len(b.shape_of(x))
    shifts, dims = b.static(arg(node, 1, "shifts")), b.static(arg(node, 2, "dims", ()))
    shifts = (shifts,) if isinstance(shifts, int) else tuple(shifts)
    dims = (dims,) if isinstance(dims, int) else tuple(dims or ())
    if not dims or len(dims) != len(shifts) or any(d % rank == 0 for d in dims):
        return False
    b.set(node, b.emit(node, kind, [x], {"shifts": shifts, "dims": tuple(d % rank for d in dims)}))
    return True


def _einsum(b: FxBuilder, node: fx.Node, kind: str) -> bool:
    """torch.einsum(eq, *operands) or (eq, [operands]) as the einsum op where its rule fits."""
    eq = b.static(node.args[0])
    a1 = node.args[1] if len(node.args) == 2 else None
    args = list(a1) if isinstance(a1, (list, tuple)) else list(node.args[1:])
    if node.kwargs or not isinstance(eq, str) or not all(b.is_tensor_value(a) for a in args):
        return False
    xs = [b.env[node_of(a, node).name] for a in args]
    if not einsum_fits(eq, tuple(b.shape_of(v) for v in xs), tuple(b.meta(node).shape)):
        return False
    b.set(node, b.emit(node, kind, xs, {"equation": eq}))
    return True


def _sdpa(b: FxBuilder, node: fx.Node, kind: str) -> bool:
    dropout_p = b.static(arg(node, 4, "dropout_p", 0.0))
    if arg(node, 3, "attn_mask") is not None or not isinstance(dropout_p, (int, float)):
        return False
    if len(node.args) < 3:
        return False
    q, k, v = (tuple(m.shape) if m is not None else () for m in (b.meta(a) for a in node.args[:3]))
    if not sdpa_heads_fit(q, k, v, bool(b.static(node.kwargs.get("enable_gqa", False)))):
        return False
    ins = [_x(b, node, i) for i in range(3)]
    attrs = {"is_causal": bool(b.static(arg(node, 5, "is_causal", False))), "scale": b.static(node.kwargs.get("scale"))}
    if dropout_p:  # the kernel drops attention weights itself (sdpa_rule: each device its piece's mask)
        attrs["dropout_p"] = float(dropout_p)
    b.set(node, b.emit(node, kind, ins, attrs))
    return True


def _cross_entropy(b: FxBuilder, node: fx.Node, kind: str) -> bool:
    logits = b.meta(node.args[0])
    defaults = {"weight": None, "size_average": None, "reduce": None, "label_smoothing": 0.0}
    extra = {k for k, v in node.kwargs.items() if k not in ("reduction", "ignore_index", "target")
             and not (k in defaults and v == defaults[k])}
    if not (logits is not None and len(logits.shape) == 2 and not extra and len(node.args) <= 2
            and node.kwargs.get("reduction", "mean") in ("mean", "sum", "none")
            and node.kwargs.get("ignore_index", -100) == -100):
        return False
    ins = [_x(b, node, 0), b.tensor_of(arg(node, 1, "target"), node, 1)]
    b.set(node, b.emit(node, kind, ins, {"reduction": b.static(node.kwargs.get("reduction", "mean"))}))
    return True


def _dropout(b: FxBuilder, node: fx.Node, kind: str) -> bool:
    p = b.static(arg(node, 1, "p", 0.5))
    training = b.static(arg(node, 2, "training", True))
    b.set(node, b.emit(node, kind, [_x(b, node)], {"p": p, "training": bool(training and b.training)}))
    return True


def _tensor_list(b: FxBuilder, node: fx.Node) -> list[str]:
    xs = node.args[0]
    if not isinstance(xs, (list, tuple)):
        raise TypeError(f"{node.format_node()}: a list of tensors expected")
    return [b.tensor_of(a, node, i) for i, a in enumerate(xs)]


def _stack_or_cat(b: FxBuilder, node: fx.Node, kind: str) -> bool:
    b.set(node, b.emit(node, kind, _tensor_list(b, node), {"dim": b.static(arg(node, 1, "dim", 0))}))
    return True


def _reduce(b: FxBuilder, node: fx.Node, kind: str) -> bool:
    if node.kwargs.get("dtype"):
        return False
    dim = b.static(arg(node, 1, "dim"))
    keep = bool(b.static(arg(node, 2, "keepdim", False)))
    attrs = {"dim": tuple(dim) if isinstance(dim, list) else dim, "keepdim": keep}
    b.set(node, b.emit(node, kind, [_x(b, node)], attrs))
    return True


def _transpose(b: FxBuilder, node: fx.Node, kind: str) -> bool:
    b.set(node, b.emit(node, kind, [_x(b, node)],
                       {"dim0": b.static(node.args[1]), "dim1": b.static(node.args[2])}))
    return True


def _permute(b: FxBuilder, node: fx.Node, kind: str) -> bool:
    first = b.static(node.args[1])  # x.permute(0, 2, 1) or x.permute((0, 2, 1))
    dims = tuple(first) if isinstance(first, (tuple, list)) else tuple(b.static(d) for d in node.args[1:])
    b.set(node, b.emit(node, kind, [_x(b, node)], {"dims": dims}))
    return True


def _split(b: FxBuilder, node: fx.Node, kind: str) -> bool:
    """chunk/split: a tuple of pieces; each getitem of it becomes one "split" op (`piece`)."""
    b.static_values[node.name] = ("pieces", node)
    return True


def mse(b: FxBuilder, node: fx.Node) -> bool:
    """mse_loss(a, t) = mean((a - t)^2), lowered to ops with rules (sub, mul, mean or sum)."""
    if b.static(node.kwargs.get("reduction", "mean")) not in ("mean", "sum") or len(node.args) != 2:
        return False
    a, t = _x(b, node, 0), _x(b, node, 1)
    meta = b.meta(node.args[0])
    d = b.emit(node, "sub", [a, t], out=meta, name=f"{node.name}_diff")
    sq = b.emit(node, "mul", [d, d], out=meta, name=f"{node.name}_sq")
    red = "sum" if b.static(node.kwargs.get("reduction", "mean")) == "sum" else "mean"
    b.set(node, b.emit(node, red, [sq], {"dim": None, "keepdim": False}))
    return True


READERS: dict[str, Reader] = {
    "linear": _linear, "matmul": _two, "bmm": _two, "addmm": _addmm, "embedding": _embedding,
    "layer_norm": _layer_norm, "softmax": _softmax, "log_softmax": _softmax,
    **{k: _unary for k in ("gelu", "relu", "silu", "tanh", "exp", "neg", "rsqrt", "sqrt", "sigmoid", "sin", "cos")},
    **{k: _binary for k in ("add", "sub", "mul", "div")},
    "cast": _type_as, "dropout": _dropout, "sum": _reduce, "mean": _reduce,
    "view": _one, "reshape": _one, "flatten": _one, "expand": _one, "transpose": _transpose, "permute": _permute,
    "cat": _stack_or_cat, "stack": _stack_or_cat, "split": _split, "roll": _roll, "einsum": _einsum,
    "scaled_dot_product_attention": _sdpa, "cross_entropy": _cross_entropy,
}
COMPOSITE_READERS: dict[str, Callable[[FxBuilder, fx.Node], bool]] = {"torch.nn.functional.mse_loss": mse}


# ------------------------------------------------------------------------------ module calls
def _param(b: FxBuilder, node: fx.Node, mod: Any, name: str) -> str:
    return b.param(f"{node.target}.{name}", getattr(mod, name))


def _weights(b: FxBuilder, node: fx.Node, mod: Any) -> list[str]:
    """weight (and bias where the module has one)."""
    return [_param(b, node, mod, "weight")] + ([_param(b, node, mod, "bias")] if mod.bias is not None else [])


def _linear_module(b: FxBuilder, node: fx.Node, kind: str, mod: Any) -> bool:
    b.set(node, b.emit(node, kind, [_x(b, node)] + _weights(b, node, mod)))
    return True


def _embedding_module(b: FxBuilder, node: fx.Node, kind: str, mod: Any) -> bool:
    if mod.max_norm is not None or mod.scale_grad_by_freq or mod.sparse:
        return False
    attrs = {"padding_idx": mod.padding_idx} if mod.padding_idx is not None else None
    b.set(node, b.emit(node, kind, [_x(b, node), _param(b, node, mod, "weight")], attrs))
    return True


def _layer_norm_module(b: FxBuilder, node: fx.Node, kind: str, mod: Any) -> bool:
    if not mod.elementwise_affine:
        return False
    b.set(node, b.emit(node, kind, [_x(b, node)] + _weights(b, node, mod),
                       {"eps": mod.eps, "normalized_ndim": len(mod.normalized_shape)}))
    return True


def _rms_norm_module(b: FxBuilder, node: fx.Node, kind: str, mod: Any) -> bool:
    ins = [_x(b, node)] + ([_param(b, node, mod, "weight")] if mod.elementwise_affine else [])
    b.set(node, b.emit(node, kind, ins, {"eps": mod.eps, "normalized_ndim": len(mod.normalized_shape)}))
    return True


def _dropout_module(b: FxBuilder, node: fx.Node, kind: str, mod: Any) -> bool:
    b.set(node, b.emit(node, kind, [_x(b, node)], {"p": mod.p, "training": b.training and mod.training}))
    return True


def _unary_module(b: FxBuilder, node: fx.Node, kind: str, mod: Any) -> bool:
    attrs = {"approximate": mod.approximate} if type(mod) is nn.GELU and mod.approximate != "none" else {}
    b.set(node, b.emit(node, kind, [_x(b, node)], attrs))
    return True


def _conv2d_module(b: FxBuilder, node: fx.Node, kind: str, mod: Any) -> bool:
    if mod.padding_mode != "zeros" or not isinstance(mod.padding, tuple):
        return False
    b.set(node, b.emit(node, kind, [_x(b, node)] + _weights(b, node, mod),
                       {"stride": mod.stride, "padding": mod.padding, "dilation": mod.dilation, "groups": mod.groups}))
    return True


MODULE_READERS: dict[str, ModuleReader] = {
    "linear": _linear_module, "embedding": _embedding_module, "layer_norm": _layer_norm_module,
    "rms_norm": _rms_norm_module, "dropout": _dropout_module, "conv2d": _conv2d_module,
    **{k: _unary_module for k in ("gelu", "relu", "silu", "tanh", "sigmoid")},
}


# ------------------------------------------------------------------------------ getitem
def getitem(b: FxBuilder, node: fx.Node) -> None:
    """x[idx]: a piece of a chunk/split, an item of a static value, or tensor indexing (slices)."""
    src, idx = node_of(node.args[0], node), node.args[1]
    if src.name in b.static_values:
        v = b.static_values[src.name]
        if isinstance(v, tuple) and len(v) == 2 and v[0] == "pieces":
            piece(b, node, v[1], b.static(idx))
        else:
            b.static_values[node.name] = v[b.static(idx)] if not isinstance(v, tuple) or v[:1] != ("pieces",) else None
        return
    # tensor indexing: plain slices become "slice" ops; an integer index is the length-1 slice at it,
    # then the dims it drops go in a reshape (x[:, 0] of a pooler)
    x = b.env[src.name]
    index = b.static(idx)
    items: tuple[Any, ...] = index if isinstance(index, tuple) else (index,)
    shape = b.shape_of(x)
    if sum(s is Ellipsis for s in items) == 1:  # x[..., ::2]: the dims the ellipsis stands for, whole
        k = items.index(Ellipsis)
        items = items[:k] + (slice(None),) * (len(shape) - len(items) + 1) + items[k + 1:]
    ints = [isinstance(s, int) and not isinstance(s, bool) for s in items]
    if len(items) <= len(shape) and all(isinstance(s, slice) and (s.step or 1) > 0 or i for s, i in zip(items, ints)):
        b.set(node, _slices(b, node, x, tuple(slice(s % shape[d], s % shape[d] + 1) if ints[d] else s
                                             for d, s in enumerate(items)), any(ints)))
        return
    b.set(node, b.opaque(node))


def _slices(b: FxBuilder, node: fx.Node, x: str, items: tuple[slice, ...], drops: bool) -> str:
    """One "slice" op per dim cut (then a reshape dropping the dims an integer index took)."""
    cur = x
    shape = b.shape_of(x)
    for d, s in enumerate(items):
        if s == slice(None):
            continue
        start = s.start or 0
        end = shape[d] if s.stop is None else s.stop
        step = s.step or 1  # x[..., ::2]: every second element (GPT-J's rotary)
        out = torch.empty(shape[:d] + (len(range(*slice(start, end, step).indices(shape[d]))),) + shape[d + 1:],
                          device="meta", dtype=TORCH_DTYPE.get(b.values[x].dtype, torch.float32))
        last = all(t == slice(None) for t in items[d + 1:]) and not drops
        name = node.name if last else f"{node.name}_d{d}"
        attrs = {"dim": d, "start": start, "end": end, **({"step": step} if step != 1 else {})}
        cur = b.emit(node, "slice", [cur], attrs, out=out, name=name)
        shape = b.shape_of(cur)
    if drops:
        cur = b.emit(node, "reshape", [cur])
    return cur


def piece(b: FxBuilder, node: fx.Node, split: fx.Node, index: int) -> None:
    x = b.env[node_of(split.args[0], split).name]
    n = b.shape_of(x)
    if split.target in ("chunk", torch.chunk):
        chunks = b.static(arg(split, 1, "chunks"))
        dim = b.static(arg(split, 2, "dim", 0)) % len(n)
        size = -(-n[dim] // chunks)
    else:
        size = b.static(arg(split, 1, "split_size_or_sections" if split.op == "call_function" else "split_size"))
        dim = b.static(arg(split, 2, "dim", 0)) % len(n)
    b.set(node, b.emit(node, "split", [x], {"dim": dim, "split_size": tuple(size) if isinstance(size, list) else size,
                                            "index": index}))
