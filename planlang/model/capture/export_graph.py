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

import contextlib
import functools
import operator
from typing import Any, Callable, Iterator

import torch
import torch.fx.config
from torch import fx, nn

from planlang.model.capture import aten_readers
from planlang.model.capture.aten_readers import causal_mask, keeps_all  # noqa: F401 - part of this module's API
from planlang.model.capture.export_builder import AtenCall, ExportBuilder, StepSignature, aten_name
from planlang.model.capture.fx_builder import node_of
from planlang.model.capture.graph_values import (
    OpGraph, UnsupportedGraph, keyword_inputs, loss_step, rename_inputs, step_input_names,
)
from planlang.model.capture.targets import ATEN_IDENTITY, COMPOSITE, TargetIndex, resolve, target_index

__all__ = ["AtenCall", "causal_mask", "export_op_graph", "export_step", "inline_wrappers", "keeps_all",
           "lower_export", "rules"]

aten = torch.ops.aten
Rule = Callable[[ExportBuilder, fx.Node], bool]


# ------------------------------------------------------------------------------ capture
def export_step(model: nn.Module, inputs: dict[str, torch.Tensor], loss_fn: Callable | None,
                targets: tuple[torch.Tensor, ...], outputs: bool = False) -> tuple[torch.export.ExportedProgram, nn.Module]:
    """torch.export of the model (with its loss when given) and the module exported (`outputs`:
    graph_values.loss_step's)."""
    names = keyword_inputs(model, list(inputs))
    root = loss_step(model, loss_fn, names or len(inputs), outputs) if loss_fn is not None or names else model
    dev = next((p.device for p in model.parameters()), torch.device("cpu"))
    # fresh tensors on the model's device: export works on fakes of them (nothing is read), and two
    # arguments that are one tensor (an LM's input and its target) would be traced as one input
    args = tuple(torch.zeros(t.shape, dtype=t.dtype, device=dev) for t in [*inputs.values(), *targets])
    try:
        with _no_stack_traces():
            return torch.export.export(root, args, strict=False), root
    except Exception as e:  # noqa: BLE001 - report the export failure as one located error
        raise UnsupportedGraph(f"torch.export failed on {type(model).__name__}: {type(e).__name__}: "
                               f"{str(e).splitlines()[0] if str(e) else ''}") from e


@contextlib.contextmanager
def _no_stack_traces() -> Iterator[None]:
    """torch.fx's tracers record no Python stack per node (torch.fx.config.do_not_emit_stack_traces), which
    nothing here reads: a traceback extracted and symbolized for each of the export's nodes was ~0.1 of
    the ~0.4 CPU-s of exporting Llama-3-8B's three blocks and loss (once torch.export has loaded)."""
    was = torch.fx.config.do_not_emit_stack_traces
    torch.fx.config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        torch.fx.config.do_not_emit_stack_traces = was


def export_op_graph(model: nn.Module, inputs: dict[str, torch.Tensor], loss_fn: Callable | None = None,
                    targets: tuple[torch.Tensor, ...] = (), outputs: bool = False) -> OpGraph:
    """The op graph of `model` (and `loss_fn(output, *targets)`) from torch.export; input Values carry
    the plan's input names and `target`/`targetN`, as planlang.model.capture.opgraph.op_graph names them.
    `outputs`: the loss then the output's tensor leaves (op_graph's)."""
    ep, root = export_step(model, inputs, loss_fn, targets, outputs)
    inline_wrappers(ep.graph_module)
    g = lower_export(ep.graph, StepSignature.of(ep), root, model, list(inputs), len(targets))
    g.output_tree = getattr(root, "output_tree", None) if outputs else None
    return g


def lower_export(graph: fx.Graph, sig: StepSignature, root: nn.Module, model: nn.Module, inputs: list[str],
                 n_targets: int) -> OpGraph:
    """The op graph of an exported step's graph (wrappers inlined) whose placeholders `sig` names; `root`
    is the module exported (`model`, or the step wrapping it with its loss)."""
    prefix = "model" if root is not model else ""
    b = ExportBuilder(sig, root, prefix, training=model.training)
    table = rules(target_index())
    for node in graph.nodes:
        try:
            _lower(b, node, table)
        except UnsupportedGraph:
            raise
        except Exception as e:  # noqa: BLE001 - name the node that could not be lowered
            raise UnsupportedGraph(f"cannot lower `{node.format_node()}` (torch.export graph): {e}") from e
    outs = tuple(b.env[o] for o in b.user_outputs if o in b.env)
    if not outs:
        raise UnsupportedGraph("the exported step has no tensor output computed from the inputs")
    g = OpGraph(b.values, b.nodes, outs, b.consts)
    names = step_input_names(inputs, n_targets)
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
            grad, sub, args = node.args[0], node_of(node.args[1], node), node.args[2:]
        else:
            if node.args[2]:
                raise UnsupportedGraph(f"{node.format_node()}: an enabled torch.autocast region inside the "
                                       "model; planlang runs the plan's dtypes, not autocast")
            grad, sub, args = True, node_of(node.args[4], node), node.args[5:]
        body = getattr(gm, str(sub.target))
        phs = [n for n in body.graph.nodes if n.op == "placeholder"]
        with graph.inserting_before(node):
            copied: Any = graph.graph_copy(body.graph, dict(zip(phs, args)), return_output_node=False)
            outs = list(copied) if isinstance(copied, (tuple, list)) else [copied]
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
            k = user.args[1]
            if not isinstance(k, int):
                raise UnsupportedGraph(f"{user.format_node()}: a wrapped region's output taken by {k!r}")
            user.replace_all_uses_with(outs[k])
            graph.erase_node(user)
        graph.erase_node(node)
        if not sub.users:
            graph.erase_node(sub)


# ------------------------------------------------------------------------------ rules: the op table's ATen targets
def _bind(reader: aten_readers.Reader, kind: str) -> Rule:
    return lambda b, node: reader(b, node, kind)


@functools.lru_cache(maxsize=8)
def rules(index: TargetIndex) -> dict[Any, Rule]:
    """ATen overload -> how to lower it (False: an opaque call), from the op table's `aten` targets
    (`index`: the registry's, planlang.model.capture.targets.target_index()) and aten_readers, with the
    identities and composites of planlang.model.capture.targets."""
    out: dict[Any, Rule] = {}
    for name, kind in index.names.items():
        if name.startswith("aten."):
            reader = aten_readers.TARGET_READERS.get(name) or aten_readers.READERS.get(kind, aten_readers.read_plain)
            out[resolve(name)] = _bind(reader, kind)
    for name in ATEN_IDENTITY:
        out[resolve(name)] = aten_readers.IDENTITY_READER
    for name, read in aten_readers.COMPOSITE_READERS.items():
        if name in COMPOSITE:
            out[resolve(name)] = read
    return out



# ------------------------------------------------------------------------------ lowering nodes
def _lower(b: ExportBuilder, node: fx.Node, table: dict[Any, Rule]) -> None:
    if node.op == "placeholder":
        b.placeholder(node)
    elif node.op == "call_function":
        if not b.fold(node):
            _call(b, node, table)
    elif node.op in ("output",):
        return
    else:
        raise UnsupportedGraph(f"{node.format_node()}: {node.op} nodes are not supported")


def _call(b: ExportBuilder, node: fx.Node, table: dict[Any, Rule]) -> None:
    t = node.target
    val = node.meta.get("val")
    if t is operator.getitem:
        _getitem(b, node)
        return
    if val is None:  # shape/dtype assertions: nothing to run
        return
    if isinstance(t, torch._ops.OpOverload):
        rule = table.get(t)
        if rule is not None and rule(b, node):
            return
        if isinstance(val, (tuple, list)):
            b.multi[node.name] = node
            return
        b.opaque(node)
        return
    raise UnsupportedGraph(f"{node.format_node()}: {t} is not an ATen op (higher-order ops are not supported)")


def _getitem(b: ExportBuilder, node: fx.Node) -> None:
    src, idx = node_of(node.args[0], node), node.args[1]
    if not isinstance(idx, int):
        raise UnsupportedGraph(f"{node.format_node()}: an index that is not an integer")
    if src.name in b.pieces:
        aten_readers.piece(b, node, b.pieces[src.name], idx)
    elif src.name in b.multi:
        orig = b.multi[src.name]
        b.opaque(node, AtenCall(aten_name(orig.target), idx), src=orig)
    else:
        raise UnsupportedGraph(f"{node.format_node()}: indexing a value that is not a tuple of tensors")
