"""SageMaker model parallelism's tree partition of a module hierarchy over pipeline devices
(sagemaker-model-parallelism §4.5 and App. C, Algorithms 1–3), for models that are not one flat chain.

The model is a tree of nodes (modules) with children in execution order; each node has its own cost
(what runs or is stored in the module itself, not in a child) and a subtree cost c(n) = own + Σ children
(App. C.3; super-additive). Algorithm 1 walks the tree breadth first with a device set P(n) per node:
the node takes P(n)[0]; when |P(n)| > 1 its children are split by Partition (Algorithm 2):

1. cut the children, in execution order, into ℓ = |P(n)| consecutive segments minimising the largest
   segment cost (recursion (2)–(3); `partition.min_max_partition`, whose tie rule — leximax, then the
   earliest cuts — picks one of the optimal segmentations); when there are fewer children than devices,
   ℓ is the number of children (a segment cannot be empty);
2. share the |P(n)| devices among the segments in proportion to their costs with D'Hondt's method
   (Algorithm 3; ties to the earlier segment);
3. a segment with no device runs on the parent's device P[0]; with one device, or a single node, its
   nodes get its devices; otherwise Partition recurses on it.

Two deliberate differences from the paper, both for planlang's linear pipelines, where stage i must run
before stage i + 1:

* Algorithm 3 as printed divides the winner's quotient by a global counter (q_k ← q_k / (s + 1)); that is
  not D'Hondt's rule, which divides each segment's cost by (seats it holds + 1) — the method the paper
  names, whose max-min property its footnote 3 states. We implement D'Hondt's rule.
* Devices are handed to segments as consecutive runs of P in segment order (the counts are D'Hondt's),
  and a segment that gets none runs on the device of the segment before it (the first device of the next
  one for a leading segment) instead of the parent's P[0]. With `order_preserving=False` the paper's
  parent rule is used. With order preservation, devices never decrease along the execution (preorder)
  order of the tree, so each device's nodes form one pipeline stage.

The result maps every node to a device; `loads` sums the nodes' own costs per device.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence, Union

from .partition import PartitionError, min_max_partition


@dataclass(frozen=True)
class TreeNode:
    """A module: `name` (its path segment), `cost` of its own, `children` in execution order."""

    name: str
    cost: float = 0.0
    children: tuple["TreeNode", ...] = ()
    total: float = field(init=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "total", self.cost + sum(c.total for c in self.children))

    def __str__(self) -> str:
        return f"{self.name or '<root>'}({self.total:g})"


def tree_from_dict(costs: Mapping[str, Union[float, Mapping]], name: str = "") -> TreeNode:
    """A tree from nested dicts in execution order: a number is a leaf's cost, a dict a subtree, and the
    key "" inside a dict is that node's own cost. `{"": 1, "emb": 4, "h": {"0": 3, "1": 3}}`"""
    kids = []
    own = 0.0
    for key, val in costs.items():
        if key == "":
            own = float(val)  # type: ignore[arg-type]
        elif isinstance(val, Mapping):
            kids.append(tree_from_dict(val, key))
        else:
            kids.append(TreeNode(key, float(val)))
    return TreeNode(name, own, tuple(kids))


@dataclass(frozen=True)
class TreePartition:
    """`devices[path]` for every node (paths join names with "."; the root is ""); per-device own-cost loads."""

    devices: tuple[tuple[str, int], ...]  # preorder
    loads: tuple[float, ...]

    def __str__(self) -> str:
        return f"{len(self.loads)} devices, max load {max(self.loads):g}"

    def device_of(self, path: str) -> int:
        return dict(self.devices)[path]


def dhondt(costs: Sequence[float], seats: int) -> tuple[int, ...]:
    """D'Hondt's allocation of `seats` to parties with `costs` (Algorithm 3, with the per-party divisor):
    each seat goes to the party with the largest cost / (seats held + 1), the earliest on ties."""
    held = [0] * len(costs)
    for _ in range(seats):
        k = 0
        for i in range(1, len(costs)):
            # costs[i] / (held[i] + 1) > costs[k] / (held[k] + 1), without division
            if costs[i] * (held[k] + 1) > costs[k] * (held[i] + 1):
                k = i
        held[k] += 1
    return tuple(held)


def tree_partition(root: TreeNode, devices: int, order_preserving: bool = True) -> TreePartition:
    """Algorithm 1 over `root` with devices 0..devices-1 (module docstring)."""
    if devices < 1:
        raise PartitionError(f"{devices} devices; use at least 1")
    _check(root)
    # nodes are keyed by their index path from the root (the same TreeNode may appear twice)
    assigned: dict[tuple[int, ...], tuple[int, ...]] = {(): tuple(range(devices))}
    device: dict[tuple[int, ...], int] = {}
    queue: list[tuple[tuple[int, ...], TreeNode]] = [((), root)]
    while queue:  # breadth first
        key, node = queue.pop(0)
        P = assigned[key]
        device[key] = P[0]
        kids = [(key + (i,), c) for i, c in enumerate(node.children)]
        if kids and len(P) > 1:
            _partition(P, kids, assigned, order_preserving, fallback=P[0])
        for k, _ in kids:
            assigned.setdefault(k, (P[0],))
        queue += kids
    order, loads = [], [0.0] * devices
    for key, path, node in _preorder(root, (), ""):
        order.append((path, device[key]))
        loads[device[key]] += node.cost
    return TreePartition(tuple(order), tuple(loads))


def _partition(P: tuple[int, ...], nodes: list[tuple[tuple[int, ...], TreeNode]], assigned: dict,
               order_preserving: bool, fallback: int) -> None:
    """Algorithm 2: segments by min–max DP, devices by D'Hondt, recursion on multi-device segments."""
    ell = min(len(P), len(nodes))
    segs = min_max_partition([n.total for _, n in nodes], ell)
    counts = dhondt(segs.costs, len(P))
    runs, at = [], 0
    for cnt in counts:  # consecutive runs of P, in segment order
        runs.append(P[at:at + cnt])
        at += cnt
    for i, ((a, b), run) in enumerate(zip(segs.ranges, runs)):
        members = nodes[a:b]
        if not run:
            if order_preserving:
                before = [r for r in runs[:i] if r]
                after = [r for r in runs[i + 1:] if r]
                dev = before[-1][-1] if before else after[0][0]
            else:
                dev = fallback
            for k, _ in members:
                assigned[k] = (dev,)
        elif len(members) == 1 or len(run) == 1:
            for k, _ in members:
                assigned[k] = run
        else:
            _partition(run, members, assigned, order_preserving, fallback)


def _preorder(node: TreeNode, key: tuple[int, ...], path: str):
    yield key, path, node
    for i, c in enumerate(node.children):
        yield from _preorder(c, key + (i,), f"{path}.{c.name}" if path else c.name)


def _check(node: TreeNode) -> None:
    if not math.isfinite(node.cost) or node.cost < 0:
        raise PartitionError(f"node `{node.name}` has cost {node.cost}; costs must be finite and >= 0")
    for c in node.children:
        _check(c)
