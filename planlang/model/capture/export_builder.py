"""The state of lowering one torch.export graph to an op graph (planlang.model.capture.export_graph):
the Values made so far, the constants folded on the CPU (or deferred: lazy_consts), the pieces of splits, and `AtenCall`, the
picklable name of an ATen op an opaque call runs. The ATen argument readers are
planlang.model.capture.aten_readers."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from planlang.model.capture.fx_builder import node_of, strip
from planlang.model.capture.lazy_consts import Deferred, fold_call
from planlang.model.capture.graph_values import (
    DTYPES, OpaqueCall, OpNode, TensorArg, UnsupportedGraph, Value, dtype_name, op_spec,
)

TORCH_DTYPE = {v: k for k, v in DTYPES.items()}


@dataclass(frozen=True)
class AtenCall:
    """A picklable stand-in for an ATen op overload (`aten::diff.default`), optionally taking item
    `index` of a tuple result."""

    op: str  # "namespace::name.overload"
    index: int | None = None

    def resolve(self) -> Any:
        ns, rest = self.op.split("::")
        name, _, overload = rest.partition(".")
        return getattr(getattr(getattr(torch.ops, ns), name), overload or "default")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self.resolve()(*args, **kwargs)
        return out if self.index is None else out[self.index]

    @property
    def __name__(self) -> str:  # what the generated code's comments show
        return self.op.split("::")[-1].split(".")[0] + ("" if self.index is None else f"[{self.index}]")

    def __str__(self) -> str:
        return self.__name__


def aten_name(target: Any) -> str:
    # name() is "aten::add_.Tensor" for an overload other than the default one, "aten::diff" for it
    return f"{target._schema.name}.{target._overloadname}" if "::" in target.name() else target.name()


# ------------------------------------------------------------------------------ building the graph
def clean_path(path: str) -> str:
    # some torch versions write `L['self'].h[0].attn`, others `h.0.attn`
    path = path.replace("L['self'].", "").replace("L['self']", "")
    return ".".join(p for p in path.replace("[", ".").replace("]", "").split(".") if p)


def is_tensor(v: object) -> bool:
    """A tensor value: a real (or fake) one, or a folded constant not computed yet."""
    return isinstance(v, (torch.Tensor, Deferred))


@dataclass
class StepSignature:
    """What lowering reads off an ExportedProgram besides its graph: which placeholders are parameters,
    buffers and lifted constants (by FQN or constant name), the constants, and the user inputs and
    outputs by node name (planlang.model.capture.fold_graph builds one for a graph it expands)."""

    params: dict[str, str]
    buffers: dict[str, str]
    lifted: dict[str, str]
    constants: dict[str, Any]
    user_inputs: list[str]
    user_outputs: list[str]

    @classmethod
    def of(cls, ep: torch.export.ExportedProgram) -> "StepSignature":
        sig = ep.graph_signature
        outs = [s.arg.name for s in sig.output_specs
                if s.kind == torch.export.graph_signature.OutputKind.USER_OUTPUT and hasattr(s.arg, "name")]
        return cls(dict(sig.inputs_to_parameters), dict(sig.inputs_to_buffers),
                   dict(sig.inputs_to_lifted_tensor_constants), dict(ep.constants), list(sig.user_inputs), outs)


class ExportBuilder:
    """What lowering an exported graph has made so far; `emit` adds an op (and names the node's value)."""

    def __init__(self, ep: "torch.export.ExportedProgram | StepSignature", root: nn.Module, prefix: str,
                 training: bool) -> None:
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
        sig = ep if isinstance(ep, StepSignature) else StepSignature.of(ep)
        self.param_of = sig.params
        self.buffer_of = sig.buffers
        self.lifted = sig.lifted
        self.constants = sig.constants
        self.user_inputs = sig.user_inputs
        self.user_outputs = sig.user_outputs
        # a shared parameter's canonical name: the first of its names, the one named_parameters() gives
        self.canonical: dict[int, str] = {}
        for n, p in root.named_parameters(remove_duplicate=False):
            self.canonical.setdefault(id(p), strip(n, prefix))
        self._param_value: dict[str, str] = {}

    # -- values
    def add_value(self, name: str, t: Any, kind: str, module: str = "", ref: str = "") -> str:
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

    def tensor(self, a: object, node: fx.Node, like: str | None = None) -> str:
        """The Value name of a tensor argument; constants (folded nodes, python scalars) become const
        Values (a scalar takes the dtype of `like`, the op's other operand, as torch's promotion would)."""
        if isinstance(a, fx.Node):
            if a.name in self.env:
                return self.env[a.name]
            if a.name in self.folded and is_tensor(self.folded[a.name]):
                if a.name not in self._const_of:
                    self._const_of[a.name] = self.const(a.name, self.folded[a.name], self.module_of(a))
                return self._const_of[a.name]
            raise UnsupportedGraph(f"{node.format_node()}: argument {a.name} is not a tensor")
        if isinstance(a, (bool, int, float)):
            dt = torch.float32
            if like is not None:
                other = TORCH_DTYPE.get(self.values[like].dtype, torch.float32)
                if other.is_floating_point or not isinstance(a, float):
                    dt = other
            return self.const(f"{node.name}_scalar", torch.tensor(a, dtype=dt), self.module_of(node))
        raise UnsupportedGraph(f"{node.format_node()}: unsupported argument {a!r}")

    def module_of(self, node: fx.Node) -> str:
        stack = node.meta.get("nn_module_stack")
        if not stack:
            return ""
        return strip(clean_path(str(list(stack.values())[-1][0])), self.prefix)

    def emit(self, node: fx.Node, kind: str, inputs: list[str], attrs: dict[str, Any] | None = None,
             call: OpaqueCall | None = None, out: Any = None, name: str | None = None) -> str:
        op = op_spec(kind, [self.values[v] for v in inputs], out if out is not None else node.meta["val"], attrs)
        name = name or node.name
        module = self.module_of(node)
        self.values[name] = Value(name, op.output, op.dtype, "op", module)
        self.nodes.append(OpNode(name, module, op, tuple(inputs), call))
        self.env[node.name] = name
        return name

    def opaque(self, node: fx.Node, target: Any = None, src: fx.Node | None = None) -> str:
        """Run the ATen call itself on replicated inputs (no rule for it); the call is `src`'s when
        given (a tuple-valued op whose item `node` takes)."""
        src = src or node
        inputs: list[str] = []

        def sub(a: Any) -> Any:
            if isinstance(a, fx.Node):
                if a.name in self.env or a.name in self.folded and is_tensor(self.folded[a.name]):
                    inputs.append(self.tensor(a, node))
                    return TensorArg(len(inputs) - 1)
                if a.name in self.folded:
                    return self.folded[a.name]
                raise UnsupportedGraph(f"{node.format_node()}: argument {a.name} has no value")
            if isinstance(a, torch.device):
                return None  # the runtime puts it on the rank's device
            return a

        args: Any = fx.node.map_aggregate(src.args, sub)
        kwargs: Any = fx.node.map_aggregate(dict(src.kwargs), sub)
        target = target or _callable(src.target)
        call = OpaqueCall("call_function", target, tuple(args), tuple(sorted(kwargs.items())))
        return self.emit(node, "opaque", inputs, {"target": getattr(target, "__name__", str(target))}, call)

    def placeholder(self, node: fx.Node) -> None:
        name = node.name
        if name in self.param_of:
            t = self.root.get_parameter(self.param_of[name])
            canonical = self.canonical.get(id(t), strip(self.param_of[name], self.prefix))
            if canonical not in self._param_value:
                self._param_value[canonical] = self.add_value(canonical.replace(".", "_"), t, "param", ref=canonical)
            self.env[name] = self._param_value[canonical]
        elif name in self.buffer_of:
            self.folded[name] = self.root.get_buffer(self.buffer_of[name])
        elif name in self.lifted:
            self.folded[name] = self.constants[self.lifted[name]]
        else:
            val = node.meta.get("val")
            if not is_tensor(val):
                raise UnsupportedGraph(f"input {name} has no tensor shape (give it in the plan's `input`)")
            self.add_value(name, val, "input", ref=name)
            self.env[name] = name

    def fold(self, node: fx.Node) -> bool:
        """Evaluate a node whose inputs are all constants (CPU, real tensors when small; a large result,
        or one read off a large one, is a lazy_consts.Deferred: computed only where the program runs);
        False if it is not one."""
        deps = node.all_input_nodes
        if any(d.name not in self.folded for d in deps):
            return False
        target: Any = node.target
        if isinstance(target, torch._ops.OpOverload) and (
                torch.Tag.nondeterministic_seeded in target.tags or target._schema.is_mutable):
            return False  # random each step, or writes to its input (a buffer's in-place update)
        if any(isinstance(self.folded[d.name], torch.Tensor) and self.folded[d.name].device.type == "meta"
               for d in deps):
            return False  # a meta buffer: nothing to compute with

        def val(a: Any) -> Any:
            if isinstance(a, fx.Node):
                return self.folded[a.name]
            return torch.device("cpu") if isinstance(a, torch.device) else a

        args: Any = fx.node.map_aggregate(node.args, val)
        kwargs: Any = fx.node.map_aggregate(dict(node.kwargs), val)
        folded, out = fold_call(target, _callable(target), args, kwargs)
        if folded:
            self.folded[node.name] = out
        return folded


def _callable(target: Any) -> Any:
    return AtenCall(aten_name(target)) if isinstance(target, torch._ops.OpOverload) else target


def val_of(a: object, node: fx.Node) -> Any:
    """The fake value export recorded for argument `a` of `node` (a node)."""
    return node_of(a, node).meta["val"]
