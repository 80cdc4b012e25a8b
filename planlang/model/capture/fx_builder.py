"""The state of lowering one fx graph to an op graph (planlang.model.capture.opgraph): the Values made so
far, the static (non-tensor) values evaluated from global shapes, and the typed helpers the argument
readers (planlang.model.capture.fx_readers) read fx nodes with.

torch.fx types a node's arguments as one wide union (`Argument`); the helpers here narrow it: `node_of`
(an fx.Node or UnsupportedGraph), `arg` (an argument by position or keyword), `FxBuilder.static` (the
python value of a static argument, `Any` as the model computed it)."""
from __future__ import annotations

from typing import Any

import torch
from torch import fx, nn

from planlang.model.capture.graph_values import (
    DTYPES, OpaqueCall, OpNode, TensorArg, UnsupportedGraph, Value, dtype_name, op_spec,
)

TORCH_DTYPE = {v: k for k, v in DTYPES.items()}


def strip(path: str, prefix: str) -> str:
    if prefix and (path == prefix or path.startswith(prefix + ".")):
        return path[len(prefix) + 1:]
    return path


def module_of(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack")
    if node.op == "call_module":
        return str(node.target)
    if not stack:
        return ""
    return str(list(stack.values())[-1][0])


def target_name(node: fx.Node) -> str:
    t = node.target
    if isinstance(t, str):
        return t
    return str(getattr(t, "__name__", str(t)))


def arg(node: fx.Node, i: int, name: str, default: Any = None) -> Any:
    """Argument `i` of the call, or keyword `name`, or `default`."""
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


def node_of(a: object, node: fx.Node) -> fx.Node:
    """`a`, an argument of `node` that must be an fx node."""
    if isinstance(a, fx.Node):
        return a
    raise UnsupportedGraph(f"{node.format_node()}: argument {a!r} is not a graph value")


def fetch_attr(gm: nn.Module, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


class FxBuilder:
    """What lowering an fx graph has made so far; `emit` adds an op."""

    def __init__(self, gm: fx.GraphModule, prefix: str, training: bool) -> None:
        self.gm = gm
        self.prefix = prefix  # "model" when the graph wraps the model with its loss
        self.training = training
        self.values: dict[str, Value] = {}
        self.nodes: list[OpNode] = []
        self.consts: dict[str, torch.Tensor] = {}
        self.static_values: dict[str, Any] = {}  # fx node name -> python value (sizes, tuples of Values ...)
        self.env: dict[str, str] = {}  # fx node name -> Value name (aliases for identity ops)
        # a tied parameter is named by its first alias, as named_parameters() (and so the model layer's
        # canonical names, apply's gradient sums and the optimizer) name it
        self.param_names: dict[int, str] = {}
        for n, p in gm.named_parameters(remove_duplicate=False):
            self.param_names.setdefault(id(p), strip(n, prefix))
        self._param_value: dict[str, str] = {}  # canonical FQN -> Value name (shared params: one value)

    # -- values
    def add_value(self, name: str, t: Any, kind: str, module: str = "", ref: str = "") -> str:
        self.values[name] = Value(name, tuple(int(s) for s in t.shape), dtype_name(t.dtype), kind,
                                  strip(module, self.prefix), ref)
        return name

    def param(self, fqn: str, t: torch.Tensor) -> str:
        canonical = self.param_names.get(id(t), strip(fqn, self.prefix))
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

    def tensor_of(self, a: object, node: fx.Node, pos: int) -> str:
        """The Value name for an fx argument that must be a tensor (python scalars become 0-d consts)."""
        if isinstance(a, fx.Node):
            if a.name in self.env:
                return self.env[a.name]
            raise UnsupportedGraph(f"{node.format_node()}: argument {a.name} is not a tensor")
        if isinstance(a, (int, float, bool)):
            return self.const(f"{node.name}_{pos}", torch.tensor(a, dtype=torch.float32))
        raise UnsupportedGraph(f"{node.format_node()}: unsupported argument {a!r}")

    def is_tensor_value(self, a: object) -> bool:
        """Whether `a` is an fx node whose value is a tensor of the graph."""
        return isinstance(a, fx.Node) and a.name in self.env

    def meta(self, n: object) -> Any:
        """The shape-propagated value of an fx node (tensor metadata or a fake tensor; None for others)."""
        if not isinstance(n, fx.Node):
            return None
        return n.meta.get("tensor_meta") or n.meta.get("val")

    def shape_of(self, vname: str) -> tuple[int, ...]:
        return self.values[vname].shape

    def static(self, a: object) -> Any:
        """The python value of an argument (fx nodes of static values are looked up)."""
        if isinstance(a, fx.Node):
            if a.name in self.static_values:
                return self.static_values[a.name]
            raise UnsupportedGraph(f"{a.format_node()}: a tensor where a static value was expected")
        if isinstance(a, (list, tuple)):
            return type(a)(self.static(x) for x in a)
        return a

    # -- ops
    def emit(self, node: fx.Node, kind: str, inputs: list[str], attrs: dict[str, Any] | None = None,
             call: OpaqueCall | None = None, out: Any = None, name: str | None = None) -> str:
        op = op_spec(kind, [self.values[v] for v in inputs], out if out is not None else self.meta(node), attrs)
        name = name or node.name
        module = strip(module_of(node), self.prefix)
        self.values[name] = Value(name, op.output, op.dtype, "op", module)
        self.nodes.append(OpNode(name, module, op, tuple(inputs), call))
        return name

    def set(self, node: fx.Node, value: str) -> None:
        """`node` is Value `value`."""
        self.env[node.name] = value

    def call_args(self, node: fx.Node) -> tuple[list[str], Any, Any]:
        """The node's arguments with tensors replaced by `TensorArg(i)` (i-th of the returned Values)
        and static values by their python value."""
        inputs: list[str] = []

        def sub(a: Any) -> Any:
            if isinstance(a, fx.Node):
                if a.name in self.env:
                    inputs.append(self.env[a.name])
                    return TensorArg(len(inputs) - 1)
                return self.static_values[a.name]
            return a

        return inputs, fx.node.map_aggregate(node.args, sub), fx.node.map_aggregate(node.kwargs, sub)

    def opaque(self, node: fx.Node) -> str:
        """Run the original call on replicated inputs (no rule for it)."""
        inputs, args, kwargs = self.call_args(node)
        target: Any = node.target
        if node.op == "call_module":
            target = strip(str(target), self.prefix)
        call = OpaqueCall(node.op, target, tuple(args), tuple(sorted(kwargs.items())))
        return self.emit(node, "opaque", inputs, {"target": target_name(node)}, call)

    def opaque_module(self, node: fx.Node, mod: nn.Module) -> str:
        """A module without a rule: its parameters become inputs of an opaque op run with torch.func."""
        inputs, args, kwargs = self.call_args(node)
        path = str(node.target)
        pnames = []
        for pname, t in mod.named_parameters():
            inputs.append(self.param(f"{path}.{pname}", t))
            pnames.append(pname)
        call = OpaqueCall("call_module", strip(path, self.prefix), tuple(args),
                          tuple(sorted(kwargs.items())) + (("__params__", tuple(pnames)),))
        return self.emit(node, "opaque", inputs, {"target": type(mod).__name__}, call)

    def static_value(self, node: fx.Node) -> Any:
        """Evaluate a non-tensor node from global shapes: x.size(), x.shape, x.device, len(), arithmetic."""
        def val(a: Any) -> Any:
            if isinstance(a, fx.Node):
                if a.name in self.static_values:
                    return self.static_values[a.name]
                if a.name in self.env:
                    v = self.values[self.env[a.name]]
                    return torch.empty(v.shape, dtype=TORCH_DTYPE.get(v.dtype, torch.float32), device="meta")
                raise UnsupportedGraph(f"{a.format_node()} has no value")
            return a

        args: Any = fx.node.map_aggregate(node.args, val)
        kwargs: Any = fx.node.map_aggregate(node.kwargs, val)
        target: Any = node.target
        if node.op == "call_method":
            out = getattr(args[0], str(target))(*args[1:], **kwargs)
        elif node.op == "call_function":
            out = target(*args, **kwargs)
        else:
            raise UnsupportedGraph(f"{node.format_node()}: a module call without a tensor result")
        if isinstance(out, torch.device) and out.type == "meta":
            return None  # the device of a tensor: the runtime uses the tensors' own device
        if isinstance(out, torch.Size):
            return tuple(int(s) for s in out)
        return out
