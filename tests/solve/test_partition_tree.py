"""SageMaker tree partition (planlang.solve.tree_partition) against enumeration.

The space the paper's method covers, enumerated here without the kernel's DP or D'Hondt loop: Algorithm
1 (breadth first, node on P[0]) where every Partition call may take *any* segmentation of the children
into ℓ consecutive segments that attains the min–max value (2), and *any* allocation of the devices whose
counts satisfy the divisor (D'Hondt) criterion max_i c_i / (a_i + 1) <= min_{a_i > 0} c_i / a_i — i.e.
D'Hondt under every tie resolution — with devices handed out in consecutive runs and seatless segments on
their neighbour's device (the order-preserving rule) or the parent's (the paper's rule). The kernel's
result must be one of the reachable assignments, and the only one when the instance has no ties."""
from __future__ import annotations

import itertools
import random
from fractions import Fraction

import pytest

from planlang.solve.partition import PartitionError, min_max_partition
from planlang.solve.tree_partition import TreeNode, TreePartition, dhondt, tree_from_dict, tree_partition


# ------------------------------------------------------------------------------ D'Hondt
def allocations(parties: int, seats: int):
    for cuts in itertools.combinations(range(seats + parties - 1), parties - 1):
        bounds = (-1, *cuts, seats + parties - 1)
        yield tuple(b - a - 1 for a, b in zip(bounds, bounds[1:]))


def dhondt_consistent(costs, alloc) -> bool:
    c = [Fraction(x) for x in costs]
    lo = min((c[i] / a for i, a in enumerate(alloc) if a), default=None)
    hi = max(c[i] / (a + 1) for i, a in enumerate(alloc))
    return lo is None or hi <= lo


def test_dhondt_against_enumeration():
    rng = random.Random(3)
    for trial in range(200):
        parties, seats = rng.randint(1, 5), rng.randint(0, 7)
        costs = [rng.randint(1, 12) for _ in range(parties)]
        got = dhondt(costs, seats)
        assert sum(got) == seats
        allocs = list(allocations(parties, seats))
        consistent = [a for a in allocs if dhondt_consistent(costs, a)]
        assert got in consistent
        if len(consistent) == 1:  # no tie: the criterion pins the allocation down
            assert got == consistent[0]
        # footnote 3: D'Hondt minimises the largest seats-to-cost ratio
        ratio = lambda a: max(Fraction(x, c) for x, c in zip(a, costs))
        assert ratio(got) == min(ratio(a) for a in allocs)


# ------------------------------------------------------------------------------ the whole tree
def segmentations(costs, ell):
    """Every cut into ell consecutive segments attaining the min–max value."""
    n = len(costs)
    cuts = [(0, *c, n) for c in itertools.combinations(range(1, n), ell - 1)]
    value = lambda b: max(sum(costs[x:y]) for x, y in zip(b, b[1:]))
    best = min(value(b) for b in cuts)
    return [b for b in cuts if value(b) == best]


def reachable(root: TreeNode, devices: int, order_preserving: bool) -> set[tuple]:
    """Every assignment (preorder tuple of devices) the paper's method can produce, over all ties."""
    def partition(P, nodes, fallback):
        """Yield lists of (node key, device set) for the children in `nodes`."""
        ell = min(len(P), len(nodes))
        for b in segmentations([n.total for _, n in nodes], ell):
            seg_costs = [sum(n.total for _, n in nodes[x:y]) for x, y in zip(b, b[1:])]
            for alloc in allocations(ell, len(P)):
                if not dhondt_consistent(seg_costs, alloc) or (sum(seg_costs) == 0 and alloc != dhondt(seg_costs, len(P))):
                    continue
                runs, at = [], 0
                for a in alloc:
                    runs.append(P[at:at + a])
                    at += a
                parts = []
                for i, ((x, y), run) in enumerate(zip(zip(b, b[1:]), runs)):
                    members = nodes[x:y]
                    if not run:
                        before = [r for r in runs[:i] if r]
                        after = [r for r in runs[i + 1:] if r]
                        dev = (before[-1][-1] if before else after[0][0]) if order_preserving else fallback
                        parts.append([[(k, (dev,)) for k, _ in members]])
                    elif len(members) == 1 or len(run) == 1:
                        parts.append([[(k, run) for k, _ in members]])
                    else:
                        parts.append(list(partition(run, members, fallback)))
                for combo in itertools.product(*parts):
                    yield [x for part in combo for x in part]

    def bfs(assigned, queue, device):
        if not queue:
            yield dict(device)
            return
        (key, node), rest = queue[0], queue[1:]
        P = assigned[key]
        device = {**device, key: P[0]}
        kids = [(key + (i,), c) for i, c in enumerate(node.children)]
        if kids and len(P) > 1:
            for choice in partition(P, kids, P[0]):
                yield from bfs({**assigned, **dict(choice)}, rest + kids, device)
        else:
            yield from bfs({**assigned, **{k: (P[0],) for k, _ in kids}}, rest + kids, device)

    def keys(node, key=()):
        yield key
        for i, c in enumerate(node.children):
            yield from keys(c, key + (i,))

    order = list(keys(root))
    return {tuple(d[k] for k in order) for d in bfs({(): tuple(range(devices))}, [((), root)], {})}


def random_tree(rng: random.Random, depth: int = 0, name: str = "") -> TreeNode:
    n_kids = rng.randint(1, 4) if depth < 2 and rng.random() < 0.8 else 0
    kids = tuple(random_tree(rng, depth + 1, f"m{i}") for i in range(n_kids))
    return TreeNode(name, float(rng.choice([0, rng.randint(1, 40)])), kids)


def test_tree_partition_is_in_the_enumerated_space():
    rng = random.Random(12)
    unique = 0
    for trial in range(150):
        root = random_tree(rng)
        devices = rng.randint(1, 4)
        order_preserving = rng.random() < 0.7
        got = tree_partition(root, devices, order_preserving)
        space = reachable(root, devices, order_preserving)
        mine = tuple(d for _, d in got.devices)
        assert mine in space, (root, devices)
        if len(space) == 1:
            unique += 1
        if order_preserving:  # devices never go back along execution (preorder) order
            assert list(mine) == sorted(mine)
        loads = [0.0] * devices
        for (path, d), node in zip(got.devices, _preorder_nodes(root)):
            loads[d] += node.cost
        assert tuple(loads) == got.loads
    assert unique >= 60  # most instances have no tie, and there the result is the only one


def _preorder_nodes(node):
    yield node
    for c in node.children:
        yield from _preorder_nodes(c)


def test_segments_are_min_max_partitions():
    # the segmentation step is kernel (a); on every Partition call its value is the enumerated optimum
    rng = random.Random(8)
    for trial in range(100):
        costs = [float(rng.randint(0, 9)) for _ in range(rng.randint(1, 7))]
        ell = rng.randint(1, len(costs))
        best = segmentations(costs, ell)
        assert min_max_partition(costs, ell).bounds in best


def test_t5_like_tree_balances_encoder_and_decoder():
    tree = tree_from_dict({
        "shared": 8.0,
        "encoder": {"block": {str(i): 4.0 for i in range(6)}, "final_layer_norm": 0.1},
        "decoder": {"block": {str(i): 5.0 for i in range(6)}, "final_layer_norm": 0.1},
        "lm_head": 8.0,
    })
    part = tree_partition(tree, 4)
    assert isinstance(part, TreePartition) and len(part.loads) == 4
    assert part.device_of("") == 0 and part.device_of("shared") == 0
    assert part.device_of("lm_head") == 3
    # each device gets a fair share: no more than twice the mean
    assert max(part.loads) <= 2 * sum(part.loads) / 4
    devs = [d for _, d in part.devices]
    assert devs == sorted(devs)
    assert str(part).startswith("4 devices")


def test_zero_seat_segment_rules():
    # a tiny middle child gets no device: neighbour's device (order-preserving) or the parent's (paper)
    tree = tree_from_dict({"a": 10.0, "b": 0.01, "c": 10.0})
    assert [d for _, d in tree_partition(tree, 2).devices] == [0, 0, 1, 1]  # [a] | [b, c]: earliest cut
    assert dhondt([10.0, 0.01, 10.0], 3) == (2, 0, 1)
    ours = dict(tree_partition(tree, 3).devices)
    paper = dict(tree_partition(tree, 3, order_preserving=False).devices)
    assert (ours["a"], ours["b"], ours["c"]) == (0, 1, 2)  # a keeps devices 0-1; b follows a's last
    assert (paper["b"], paper["c"]) == (0, 2)


def test_bad_input():
    with pytest.raises(PartitionError, match="at least 1"):
        tree_partition(TreeNode("x", 1.0), 0)
    with pytest.raises(PartitionError, match="finite"):
        tree_partition(TreeNode("", 0.0, (TreeNode("x", -1.0),)), 2)
