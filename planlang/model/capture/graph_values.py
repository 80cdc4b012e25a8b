"""The values of an op graph (planlang.model.capture.opgraph builds it from torch.fx, planlang.model.capture.export_graph
from torch.export): tensors, op nodes, opaque calls, the graph, and the model-with-loss module both
front ends trace. A module of its own so that the two front ends share it without importing each other."""
from __future__ import annotations

import importlib
import inspect
import pickle
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx
from torch import nn
from torch.utils._pytree import tree_flatten

from planlang.cost.ops import op_kind
from planlang.cost.ops.base import OpSpec

DTYPES = {torch.float32: "f32", torch.float64: "f64", torch.bfloat16: "bf16", torch.float16: "f16",
          torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
          torch.bool: "bool"}


def dtype_name(dt: torch.dtype) -> str:
    return DTYPES.get(dt, str(dt).replace("torch.", ""))


def op_spec(kind: str, inputs: list["Value"], out: torch.Tensor, attrs: dict | None) -> OpSpec:
    """The OpSpec a front end emits: a kind of the op registry (planlang.cost.ops) or an opaque call. A
    front end that maps a torch op onto a kind without rule, facts and local implementation fails here,
    at trace time, not in the solver or on the first rank that runs it."""
    if kind != "opaque":
        op_kind(kind)
    return OpSpec(kind, tuple(v.shape for v in inputs), tuple(int(s) for s in out.shape), dtype_name(out.dtype),
                  tuple(sorted((attrs or {}).items())), tuple(v.dtype for v in inputs))


@dataclass(frozen=True)
class Value:
    """One tensor of the step."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: str  # "input" | "param" | "const" | "op"
    module: str = ""
    ref: str = ""  # parameter FQN, input name, or buffer FQN

    def __str__(self) -> str:
        return f"{self.name}: {self.dtype}{list(self.shape)} ({self.kind}{' ' + self.ref if self.ref else ''})"


@dataclass(frozen=True)
class OpNode:
    """One op: produces the Value of the same name from `inputs` (Value names, one per `op.inputs`)."""

    name: str
    module: str
    op: OpSpec
    inputs: tuple[str, ...]
    # how to run an "opaque" op: the original fx call with tensor arguments replaced by positions
    call: "OpaqueCall | None" = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        return f"{self.name} = {self.op.kind}({', '.join(self.inputs)})  # {list(self.op.output)}"


@dataclass(frozen=True)
class OpaqueCall:
    """An fx call (`op` is call_function/call_method/call_module) with its arguments, where tensor
    arguments are `TensorArg(i)` placeholders for the i-th input Value."""

    op: str
    target: Any
    args: tuple
    kwargs: tuple[tuple[str, Any], ...]

    def __reduce__(self):
        # rank 0 sends the lowered program to the others (pickle): a function pickle cannot name by its
        # qualified name (torch's boolean_dispatch wrappers such as F.max_pool2d are local closures) goes
        # by the public name its module exports it under
        return (_opaque_call, (self.op, _by_name(self.target), self.args, self.kwargs))


def _by_name(target):
    try:
        pickle.dumps(target)
        return target
    except Exception:  # noqa: BLE001 - any pickling failure: try the module's public name
        module, name = getattr(target, "__module__", None), getattr(target, "__name__", None)
        if module and name and getattr(importlib.import_module(module), name, None) is target:
            return _Named(module, name)
        raise


@dataclass(frozen=True)
class _Named:
    module: str
    name: str


def _opaque_call(op, target, args, kwargs) -> OpaqueCall:
    if isinstance(target, _Named):
        target = getattr(importlib.import_module(target.module), target.name)
    return OpaqueCall(op, target, args, kwargs)


@dataclass(frozen=True)
class TensorArg:
    index: int


@dataclass
class OpGraph:
    values: dict[str, Value]
    nodes: list[OpNode]  # topological order
    outputs: tuple[str, ...]
    consts: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)  # const Value name -> tensor
    # captured with the model's output (`loss_step(outputs=True)`): `outputs` is the loss then the output's
    # tensor leaves, and this says how they build the output (planlang.runtime.call_outputs.OutputTree)
    output_tree: Any = field(default=None, repr=False)

    def consumers(self, value: str) -> list[tuple[OpNode, int]]:
        return [(n, i) for n in self.nodes for i, v in enumerate(n.inputs) if v == value]

    def params(self) -> list[Value]:
        return [v for v in self.values.values() if v.kind == "param"]

    def module_outputs(self) -> dict[str, str]:
        """Module path -> the Value its call returns (the last op inside it, in execution order)."""
        out: dict[str, str] = {}
        for n in self.nodes:
            parts = n.module.split(".") if n.module else []
            for k in range(1, len(parts) + 1):
                out[".".join(parts[:k])] = n.name
        return out

    def node(self, name: str) -> OpNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def __str__(self) -> str:
        return "\n".join(str(n) for n in self.nodes)


class UnsupportedGraph(ValueError):
    """The model's forward cannot be turned into an op graph (the message says what and where)."""



# ------------------------------------------------------------------------------ the model's output
@dataclass(frozen=True)
class OutputTree:
    """How the model's output is built from its tensor leaves: the pytree spec of the whole output and
    its non-tensor leaves (None where a tensor goes, in the order the program returns them)."""

    spec: Any  # torch.utils._pytree.TreeSpec
    template: tuple[Any, ...]

    @property
    def n_tensors(self) -> int:
        return sum(1 for x in self.template if x is None)


def flatten_output(out: Any) -> tuple[list[Any], OutputTree]:
    """The tensor leaves of a model's output (tensors or fx proxies: anything with a shape and dtype)
    and its OutputTree (ModelOutput and dict keys, tuple positions: torch's pytree)."""
    leaves, spec = tree_flatten(out)
    tensors = [x for x in leaves if _tensor_like(x)]
    return tensors, OutputTree(spec, tuple(None if _tensor_like(x) else x for x in leaves))


def _tensor_like(x: Any) -> bool:
    return isinstance(x, (torch.Tensor, torch.fx.Proxy))


# ------------------------------------------------------------------------------ the model with its loss
class LossStep(nn.Module):
    """The model and its loss as one module, so they trace as one graph."""

    def __init__(self, model: nn.Module, loss_fn: Callable) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    # the output structures `with_outputs` saw, on the generated class (torch.export may trace a copy of
    # the module, whose attributes the caller never sees)
    _trees: list[OutputTree] = []

    @property
    def output_tree(self) -> OutputTree | None:
        return self._trees[-1] if self._trees else None

    def with_outputs(self, loss, out) -> tuple:
        """The loss then the output's tensor leaves (fx proxies or fakes while traced), the output's
        structure kept in `output_tree` (the runtime rebuilds the model's output from the leaves)."""
        leaves, tree = flatten_output(out)
        self._trees.append(tree)
        return (loss, *leaves)


def loss_step(model: nn.Module, loss_fn: Callable | None, inputs: int | list[str], outputs: bool = False) -> nn.Module:
    """A `LossStep` whose forward takes the inputs then the loss' targets as named arguments (fx cannot
    trace *args). `inputs`: how many, passed to the model positionally, or the plan's input names when
    the model takes them by name (`keyword_inputs`: T5's `decoder_input_ids` is not its second
    parameter). Without a loss the step returns the model's output. `outputs`: the step returns the
    loss then the tensor leaves of the model's output (`LossStep.with_outputs`; needs a loss)."""
    names = inputs if isinstance(inputs, list) else []
    ins = [f"arg{i}" for i in range(len(inputs) if isinstance(inputs, list) else inputs)]
    tgts = [f"target{i}" for i in range(n_targets(loss_fn))] if loss_fn is not None else []
    call = f"self.model({', '.join(f'{n}={a}' for n, a in zip(names, ins)) if names else ', '.join(ins)})"
    body = f"self.loss_fn({call}, {', '.join(tgts)})" if loss_fn is not None else call
    src = f"def forward(self, {', '.join(ins + tgts)}):\n    return {body}\n"
    if outputs and loss_fn is not None:
        src = (f"def forward(self, {', '.join(ins + tgts)}):\n    out = {call}\n"
               f"    return self.with_outputs(self.loss_fn(out, {', '.join(tgts)}), out)\n")
    scope: dict = {}
    exec(compile(src, "<planlang loss step>", "exec"), scope)  # noqa: S102 - generated from names and counts
    cls = type("LossStep", (LossStep,), {"forward": scope["forward"], "_trees": []})
    return cls(model, loss_fn)


def keyword_inputs(model: nn.Module, names: list[str]) -> list[str] | None:
    """The plan's input names when the model must receive them by name: every one names a parameter of
    its forward, in another order than the forward's first parameters (else None: positional)."""
    try:
        params = list(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return None
    if names and all(n in params for n in names) and params[:len(names)] != list(names):
        return list(names)
    return None


def n_targets(loss_fn: Callable) -> int:
    """How many targets `loss_fn(output, *targets)` takes (its positional parameters without defaults, less one)."""
    try:
        params = list(inspect.signature(loss_fn).parameters.values())
    except (TypeError, ValueError):
        return 1
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
    return max(len(positional) - 1, 0)



def step_input_names(inputs: list[str], n_targets: int) -> list[str]:
    """The names of a step's input Values: the plan's inputs, then the loss' targets (`target`, or
    `target0`, `target1`, ...), each target name given `_` until it is no input's (a plan may name an input
    `target`: the two must stay two values)."""
    out = list(inputs)
    for i in range(n_targets):
        name = "target" if n_targets == 1 else f"target{i}"
        while name in out:
            name += "_"
        out.append(name)
    return out


def rename_inputs(g: OpGraph, renames: dict[str, str]) -> OpGraph:
    if all(k == v for k, v in renames.items()):
        return g
    if len(set(renames.values())) != len(renames):  # two values under one name would become one
        raise ValueError(f"inputs renamed onto one name: {renames}")
    clash = set(renames.values()) & (set(g.values) - set(renames))
    if clash:
        renames = {k: v + "_in" if v in clash else v for k, v in renames.items()}

    def r(n: str) -> str:
        return renames.get(n, n)

    values = {}
    for k, v in g.values.items():
        nv = Value(r(v.name), v.shape, v.dtype, v.kind, v.module, r(v.ref) if v.kind == "input" else v.ref)
        values[r(k)] = nv
    nodes = [OpNode(n.name, n.module, n.op, tuple(r(i) for i in n.inputs), n.call) for n in g.nodes]
    return OpGraph(values, nodes, tuple(r(o) for o in g.outputs), g.consts, g.output_tree)
