"""Head-parallel fused projections: a column-parallel weight whose output is cut into equal pieces.

GPT-2's `c_attn` computes q, k and v in one product, `[hidden, 3 * hidden]`, and the model cuts its
output in three (`split`/`chunk` on the feature dim). Split contiguously over tp, rank 0 would hold all
of q and part of k, and the cut would need the whole output (an all-gather per block). Megatron-LM
(Shoeybi et al. 2019, §3) stores the fused weight per head instead, so that each rank's columns are the
same heads of q, of k and of v: attention then runs on the local heads with no communication.

planlang does the same without asking the user to reorder anything. When a parameter's split dim
feeds, through one linear product (`addmm`, `linear`) and views that keep that dim, nothing but a cut
into `k` equal pieces of a size the split divides, the parameter is stored *blocked*: its dim is
viewed as `[k, s]`, each of the `k` blocks is split over the axes as the spec says, and a rank holds
its share of every block, in block order. In a program the product's output is then that blocked
value, and each piece of the cut is split over the same axes with no conversion (the op's `blocks`
attribute, planlang.cost.ops.rules). A bias added by the product is blocked the same way.

`blocked_order` and `unblocked_order` convert a whole tensor between the model's order and the order
whose contiguous split gives each rank its blocks (what the runtime shards and gathers).
"""
from __future__ import annotations

import dataclasses
import math

from planlang.cost.ops import registry
from planlang.model.capture.opgraph import OpGraph, OpNode
from planlang.plan.complete import CompleteMesh
from planlang.plan.types import Spec

# kind -> (the input that is the weight, the weight dim that becomes the output's last dim, the bias
# input): the op table's `product`s (linear, addmm, matmul)
_PRODUCTS = {k: f.product for k, f in registry().items() if f.product is not None}
_VIEWS = ("view", "reshape")


@dataclasses.dataclass(frozen=True)
class Blocked:
    """A parameter stored blocked: dim `dim` is `blocks` equal blocks, each split over `axes`."""

    dim: int
    blocks: int
    axes: tuple[str, ...]

    def __str__(self) -> str:
        return f"dim {self.dim} in {self.blocks} blocks over {', '.join(self.axes)}"


def cut_per_head(width: int, size: int, devices: int) -> bool:
    """Whether a dim of `width` cut into pieces of `size` can be stored per head over `devices`: at least
    two equal pieces, each split evenly over the devices."""
    return size > 0 and width % size == 0 and width // size >= 2 and size % devices == 0


def _consumers(graph: OpGraph) -> dict[str, list[tuple[OpNode, int]]]:
    out: dict[str, list[tuple[OpNode, int]]] = {}
    for n in graph.nodes:
        for i, v in enumerate(n.inputs):
            out.setdefault(v, []).append((n, i))
    return out


def _pieces(graph: OpGraph, value: str, width: int, uses) -> tuple[list[OpNode], list[str]] | None:
    """The split ops that take `value`'s last dim (of size `width`) apart, through views that keep it and
    the add of a bias (a 1-d parameter of that size: its value names are returned too); None when
    anything else reads it."""
    found: list[OpNode] = []
    biases: list[str] = []
    todo = [value]
    while todo:
        for node, at in uses.get(todo.pop(), []):
            op = node.op
            rank = len(op.inputs[at])
            if op.kind in _VIEWS and op.output and op.output[-1] == width and op.inputs[0][-1] == width:
                todo.append(node.name)
            elif op.kind == "split" and op.attr("dim", 0) % rank == rank - 1 and op.output and op.output[-1] < width:
                found.append(node)
            elif op.kind == "add" and len(node.inputs) == 2 and not biases:
                other = graph.values[node.inputs[1 - at]]
                if other.kind != "param" or other.shape != (width,) or op.output != op.inputs[at]:
                    return None
                biases.append(other.name)
                todo.append(node.name)
            else:
                return None
    return found, biases


def find_blocked(graph: OpGraph, pspecs: dict[str, Spec], mesh: CompleteMesh) -> tuple[dict[str, Blocked], dict[str, Blocked]]:
    """(parameter FQN -> how it is blocked, split node -> the same) for every fused projection whose cut
    pieces the parameter's split divides."""
    uses = _consumers(graph)
    params, nodes = {}, {}
    for node in graph.nodes:
        form = _PRODUCTS.get(node.op.kind)
        if form is None or len(node.inputs) <= form[0]:
            continue
        w_at, w_dim, b_at = form
        weight = graph.values[node.inputs[w_at]]
        if weight.kind != "param" or len(weight.shape) != 2 or len(uses.get(weight.name, [])) != 1:
            continue
        w_dim %= 2
        axes = tuple(a for a in pspecs[weight.ref].axes_of(w_dim) if mesh.size_of(a) > 1)
        f = math.prod(mesh.size_of(a) for a in axes)
        width = weight.shape[w_dim]
        if f == 1 or not node.op.output or node.op.output[-1] != width:
            continue
        found = _pieces(graph, node.name, width, uses)
        if not found or not found[0]:
            continue
        pieces, biases = found
        sizes = {p.op.output[-1] for p in pieces}
        size = sizes.pop() if len(sizes) == 1 else 0
        if not cut_per_head(width, size, f):
            continue
        if b_at is not None and len(node.inputs) > b_at:
            biases.append(node.inputs[b_at])
        bias_values = [graph.values[b] for b in biases]
        if any(b.kind != "param" or len(uses.get(b.name, [])) != 1 or len(b.shape) != 1 or
               pspecs[b.ref].axes_of(0) != pspecs[weight.ref].axes_of(w_dim) for b in bias_values):
            continue
        blocked = Blocked(w_dim, width // size, axes)
        params[weight.ref] = blocked
        for b in bias_values:
            params[b.ref] = Blocked(0, blocked.blocks, axes)
        for p in pieces:
            nodes[p.name] = blocked
    return params, nodes


def mark_blocked(graph: OpGraph, nodes: dict[str, Blocked]) -> OpGraph:
    """The graph with the cut pieces of blocked values marked (`blocks`, `block_axes` attributes)."""
    if not nodes:
        return graph

    def mark(n: OpNode) -> OpNode:
        b = nodes.get(n.name)
        if b is None:
            return n
        op = dataclasses.replace(n.op, attrs=n.op.attrs + (("blocks", b.blocks), ("block_axes", b.axes)))
        return dataclasses.replace(n, op=op)

    return dataclasses.replace(graph, nodes=[mark(n) for n in graph.nodes])


def block_factor(blocked: Blocked, mesh: CompleteMesh) -> int:
    """The number of devices a blocked dim is split over."""
    return math.prod(mesh.size_of(a) for a in blocked.axes)


def blocked_order(t, blocked: Blocked, factor: int):
    """A whole tensor in the model's order -> the order whose contiguous split over the axes (`factor`
    devices) gives each device its share of every block."""
    d, k = blocked.dim, blocked.blocks
    shape = list(t.shape)
    s = shape[d] // k
    return t.reshape(shape[:d] + [k, factor, s // factor] + shape[d + 1:]).transpose(d, d + 1).reshape(shape)


def unblocked_order(t, blocked: Blocked, factor: int):
    """The inverse of `blocked_order`."""
    d, k = blocked.dim, blocked.blocks
    shape = list(t.shape)
    s = shape[d] // k
    return t.reshape(shape[:d] + [factor, k, s // factor] + shape[d + 1:]).transpose(d, d + 1).reshape(shape)
