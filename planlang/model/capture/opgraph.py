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

Which op a call becomes is looked up in the op table (planlang.cost.ops: each kind's `targets`, resolved
by planlang.model.capture.targets), and how it reads its arguments in planlang.model.capture.fx_readers;
`_lower_node` itself handles only what is no op: placeholders, attributes, static values, indexing and
identities.
"""
from __future__ import annotations

import operator
from typing import Callable

import torch
from torch import fx, nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.shape_prop import ShapeProp

from planlang.model.capture import fx_readers
from planlang.model.capture.export_graph import export_op_graph
from planlang.model.capture.fx_builder import FxBuilder, fetch_attr, node_of, strip
from planlang.model.capture.graph_values import (  # noqa: F401 - the graph's value types are part of this module's API
    DTYPES, OpaqueCall, OpGraph, OpNode, TensorArg, UnsupportedGraph, Value, dtype_name, keyword_inputs, loss_step,
    op_spec, rename_inputs, step_input_names,
)
from planlang.model.capture.targets import COMPOSITE, FX_IDENTITY, TargetIndex, resolve, target_index


# ------------------------------------------------------------------------------ tracing
def trace(model: nn.Module, loss_fn: Callable | None = None, inputs: int | list[str] = 1,
          outputs: bool = False) -> fx.GraphModule:
    """symbolic_trace the model (with its loss when given). Raises UnsupportedGraph with the reason.
    `inputs`: how many, or the names the model takes them by (graph_values.keyword_inputs); `outputs`:
    the step returns the model's output leaves after the loss (graph_values.loss_step)."""
    root = loss_step(model, loss_fn, inputs, outputs) if loss_fn is not None or isinstance(inputs, list) else model
    try:
        gm = fx.symbolic_trace(root)
        setattr(gm, "output_tree", getattr(root, "output_tree", None))  # noqa: B010 - not a module attribute
        return gm
    except Exception as e:  # noqa: BLE001 - report any tracing failure as one located error
        raise UnsupportedGraph(f"torch.fx.symbolic_trace failed on {type(model).__name__}: {e}") from e


# ------------------------------------------------------------------------------ building the graph
_IDENTITY_MODULES = tuple(resolve(n) for n in FX_IDENTITY if not n.startswith("Tensor."))
_IDENTITY_METHODS = tuple(n.removeprefix("Tensor.") for n in FX_IDENTITY if n.startswith("Tensor."))
_COMPOSITE = {resolve(n): r for n, r in fx_readers.COMPOSITE_READERS.items() if n in COMPOSITE}


def _kind(index: TargetIndex, b: FxBuilder, node: fx.Node) -> str | None:
    """The op kind the table gives the call `node` (None: no kind has its target)."""
    if node.op == "call_function":
        return index.function(node.target)
    if node.op == "call_method":
        return index.methods.get(str(node.target))
    if node.op == "call_module":
        return index.module(b.gm.get_submodule(str(node.target)))
    return None


def _lower_node(b: FxBuilder, node: fx.Node, index: TargetIndex) -> None:
    op, target = node.op, node.target
    tm = b.meta(node)
    is_tensor = isinstance(tm, torch.Tensor) or hasattr(tm, "shape") and hasattr(tm, "dtype")
    if op == "placeholder":
        if not is_tensor:
            raise UnsupportedGraph(f"input {node.name} has no tensor shape (give it in the plan's `input`)")
        b.set(node, b.add_value(node.name, tm, "input", ref=node.name))
        return
    if op == "output":
        return
    if op == "get_attr":
        t = fetch_attr(b.gm, str(target))
        if isinstance(t, nn.Parameter):
            b.set(node, b.param(str(target), t))
        elif isinstance(t, torch.Tensor):
            b.set(node, b.const(strip(str(target), b.prefix).replace(".", "_"), t))
        else:
            b.static_values[node.name] = t
        return
    kind = _kind(index, b, node)
    if not is_tensor and kind != "split":  # static (non-tensor) values; chunk/split: a tuple of pieces
        b.static_values[node.name] = b.static_value(node)
        return
    if op == "call_module":
        mod = b.gm.get_submodule(str(target))
        if type(mod) in _IDENTITY_MODULES:
            b.set(node, b.env[node_of(node.args[0], node).name])
        elif kind is None or not fx_readers.MODULE_READERS.get(kind, fx_readers.read_plain_module)(b, node, kind, mod):
            b.set(node, b.opaque_module(node, mod))
        return
    if op == "call_function" and target is operator.getitem:
        fx_readers.getitem(b, node)
    elif op == "call_method" and target in _IDENTITY_METHODS:
        b.set(node, b.env[node_of(node.args[0], node).name])
    elif kind is not None:
        if not fx_readers.READERS.get(kind, fx_readers.read_plain)(b, node, kind):
            b.set(node, b.opaque(node))
    elif not (op == "call_function" and target in _COMPOSITE and _COMPOSITE[target](b, node)):
        b.set(node, b.opaque(node))


def propagate(gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> None:
    """Shape-propagate `gm` on `example_inputs` (meta tensors are fine): each node's `tensor_meta`."""
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


def build_op_graph(gm: fx.GraphModule, example_inputs: list[torch.Tensor], prefix: str = "",
                   training: bool = True, propagated: bool = False) -> OpGraph:
    """Shape-propagate `gm` on `example_inputs` (unless `propagated`: its nodes hold their `tensor_meta`
    already) and lower every node, looking calls up in the op registry as it is now."""
    if not propagated:
        propagate(gm, example_inputs)
    b = FxBuilder(gm, prefix, training)
    index = target_index()
    for node in gm.graph.nodes:
        try:
            _lower_node(b, node, index)
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
             targets: tuple[torch.Tensor, ...] = (), outputs: bool = False) -> OpGraph:
    """The op graph of `model` (and `loss_fn(output, *targets)` when given) for `inputs` (meta ok).
    Models symbolic tracing refuses (Hugging Face transformers) are captured with torch.export instead
    (planlang.model.capture.export_graph). `outputs` (with a loss): the graph's outputs are the loss then
    the model output's tensor leaves, `output_tree` how they build it (`pm(...)`'s program)."""
    try:
        gm = trace(model, loss_fn, keyword_inputs(model, list(inputs)) or len(inputs), outputs)
    except UnsupportedGraph as traced:
        try:
            return export_op_graph(model, inputs, loss_fn, targets, outputs)
        except UnsupportedGraph as exported:
            raise UnsupportedGraph(f"{traced}; {exported}") from exported
    g = build_op_graph(gm, list(inputs.values()) + list(targets), step_prefix(model, loss_fn, list(inputs)),
                       training=model.training)
    return named_inputs(g, gm, list(inputs), len(targets))


def step_prefix(model: nn.Module, loss_fn: Callable | None, inputs: list[str]) -> str:
    """The path of the model in the traced step's root: "model" when `trace` wraps it (a loss, or
    inputs by name), else "" (the model is the root)."""
    return "model" if loss_fn is not None or keyword_inputs(model, inputs) else ""


def named_inputs(g: OpGraph, gm: fx.GraphModule, inputs: list[str], n_targets: int) -> OpGraph:
    """`g` (lowered from `gm`) with its input Values named after the plan's inputs and the targets, and
    the step's output tree."""
    renames = {}
    ph = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    for fx_name, plan_name in zip(ph, step_input_names(inputs, n_targets)):
        renames[fx_name] = plan_name
    g.output_tree = getattr(gm, "output_tree", None)
    return rename_inputs(g, renames)
