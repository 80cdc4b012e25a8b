"""What the plan needs to know about a model, found on the meta device without allocating it.

`probe_modules` runs the model on meta inputs with forward hooks: the execution order of modules, the
shapes their forward receives and returns (a model whose blocks fold runs cut to a few of them:
planlang.model.capture.fold_probe). `trace_graph` builds the op-level torch.fx graph with
module paths on every node (torch.fx.symbolic_trace; torch.export for models symbolic tracing cannot
handle, such as Hugging Face transformers), with shapes propagated from the declared inputs.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx as fx
from torch.fx.passes.shape_prop import ShapeProp
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils._pytree import tree_flatten

from .fold import Fold
from .fold_probe import folded_run
from .quiet_logs import install as _quiet_kernel_failures
from .valueless import run_without_values

_quiet_kernel_failures()  # torch's tracebacks of the fake-tensor tries that fail by design (quiet_logs)


def _shape(x) -> tuple[int, ...] | None:
    return tuple(x.shape) if isinstance(x, torch.Tensor) else None


def bind_inputs(module: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> tuple[tuple, dict]:
    """(args, kwargs) for `module.forward`: by parameter name when the plan's input names match the
    forward's parameters, else positionally in declaration order."""
    try:
        params = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        params = []
    if inputs and all(n in params for n in inputs):
        return (), dict(inputs)
    return tuple(inputs.values()), {}


@dataclass
class ModuleCall:
    path: str  # qualified name ("" for the root)
    type: str
    inputs: tuple[tuple[int, ...] | None, ...]
    output: tuple[int, ...] | None
    outputs: tuple[tuple[int, ...] | None, ...] = ()
    keywords: tuple[str, ...] = ()  # the keyword arguments it was called with (HF layers: attention_mask=...)


@dataclass
class ModuleFacts:
    """Module-level facts: execution order, call shapes, parameters and which of them are shared."""

    order: list[str]  # modules in the order their forward first starts (root excluded)
    calls: dict[str, ModuleCall]
    params: dict[str, tuple[tuple[int, ...], str]]  # every parameter name (aliases included) -> shape, dtype
    shared: list[tuple[str, ...]] = field(default_factory=list)  # names of one shared parameter
    all_modules: list[str] = field(default_factory=list)  # named_modules() order, root excluded
    batch_norms: list[str] = field(default_factory=list)  # BatchNorm modules (statistics over the batch)
    blocks: list[str] = field(default_factory=list)  # repeated blocks (`module_list_blocks`): ZeRO-2/3 units

    def canonical(self, name: str) -> str:
        for group in self.shared:
            if name in group:
                return group[0]
        return name


@dataclass
class Run:
    """One forward of a model with every module's first call recorded (`record_run`)."""

    order: list[str]
    calls: dict[str, ModuleCall]
    output: Any  # what the forward returned
    how: str  # how it ran without values: "meta", "traced" or "fake" (valueless.run_without_values)
    fold: Fold | None = None  # the run was of the model cut to FOLD_RUNS[0] of these blocks (`probe_run`)
    whole: str = ""  # why `probe_run` ran the whole model (no fold, or the cut runs disagreed)


def record_run(module: torch.nn.Module, inputs: dict[str, torch.Tensor],
               before: Callable[[], None] | None = None) -> Run:
    """Run the model once (meta tensors: no compute, no memory) and record every module's first call;
    `before()` is called before each try (valueless.run_without_values)."""
    names = {id(m): n for n, m in module.named_modules(remove_duplicate=False)}
    calls: dict[str, ModuleCall] = {}
    order: list[str] = []
    handles = []

    def pre(mod, args, kwargs):
        name = names.get(id(mod), "")
        if name and name not in calls:
            order.append(name)
            calls[name] = ModuleCall(name, type(mod).__name__, tuple(_shape(a) for a in tree_flatten(args)[0]), None,
                                     keywords=tuple(kwargs))

    def post(mod, args, out):
        name = names.get(id(mod), "")
        call = calls.get(name)
        if call is not None and call.output is None:
            flat = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
            call.outputs = tuple(_shape(o) for o in flat)
            call.output = call.outputs[0] if call.outputs else None

    for m in {id(m): m for m in module.modules()}.values():
        handles.append(m.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(m.register_forward_hook(post))
    def run():
        calls.clear()
        order.clear()
        if before is not None:
            before()
        args, kwargs = bind_inputs(module, inputs)
        with torch.no_grad():
            return module(*args, **kwargs)

    try:
        out, how = run_without_values(run)
    finally:
        for h in handles:
            h.remove()
    return Run(order, calls, out, how)


def probe_modules(module: torch.nn.Module, inputs: dict[str, torch.Tensor], fold: bool = True) -> ModuleFacts:
    """Run the model (meta tensors: no compute, no memory) and record every module call; a model on meta
    whose blocks fold runs cut to a few of them (`probe_run`)."""
    return probe_run(module, inputs, fold)[0]


def probe_run(module: torch.nn.Module, inputs: dict[str, torch.Tensor],
              fold: bool = True) -> tuple[ModuleFacts, Run]:
    """`probe_modules`' facts and the run they were recorded from. With `fold`, a model whose parameters
    and inputs are on meta (a run changes no state) and whose blocks fold runs cut to FOLD_RUNS' counts
    (planlang.model.capture.fold_probe; the facts are the whole model's), and the run returned is the one
    at FOLD_RUNS[0] blocks, whose output has the whole model's structure and shapes."""
    got, why = None, "not folded (fold=False)" if not fold else "not on meta"
    if fold and _on_meta(module, inputs):
        got, why = folded_run(module, inputs, record_run)
    if got is not None:
        order, calls, run, blocks = got
        run = Run(run.order, run.calls, run.output, run.how, blocks)
    else:
        run = record_run(module, inputs)
        run.whole = why
        order, calls = run.order, run.calls
    return module_facts(module, order, calls), run


def _on_meta(module: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> bool:
    tensors = [*module.parameters(), *module.buffers(), *inputs.values()]
    return all(t.device.type == "meta" for t in tensors)


def module_facts(module: torch.nn.Module, order: list[str], calls: dict[str, ModuleCall]) -> ModuleFacts:
    """The probed `order` and `calls` with what the module objects say (parameters, sharing, blocks)."""
    params: dict[str, tuple[tuple[int, ...], str]] = {}
    by_id: dict[int, list[str]] = {}
    for n, p in module.named_parameters(remove_duplicate=False):
        params[n] = (tuple(p.shape), str(p.dtype).replace("torch.", ""))
        by_id.setdefault(id(p), []).append(n)
    shared = [tuple(v) for v in by_id.values() if len(v) > 1]
    all_modules = [n for n, _ in module.named_modules(remove_duplicate=False) if n]
    batch_norms = [n for n, m in module.named_modules() if n and isinstance(m, _BatchNorm)]
    return ModuleFacts(order, calls, params, shared, all_modules, batch_norms, module_list_blocks(module))


def module_list_blocks(module: torch.nn.Module) -> list[str]:
    """The model's repeated blocks: every entry of an nn.ModuleList not inside another such entry
    (GPT-2's `h.0`, Llama's `model.layers.0`; what a plan's `for` loops over). The planlang runtime
    shards each as its own FSDP2 unit under ZeRO-2/3 (planlang.runtime.zero_blocks), the estimator
    prices ZeRO-3's gathered parameters per block."""
    names = [f"{n}.{i}" if n else str(i) for n, m in module.named_modules()
             if isinstance(m, torch.nn.ModuleList) for i in range(len(m))]
    return [n for n in names if not any(n.startswith(o + ".") for o in names if o != n)]


@dataclass
class NodeInfo:
    name: str
    op: str
    target: str
    module: str  # innermost module path the node runs in ("" at the top level)
    shape: tuple[int, ...] | None
    dtype: str | None
    args: tuple[str, ...] = ()  # names of the input nodes


@dataclass
class GraphFacts:
    method: str  # "symbolic_trace" or "export"
    nodes: list[NodeInfo]
    graph_module: fx.GraphModule | None = None


def _module_of(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return node.target if node.op == "call_module" else ""  # type: ignore[return-value]
    path = list(stack.values())[-1][0]
    if node.op == "call_module":
        return str(node.target)
    return _clean_export_path(str(path))


def _clean_export_path(path: str) -> str:
    # torch.export writes `L['self'].h[0].attn` style paths in some versions and `h.0.attn` in others
    path = path.replace("L['self'].", "").replace("L['self']", "")
    out = []
    for part in path.replace("[", ".").replace("]", "").split("."):
        if part:
            out.append(part)
    return ".".join(out)


def trace_graph(module: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> GraphFacts:
    """The op graph with module paths and output shapes. symbolic_trace first, torch.export if it fails."""

    args, kwargs = bind_inputs(module, inputs)
    try:
        if kwargs:
            gm = fx.symbolic_trace(module, concrete_args=None)
            ShapeProp(gm).propagate(*[kwargs[n.target] for n in gm.graph.nodes if n.op == "placeholder"])
        else:
            gm = fx.symbolic_trace(module)
            ShapeProp(gm).propagate(*args)
        method = "symbolic_trace"
    except Exception:  # noqa: BLE001 - any tracing failure falls back to export
        ep = torch.export.export(module, args, kwargs, strict=False)
        gm = ep.module()
        method = "export"
    nodes = []
    for n in gm.graph.nodes:
        tm = n.meta.get("tensor_meta") or n.meta.get("val")
        shape = dtype = None
        if hasattr(tm, "shape"):
            shape, dtype = tuple(int(s) for s in tm.shape), str(tm.dtype).replace("torch.", "")
        target = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", str(n.target))
        nodes.append(NodeInfo(n.name, n.op, str(target), _module_of(n), shape, dtype,
                              tuple(a.name for a in n.all_input_nodes)))
    return GraphFacts(method, nodes, gm)
