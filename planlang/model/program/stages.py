"""Cutting a model into the plan's pipeline stages with torch.fx.

`split_stages(model, plan)` returns one `fx.GraphModule` per `stage` of the plan's pipeline, in order.
Stage i runs exactly the modules its selections name, in the model's execution order; its forward takes
the values the previous stage returns (stage 0 takes the model's inputs) and returns what later stages
need (the last stage returns the model's output). So stage modules compose:
`stages[2](*stages[1](*stages[0](x)))` equals `model(x)`.

How the cut is made:

- The model is traced with a tracer whose leaves are the modules the stages select (the outermost
  selected ones): a selected module runs its own eager forward inside its stage, so its internals need
  not be traceable and a later rewrite of it (tensor parallelism) sees the original module object.
  Modules above the selected ones (the root, a block whose children are split between stages) are
  traced through; their own operations ("glue") are placed by data flow: with their latest producer,
  or, when computed from the model's inputs only (`pos = arange(idx.size(1))`), recomputed in each
  stage that uses them, so that no plain Python value (an int from `.size()`) has to cross a stage
  boundary — torch's pipeline stages send tensors only.
- A value a later stage needs is passed through every stage in between (skip connections, an input
  the last stage reads). Non-first stages receive positionally what the previous stage returned.
- Parameters keep their original fully qualified names: each stage is a `GraphModule` over the
  original model, which copies the referenced submodules *by reference* under their original paths,
  so `stage.named_parameters()` gives `h.3.attn.c_attn.weight`, and the parameter objects are the
  model's own. `param_fqns(stage)` states this mapping (stage-local name -> model name, the identity).

Errors are `StageSplitError`s with the checker's code for the same problem where one exists (PL360
unknown path, PL460 coverage, PL461 overlap, PL462 order), a message naming the
cause and a `help` naming the fix.
"""
from __future__ import annotations

import inspect
import warnings
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Sequence

import torch
import torch.fx as fx
from torch import nn

from torch.utils._pytree import tree_flatten

if TYPE_CHECKING:
    from torch.distributed.pipelining import Pipe

from planlang.plan.complete import CompletePlan
from planlang.plan.data import batch_dim, data_degree
from planlang.plan.selection import Selection, stage_targets

from planlang.model.capture.load import TORCH_DTYPES
from planlang.model.capture.graph_values import keyword_inputs
from planlang.model.capture.trace import probe_modules
from planlang.model.capture.valueless import meta_or_fake


class StageSplitError(ValueError):
    """The plan's stages cannot be cut out of the model. `code` is the checker's code for the same
    problem when there is one (PL360, PL460, PL461, PL462), else None. `untraceable`: torch.fx
    could not trace the model between the stage modules (the cut is then made from torch.export)."""

    def __init__(self, message: str, help: str, code: str | None = None, untraceable: bool = False) -> None:
        self.code, self.message, self.help, self.untraceable = code, message, help, untraceable
        super().__init__(f"{code + ': ' if code else ''}{message} (help: {help})")


def plan_name(name: str) -> str:
    """`h.0.attn` -> `h[0].attn`, how plans write container children."""
    out: list[str] = []
    for part in name.split("."):
        out.append(f"[{part}]" if part.isdigit() else ("." if out else "") + part)
    return "".join(out)


@dataclass(frozen=True)
class StageValues:
    """What crosses into and out of one stage: node names of the traced model, in order."""

    index: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]  # for the last stage: the values the model returns

    def __str__(self) -> str:
        return f"stage {self.index}: ({', '.join(self.inputs)}) -> ({', '.join(self.outputs)})"


# ------------------------------------------------------------------------------ public API
def split_stages(model: nn.Module, plan: CompletePlan) -> list[fx.GraphModule]:
    """The plan's pipeline stages cut out of `model`, in order (see the module docstring). A model torch.fx
    cannot trace between its stage modules (Hugging Face forwards) is cut from its torch.export graph
    instead (`split_exported`), for the microbatch the plan runs."""
    p = plan.pipeline
    if p is None:
        raise StageSplitError("the plan has no `pipeline` block", "add `pipeline over AXIS ... { stage ... }`")
    stages = [st.modules for st in p.stages]
    try:
        return split_model(model, stages)
    except StageSplitError as err:
        if not err.untraceable:
            raise
        # torch.export's cut leaves the model changed so that it cannot be exported again: a second cut
        # of the same model (`planlang lower` prints every rank's stages) is the first one
        example = microbatch_inputs(plan, model)
        key = (tuple(tuple(map(str, s)) for s in stages), tuple((tuple(x.shape), x.dtype) for x in example))
        done = _EXPORTED_CUTS.get(model)
        if done is not None and done[0] == key:
            return done[1]
        try:
            cut = split_exported(model, stages, example, [i.name for i in plan.inputs])
            _EXPORTED_CUTS[model] = (key, cut)
            return cut
        except StageSplitError:
            raise
        except Exception as exported:  # noqa: BLE001 - both tracers failed: say both why
            raise StageSplitError(f"{err.message}; torch.export could not cut it either: "
                                  f"{type(exported).__name__}: {exported}", err.help) from exported


_EXPORTED_CUTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (stages and inputs, cut)

# the output structure of an exported cut's last stage: its loss gets the model's own output back
OUT_FROM_LAST = "_planlang_out_from_last"
OUT_SPEC = "planlang_out_spec"


def microbatch_inputs(plan: CompletePlan, model: nn.Module) -> tuple[torch.Tensor, ...]:
    """Zero-filled inputs of one microbatch (batch / data degree / microbatches) on the model's device."""
    p = plan.pipeline
    divide = data_degree(plan) * (p.microbatches if p is not None else 1)
    device = next((t.device for t in model.parameters()), torch.device("cpu"))
    out = []
    for inp in plan.inputs:
        shape = [size for _, size in inp.dims]
        b = batch_dim(inp)
        shape[b] = max(1, shape[b] // divide)
        out.append(torch.zeros(shape, dtype=TORCH_DTYPES[inp.dtype], device=device))
    return tuple(out)


def split_exported(model: nn.Module, stages, example: tuple[torch.Tensor, ...],
                   names: Sequence[str] = ()) -> list[fx.GraphModule]:
    """Cut `model` with torch.distributed.pipelining's tracer (torch.export) at the first module, in
    execution order, of every stage after the first. The stage modules keep the model's parameter names
    and compose like the fx cut's; the last one returns the flattened output (tensors), and carries the
    output's pytree spec (`OUT_SPEC`) so that the loss sees the model's own output object."""
    stage_of, _ = _stage_of_modules(model, stages)
    # inputs the model takes by name (T5's decoder_input_ids) are traced as keyword arguments; the first
    # stage then takes them positionally in the plan's order
    by_name = keyword_inputs(model, list(names)) if names else None
    args, kwargs = ((), dict(zip(by_name, example))) if by_name else (example, {})
    order = probe_modules(model, dict(zip(by_name, example)) if by_name else
                          {f"in{i}": x for i, x in enumerate(example)}).order
    firsts = []
    for i in range(1, len(stages)):
        mine = [m for m in order if stage_of.get(m) == i]
        if not mine:
            raise StageSplitError(f"stage {i} computes nothing: its modules never run in forward",
                                  "give the stage modules that run, or remove it")
        firsts.append(mine[0])
    # torch's pipeline stages receive only what the stage before sends: an input a later stage reads
    # first (T5's decoder_input_ids) must enter in stage 0 and be passed on. A copy of every input made
    # before the model's first module is such a value
    hook = model.register_forward_pre_hook(_copy_inputs, with_kwargs=True)
    try:
        with warnings.catch_warnings():  # torch.export's own deprecation notices are not the user's
            warnings.simplefilter("ignore", FutureWarning)
            # lazy: torch.distributed.pipelining costs ~1.5 CPU-s to import; only an exported cut needs it
            from torch.distributed.pipelining import SplitPoint, pipeline

            pipe = pipeline(model, mb_args=args, mb_kwargs=kwargs or None,
                            split_spec={m: SplitPoint.BEGINNING for m in firsts})
    finally:
        hook.remove()
    if pipe.num_stages != len(stages):
        raise StageSplitError(f"torch.export cut the model into {pipe.num_stages} stages, not {len(stages)}",
                              "start each stage at a module the model calls at its top level or in a block list")
    modules = [_stage_module(pipe, i) for i in range(pipe.num_stages)]
    _pass_through(pipe.split_gm.graph, modules)
    for m in modules[:-1]:
        m.register_forward_hook(_contiguous_outputs)
    with torch.no_grad():
        out = meta_or_fake(lambda: model(*args, **kwargs))
    setattr(modules[-1], OUT_SPEC, tree_flatten(out)[1])
    setattr(modules[-1], OUT_FROM_LAST, _from_last_stage(pipe))
    return modules


def _stage_module(pipe: "Pipe", i: int) -> fx.GraphModule:
    """Stage `i` of torch.export's cut: a submodule of the cut's GraphModule, itself a GraphModule (torch
    types it as any Module)."""
    m = pipe.get_stage_module(i)
    if not isinstance(m, fx.GraphModule):
        raise TypeError(f"torch.export's stage {i} is a {type(m).__name__}, not a GraphModule")
    return m


def _pass_through(top: fx.Graph, modules: list[fx.GraphModule]) -> None:
    """Rewrite the stage graphs of torch.export's cut so that each stage receives everything it or a later
    stage needs from before it, and returns what later stages need: torch.distributed.pipelining's tracer
    lets stage j read a value stage i < j - 1 made (Llama's rotary embeddings and mask, made with the
    embedding and read by every decoder layer), but a stage receives only what the stage before it sends.

    `top` is the cut's graph over the stage modules (`submod_i` calls, `getitem`s of their tuple outputs).
    Stage i's parameters keep their names: its own graph gets placeholders for the values it passes on
    and returns them after its own outputs' values, in one order both sides agree on."""
    calls = [n for n in top.nodes if n.op == "call_module"]
    stage_of = {n: i for i, n in enumerate(calls)}

    def producer(v: fx.Node) -> int:  # the stage that makes a value; -1 for a model input
        if v in stage_of:
            return stage_of[v]
        if v.op == "call_function" and v.args and v.args[0] in stage_of:
            return stage_of[v.args[0]]
        return -1

    users: dict[fx.Node, int] = {}  # value -> the last stage that reads it
    for i, call in enumerate(calls):
        for v in call.all_input_nodes:
            users[v] = max(users.get(v, -1), i)
    order = {v: k for k, v in enumerate(top.nodes)}
    # the values stage i receives: made before it and read by it or a later stage
    carry = [sorted((v for v, last in users.items() if producer(v) < i <= last), key=order.__getitem__)
             for i in range(len(calls))]
    for i, (call, gm) in enumerate(zip(calls, modules)):
        g = gm.graph
        old = [n for n in g.nodes if n.op == "placeholder"]
        if i > 0 and len(old) != len(call.args):
            raise StageSplitError(f"torch.export's stage {i} takes {len(old)} values for {len(call.args)} sent",
                                  "report this model to planlang; cut the stages at other modules meanwhile")
        mine = dict(zip(call.args, old))
        new = {}
        if i > 0:  # placeholders in `carry[i]`'s order: the stage's own, and those it only passes on
            anchor = next(n for n in g.nodes if n.op != "placeholder")
            for v in carry[i]:
                if v in mine:
                    ph = mine[v]
                else:
                    with g.inserting_before(anchor):
                        ph = g.placeholder(f"carried_{v.name}")
                anchor.prepend(ph)
                new[v] = ph
        if i < len(calls) - 1:
            out = next(n for n in g.nodes if n.op == "output")
            result = out.args[0]
            sent = []
            for v in carry[i + 1]:
                if producer(v) == i:  # this stage's own output: the whole one, or an item of its tuple
                    sent.append(result if v is call else result[v.args[1]])
                else:
                    sent.append(new[v])
            out.args = (tuple(sent),)
        g.lint()
        gm.recompile()


def _from_last_stage(pipe) -> tuple[bool, ...]:
    """For each tensor of the model's output, whether the last stage returns it. An output computed in
    an earlier stage (T5's encoder_last_hidden_state) is not sent on: the loss sees None there."""
    nodes = list(pipe.split_gm.graph.nodes)
    last = str([n for n in nodes if n.op == "call_module"][-1].target)
    out = next(n for n in nodes if n.op == "output")

    def producer(n):
        while n.op == "call_function" and n.all_input_nodes:
            n = n.all_input_nodes[0]
        return str(n.target)

    return tuple(isinstance(n, fx.Node) and producer(n) == last for n in tree_flatten(out.args)[0])


def _copy_inputs(_module, args, kwargs):
    def copy(v):
        return v.clone() if isinstance(v, torch.Tensor) else v

    return tuple(copy(a) for a in args), {k: copy(v) for k, v in kwargs.items()}


def split_model(model: nn.Module, stages: Sequence[Sequence[Selection | str]]) -> list[fx.GraphModule]:
    """Cut `model` into one GraphModule per entry of `stages` (each a list of module selections)."""
    return _split(model, stages)[0]


def stage_values(model: nn.Module, stages: Sequence[Sequence[Selection | str]]) -> list[StageValues]:
    """The values each stage receives and returns (for `planlang lower` and debugging)."""
    return _split(model, stages)[1]


def cut_values(cut: Sequence[nn.Module]) -> list[StageValues]:
    """The values each stage module of a cut (`split_stages`) receives and returns, read from its graph:
    the placeholders and the output's arguments (works for the fx cut and torch.export's alike)."""
    out = []
    for i, stage in enumerate(cut):
        graph = stage.graph if isinstance(stage, fx.GraphModule) else None
        if graph is None:
            out.append(StageValues(i, (), ()))
            continue
        inputs = tuple(n.name for n in graph.nodes if n.op == "placeholder")
        result = next((n for n in graph.nodes if n.op == "output"), None)
        flat = tree_flatten(result.args)[0] if result is not None else []
        out.append(StageValues(i, inputs, tuple(n.name for n in flat if isinstance(n, fx.Node))))
    return out


def param_fqns(stage: nn.Module) -> dict[str, str]:
    """Stage-local parameter name -> the model's fully qualified name. Stages keep the model's paths,
    so this is the identity; callers that must map names (checkpoints, ZeRO) use it to stay correct
    should that ever change."""
    return {n: n for n, _ in stage.named_parameters()}


# ------------------------------------------------------------------------------ tracing
class _StageTracer(fx.Tracer):
    """Selected modules are leaves; a module with a selected descendant is traced through."""

    def __init__(self, leaves: set[str], ancestors: set[str]) -> None:
        super().__init__()
        self.leaves, self.ancestors = leaves, ancestors

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        if qualname in self.leaves:
            return True
        if qualname in self.ancestors:
            return False
        return super().is_leaf_module(m, qualname)


def _as_selection(s: Selection | str) -> Selection:
    return s if isinstance(s, Selection) else Selection.parse(s)


def _stage_of_modules(model: nn.Module, stages) -> tuple[dict[str, int], set[str]]:
    """Every selected module and its descendants -> stage index; and the outermost selected modules."""
    modules = [n for n, _ in model.named_modules() if n]
    names = stage_targets(modules, [n for n, _ in model.named_parameters(recurse=False)])
    stage_of: dict[str, int] = {}
    selected: dict[str, int] = {}
    for i, sels in enumerate(stages):
        if not sels:
            raise StageSplitError(f"stage {i} names no module", "give every stage at least one module")
        for raw in sels:
            sel = _as_selection(raw)
            hits = sel.select(names)
            if not hits:
                raise StageSplitError(f"stage {i}: `{sel}` matches no module of the model",
                                      "run `planlang inspect` to list the model's modules", "PL360")
            for h in hits:
                if selected.get(h, i) != i:
                    raise StageSplitError(f"`{plan_name(h)}` is in stages {selected[h]} and {i}",
                                          "give each module to one stage", "PL461")
                selected[h] = i
    for name in names:  # descendants inherit; a descendant selected elsewhere is an overlap
        owners = {s for m, s in selected.items() if name == m or name.startswith(m + ".")}
        if len(owners) > 1:
            raise StageSplitError(f"`{plan_name(name)}` is in stages {', '.join(map(str, sorted(owners)))}",
                                  "give each module (with everything inside it) to one stage", "PL461")
        if owners:
            stage_of[name] = owners.pop()
    leaves = {m for m in selected if m in set(modules) and not any(m.startswith(o + ".") for o in selected if o != m)}
    return stage_of, leaves


def _trace(model: nn.Module, leaves: set[str]) -> fx.Graph:
    ancestors = {".".join(m.split(".")[:k]) for m in leaves for k in range(1, m.count(".") + 1)}
    try:
        return _StageTracer(leaves, ancestors).trace(model)
    except Exception as err:  # noqa: BLE001 - the user's forward is not symbolically traceable
        raise StageSplitError(
            f"torch.fx cannot trace the model between its stage modules: {type(err).__name__}: {err}",
            "the code outside the modules the stages select must be traceable (no data-dependent control "
            "flow); select the module that holds such code as a whole", untraceable=True) from err


# ------------------------------------------------------------------------------ placing nodes
def _where(node: fx.Node) -> str:
    """A user-facing description of the module a node belongs to."""
    if node.op in ("call_module", "get_attr"):
        return f"`{plan_name(str(node.target))}`"
    stack = node.meta.get("nn_module_stack") or {}
    if stack:
        path = list(stack.values())[-1][0]
        return f"an operation of `{plan_name(path)}` ({node.name})"
    return f"the model's forward ({node.name})"


def _owner(target: str) -> str:
    return target.rsplit(".", 1)[0] if "." in target else ""


def _place(graph: fx.Graph, model: nn.Module, stage_of: dict[str, int]):
    """The stage of every node that runs once (modules, parameters, glue after a module), and the set
    of nodes computed from the model's inputs only, which every stage that reads them recomputes.
    Impure input-only nodes (random numbers) run once, in stage 0, and are passed on."""
    stage: dict[fx.Node, int] = {}
    from_inputs: set[fx.Node] = set()
    last_fixed: tuple[int, fx.Node] | None = None
    for node in graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        fixed = None
        if node.op == "call_module":
            fixed = stage_of.get(str(node.target))
            if fixed is None and any(True for _ in _attr(model, str(node.target)).parameters()):
                raise StageSplitError(f"`{plan_name(str(node.target))}` runs and holds parameters but is in no stage",
                                      "add it to the stage it runs in", "PL460")
        elif node.op == "get_attr":
            target = str(node.target)
            # a parameter of the root itself lives in the stage that names it (plan.selection.stage_targets)
            fixed = stage_of.get(_owner(target)) if _owner(target) else stage_of.get(target)
            if fixed is None and isinstance(_attr(model, target), nn.Parameter):
                raise StageSplitError(
                    f"parameter `{plan_name(target)}` is used by the model but its module "
                    f"`{plan_name(_owner(target))}` is in no stage" if _owner(target) else
                    f"parameter `{target}` of the root module is used by the model but is in no stage",
                    "add that module to the stage that uses it" if _owner(target) else
                    f"name it in the stage whose code reads it: `stage ..., {target}`", "PL460")
            # a buffer or constant outside every stage is copied to each stage that reads it
        if fixed is not None:
            if last_fixed is not None and fixed < last_fixed[0]:
                raise StageSplitError(
                    f"{_where(node)} (stage {fixed}) runs after {_where(last_fixed[1])} (stage {last_fixed[0]})",
                    "stages must follow the model's execution order", "PL462")
            last_fixed = (fixed, node)
            stage[node] = fixed
            continue
        producers = [a for a in node.all_input_nodes if a.op != "placeholder"]
        if all(a in from_inputs for a in producers) and not node.is_impure():
            from_inputs.add(node)  # a function of the inputs: recomputed where used
            continue
        stage[node] = max((stage[a] for a in producers if a in stage), default=0)
    # data flow never goes backwards
    for node, s in stage.items():
        for a in node.all_input_nodes:
            if a in stage and stage[a] > s:
                raise StageSplitError(
                    f"{_where(node)} (stage {s}) uses the result of {_where(a)} (stage {stage[a]})",
                    "stages must follow the model's execution order; move the boundary so that a value "
                    "only flows to the same or a later stage", "PL462")
    return stage, from_inputs


def _attr(model: nn.Module, target: str):
    obj = model
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


# ------------------------------------------------------------------------------ building stages
def _needed_recomputes(node: fx.Node, from_inputs: set[fx.Node], acc: set[fx.Node]) -> None:
    """Add to `acc` the input-derived nodes `node` reads, directly or through other such nodes."""
    todo = [a for a in node.all_input_nodes if a in from_inputs]
    while todo:
        a = todo.pop()
        if a not in acc:
            acc.add(a)
            todo.extend(b for b in a.all_input_nodes if b in from_inputs)


def _split(model: nn.Module, stages) -> tuple[list[fx.GraphModule], list[StageValues]]:
    n = len(stages)
    if n == 0:
        raise StageSplitError("the pipeline has no stages", "list at least one `stage`")
    stage_of, leaves = _stage_of_modules(model, stages)
    graph = fx.GraphModule(model, _trace(model, leaves)).graph  # owned: purity checks need the module
    graph.eliminate_dead_code()
    stage, from_inputs = _place(graph, model, stage_of)
    nodes = list(graph.nodes)
    placeholders = [x for x in nodes if x.op == "placeholder"]
    output = next(x for x in nodes if x.op == "output")
    for i in range(n):
        if not any(s == i for s in stage.values()):
            raise StageSplitError(f"stage {i} computes nothing: its modules never run in forward",
                                  "give the stage modules that run, or remove it")

    # per stage: the nodes it runs (own + recomputed) and the outside values it reads
    runs: list[list[fx.Node]] = []
    reads: list[set[fx.Node]] = []
    for i in range(n):
        own = [x for x in nodes if stage.get(x) == i]
        consumers = own + ([output] if i == n - 1 else [])
        extra: set[fx.Node] = set()
        for x in consumers:
            _needed_recomputes(x, from_inputs, extra)
        body = [x for x in nodes if x in extra or stage.get(x) == i]
        inside = set(body)
        outside = {a for x in body + ([output] if i == n - 1 else []) for a in x.all_input_nodes if a not in inside}
        runs.append(body)
        reads.append(outside)
    # live values at each boundary: read at stage >= i, produced before i (or an input)
    order = {x: k for k, x in enumerate(nodes)}
    carried: list[list[fx.Node]] = [list(placeholders)]
    for i in range(1, n):
        live = {v for j in range(i, n) for v in reads[j] if v.op == "placeholder" or stage.get(v, n) < i}
        carried.append(sorted(live, key=order.__getitem__))

    modules, values = [], []
    for i in range(n):
        g = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        for v in carried[i]:
            # stage 0 takes the model's own arguments, defaults included
            default = v.args[0] if i == 0 and v.op == "placeholder" and v.args else inspect.Signature.empty
            env[v] = g.placeholder(v.name, default_value=default)
            if v.op == "placeholder":
                env[v].meta = dict(v.meta)
        for x in runs[i]:
            env[x] = g.node_copy(x, env.__getitem__)
        if i == n - 1:
            g.output(fx.map_arg(output.args[0], env.__getitem__))
            outs = tuple(a.name for a in output.all_input_nodes)
        else:
            nxt = carried[i + 1]
            g.output(tuple(env[v] for v in nxt))
            outs = tuple(v.name for v in nxt)
        g.lint()
        gm = fx.GraphModule(model, g, class_name=f"PipelineStage{i}")
        if i < n - 1:
            gm.register_forward_hook(_tensor_outputs_hook(i, outs))
            gm.register_forward_hook(_contiguous_outputs)
        modules.append(gm)
        values.append(StageValues(i, tuple(v.name for v in carried[i]), outs))
    return modules, values


def _contiguous_outputs(_module, _args, out):
    """What a stage sends is contiguous (point-to-point sends take contiguous tensors only; a transposed
    view, ViT's attention output, would be refused)."""
    if isinstance(out, tuple):
        return tuple(o.contiguous() if isinstance(o, torch.Tensor) else o for o in out)
    return out.contiguous() if isinstance(out, torch.Tensor) else out


def _tensor_outputs_hook(index: int, names: Iterable[str]):
    names = tuple(names)

    def hook(_module, _args, out):
        for name, v in zip(names, out):
            if not isinstance(v, torch.Tensor):
                raise StageSplitError(
                    f"stage {index} must pass `{name}` ({type(v).__name__}) to a later stage, but pipeline stages "
                    "send tensors only",
                    "move the stage boundary so that this value is computed in the stage that uses it")
        return None

    return hook
