"""From a model to the layers a pipeline partition cuts, and from a cut back to plan selections.

`layer_sequence` lists the model's top-level modules in execution order, expanding containers (a
ModuleList such as GPT-2's `h`, a ModuleDict, a Sequential) into their children, with each layer's cost
from the symbolic profile (planlang.model.capture.profile): forward + backward flops, parameter bytes and the
activation bytes autograd saves for the profiled batch. It checks what a contiguous partition needs:
every layer's modules run together and the layers run one after another (else the model is not a chain
and `model_tree` + the tree partition apply), and no parameter is shared between two layers (a pipeline
would split it, PL463).

`stage_selections` turns cut points into the selection strings a `stage` line holds, folding runs of a
container's children into slices: `wte, wpe, drop, h[0:6]`.

`model_tree` builds the module hierarchy for `tree_partition` with SageMaker's cost (App. C.3) and
`tree_selections` reads a tree partition back as one list of selections per device.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from planlang.plan.selection import to_plan_name
from planlang.model.capture.profile import Profile, profile_model
from planlang.model.capture.trace import ModuleFacts, probe_modules

from .partition import PartitionError
from .tree_partition import TreeNode, TreePartition

CONTAINERS = (torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.Sequential)


@dataclass(frozen=True)
class Layer:
    """One unit of a pipeline cut: a module (torch dotted name) and its costs for the profiled batch."""

    name: str
    flops: float  # forward + backward
    param_bytes: int
    act_bytes: int  # saved for backward
    out_bytes: int = 0

    def __str__(self) -> str:
        return f"{to_plan_name(self.name)} ({self.flops / 1e9:.3g} GFLOP)"


@dataclass(frozen=True)
class LayerSequence:
    layers: tuple[Layer, ...]
    notes: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{len(self.layers)} layers: " + ", ".join(to_plan_name(x.name) for x in self.layers)

    @property
    def names(self) -> list[str]:
        return [x.name for x in self.layers]

    def costs(self, what: str = "flops") -> list[float]:
        """Per-layer costs: "flops", "params" (bytes) or "activations" (saved bytes)."""
        attr = {"flops": "flops", "params": "param_bytes", "activations": "act_bytes"}.get(what)
        if attr is None:
            raise PartitionError(f"cost {what!r}: use flops, params or activations")
        return [float(getattr(x, attr)) for x in self.layers]


def _first_calls(facts: ModuleFacts) -> dict[str, int]:
    """For every module that runs or has a running descendant: the position of its first call."""
    first: dict[str, int] = {}
    for i, name in enumerate(facts.order):
        parts = name.split(".")
        for j in range(1, len(parts) + 1):
            first.setdefault(".".join(parts[:j]), i)
    return first


def _children(module: torch.nn.Module, prefix: str, first: dict[str, int]) -> list[tuple[str, torch.nn.Module]]:
    kids = [(f"{prefix}.{n}" if prefix else n, m) for n, m in module.named_children()]
    return sorted([(n, m) for n, m in kids if n in first], key=lambda nm: first[nm[0]])


def _owns_params(module: torch.nn.Module) -> bool:
    return any(True for _ in module.parameters(recurse=False))


def layer_sequence(module: torch.nn.Module, inputs: dict[str, torch.Tensor], loss=None,
                   expand: Sequence[str] = (), stages: int = 0,
                   facts: ModuleFacts | None = None, profile: Profile | None = None) -> LayerSequence:
    """The layers a pipeline cut works on (module docstring). `expand` names more modules to replace by
    their children. For a cut into `stages` stages, the heaviest layer that can be split (it has running
    children and no parameters of its own) is replaced by its children while there are fewer layers than
    stages or it holds more than a stage's fair share (1 / stages) of the model's flops — so a wrapper
    such as BERT's `encoder` becomes `encoder.layer[0]`, ... Modules that never run are left out. A
    module's own work outside its children (rare: an add between two children) is counted with its
    first child, the root's with the first layer."""
    facts = facts or probe_modules(module, inputs)
    prof = profile or profile_model(module, inputs, loss)
    first = _first_calls(facts)
    notes: list[str] = []
    mods = dict(module.named_modules(remove_duplicate=False))

    known: dict[str, bool] = {}

    def expandable(name: str) -> bool:
        if name not in known:
            m = mods[name]
            known[name] = bool(_children(m, name, first)) and not _owns_params(m)
        return known[name]

    items = _children(module, "", first)
    changed = True
    while changed:
        changed = False
        out = []
        for name, m in items:
            if (isinstance(m, CONTAINERS) or name in expand) and expandable(name):
                out += _children(m, name, first)
                changed = True
            else:
                out.append((name, m))
        items = out
    total = (prof.total_fwd_flops + prof.total_bwd_flops) or 1
    work: dict[str, int] = {}  # a module's subtree flops (each split asks again of every layer)

    def subtree_flops(name: str) -> int:
        if name not in work:
            agg = prof.subtree(name)
            work[name] = agg.fwd_flops + agg.bwd_flops
        return work[name]

    while stages:
        flops = [(subtree_flops(n), -i, i) for i, (n, _) in enumerate(items) if expandable(n)]
        heavy = [f for f in flops if len(items) < stages or f[0] > total / stages]
        if not heavy:
            if len(items) < stages:
                notes.append(f"only {len(items)} layers for {stages} stages: no layer left to split")
            break
        _, _, i = max(heavy)
        name, m = items[i]
        items = items[:i] + _children(m, name, first) + items[i + 1:]
    if not items:
        raise PartitionError("the model runs no submodule; a pipeline needs at least one module to place")
    names = [n for n, _ in items]
    _check_chain(names, facts)
    _check_shared(names, facts)

    # own work of expanded modules (and the root) goes to the first layer below them
    extra: dict[str, list[int]] = {n: [0, 0] for n in names}
    for path, mp in prof.modules.items():
        if path in extra or any(path.startswith(n + ".") for n in names):
            continue
        below = [n for n in names if not path or n.startswith(path + ".")]
        target = below[0] if below else names[0]
        extra[target][0] += mp.fwd_flops + mp.bwd_flops
        extra[target][1] += mp.saved_bytes
    layers = []
    for n in names:
        agg = prof.subtree(n)
        layers.append(Layer(n, float(agg.fwd_flops + agg.bwd_flops + extra[n][0]), agg.param_bytes,
                            agg.saved_bytes + extra[n][1], agg.out_bytes))
    return LayerSequence(tuple(layers), tuple(notes + prof.notes))


def _check_chain(names: list[str], facts: ModuleFacts) -> None:
    """Each layer's module calls are one run of the execution order and the runs follow each other: the
    layer index of the calls, in execution order, never goes down."""
    last, last_name = 0, names[0]
    for name in facts.order:
        hit = next((i for i, n in enumerate(names) if name == n or name.startswith(n + ".")), None)
        if hit is None:
            continue
        if hit < last:
            raise PartitionError(
                f"`{to_plan_name(name)}` (layer `{to_plan_name(names[hit])}`) runs after `{to_plan_name(last_name)}` "
                f"(layer `{to_plan_name(names[last])}`): the model's modules do not run as a chain, so a "
                "contiguous pipeline cut cannot follow them; use the tree partition (`model_tree` + "
                "`tree_partition`)")
        last, last_name = hit, name


def _check_shared(names: list[str], facts: ModuleFacts) -> None:
    """No parameter is shared by modules of two different layers."""
    for group in facts.shared:
        where = {}
        for p in group:
            owner = p.rsplit(".", 1)[0]
            hit = next((n for n in names if owner == n or owner.startswith(n + ".")), None)
            if hit is not None:
                where[p] = hit
        if len(set(where.values())) > 1:
            shown = " and ".join(f"`{to_plan_name(p)}` (layer `{to_plan_name(l)}`)" for p, l in where.items())
            raise PartitionError(
                f"{shown} are one parameter: pipeline stages would split it (PL463); untie it in the model "
                "(GPT-2 example: tie_embeddings=False) or give those layers to one stage by hand")


# ------------------------------------------------------------------------------ back to selections
def _container_index(name: str) -> tuple[str, int] | None:
    head, _, last = name.rpartition(".")
    return (head, int(last)) if head and last.isdigit() else None


def selections(names: Sequence[str]) -> list[str]:
    """Plan selections for consecutive modules: runs of one container's children become `h[a:b]`."""
    out: list[str] = []
    run: tuple[str, int, int] | None = None  # container, start, stop
    for name in [*names, None]:
        ci = _container_index(name) if name is not None else None
        if run and ci and ci[0] == run[0] and ci[1] == run[2]:
            run = (run[0], run[1], run[2] + 1)
            continue
        if run:
            base = to_plan_name(run[0])
            out.append(f"{base}[{run[1]}]" if run[2] - run[1] == 1 else f"{base}[{run[1]}:{run[2]}]")
            run = None
        if name is None:
            break
        if ci:
            run = (ci[0], ci[1], ci[1] + 1)
        else:
            out.append(to_plan_name(name))
    return out


def stage_selections(layers: LayerSequence | Sequence[str], bounds: Sequence[int]) -> list[list[str]]:
    """One list of selection strings per stage, stage i holding layers bounds[i]:bounds[i+1]."""
    names = layers.names if isinstance(layers, LayerSequence) else list(layers)
    if list(bounds[:1]) != [0] or bounds[-1] != len(names) or any(a >= b for a, b in zip(bounds, bounds[1:])):
        raise PartitionError(f"bounds {tuple(bounds)} do not cut {len(names)} layers into non-empty stages")
    return [selections(names[a:b]) for a, b in zip(bounds, bounds[1:])]


# ------------------------------------------------------------------------------ the module tree
def model_tree(module: torch.nn.Module, facts: ModuleFacts, profile: Profile, alpha: float = 0.5) -> TreeNode:
    """The module hierarchy of the modules that run (children in execution order) with SageMaker's
    cost (App. C.3): alpha x memory + (1 - alpha) x compute. Memory is the module's own parameter and
    saved-activation bytes, compute its own forward + backward flops (the paper uses measured times or
    descendant counts); each is taken as a share of the model's total so that alpha mixes like with like."""
    if not 0.0 <= alpha <= 1.0:
        raise PartitionError(f"alpha = {alpha}; use a value in [0, 1]")
    first = _first_calls(facts)
    own_params: dict[str, int] = {}
    seen: set[int] = set()
    for name, m in module.named_modules():
        for p in m.parameters(recurse=False):
            if id(p) not in seen:
                seen.add(id(p))
                own_params[name] = own_params.get(name, 0) + p.numel() * p.element_size()
    mem_total = (sum(own_params.values()) + sum(m.saved_bytes for m in profile.modules.values())) or 1
    flop_total = sum(m.fwd_flops + m.bwd_flops for m in profile.modules.values()) or 1

    def own(name: str) -> float:
        mp = profile.modules.get(name)
        mem = own_params.get(name, 0) + (mp.saved_bytes if mp else 0)
        flops = (mp.fwd_flops + mp.bwd_flops) if mp else 0
        return alpha * mem / mem_total + (1 - alpha) * flops / flop_total

    def build(name: str, m: torch.nn.Module) -> TreeNode:
        kids = tuple(build(n, c) for n, c in _children(m, name, first))
        return TreeNode(name.rpartition(".")[2], own(name), kids)

    return build("", module)


def tree_selections(part: TreePartition, module: torch.nn.Module, devices: int,
                    facts: ModuleFacts | None = None) -> list[list[str]]:
    """One list of selections per device: the largest subtrees wholly on it, in execution order. A module
    split across devices cannot be named itself (a selection takes all its children), so it must own no
    parameters; the partition must be order-preserving. With `facts`, the stages must also follow the
    modules' actual execution order (a model whose execution does not follow its module tree, like one
    that runs part of a module after the next one, cannot be cut this way) and the modules of one shared
    parameter must sit on one device (PL463)."""
    dev = dict(part.devices)
    paths = [p for p, _ in part.devices]
    if [dev[p] for p in paths] != sorted(dev[p] for p in paths):
        raise PartitionError("the tree partition is not order-preserving; run tree_partition with "
                             "order_preserving=True to get pipeline stages")
    children: dict[str, list[str]] = {p: [] for p in paths}
    for q in paths:
        if q:
            children[q.rpartition(".")[0]].append(q)
    whole: dict[str, bool] = {}
    for p in reversed(paths):  # children before parents: whole = the subtree sits on one device
        whole[p] = all(whole[k] and dev[k] == dev[p] for k in children[p])
    mods = dict(module.named_modules())
    picked: list[tuple[int, str]] = []  # the root is not a selectable module; its children are
    for p in paths[1:]:
        parent = p.rpartition(".")[0]
        if whole[p] and (parent == "" or not whole[parent]):
            picked.append((dev[p], p))
        elif not whole[p] and p in mods and _owns_params(mods[p]):
            raise PartitionError(f"`{to_plan_name(p)}` owns parameters but its children sit on different devices; "
                                 "a stage cannot name it without its children — give the tree more devices per "
                                 "subtree or use the flat partition")
    def device_of(name: str) -> int:
        while name not in dev and "." in name:
            name = name.rsplit(".", 1)[0]
        return dev.get(name, dev[""])

    last = (0, "")
    for name in facts.order if facts else ():
        d = device_of(name)
        if d < last[0]:
            raise PartitionError(f"`{to_plan_name(name)}` (stage {d}) runs after `{to_plan_name(last[1])}` (stage "
                                 f"{last[0]}): the model's execution does not follow its module tree, so these "
                                 "stages would run out of order (PL462); place the modules by hand")
        last = (d, name)
    for group in facts.shared if facts else ():
        where = {}
        for p in group:
            where[p] = device_of(p.rsplit(".", 1)[0])
        if len(set(where.values())) > 1:
            shown = " and ".join(f"`{to_plan_name(p)}` (stage {d})" for p, d in where.items())
            raise PartitionError(f"{shown} are one parameter: the stages would split it (PL463); untie it in "
                                 "the model or place those modules by hand")
    return [selections([p for dd, p in picked if dd == d]) for d in range(devices)]
