"""The op graph of a model `torch.fx.symbolic_trace` cannot handle, captured with `torch.export`.

Hugging Face transformers models branch on tensors and build attention masks with python control
flow, which symbolic tracing refuses. `torch.export.export(..., strict=False)` runs the forward once
under fake tensors and records the ATen ops it dispatched (the training IR: `aten.linear`,
`aten.addmm`, `aten.layer_norm`, `aten.dropout`, `aten.scaled_dot_product_attention` ... are kept
whole, not decomposed). Parameters are lifted to graph inputs; the graph signature maps each back to
its FQN, and a tied parameter (HF's `lm_head.weight` = `transformer.wte.weight`) becomes one Value
under the name `named_parameters()` gives it first (the name `apply` shards and reduces it by).

The nodes become the same `OpSpec`s planlang.model.capture.opgraph makes from fx nodes:

* ops with a cost rule: linear, addmm, matmul/mm, bmm, embedding, layer_norm, dropout, softmax,
  log_softmax, gelu/relu/silu/tanh/exp/neg, add/sub/mul/div (python scalars become 0-d consts),
  sum/mean/amax, view/reshape/flatten (unsqueeze/squeeze are reshapes), transpose/t/permute, cat,
  slice, split/chunk + getitem ("split" per piece), scaled_dot_product_attention, cross_entropy,
  mse_loss (as sub, mul, mean);
* `pow(x, 2 | 3)` as a chain of muls (ATen computes those exponents as products too), so an
  elementwise activation built from it (HF's tanh GELU) keeps its sharding;
* aliases, clones and same-dtype `to` are the value itself; shape asserts vanish;
* everything computed from constants alone (position ids, the attention mask: `arange`, `cumsum`,
  `index`, comparisons ...; buffers, read when the graph is built) is evaluated here, once, on the
  CPU and becomes one `const` Value where an op uses it, as the fx path's tensors made in forward
  are. `torch.no_grad()` blocks (higher-order ops in the export) are inlined first, their outputs
  detached (`inline_wrappers`). An SDPA mask that equals torch's causal mask becomes
  `is_causal=True`, so attention keeps its batch/head-split strategies; any other mask stays a const
  input of an opaque attention;
* anything else is an opaque call, exactly as in the fx path: the runtime runs the ATen op on
  gathered inputs (`AtenCall` names it, since ATen op objects do not pickle and the program is
  broadcast to every rank).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import fx, nn

from planlang.cost.ops.rules import sdpa_heads_fit
from planlang.cost.ops.tensor_ops import einsum_fits
from planlang.model.capture.graph_values import (DTYPES, OpaqueCall, OpGraph, OpNode, TensorArg, UnsupportedGraph, Value,
                                         dtype_name, keyword_inputs, loss_step, op_spec, rename_inputs,
                                         step_input_names)

aten = torch.ops.aten


@dataclass(frozen=True)
class AtenCall:
    """A picklable stand-in for an ATen op overload (`aten::diff.default`), optionally taking item
    `index` of a tuple result."""

    op: str  # "namespace::name.overload"
    index: int | None = None

    def resolve(self):
        ns, rest = self.op.split("::")
        name, _, overload = rest.partition(".")
        return getattr(getattr(getattr(torch.ops, ns), name), overload or "default")

    def __call__(self, *args, **kwargs):
        out = self.resolve()(*args, **kwargs)
        return out if self.index is None else out[self.index]

    @property
    def __name__(self) -> str:  # what the generated code's comments show
        return self.op.split("::")[-1].split(".")[0] + ("" if self.index is None else f"[{self.index}]")

    def __str__(self) -> str:
        return self.__name__


def aten_name(target) -> str:
    # name() is "aten::add_.Tensor" for an overload other than the default one, "aten::diff" for it
    return f"{target._schema.name}.{target._overloadname}" if "::" in target.name() else target.name()


# ------------------------------------------------------------------------------ capture
def export_step(model: nn.Module, inputs: dict[str, torch.Tensor], loss_fn: Callable | None,
                targets: tuple[torch.Tensor, ...]) -> tuple[torch.export.ExportedProgram, nn.Module]:
    """torch.export of the model (with its loss when given) and the module exported."""
    names = keyword_inputs(model, list(inputs))
    root = loss_step(model, loss_fn, names or len(inputs)) if loss_fn is not None or names else model
    dev = next((p.device for p in model.parameters()), torch.device("cpu"))
    # fresh tensors on the model's device: export works on fakes of them (nothing is read), and two
    # arguments that are one tensor (an LM's input and its target) would be traced as one input
    args = tuple(torch.zeros(t.shape, dtype=t.dtype, device=dev) for t in [*inputs.values(), *targets])
    try:
        return torch.export.export(root, args, strict=False), root
    except Exception as e:  # noqa: BLE001 - report the export failure as one located error
        raise UnsupportedGraph(f"torch.export failed on {type(model).__name__}: {type(e).__name__}: "
                               f"{str(e).splitlines()[0] if str(e) else ''}") from e


def export_op_graph(model: nn.Module, inputs: dict[str, torch.Tensor], loss_fn: Callable | None = None,
                    targets: tuple[torch.Tensor, ...] = ()) -> OpGraph:
    """The op graph of `model` (and `loss_fn(output, *targets)`) from torch.export; input Values carry
    the plan's input names and `target`/`targetN`, as planlang.model.capture.opgraph.op_graph names them."""
    ep, root = export_step(model, inputs, loss_fn, targets)
    inline_wrappers(ep.graph_module)
    prefix = "model" if root is not model else ""
    b = _ExportBuilder(ep, root, prefix, training=model.training)
    for node in ep.graph.nodes:
        try:
            b.lower(node)
        except UnsupportedGraph:
            raise
        except Exception as e:  # noqa: BLE001 - name the node that could not be lowered
            raise UnsupportedGraph(f"cannot lower `{node.format_node()}` (torch.export graph): {e}") from e
    outs = tuple(b.env[o] for o in b.user_outputs if o in b.env)
    if not outs:
        raise UnsupportedGraph("the exported step has no tensor output computed from the inputs")
    g = OpGraph(b.values, b.nodes, outs, b.consts)
    names = step_input_names(list(inputs), len(targets))
    return rename_inputs(g, dict(zip(b.user_inputs, names)))


def inline_wrappers(gm: fx.GraphModule) -> None:
    """Inline the regions export wraps in higher-order ops: `torch.no_grad()` / `set_grad_enabled`
    blocks (HF's rotary embeddings compute cos/sin in one) and disabled-autocast blocks. The ops are
    copied into the main graph; a no-grad block's outputs pass through `aten.detach`, which keeps its
    meaning (constants fold through it). An enabled autocast block changes dtypes and is refused."""
    hops = torch.ops.higher_order
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in (hops.wrap_with_set_grad_enabled, hops.wrap_with_autocast):
            continue
        if node.target is hops.wrap_with_set_grad_enabled:
            grad, sub, args = node.args[0], node.args[1], node.args[2:]
        else:
            if node.args[2]:
                raise UnsupportedGraph(f"{node.format_node()}: an enabled torch.autocast region inside the "
                                       "model; planlang runs the plan's dtypes, not autocast")
            grad, sub, args = True, node.args[4], node.args[5:]
        body = getattr(gm, sub.target)
        phs = [n for n in body.graph.nodes if n.op == "placeholder"]
        with graph.inserting_before(node):
            outs = graph.graph_copy(body.graph, dict(zip(phs, args)), return_output_node=False)
            outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
            if not grad:
                detached = []
                for o in outs:
                    d = graph.call_function(aten.detach.default, (o,))
                    d.meta = dict(o.meta)
                    detached.append(d)
                outs = detached
        for user in list(node.users):
            if user.target is not operator.getitem:
                raise UnsupportedGraph(f"{user.format_node()}: uses a wrapped region's outputs as a tuple")
            user.replace_all_uses_with(outs[user.args[1]])
            graph.erase_node(user)
        graph.erase_node(node)
        if not sub.users:
            graph.erase_node(sub)


# ------------------------------------------------------------------------------ building the graph
def _strip(path: str, prefix: str) -> str:
    if prefix and (path == prefix or path.startswith(prefix + ".")):
        return path[len(prefix) + 1:]
    return path


def _clean_path(path: str) -> str:
    # some torch versions write `L['self'].h[0].attn`, others `h.0.attn`
    path = path.replace("L['self'].", "").replace("L['self']", "")
    return ".".join(p for p in path.replace("[", ".").replace("]", "").split(".") if p)


def _is_tensor(v) -> bool:
    return isinstance(v, torch.Tensor)


class _ExportBuilder:
    def __init__(self, ep: torch.export.ExportedProgram, root: nn.Module, prefix: str, training: bool) -> None:
        self.prefix = prefix
        self.training = training
        self.root = root
        self.values: dict[str, Value] = {}
        self.nodes: list[OpNode] = []
        self.consts: dict[str, torch.Tensor] = {}
        self.env: dict[str, str] = {}  # node name -> Value name
        self.folded: dict[str, Any] = {}  # node name -> real value computed from constants only
        self.pieces: dict[str, fx.Node] = {}  # split/chunk node name -> the node (its getitems are pieces)
        self.multi: dict[str, fx.Node] = {}  # tuple-valued op without a rule -> the node
        self._const_of: dict[str, str] = {}  # folded node name -> const Value name
        sig = ep.graph_signature
        self.param_of = dict(sig.inputs_to_parameters)
        self.buffer_of = dict(sig.inputs_to_buffers)
        self.lifted = dict(sig.inputs_to_lifted_tensor_constants)
        self.constants = ep.constants
        self.user_inputs = list(sig.user_inputs)
        self.user_outputs = [s.arg.name for s in sig.output_specs
                             if s.kind == torch.export.graph_signature.OutputKind.USER_OUTPUT
                             and hasattr(s.arg, "name")]
        # a shared parameter's canonical name: the first of its names, the one named_parameters() gives
        self.canonical: dict[int, str] = {}
        for n, p in root.named_parameters(remove_duplicate=False):
            self.canonical.setdefault(id(p), _strip(n, prefix))
        self._param_value: dict[str, str] = {}

    # -- values
    def add_value(self, name: str, t, kind: str, module: str = "", ref: str = "") -> str:
        self.values[name] = Value(name, tuple(int(s) for s in t.shape), dtype_name(t.dtype), kind, module, ref)
        return name

    def fresh(self, base: str) -> str:
        name, i = base, 0
        while name in self.values:
            i += 1
            name = f"{base}_{i}"
        return name

    def const(self, hint: str, t: torch.Tensor, module: str = "") -> str:
        name = self.fresh(f"const_{hint}")
        self.consts[name] = t
        return self.add_value(name, t, "const", module, hint)

    def tensor(self, a, node: fx.Node, like: str | None = None) -> str:
        """The Value name of a tensor argument; constants (folded nodes, python scalars) become const
        Values (a scalar takes the dtype of `like`, the op's other operand, as torch's promotion would)."""
        if isinstance(a, fx.Node):
            if a.name in self.env:
                return self.env[a.name]
            if a.name in self.folded and _is_tensor(self.folded[a.name]):
                if a.name not in self._const_of:
                    self._const_of[a.name] = self.const(a.name, self.folded[a.name], self.module_of(a))
                return self._const_of[a.name]
            raise UnsupportedGraph(f"{node.format_node()}: argument {a.name} is not a tensor")
        if isinstance(a, (bool, int, float)):
            dt = torch.float32
            if like is not None:
                other = _TORCH_DTYPE.get(self.values[like].dtype, torch.float32)
                if other.is_floating_point or not isinstance(a, float):
                    dt = other
            return self.const(f"{node.name}_scalar", torch.tensor(a, dtype=dt), self.module_of(node))
        raise UnsupportedGraph(f"{node.format_node()}: unsupported argument {a!r}")

    def module_of(self, node: fx.Node) -> str:
        stack = node.meta.get("nn_module_stack")
        if not stack:
            return ""
        return _strip(_clean_path(str(list(stack.values())[-1][0])), self.prefix)

    def emit(self, node: fx.Node, kind: str, inputs: list[str], attrs: dict | None = None,
             call: OpaqueCall | None = None, out=None, name: str | None = None) -> str:
        op = op_spec(kind, [self.values[v] for v in inputs], out if out is not None else node.meta["val"], attrs)
        name = name or node.name
        module = self.module_of(node)
        self.values[name] = Value(name, op.output, op.dtype, "op", module)
        self.nodes.append(OpNode(name, module, op, tuple(inputs), call))
        self.env[node.name] = name
        return name

    def opaque(self, node: fx.Node, target=None, src: fx.Node | None = None) -> str:
        """Run the ATen call itself on replicated inputs (no rule for it); the call is `src`'s when
        given (a tuple-valued op whose item `node` takes)."""
        src = src or node
        inputs: list[str] = []

        def sub(a):
            if isinstance(a, fx.Node):
                if a.name in self.env or a.name in self.folded and _is_tensor(self.folded[a.name]):
                    inputs.append(self.tensor(a, node))
                    return TensorArg(len(inputs) - 1)
                if a.name in self.folded:
                    return self.folded[a.name]
                raise UnsupportedGraph(f"{node.format_node()}: argument {a.name} has no value")
            if isinstance(a, torch.device):
                return None  # the runtime puts it on the rank's device
            return a

        args = fx.node.map_aggregate(src.args, sub)
        kwargs = fx.node.map_aggregate(dict(src.kwargs), sub)
        target = target or _callable(src.target)
        call = OpaqueCall("call_function", target, tuple(args), tuple(sorted(kwargs.items())))
        return self.emit(node, "opaque", inputs, {"target": getattr(target, "__name__", str(target))}, call)

    # -- nodes
    def lower(self, node: fx.Node) -> None:
        if node.op == "placeholder":
            self.placeholder(node)
        elif node.op == "call_function":
            if not self.fold(node):
                self.call(node)
        elif node.op in ("output",):
            return
        else:
            raise UnsupportedGraph(f"{node.format_node()}: {node.op} nodes are not supported")

    def placeholder(self, node: fx.Node) -> None:
        name = node.name
        if name in self.param_of:
            t = self.root.get_parameter(self.param_of[name])
            canonical = self.canonical.get(id(t), _strip(self.param_of[name], self.prefix))
            if canonical not in self._param_value:
                self._param_value[canonical] = self.add_value(canonical.replace(".", "_"), t, "param", ref=canonical)
            self.env[name] = self._param_value[canonical]
        elif name in self.buffer_of:
            self.folded[name] = self.root.get_buffer(self.buffer_of[name])
        elif name in self.lifted:
            self.folded[name] = self.constants[self.lifted[name]]
        else:
            val = node.meta.get("val")
            if not _is_tensor(val):
                raise UnsupportedGraph(f"input {name} has no tensor shape (give it in the plan's `input`)")
            self.add_value(name, val, "input", ref=name)
            self.env[name] = name

    def fold(self, node: fx.Node) -> bool:
        """Evaluate a node whose inputs are all constants (CPU, real tensors); False if it is not one."""
        deps = node.all_input_nodes
        if any(d.name not in self.folded for d in deps):
            return False
        target = node.target
        if isinstance(target, torch._ops.OpOverload) and (
                torch.Tag.nondeterministic_seeded in target.tags or target._schema.is_mutable):
            return False  # random each step, or writes to its input (a buffer's in-place update)
        if any(_is_tensor(self.folded[d.name]) and self.folded[d.name].device.type == "meta" for d in deps):
            return False  # a meta buffer: nothing to compute with

        def val(a):
            if isinstance(a, fx.Node):
                return self.folded[a.name]
            return torch.device("cpu") if isinstance(a, torch.device) else a

        try:
            out = target(*fx.node.map_aggregate(node.args, val), **fx.node.map_aggregate(dict(node.kwargs), val))
        except Exception:  # noqa: BLE001 - not evaluable here: lower it as an op instead
            return False
        self.folded[node.name] = out
        return True

    def call(self, node: fx.Node) -> None:
        t = node.target
        val = node.meta.get("val")
        if t is operator.getitem:
            self.getitem(node)
            return
        if val is None:  # shape/dtype assertions: nothing to run
            return
        if isinstance(t, torch._ops.OpOverload):
            rule = RULES.get(t)
            if rule is not None and rule(self, node) is not False:
                return
            if isinstance(val, (tuple, list)):
                self.multi[node.name] = node
                return
            self.opaque(node)
            return
        raise UnsupportedGraph(f"{node.format_node()}: {t} is not an ATen op (higher-order ops are not supported)")

    def getitem(self, node: fx.Node) -> None:
        src, idx = node.args
        if src.name in self.pieces:
            _piece(self, node, self.pieces[src.name], idx)
        elif src.name in self.multi:
            orig = self.multi[src.name]
            self.opaque(node, AtenCall(aten_name(orig.target), idx), src=orig)
        else:
            raise UnsupportedGraph(f"{node.format_node()}: indexing a value that is not a tuple of tensors")


_TORCH_DTYPE = {v: k for k, v in DTYPES.items()}


def _callable(target):
    return AtenCall(aten_name(target)) if isinstance(target, torch._ops.OpOverload) else target


def _a(node: fx.Node, i: int, name: str, default=None):
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


# ------------------------------------------------------------------------------ rules: ATen -> OpSpec
# Each returns False to make the node opaque (a case the OpSpec does not express).
def _same(kind: str, n_tensors: int, **fixed):
    """An op whose first `n_tensors` arguments are its tensor inputs and whose other arguments must
    have the given defaults (anything else: opaque)."""
    def rule(b: _ExportBuilder, node: fx.Node):
        for i, (k, v) in enumerate(fixed.items()):
            if _a(node, n_tensors + i, k, v) != v:
                return False
        ins = [b.tensor(a, node) for a in node.args[:n_tensors] if a is not None]
        b.emit(node, kind, ins)
    return rule


def _binary(kind: str):
    def rule(b: _ExportBuilder, node: fx.Node):
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
    return rule


def _unary(kind: str):
    def rule(b: _ExportBuilder, node: fx.Node):
        attrs = {}
        if kind == "gelu" and node.kwargs.get("approximate", "none") != "none":
            attrs["approximate"] = node.kwargs["approximate"]
        b.emit(node, kind, [b.tensor(node.args[0], node)], attrs)
    return rule


def _expand(b: _ExportBuilder, node: fx.Node):
    if node.kwargs.get("implicit", False):
        return False
    b.emit(node, "expand", [b.tensor(node.args[0], node)])


def _identity(b: _ExportBuilder, node: fx.Node):
    x = node.args[0]
    v = b.tensor(x, node)
    val = node.meta["val"]
    if tuple(val.shape) != b.values[v].shape or dtype_name(val.dtype) != b.values[v].dtype:
        return False
    b.env[node.name] = v


def _to(b: _ExportBuilder, node: fx.Node):
    """`x.to(dtype)` / `_to_copy(x, dtype=...)`: an explicit floating cast is a `cast` op even where it is
    the identity here. The program is traced in f32 and run in the plan's precision, so RMSNorm's
    `hidden.to(torch.float32)` (HF Llama, Mistral, Qwen2, Gemma) is a no-op at trace time and the upcast
    that keeps its rsqrt finite in f16 at run time; dropping it ran the norm in f16 (NaN gradients).
    A cast back to the input's dtype (`.to(input_dtype)`) was f32 at trace time too and stays f32: the
    next matmul's autocast casts again, and one norm's output is kept in f32, not f16. Only `aten.to.dtype`
    (`x.to(torch.float32)`, `x.float()`, `x.to(y.dtype)`) is a cast: `x.to(device)` exports as
    `to.dtype_layout` with the trace's dtype filled in, which says nothing of the run's (HF GPT-2's
    position embeddings: cast to f32, they made the residual stream f32 beside f16 LayerNorm weights)."""
    x = node.args[0]
    dtype = node.args[1] if len(node.args) > 1 else node.kwargs.get("dtype")
    v = b.tensor(x, node)
    val = node.meta["val"]
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point and val.dtype.is_floating_point) \
            or tuple(val.shape) != b.values[v].shape:
        return _identity(b, node)
    b.emit(node, "cast", [v], {"dtype": dtype_name(dtype)})


def _type_as(b: _ExportBuilder, node: fx.Node):
    """`x.type_as(other)`: x itself where the dtypes agree at trace time (other's dtype follows the
    plan's at run time, as x's does: Gemma2's norm casting back to its input's dtype), a `cast` to
    other's dtype where they differ."""
    v = b.tensor(node.args[0], node)
    out = dtype_name(node.meta["val"].dtype)
    if out == b.values[v].dtype:
        b.env[node.name] = v
        return
    b.emit(node, "cast", [v], {"dtype": out})


def _reshape(kind: str):
    def rule(b: _ExportBuilder, node: fx.Node):
        b.emit(node, kind, [b.tensor(node.args[0], node)])
    return rule


def _transpose(b, node):
    x = b.tensor(node.args[0], node)
    d0, d1 = (node.args[1], node.args[2]) if len(node.args) > 2 else (0, 1)
    b.emit(node, "transpose", [x], {"dim0": d0, "dim1": d1})


def _permute(b, node):
    b.emit(node, "permute", [b.tensor(node.args[0], node)], {"dims": tuple(node.args[1])})


def _numpy_t(b, node):
    # x.T (HF FalconLinear's `input @ self.weight.T`): its dims reversed
    x = b.tensor(node.args[0], node)
    b.emit(node, "permute", [x], {"dims": tuple(range(len(b.values[x].shape)))[::-1]})


def _embedding(b, node):
    # aten.embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False)
    if _a(node, 3, "scale_grad_by_freq", False) or _a(node, 4, "sparse", False):
        return False
    pad = _a(node, 2, "padding_idx", -1)
    b.emit(node, "embedding", [b.tensor(node.args[1], node), b.tensor(node.args[0], node)],
           {"padding_idx": pad} if pad is not None and pad >= 0 else None)


def _conv2d(b, node):
    # aten.conv2d(input, weight, bias=None, stride=[1, 1], padding=[0, 0], dilation=[1, 1], groups=1)
    pair = lambda v: tuple(v) if isinstance(v, (list, tuple)) else (v, v)  # noqa: E731
    bias = _a(node, 2, "bias")
    ins = [b.tensor(node.args[0], node), b.tensor(node.args[1], node)] + ([b.tensor(bias, node)] if bias is not None else [])
    b.emit(node, "conv2d", ins, {"stride": pair(_a(node, 3, "stride", 1)), "padding": pair(_a(node, 4, "padding", 0)),
                                 "dilation": pair(_a(node, 5, "dilation", 1)), "groups": _a(node, 6, "groups", 1)})


def _select(b, node):
    # aten.select(x, dim, index): the length-1 slice at `index`, then that dim dropped (a reshape)
    x = b.tensor(node.args[0], node)
    shape = b.values[x].shape
    d = node.args[1] % len(shape)
    i = node.args[2] % shape[d]
    val = node.meta["val"]
    piece = torch.empty(shape[:d] + (1,) + shape[d + 1:], dtype=val.dtype, device="meta")
    s = b.emit(node, "slice", [x], {"dim": d, "start": i, "end": i + 1}, out=piece, name=b.fresh(f"{node.name}_piece"))
    b.emit(node, "reshape", [s])


def _addmm(b, node):
    if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
        return False
    b.emit(node, "addmm", [b.tensor(a, node) for a in node.args[:3]])


def _linear(b, node):
    ins = [b.tensor(a, node) for a in node.args[:3] if a is not None]
    b.emit(node, "linear", ins)


def _layer_norm(b, node):
    # aten.layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True)
    w, bias = _a(node, 2, "weight"), _a(node, 3, "bias")
    if w is None or bias is None:
        return False
    b.emit(node, "layer_norm", [b.tensor(a, node) for a in (node.args[0], w, bias)],
           {"eps": _a(node, 4, "eps", 1e-5), "normalized_ndim": len(node.args[1])})


def _dropout(b, node):
    p, train = _a(node, 1, "p", 0.5), _a(node, 2, "train", True)
    b.emit(node, "dropout", [b.tensor(node.args[0], node)], {"p": p, "training": bool(train and b.training)})


def _softmax(kind: str):
    def rule(b, node):
        x = b.tensor(node.args[0], node)
        attrs = {"dim": node.args[1]}
        out = dtype_name(node.meta["val"].dtype)
        explicit = len(node.args) > 2 and isinstance(node.args[2], torch.dtype) or "dtype" in node.kwargs
        # softmax(x, dim, dtype=torch.float32) or _softmax's half_to_float; an explicit dtype is kept even
        # where the trace's f32 made it the identity (see `_to`): at run time in bf16 it is the upcast
        if out != b.values[x].dtype or explicit:
            attrs["dtype"] = out
        b.emit(node, kind, [x], attrs)
    return rule


def _dims(d):
    if d is None or isinstance(d, int):
        return d
    d = tuple(d)
    return d[0] if len(d) == 1 else (None if not d else d)


def _reduce(kind: str):
    def rule(b, node):
        if node.kwargs.get("dtype") is not None:
            return False
        x = b.tensor(node.args[0], node)
        if node.target in (aten.sum.default, aten.mean.default):
            attrs = {"dim": None, "keepdim": False}
        else:
            attrs = {"dim": _dims(_a(node, 1, "dim")), "keepdim": bool(_a(node, 2, "keepdim", False))}
        b.emit(node, kind, [x], attrs)
    return rule


def _cat(b, node):
    xs = [b.tensor(a, node) for a in node.args[0]]
    b.emit(node, "cat", xs, {"dim": _a(node, 1, "dim", 0)})


def _slice(b, node):
    # aten.slice(x, dim=0, start=None, end=None, step=1)
    x = b.tensor(node.args[0], node)
    shape = b.values[x].shape
    step = _a(node, 4, "step", 1)
    d = _a(node, 1, "dim", 0) % len(shape)
    start, end = _a(node, 2, "start"), _a(node, 3, "end")
    start = 0 if start is None else start
    end = shape[d] if end is None else min(end, shape[d])
    if start in (0, -shape[d]) and end == shape[d] and step == 1:
        b.env[node.name] = x  # the whole dim
        return
    b.emit(node, "slice", [x], {"dim": d, "start": start, "end": end, **({"step": step} if step != 1 else {})})


def _index(b, node):
    """x[..., idx, ...] with one 1-D integer index (Falcon's `qkv[..., [-2], :]`: a constant) is
    index_select along that dim; indexing dim 0 (the batch: not per sample) or with several indices
    stays an opaque call."""
    x = b.tensor(node.args[0], node)
    idx = list(node.args[1])
    used = [d for d, i in enumerate(idx) if i is not None]
    if len(used) != 1 or used[0] == 0 or not isinstance(idx[used[0]], fx.Node):
        return False
    t = idx[used[0]].meta.get("val")
    if not _is_tensor(t) or t.dim() != 1 or t.dtype not in (torch.int64, torch.int32):
        return False
    b.emit(node, "index_select", [x, b.tensor(idx[used[0]], node)], {"dim": used[0]})


def _index_select(b, node):
    # aten.index_select(x, dim, index)
    x = b.tensor(node.args[0], node)
    d = node.args[1] % len(b.values[x].shape)
    if d == 0:
        return False
    b.emit(node, "index_select", [x, b.tensor(node.args[2], node)], {"dim": d})


def _stack(b, node):
    b.emit(node, "stack", [b.tensor(a, node) for a in node.args[0]], {"dim": _a(node, 1, "dim", 0)})


def _roll(b, node):
    # aten.roll(x, shifts, dims=[]): along dim 0 (the batch) or flattened (no dims) it is not per sample
    x = b.tensor(node.args[0], node)
    rank = len(b.values[x].shape)
    shifts, dims = _a(node, 1, "shifts"), _a(node, 2, "dims", ())
    shifts = (shifts,) if isinstance(shifts, int) else tuple(shifts)
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    if not dims or len(dims) != len(shifts) or any(d % rank == 0 for d in dims):
        return False
    b.emit(node, "roll", [x], {"shifts": shifts, "dims": tuple(d % rank for d in dims)})


def _einsum(b, node):
    # aten.einsum(equation, tensors, path=None)
    xs = [b.tensor(a, node) for a in node.args[1]]
    eq = node.args[0]
    if not einsum_fits(eq, tuple(b.values[v].shape for v in xs), tuple(node.meta["val"].shape)):
        return False
    b.emit(node, "einsum", xs, {"equation": eq})


def _split(b, node):
    b.pieces[node.name] = node


def _piece(b: _ExportBuilder, node: fx.Node, split: fx.Node, index: int) -> None:
    x = b.tensor(split.args[0], node)
    n = b.values[x].shape
    dim = _a(split, 2, "dim", 0) % len(n)
    if split.target is aten.chunk.default:
        size = -(-n[dim] // split.args[1])
    else:
        size = split.args[1]
    b.emit(node, "split", [x], {"dim": dim, "split_size": tuple(size) if isinstance(size, list) else size,
                                "index": index})


def _pow(b, node):
    """x ** 2 and x ** 3 as products (what ATen computes for these exponents), so they keep layouts."""
    n = node.args[1]
    if n not in (2, 3):
        return False
    x = b.tensor(node.args[0], node)
    val = node.meta["val"]
    if n == 2:
        b.emit(node, "mul", [x, x])
        return
    sq = b.emit(node, "mul", [x, x], out=val, name=b.fresh(f"{node.name}_sq"))
    b.emit(node, "mul", [sq, x])


def _cross_entropy(b, node):
    # aten.cross_entropy_loss(self, target, weight=None, reduction=Mean, ignore_index=-100, label_smoothing=0)
    logits = node.args[0].meta["val"]
    red = {0: "none", 1: "mean", 2: "sum"}.get(_a(node, 3, "reduction", 1))
    if (logits.dim() != 2 or _a(node, 2, "weight") is not None or red is None
            or _a(node, 4, "ignore_index", -100) != -100 or _a(node, 5, "label_smoothing", 0.0) != 0.0):
        return False
    b.emit(node, "cross_entropy", [b.tensor(node.args[0], node), b.tensor(node.args[1], node)], {"reduction": red})


def _mse(b, node):
    """mse_loss(a, t) = mean((a - t)^2), as the fx path lowers it (sub, mul, mean or sum)."""
    red = {1: "mean", 2: "sum"}.get(_a(node, 2, "reduction", 1))
    if red is None:
        return False
    a, t = b.tensor(node.args[0], node), b.tensor(node.args[1], node)
    meta = node.args[0].meta["val"]
    d = b.emit(node, "sub", [a, t], out=meta, name=b.fresh(f"{node.name}_diff"))
    sq = b.emit(node, "mul", [d, d], out=meta, name=b.fresh(f"{node.name}_sq"))
    b.emit(node, red, [sq], {"dim": None, "keepdim": False})


def causal_mask(mask: torch.Tensor, s: int, t: int) -> bool:
    """Whether an SDPA mask (bool: keep; float: added) is torch's `is_causal` mask for every batch
    and head: keep key j for query i iff j <= i (top-left aligned)."""
    keep = torch.ones(s, t, dtype=torch.bool).tril()
    if mask.shape[-2:] != (s, t) and not all(m == 1 or m == n for m, n in zip(mask.shape[-2:], (s, t))):
        return False
    m = mask.expand(*mask.shape[:-2], s, t)
    if mask.dtype == torch.bool:
        return bool((m == keep).all())
    if mask.is_floating_point():
        return bool(((m == 0) == keep).all() and torch.isneginf(m[..., ~keep]).all())
    return False


def keeps_all(mask: torch.Tensor) -> bool:
    """Whether an SDPA mask (bool: keep; float: added) masks nothing."""
    if mask.dtype == torch.bool:
        return bool(mask.all())
    return bool(mask.is_floating_point() and (mask == 0).all())


def _sdpa(b, node):
    # aten.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *,
    #                                   scale=None, enable_gqa=False)
    q, k = node.args[0].meta["val"], node.args[1].meta["val"]
    mask = _a(node, 3, "attn_mask")
    if q.dim() != 4 or _a(node, 4, "dropout_p", 0.0) != 0.0:
        return False
    if not sdpa_heads_fit(tuple(q.shape), tuple(k.shape), tuple(node.args[2].meta["val"].shape),
                          bool(node.kwargs.get("enable_gqa", False))):
        return False
    causal = bool(_a(node, 5, "is_causal", False))
    if mask is not None:
        m = b.folded.get(mask.name) if isinstance(mask, fx.Node) else None
        if not causal and _is_tensor(m) and keeps_all(m):
            pass  # a mask that keeps every key (HF's default without an attention mask) is no mask
        elif causal or not _is_tensor(m) or not causal_mask(m, q.shape[2], k.shape[2]):
            return False  # a mask from the data (padding) or not causal: opaque, with the mask as input
        else:
            causal = True
    ins = [b.tensor(a, node) for a in node.args[:3]]
    b.emit(node, "scaled_dot_product_attention", ins, {"is_causal": causal, "scale": node.kwargs.get("scale")})


RULES: dict[Any, Callable] = {
    aten.linear.default: _linear,
    aten.addmm.default: _addmm,
    aten.matmul.default: _same("matmul", 2),
    aten.mm.default: _same("matmul", 2),
    aten.bmm.default: _same("bmm", 2),
    aten.embedding.default: _embedding,
    aten.layer_norm.default: _layer_norm,
    aten.dropout.default: _dropout,
    aten.softmax.int: _softmax("softmax"),
    aten._softmax.default: _softmax("softmax"),
    aten.log_softmax.int: _softmax("log_softmax"),
    aten._log_softmax.default: _softmax("log_softmax"),
    aten.gelu.default: _unary("gelu"),
    aten.relu.default: _unary("relu"),
    aten.silu.default: _unary("silu"),
    aten.tanh.default: _unary("tanh"),
    aten.exp.default: _unary("exp"),
    aten.neg.default: _unary("neg"),
    aten.rsqrt.default: _unary("rsqrt"),
    aten.sqrt.default: _unary("sqrt"),
    aten.sigmoid.default: _unary("sigmoid"),
    aten.sin.default: _unary("sin"),
    aten.cos.default: _unary("cos"),
    aten.expand.default: _expand,
    aten.conv2d.default: _conv2d,
    aten.select.int: _select,
    aten.add.Tensor: _binary("add"), aten.add.Scalar: _binary("add"),
    aten.sub.Tensor: _binary("sub"), aten.sub.Scalar: _binary("sub"),
    aten.mul.Tensor: _binary("mul"), aten.mul.Scalar: _binary("mul"),
    aten.div.Tensor: _binary("div"), aten.div.Scalar: _binary("div"),
    aten.pow.Tensor_Scalar: _pow,
    aten.sum.dim_IntList: _reduce("sum"), aten.sum.default: _reduce("sum"),
    aten.mean.dim: _reduce("mean"), aten.mean.default: _reduce("mean"),
    aten.amax.default: _reduce("amax"),
    aten.view.default: _reshape("view"),
    aten._unsafe_view.default: _reshape("view"),
    aten.reshape.default: _reshape("reshape"),
    aten.flatten.using_ints: _reshape("flatten"),
    aten.unsqueeze.default: _reshape("reshape"),
    aten.squeeze.dim: _reshape("reshape"),
    aten.squeeze.dims: _reshape("reshape"),
    aten.transpose.int: _transpose,
    aten.t.default: _transpose,
    aten.permute.default: _permute,
    aten.numpy_T.default: _numpy_t,
    aten.cat.default: _cat,
    aten.stack.default: _stack,
    aten.index.Tensor: _index,
    aten.index_select.default: _index_select,
    aten.roll.default: _roll,
    aten.einsum.default: _einsum,
    aten.type_as.default: _type_as,
    aten.slice.Tensor: _slice,
    aten.split.Tensor: _split,
    aten.split_with_sizes.default: _split,
    aten.chunk.default: _split,
    aten.alias.default: _identity,
    aten.clone.default: _identity,
    aten.contiguous.default: _identity,
    aten.to.dtype: _to,
    aten.to.dtype_layout: _identity,
    aten.to.device: _identity,
    aten._to_copy.default: _identity,
    aten.cross_entropy_loss.default: _cross_entropy,
    aten.mse_loss.default: _mse,
    aten.scaled_dot_product_attention.default: _sdpa,
}
