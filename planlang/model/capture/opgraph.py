"""The model as a graph of ops the cost model knows: fx nodes -> `OpSpec`s over named tensor values.

This is what the intra-op solver prices and what the runtime lowers. Each tensor in a forward (plus
loss) step is a `Value`: a model input, a parameter (by its FQN), a constant (buffers, scalars, tensors
made in forward such as `arange` positions), or the output of an `OpNode`. An OpNode's `op` follows
the input conventions of planlang.cost.ops.rules; ops without a rule get kind "opaque" (the solver
gives them one replicated strategy and the runtime runs the original call on gathered inputs).

Everything not a tensor (sizes, devices, dtypes, tuples from `chunk`) is evaluated statically from the
global shapes at trace time: shapes are fixed by the plan's `input` declarations, and under sharding a
local tensor's `size()` would be wrong anyway. `chunk`/`split` followed by `getitem` becomes one
"split" op per piece used.
"""
from __future__ import annotations

import operator
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.shape_prop import ShapeProp

from planlang.cost.ops.rules import sdpa_heads_fit
from planlang.cost.ops.tensor_ops import einsum_fits
from planlang.model.capture.export_graph import export_op_graph
from planlang.model.capture.graph_values import (  # noqa: F401 - the graph's value types are part of this module's API
    DTYPES, OpaqueCall, OpGraph, OpNode, TensorArg, UnsupportedGraph, Value, dtype_name, keyword_inputs, loss_step,
    op_spec, rename_inputs, step_input_names,
)

# ------------------------------------------------------------------------------ tracing
def trace(model: nn.Module, loss_fn: Callable | None = None, inputs: int | list[str] = 1) -> fx.GraphModule:
    """symbolic_trace the model (with its loss when given). Raises UnsupportedGraph with the reason.
    `inputs`: how many, or the names the model takes them by (graph_values.keyword_inputs)."""
    root = loss_step(model, loss_fn, inputs) if loss_fn is not None or isinstance(inputs, list) else model
    try:
        return fx.symbolic_trace(root)
    except Exception as e:  # noqa: BLE001 - report any tracing failure as one located error
        raise UnsupportedGraph(f"torch.fx.symbolic_trace failed on {type(model).__name__}: {e}") from e


def _module_of(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack")
    if node.op == "call_module":
        return str(node.target)
    if not stack:
        return ""
    return str(list(stack.values())[-1][0])


def _strip(path: str, prefix: str) -> str:
    if prefix and (path == prefix or path.startswith(prefix + ".")):
        return path[len(prefix) + 1:]
    return path


# ------------------------------------------------------------------------------ building the graph
class _Builder:
    def __init__(self, gm: fx.GraphModule, prefix: str, training: bool) -> None:
        self.gm = gm
        self.prefix = prefix  # "model" when the graph wraps the model with its loss
        self.training = training
        self.values: dict[str, Value] = {}
        self.nodes: list[OpNode] = []
        self.consts: dict[str, torch.Tensor] = {}
        self.static: dict[str, Any] = {}  # fx node name -> python value (sizes, tuples of Values ...)
        self.env: dict[str, str] = {}  # fx node name -> Value name (aliases for identity ops)
        # a tied parameter is named by its first alias, as named_parameters() (and so the model layer's
        # canonical names, apply's gradient sums and the optimizer) name it
        self.param_names: dict[int, str] = {}
        for n, p in gm.named_parameters(remove_duplicate=False):
            self.param_names.setdefault(id(p), _strip(n, prefix))
        self._param_value: dict[str, str] = {}  # canonical FQN -> Value name (shared params: one value)

    # -- values
    def add_value(self, name, t: torch.Tensor, kind, module="", ref="") -> str:
        self.values[name] = Value(name, tuple(int(s) for s in t.shape), dtype_name(t.dtype), kind,
                                  _strip(module, self.prefix), ref)
        return name

    def param(self, fqn: str, t: torch.Tensor) -> str:
        canonical = self.param_names.get(id(t), _strip(fqn, self.prefix))
        if canonical not in self._param_value:
            vname = canonical.replace(".", "_")
            self._param_value[canonical] = self.add_value(vname, t, "param", ref=canonical)
        return self._param_value[canonical]

    def const(self, hint: str, t: torch.Tensor, module: str = "") -> str:
        name = f"const_{hint}"
        i = 0
        while name in self.values:
            i += 1
            name = f"const_{hint}_{i}"
        self.consts[name] = t
        return self.add_value(name, t, "const", module, hint)

    def tensor_of(self, a, node: fx.Node, pos: int) -> str:
        """The Value name for an fx argument that must be a tensor (python scalars become 0-d consts)."""
        if isinstance(a, fx.Node):
            if a.name in self.env:
                return self.env[a.name]
            raise UnsupportedGraph(f"{node.format_node()}: argument {a.name} is not a tensor")
        if isinstance(a, (int, float, bool)):
            return self.const(f"{node.name}_{pos}", torch.tensor(a, dtype=torch.float32))
        raise UnsupportedGraph(f"{node.format_node()}: unsupported argument {a!r}")

    def meta(self, n: fx.Node):
        return n.meta.get("tensor_meta") or n.meta.get("val")

    def shape_of(self, vname: str) -> tuple[int, ...]:
        return self.values[vname].shape

    # -- ops
    def emit(self, node: fx.Node, kind: str, inputs: list[str], attrs: dict | None = None,
             call: OpaqueCall | None = None, out: torch.Tensor | None = None, name: str | None = None) -> str:
        op = op_spec(kind, [self.values[v] for v in inputs], out if out is not None else self.meta(node), attrs)
        name = name or node.name
        module = _strip(_module_of(node), self.prefix)
        self.values[name] = Value(name, op.output, op.dtype, "op", module)
        self.nodes.append(OpNode(name, module, op, tuple(inputs), call))
        return name

    def call_args(self, node: fx.Node) -> tuple[list[str], tuple, dict]:
        """The node's arguments with tensors replaced by `TensorArg(i)` (i-th of the returned Values)
        and static values by their python value."""
        inputs: list[str] = []

        def sub(a):
            if isinstance(a, fx.Node):
                if a.name in self.env:
                    inputs.append(self.env[a.name])
                    return TensorArg(len(inputs) - 1)
                return self.static[a.name]
            return a

        return inputs, fx.node.map_aggregate(node.args, sub), fx.node.map_aggregate(node.kwargs, sub)

    def opaque(self, node: fx.Node) -> str:
        """Run the original call on replicated inputs (no rule for it)."""
        inputs, args, kwargs = self.call_args(node)
        target = node.target
        op = node.op
        if op == "call_module":
            target = _strip(str(target), self.prefix)
        call = OpaqueCall(op, target, tuple(args), tuple(sorted(kwargs.items())))
        return self.emit(node, "opaque", inputs, {"target": _target_name(node)}, call)


def _target_name(node: fx.Node) -> str:
    t = node.target
    if isinstance(t, str):
        return t
    return getattr(t, "__name__", str(t))


def _arg(node: fx.Node, i: int, name: str, default=None):
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


UNARY_FN = {F.gelu: "gelu", torch.relu: "relu", F.relu: "relu", F.silu: "silu", torch.tanh: "tanh",
            torch.exp: "exp", torch.neg: "neg", operator.neg: "neg", torch.rsqrt: "rsqrt", torch.sqrt: "sqrt",
            torch.sigmoid: "sigmoid", F.sigmoid: "sigmoid", torch.sin: "sin", torch.cos: "cos"}
UNARY_METHOD = {"relu": "relu", "tanh": "tanh", "exp": "exp", "neg": "neg", "rsqrt": "rsqrt", "sqrt": "sqrt",
                "sigmoid": "sigmoid", "sin": "sin", "cos": "cos"}
UNARY_MODULE = {nn.GELU: "gelu", nn.ReLU: "relu", nn.SiLU: "silu", nn.Tanh: "tanh", nn.Sigmoid: "sigmoid"}
BINARY_FN = {operator.add: "add", torch.add: "add", operator.sub: "sub", torch.sub: "sub",
             operator.mul: "mul", torch.mul: "mul", operator.truediv: "div", torch.div: "div"}
BINARY_METHOD = {"add": "add", "sub": "sub", "mul": "mul", "div": "div"}
IDENTITY_METHOD = {"contiguous"}
RESHAPE_METHOD = {"view": "view", "reshape": "reshape", "flatten": "flatten"}


def _lower_node(b: _Builder, node: fx.Node) -> None:  # noqa: C901 - one dispatch table
    op, target = node.op, node.target
    tm = b.meta(node)
    is_tensor = isinstance(tm, torch.Tensor) or hasattr(tm, "shape") and hasattr(tm, "dtype")
    if op == "placeholder":
        if not is_tensor:
            raise UnsupportedGraph(f"input {node.name} has no tensor shape (give it in the plan's `input`)")
        b.env[node.name] = b.add_value(node.name, tm, "input", ref=node.name)
        return
    if op == "output":
        return
    if op == "get_attr":
        t = _fetch_attr(b.gm, str(target))
        if isinstance(t, nn.Parameter):
            b.env[node.name] = b.param(str(target), t)
        elif isinstance(t, torch.Tensor):
            b.env[node.name] = b.const(_strip(str(target), b.prefix).replace(".", "_"), t)
        else:
            b.static[node.name] = t
        return

    # -- static (non-tensor) values
    if not is_tensor and not (op == "call_method" and target == "chunk") and not _is_split(node):
        b.static[node.name] = _static_value(b, node)
        return

    if op == "call_module":
        mod = b.gm.get_submodule(str(target))
        x = lambda i: b.tensor_of(node.args[i], node, i)  # noqa: E731
        path = str(target)

        def p(name):
            t = getattr(mod, name)
            return b.param(f"{path}.{name}", t)

        if type(mod) is nn.Linear:
            ins = [x(0), p("weight")] + ([p("bias")] if mod.bias is not None else [])
            b.env[node.name] = b.emit(node, "linear", ins)
        elif type(mod) is nn.Embedding and mod.max_norm is None and not mod.scale_grad_by_freq and not mod.sparse:
            attrs = {"padding_idx": mod.padding_idx} if mod.padding_idx is not None else None
            b.env[node.name] = b.emit(node, "embedding", [x(0), p("weight")], attrs)
        elif type(mod) is nn.LayerNorm and mod.elementwise_affine:
            ins = [x(0), p("weight")] + ([p("bias")] if mod.bias is not None else [])
            b.env[node.name] = b.emit(node, "layer_norm", ins,
                                      {"eps": mod.eps, "normalized_ndim": len(mod.normalized_shape)})
        elif type(mod) is nn.RMSNorm:
            ins = [x(0)] + ([p("weight")] if mod.elementwise_affine else [])
            b.env[node.name] = b.emit(node, "rms_norm", ins,
                                      {"eps": mod.eps, "normalized_ndim": len(mod.normalized_shape)})
        elif type(mod) is nn.Dropout:
            b.env[node.name] = b.emit(node, "dropout", [x(0)], {"p": mod.p, "training": b.training and mod.training})
        elif type(mod) in UNARY_MODULE:
            attrs = {"approximate": mod.approximate} if type(mod) is nn.GELU and mod.approximate != "none" else {}
            b.env[node.name] = b.emit(node, UNARY_MODULE[type(mod)], [x(0)], attrs)
        elif type(mod) is nn.Identity:
            b.env[node.name] = b.env[node.args[0].name]
        elif type(mod) is nn.Conv2d and mod.padding_mode == "zeros" and isinstance(mod.padding, tuple):
            ins = [x(0), p("weight")] + ([p("bias")] if mod.bias is not None else [])
            b.env[node.name] = b.emit(node, "conv2d", ins, {"stride": mod.stride, "padding": mod.padding,
                                                            "dilation": mod.dilation, "groups": mod.groups})
        else:
            _opaque_module(b, node, mod)
        return

    if op == "call_method":
        name = str(target)
        x0 = node.args[0]
        if name in IDENTITY_METHOD:
            b.env[node.name] = b.env[x0.name]
        elif name in RESHAPE_METHOD:
            b.env[node.name] = b.emit(node, RESHAPE_METHOD[name], [b.tensor_of(x0, node, 0)])
        elif name == "transpose":
            b.env[node.name] = b.emit(node, "transpose", [b.tensor_of(x0, node, 0)],
                                      {"dim0": _static(b, node.args[1]), "dim1": _static(b, node.args[2])})
        elif name == "permute":
            dims = node.args[1:] if not isinstance(_static(b, node.args[1]), (tuple, list)) else node.args[1]
            b.env[node.name] = b.emit(node, "permute", [b.tensor_of(x0, node, 0)],
                                      {"dims": tuple(_static(b, d) for d in dims)})
        elif name in ("chunk", "split"):
            b.static[node.name] = ("pieces", node)
        elif name in ("expand", "expand_as"):
            b.env[node.name] = b.emit(node, "expand", [b.tensor_of(x0, node, 0)])
        elif name in UNARY_METHOD:
            b.env[node.name] = b.emit(node, UNARY_METHOD[name], [b.tensor_of(x0, node, 0)])
        elif name in BINARY_METHOD and len(node.args) == 2 and not node.kwargs:
            _binary(b, node, BINARY_METHOD[name])
        elif name in ("softmax", "log_softmax"):
            _softmax(b, node, name)
        elif name == "type_as" and isinstance(x0, fx.Node) and x0.name in b.env:
            _type_as(b, node)
        elif name == "roll":
            _roll(b, node)
        elif name in ("sum", "mean") and not node.kwargs.get("dtype"):
            _reduce(b, node, name)
        else:
            b.env[node.name] = b.opaque(node)
        return

    # call_function
    if target is operator.getitem:
        _getitem(b, node)
    elif target in BINARY_FN and not node.kwargs:
        _binary(b, node, BINARY_FN[target])
    elif target in UNARY_FN and (target is not F.gelu or set(node.kwargs) <= {"approximate"}):
        attrs = {}
        if target is F.gelu and node.kwargs.get("approximate", "none") != "none":
            attrs["approximate"] = node.kwargs["approximate"]
        b.env[node.name] = b.emit(node, UNARY_FN[target], [b.tensor_of(node.args[0], node, 0)], attrs)
    elif target in (torch.matmul, operator.matmul):
        b.env[node.name] = b.emit(node, "matmul", [b.tensor_of(node.args[0], node, 0), b.tensor_of(node.args[1], node, 1)])
    elif target is torch.bmm:
        b.env[node.name] = b.emit(node, "bmm", [b.tensor_of(node.args[0], node, 0), b.tensor_of(node.args[1], node, 1)])
    elif target is F.linear:
        ins = [b.tensor_of(a, node, i) for i, a in enumerate(node.args[:3]) if a is not None]
        if node.kwargs.get("bias") is not None:
            ins.append(b.tensor_of(node.kwargs["bias"], node, 2))
        b.env[node.name] = b.emit(node, "linear", ins)
    elif target is F.scaled_dot_product_attention and _arg(node, 3, "attn_mask") is None \
            and not _static(b, _arg(node, 4, "dropout_p", 0.0)) and _sdpa_heads_fit(b, node):
        ins = [b.tensor_of(node.args[i], node, i) for i in range(3)]
        b.env[node.name] = b.emit(node, "scaled_dot_product_attention", ins,
                                  {"is_causal": bool(_static(b, _arg(node, 5, "is_causal", False))),
                                   "scale": _static(b, node.kwargs.get("scale"))})
    elif target in (F.softmax, torch.softmax, F.log_softmax, torch.log_softmax) \
            and set(node.kwargs) <= {"dim", "dtype", "_stacklevel"} and len(node.args) <= 2:
        _softmax(b, node, "log_softmax" if target in (F.log_softmax, torch.log_softmax) else "softmax")
    elif target is torch.stack:
        xs = [b.tensor_of(a, node, i) for i, a in enumerate(node.args[0])]
        b.env[node.name] = b.emit(node, "stack", xs, {"dim": _static(b, _arg(node, 1, "dim", 0))})
    elif target is torch.roll:
        _roll(b, node)
    elif target is torch.einsum and _einsum(b, node):
        pass
    elif target is F.cross_entropy and _plain_cross_entropy(b, node):
        ins = [b.tensor_of(node.args[0], node, 0), b.tensor_of(_arg(node, 1, "target"), node, 1)]
        b.env[node.name] = b.emit(node, "cross_entropy", ins,
                                  {"reduction": _static(b, node.kwargs.get("reduction", "mean"))})
    elif target is F.mse_loss and _static(b, node.kwargs.get("reduction", "mean")) in ("mean", "sum") \
            and len(node.args) == 2:
        _mse(b, node)
    elif target is F.dropout:
        p = _static(b, _arg(node, 1, "p", 0.5))
        training = _static(b, _arg(node, 2, "training", True))
        b.env[node.name] = b.emit(node, "dropout", [b.tensor_of(node.args[0], node, 0)],
                                  {"p": p, "training": bool(training and b.training)})
    elif target is torch.cat:
        xs = [b.tensor_of(a, node, i) for i, a in enumerate(node.args[0])]
        b.env[node.name] = b.emit(node, "cat", xs, {"dim": _static(b, _arg(node, 1, "dim", 0))})
    elif target in (torch.sum, torch.mean) and not node.kwargs.get("dtype"):
        _reduce(b, node, "sum" if target is torch.sum else "mean")
    elif target in (torch.flatten, torch.reshape):
        b.env[node.name] = b.emit(node, "flatten" if target is torch.flatten else "reshape",
                                  [b.tensor_of(node.args[0], node, 0)])
    elif target is torch.transpose:
        b.env[node.name] = b.emit(node, "transpose", [b.tensor_of(node.args[0], node, 0)],
                                  {"dim0": _static(b, node.args[1]), "dim1": _static(b, node.args[2])})
    elif target is torch.addmm and not node.kwargs:
        ins = [b.tensor_of(node.args[i], node, i) for i in range(3)]
        b.env[node.name] = b.emit(node, "addmm", ins)
    elif target in (torch.chunk, torch.split):
        b.static[node.name] = ("pieces", node)
    elif target is F.layer_norm and all(a is not None for a in node.args[2:4]):
        ins = [b.tensor_of(node.args[i], node, i) for i in (0, 2, 3)]
        b.env[node.name] = b.emit(node, "layer_norm", ins, {"eps": _static(b, _arg(node, 4, "eps", 1e-5)),
                                                            "normalized_ndim": len(_static(b, node.args[1]))})
    elif target is F.embedding and len(node.args) == 2 and not node.kwargs:
        b.env[node.name] = b.emit(node, "embedding", [b.tensor_of(node.args[0], node, 0), b.tensor_of(node.args[1], node, 1)])
    else:
        b.env[node.name] = b.opaque(node)


def _softmax(b: _Builder, node: fx.Node, kind: str) -> None:
    """softmax/log_softmax over `dim`; with `dtype` (softmax(x, -1, dtype=torch.float32)) computed in it."""
    x = b.tensor_of(node.args[0], node, 0)
    attrs = {"dim": _static(b, _arg(node, 1, "dim"))}
    out = dtype_name(b.meta(node).dtype)
    # an explicit dtype is kept where the f32 trace made it the identity (export_graph's `_softmax`): at
    # run time under bf16 it is the upcast
    if out != b.values[x].dtype or node.kwargs.get("dtype") is not None:
        attrs["dtype"] = out
    b.env[node.name] = b.emit(node, kind, [x], attrs)


def _type_as(b: _Builder, node: fx.Node) -> None:
    """x.type_as(other): x itself where the dtypes agree at trace time (other's follows the plan's at
    run time, as x's does), a `cast` to other's dtype where they differ."""
    x = b.env[node.args[0].name]
    out = dtype_name(b.meta(node).dtype)
    b.env[node.name] = x if out == b.values[x].dtype else b.emit(node, "cast", [x], {"dtype": out})


def _roll(b: _Builder, node: fx.Node) -> None:
    """torch.roll along given dims other than dim 0 (the batch: not per sample); anything else opaque."""
    x = b.tensor_of(node.args[0], node, 0)
    rank = len(b.shape_of(x))
    shifts, dims = _static(b, _arg(node, 1, "shifts")), _static(b, _arg(node, 2, "dims", ()))
    shifts = (shifts,) if isinstance(shifts, int) else tuple(shifts)
    dims = (dims,) if isinstance(dims, int) else tuple(dims or ())
    if not dims or len(dims) != len(shifts) or any(d % rank == 0 for d in dims):
        b.env[node.name] = b.opaque(node)
        return
    b.env[node.name] = b.emit(node, "roll", [x], {"shifts": shifts, "dims": tuple(d % rank for d in dims)})


def _einsum(b: _Builder, node: fx.Node) -> bool:
    """torch.einsum(eq, *operands) or (eq, [operands]) as the einsum op where its rule fits."""
    eq = _static(b, node.args[0])
    args = node.args[1] if len(node.args) == 2 and isinstance(node.args[1], (list, tuple)) else node.args[1:]
    if node.kwargs or not isinstance(eq, str) or not all(isinstance(a, fx.Node) and a.name in b.env for a in args):
        return False
    xs = [b.env[a.name] for a in args]
    if not einsum_fits(eq, tuple(b.shape_of(v) for v in xs), tuple(b.meta(node).shape)):
        return False
    b.env[node.name] = b.emit(node, "einsum", xs, {"equation": eq})
    return True


def _sdpa_heads_fit(b: _Builder, node: fx.Node) -> bool:
    shapes = [tuple(b.meta(a).shape) if isinstance(a, fx.Node) and b.meta(a) is not None else ()
              for a in node.args[:3]]
    return len(node.args) >= 3 and sdpa_heads_fit(*shapes, bool(_static(b, node.kwargs.get("enable_gqa", False))))


def _plain_cross_entropy(b: _Builder, node: fx.Node) -> bool:
    logits = b.meta(node.args[0]) if isinstance(node.args[0], fx.Node) else None
    defaults = {"weight": None, "size_average": None, "reduce": None, "label_smoothing": 0.0}
    extra = {k for k, v in node.kwargs.items() if k not in ("reduction", "ignore_index", "target")
             and not (k in defaults and v == defaults[k])}
    return logits is not None and len(logits.shape) == 2 and not extra and len(node.args) <= 2 \
        and node.kwargs.get("reduction", "mean") in ("mean", "sum", "none") \
        and node.kwargs.get("ignore_index", -100) == -100


def _is_split(node: fx.Node) -> bool:
    return node.op in ("call_method", "call_function") and (
        node.target in ("chunk", "split") or node.target in (torch.chunk, torch.split))


def _fetch_attr(gm: nn.Module, target: str):
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _static(b: _Builder, a):
    """The python value of an argument (fx nodes of static values are looked up)."""
    if isinstance(a, fx.Node):
        if a.name in b.static:
            return b.static[a.name]
        raise UnsupportedGraph(f"{a.format_node()}: a tensor where a static value was expected")
    if isinstance(a, (list, tuple)):
        return type(a)(_static(b, x) for x in a)
    return a


def _static_value(b: _Builder, node: fx.Node):
    """Evaluate a non-tensor node from global shapes: x.size(), x.shape, x.device, len(), arithmetic."""
    def val(a):
        if isinstance(a, fx.Node):
            if a.name in b.static:
                return b.static[a.name]
            if a.name in b.env:
                v = b.values[b.env[a.name]]
                return torch.empty(v.shape, dtype=_TORCH_DTYPE.get(v.dtype, torch.float32), device="meta")
            raise UnsupportedGraph(f"{a.format_node()} has no value")
        return a

    args = fx.node.map_aggregate(node.args, val)
    kwargs = fx.node.map_aggregate(node.kwargs, val)
    if node.op == "call_method":
        obj = args[0]
        out = getattr(obj, str(node.target))(*args[1:], **kwargs)
    elif node.op == "call_function":
        out = node.target(*args, **kwargs)
    else:
        raise UnsupportedGraph(f"{node.format_node()}: a module call without a tensor result")
    if isinstance(out, torch.device) and out.type == "meta":
        return None  # the device of a tensor: the runtime uses the tensors' own device
    if isinstance(out, torch.Size):
        return tuple(int(s) for s in out)
    return out


_TORCH_DTYPE = {v: k for k, v in DTYPES.items()}


def _binary(b: _Builder, node: fx.Node, kind: str) -> None:
    a0, a1 = node.args[0], node.args[1]
    ins = []
    for i, a in enumerate((a0, a1)):
        if isinstance(a, fx.Node) and a.name in b.static:
            a = b.static[a.name]
        ins.append(b.tensor_of(a, node, i))
    b.env[node.name] = b.emit(node, kind, ins)


def _mse(b: _Builder, node: fx.Node) -> None:
    """mse_loss(a, t) = mean((a - t)^2), lowered to ops with rules (sub, mul, mean or sum)."""
    a, t = b.tensor_of(node.args[0], node, 0), b.tensor_of(node.args[1], node, 1)
    meta = b.meta(node.args[0])
    d = b.emit(node, "sub", [a, t], out=meta, name=f"{node.name}_diff")
    sq = b.emit(node, "mul", [d, d], out=meta, name=f"{node.name}_sq")
    red = "sum" if _static(b, node.kwargs.get("reduction", "mean")) == "sum" else "mean"
    b.env[node.name] = b.emit(node, red, [sq], {"dim": None, "keepdim": False})


def _reduce(b: _Builder, node: fx.Node, kind: str) -> None:
    dim = _static(b, _arg(node, 1, "dim"))
    keep = bool(_static(b, _arg(node, 2, "keepdim", False)))
    attrs = {"dim": tuple(dim) if isinstance(dim, list) else dim, "keepdim": keep}
    b.env[node.name] = b.emit(node, kind, [b.tensor_of(node.args[0], node, 0)], attrs)


def _getitem(b: _Builder, node: fx.Node) -> None:
    src, idx = node.args[0], node.args[1]
    if src.name in b.static:
        v = b.static[src.name]
        if isinstance(v, tuple) and len(v) == 2 and v[0] == "pieces":
            _piece(b, node, v[1], _static(b, idx))
        else:
            b.static[node.name] = v[_static(b, idx)] if not isinstance(v, tuple) or v[:1] != ("pieces",) else None
        return
    # tensor indexing: plain slices become "slice" ops; an integer index is the length-1 slice at it,
    # then the dims it drops go in a reshape (x[:, 0] of a pooler)
    x = b.env[src.name]
    idx = _static(b, idx)
    items = idx if isinstance(idx, tuple) else (idx,)
    shape = b.shape_of(x)
    if sum(s is Ellipsis for s in items) == 1:  # x[..., ::2]: the dims the ellipsis stands for, whole
        k = items.index(Ellipsis)
        items = items[:k] + (slice(None),) * (len(shape) - len(items) + 1) + items[k + 1:]
    ints = [isinstance(s, int) and not isinstance(s, bool) for s in items]
    if len(items) <= len(shape) and all(isinstance(s, slice) and (s.step or 1) > 0 or i for s, i in zip(items, ints)):
        items = tuple(slice(s % shape[d], s % shape[d] + 1) if ints[d] else s for d, s in enumerate(items))
        cur = x
        for d, s in enumerate(items):
            if s == slice(None):
                continue
            start = s.start or 0
            end = shape[d] if s.stop is None else s.stop
            step = s.step or 1  # x[..., ::2]: every second element (GPT-J's rotary)
            out = torch.empty(shape[:d] + (len(range(*slice(start, end, step).indices(shape[d]))),) + shape[d + 1:],
                              device="meta", dtype=_TORCH_DTYPE.get(b.values[x].dtype, torch.float32))
            last = all(t == slice(None) for t in items[d + 1:]) and not any(ints)
            name = node.name if last else f"{node.name}_d{d}"
            attrs = {"dim": d, "start": start, "end": end, **({"step": step} if step != 1 else {})}
            cur = b.emit(node, "slice", [cur], attrs, out=out, name=name)
            shape = b.shape_of(cur)
        if any(ints):
            cur = b.emit(node, "reshape", [cur])
        b.env[node.name] = cur
        return
    b.env[node.name] = b.opaque(node)


def _piece(b: _Builder, node: fx.Node, split: fx.Node, index: int) -> None:
    x = b.env[split.args[0].name]
    n = b.shape_of(x)
    if split.target in ("chunk", torch.chunk):
        chunks = _static(b, _arg(split, 1, "chunks"))
        dim = _static(b, _arg(split, 2, "dim", 0)) % len(n)
        size = -(-n[dim] // chunks)
    else:
        size = _static(b, _arg(split, 1, "split_size_or_sections" if split.op == "call_function" else "split_size"))
        dim = _static(b, _arg(split, 2, "dim", 0)) % len(n)
    b.env[node.name] = b.emit(node, "split", [x], {"dim": dim, "split_size": tuple(size) if isinstance(size, list) else size,
                                                   "index": index})


def _opaque_module(b: _Builder, node: fx.Node, mod: nn.Module) -> None:
    """A module without a rule: its parameters become inputs of an opaque op run with torch.func."""
    inputs, args, kwargs = b.call_args(node)
    path = str(node.target)
    pnames = []
    for pname, t in mod.named_parameters():
        inputs.append(b.param(f"{path}.{pname}", t))
        pnames.append(pname)
    call = OpaqueCall("call_module", _strip(path, b.prefix), tuple(args),
                      tuple(sorted(kwargs.items())) + (("__params__", tuple(pnames)),))
    b.env[node.name] = b.emit(node, "opaque", inputs, {"target": type(mod).__name__}, call)


def build_op_graph(gm: fx.GraphModule, example_inputs: list[torch.Tensor], prefix: str = "",
                   training: bool = True) -> OpGraph:
    """Shape-propagate `gm` on `example_inputs` (meta tensors are fine) and lower every node."""

    devices = {t.device.type for t in gm.parameters()} | {t.device.type for t in gm.buffers()}
    try:
        if devices - {"meta"}:  # a real model: propagate fake tensors, allocating nothing

            mode = FakeTensorMode(allow_non_fake_inputs=True)
            dev = next(iter(devices - {"meta"}))
            with mode:
                fakes = [torch.empty(t.shape, dtype=t.dtype, device=dev) for t in example_inputs]
            ShapeProp(gm, fake_mode=mode).propagate(*fakes)
        else:
            ShapeProp(gm).propagate(*example_inputs)
    except Exception as e:  # noqa: BLE001
        raise UnsupportedGraph(f"shape propagation failed: {e}") from e
    b = _Builder(gm, prefix, training)
    for node in gm.graph.nodes:
        try:
            _lower_node(b, node)
        except UnsupportedGraph:
            raise
        except Exception as e:  # noqa: BLE001 - name the node that could not be lowered
            raise UnsupportedGraph(f"cannot lower `{node.format_node()}`: {e}") from e
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    outs = []
    for a in fx.node.map_aggregate(out_node.args[0], lambda x: x) if isinstance(out_node.args[0], (tuple, list)) \
            else [out_node.args[0]]:
        if isinstance(a, fx.Node) and a.name in b.env:
            outs.append(b.env[a.name])
    return OpGraph(b.values, b.nodes, tuple(outs), b.consts)


def op_graph(model: nn.Module, inputs: dict[str, torch.Tensor], loss_fn: Callable | None = None,
             targets: tuple[torch.Tensor, ...] = ()) -> OpGraph:
    """The op graph of `model` (and `loss_fn(output, *targets)` when given) for `inputs` (meta ok).
    Models symbolic tracing refuses (Hugging Face transformers) are captured with torch.export instead
    (planlang.model.capture.export_graph)."""
    try:
        gm = trace(model, loss_fn, keyword_inputs(model, list(inputs)) or len(inputs))
    except UnsupportedGraph as traced:
        try:
            return export_op_graph(model, inputs, loss_fn, targets)
        except UnsupportedGraph as exported:
            raise UnsupportedGraph(f"{traced}; {exported}") from exported
    prefix = "model" if loss_fn is not None or keyword_inputs(model, list(inputs)) else ""
    g = build_op_graph(gm, list(inputs.values()) + list(targets), prefix, training=model.training)
    # name the input Values after the plan's inputs and the targets
    renames = {}
    ph = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    for fx_name, plan_name in zip(ph, step_input_names(list(inputs), len(targets))):
        renames[fx_name] = plan_name
    return rename_inputs(g, renames)
