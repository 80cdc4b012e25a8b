"""The op graph of a model torch.fx traces, from its trace cut to a few of its N identical blocks (issue #29).

torch.fx traces every block again, and shape-propagates each (a second of a solve's every microbatch shape
at 76.1B, 60 blocks). The graph of the model cut to its first `k` blocks (planlang.model.capture.fold.
truncated) holds the nodes before the blocks, the first block, an interior one, the last, and the nodes
after them; the whole model's graph is that graph with the interior block repeated, each copy's module
calls and attributes moved to the block it stands for (`model.h.1.ln_1` -> `model.h.7.ln_1`), its arguments
from the block before read from the copy before.

Node names are not computed here: the expansion creates the nodes in the order the tracer creates the whole
model's, each with the name fx's namespace gives it then (a call's counter, `add_41`, follows from the calls
made before it), so they are the names the whole model's trace gives. That the cut trace itself comes out
so (names and arguments) when its nodes are created again in order is checked first. The copies take block
1's shapes (no shape propagation of the expansion): every block reads the block before's output, and the
cut shows block 2 (k - 1) is block 1 moved — every node's op, target, arguments (in block-relative terms),
shape, dtype and module stack. Anything else is a FoldError (the caller traces the whole model):

* the blocks' nodes are contiguous and in order, each kept block ran once (`BlockCalls.check`; a list of
  modules fx keeps as leaves, nn.Linear, runs no forward hook under the tracer: traced whole);
* a block's nodes read only its own, the block before's and those before the blocks; the nodes after the
  blocks read only the last block's and their own.

The expansion is lowered by planlang.model.capture.opgraph as the whole model's trace is, on a GraphModule
of the whole model (its parameters and modules). tests/model/test_fold_fx.py compares the op graph node for
node with the whole model's trace.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import fx, nn

from planlang.model.capture.fold import Fold, FoldError, truncated
from planlang.model.capture.fx_builder import strip
from planlang.model.capture.graph_values import OpGraph, UnsupportedGraph, keyword_inputs, loss_step
from planlang.model.capture.opgraph import build_op_graph, named_inputs, propagate, step_prefix, trace


def fx_folded_op_graph(model: nn.Module, inputs: dict[str, torch.Tensor], loss_fn: Callable | None, fold: Fold,
                       targets: tuple[torch.Tensor, ...], k: int) -> OpGraph:
    """opgraph.op_graph's graph of `model` (and its loss), from its fx trace cut to `k` of `fold`'s blocks and
    expanded to `fold.count`. UnsupportedGraph when the cut does not trace (op_graph exports such a model);
    FoldError when the cut does not show the whole model's graph (see the module docstring) or fails past
    its trace (the whole model's fails there too)."""
    names = list(inputs)
    taken = keyword_inputs(model, names) or len(names)
    example = list(inputs.values()) + list(targets)
    with truncated(model, fold, k) as calls:
        gm = trace(model, loss_fn, taken)  # UnsupportedGraph: op_graph would export the model
    calls.check()
    try:  # past the trace, op_graph raises what fails on the fx path: the whole model's trace says it again
        propagate(gm, example)
        prefix = step_prefix(model, loss_fn, names)
        graph = expand_fx(gm.graph, fold, k, prefix)
        # the step's root as `trace` wraps the model, now whole: the expansion's module calls and attributes
        root = loss_step(model, loss_fn, taken) if loss_fn is not None or isinstance(taken, list) else model
        whole = fx.GraphModule(root, graph)
        setattr(whole, "output_tree", getattr(gm, "output_tree", None))  # noqa: B010 - not a module attribute
        g = build_op_graph(whole, example, prefix, training=model.training, propagated=True)
    except UnsupportedGraph as e:
        raise FoldError(f"the cut model's fx graph: {e}") from e
    return named_inputs(g, whole, names, len(targets))


# ------------------------------------------------------------------------------ the expansion
class _Blocks:
    """The cut graph's nodes by block (`runs`), each node's block and place in its run."""

    def __init__(self, graph: fx.Graph, fold: Fold, k: int, prefix: str) -> None:
        self.fold, self.k = fold, k
        self.container = ".".join(p for p in (prefix, fold.container) if p)
        if not self.container:
            raise FoldError("the model's root is its block list")
        self.nodes = list(graph.nodes)
        self.block_of: dict[fx.Node, int] = {}
        self.runs: list[list[fx.Node]] = [[] for _ in range(k)]
        for node in self.nodes:
            i = self._block(node, prefix)
            if i is None:
                continue
            if i >= k:
                raise FoldError(f"{node.format_node()}: in block {i} of a model cut to {k}")
            self.block_of[node] = i
            self.runs[i].append(node)
        if not all(self.runs):
            raise FoldError("a kept block has no nodes in the traced graph")
        self.at = {x: p for p, x in enumerate(self.nodes)}
        self.pos = {x: p for run in self.runs for p, x in enumerate(run)}
        for i, run in enumerate(self.runs):  # contiguous, in block order
            s = self.at[run[0]]
            if self.nodes[s:s + len(run)] != run or (i and s != self.at[self.runs[i - 1][-1]] + 1):
                raise FoldError(f"the nodes of {fold.block(i)} are not contiguous in the traced graph")

    def _block(self, node: fx.Node, prefix: str) -> int | None:
        if node.op in ("call_module", "get_attr"):
            got = self.fold.split(strip(str(node.target), prefix))
            if got is not None:
                return got[0]
        for path, _ in (node.meta.get("nn_module_stack") or {}).values():
            got = self.fold.split(strip(str(path), prefix))
            if got is not None:
                return got[0]
        return None

    def moved(self, path: str, j: int) -> str:
        """A module path (a module stack's key: the path, then `@n` for its n-th call) in block 1, moved
        to block j; other paths unchanged."""
        path, at, calls = path.partition("@")
        head = self.container + ".1"
        if path == head or path.startswith(head + "."):
            path = f"{self.container}.{j}{path[len(head):]}"
        return path + at + calls

    def stack(self, node: fx.Node, j: int) -> list:
        """Block 1's node's module stack moved to block j."""
        return [(self.moved(key, j), (self.moved(path, j), cls))
                for key, (path, cls) in (node.meta.get("nn_module_stack") or {}).items()]

    def target(self, node: fx.Node, j: int) -> Any:
        """Block 1's node's target moved to block j (module calls and attributes name their path)."""
        return self.moved(str(node.target), j) if node.op in ("call_module", "get_attr") else node.target


def _meta(node: fx.Node) -> tuple:
    return (node.meta.get("tensor_meta"), node.meta.get("type"))


def _check_moves(cut: _Blocks) -> None:
    """Blocks 2 .. k-1 are block 1 moved on, node for node, in block-relative terms."""
    def rel(a: Any, b: int) -> Any:
        if not isinstance(a, fx.Node):
            return a
        i = cut.block_of.get(a)
        if i is None:
            if cut.at[a] > cut.at[cut.runs[0][0]]:
                raise FoldError(f"{a.name} after the blocks is read in {cut.fold.block(b)}")
            return ("outer", a)
        if i in (b, b - 1):
            return ("same" if i == b else "prev", cut.pos[a])
        raise FoldError(f"a node of {cut.fold.block(b)} reads {a.name} of {cut.fold.block(i)}")

    def shape(n: fx.Node, b: int) -> tuple:
        return (n.op, fx.node.map_aggregate(n.args, lambda a: rel(a, b)),
                fx.node.map_aggregate(dict(n.kwargs), lambda a: rel(a, b)), _meta(n), n.type)

    one = cut.runs[1]
    for b in range(1, cut.k):
        mine = cut.runs[b]
        if len(mine) != len(one):
            raise FoldError(f"{cut.fold.block(b)} has other nodes than {cut.fold.block(1)}")
        for x, y in zip(one, mine):
            if x.op in ("placeholder", "output") or shape(x, 1) != shape(y, b) or cut.target(x, b) != y.target:
                raise FoldError(f"`{y.format_node()}` of {cut.fold.block(b)} is not `{x.format_node()}` moved on")
            if cut.stack(x, b) != list((y.meta.get("nn_module_stack") or {}).items()):
                raise FoldError(f"{y.name}'s modules are not {x.name}'s moved on")


def expand_fx(graph: fx.Graph, fold: Fold, k: int, prefix: str) -> fx.Graph:
    """The traced graph of the model with `fold.count` blocks (names, targets, module stacks, shapes), from
    its graph cut to `k` blocks and shape-propagated; FoldError when the cut does not show how."""
    if not 3 <= k < fold.count:
        raise FoldError(f"{fold}: a cut to {k} blocks keeps no interior block to repeat, or all of them")
    cut = _Blocks(graph, fold, k, prefix)
    _check_moves(cut)
    same = _rebuild(cut, None)  # the cut made again: fx's namespace names it as the tracer did, and
    if _form(same) != _form(graph):  # every node reads what it read
        raise FoldError("the traced graph is not what creating its nodes again in order gives")
    return _rebuild(cut, fold.count)


def _form(graph: fx.Graph) -> list[tuple]:
    return [(x.op, x.name, str(x.target), str(x.args), str(x.kwargs)) for x in graph.nodes]


def _rebuild(cut: _Blocks, n: int | None) -> fx.Graph:
    """The cut graph with its blocks 1 .. k-1 made as copies of block 1, `n` blocks in all (None: k, the
    cut itself, each block as itself moved from block 1)."""
    k = cut.k
    n = k if n is None else n
    made: dict[fx.Node, fx.Node] = {}  # a node of the cut, for the outer nodes and block 0 -> its new node
    copies: list[dict[fx.Node, fx.Node]] = [{} for _ in range(n)]  # copy j: block 1's node -> its new node
    new = fx.Graph()
    one = cut.runs[1]

    def create(old: fx.Node, target: Any, sub: Callable[[Any], Any], meta: dict) -> fx.Node:
        node = new.create_node(old.op, target, fx.node.map_aggregate(old.args, sub),
                               fx.node.map_aggregate(dict(old.kwargs), sub), None, old.type)
        node.meta = meta
        return node

    def outer(a: Any) -> Any:
        return made[a] if isinstance(a, fx.Node) else a

    def in_copy(j: int) -> Callable[[Any], Any]:
        def sub(a: Any) -> Any:
            if not isinstance(a, fx.Node):
                return a
            i = cut.block_of.get(a)
            if i is None:
                return made[a]
            if i == 1:
                return copies[j][a]
            return made[a] if j == 1 else copies[j - 1][one[cut.pos[a]]]  # block 0: the block before
        return sub

    def after(a: Any) -> Any:  # after the blocks: the outer nodes and the last block's
        if not isinstance(a, fx.Node):
            return a
        i = cut.block_of.get(a)
        if i is None:
            return made[a]
        if i != k - 1:
            raise FoldError(f"{a.name} of {cut.fold.block(i)} is read after the blocks")
        return copies[n - 1][one[cut.pos[a]]]

    start, end = cut.at[one[0]], cut.at[cut.runs[-1][-1]]
    for x in cut.nodes:
        p = cut.at[x]
        if p < start:  # before the blocks, and block 0
            made[x] = create(x, x.target, outer, dict(x.meta))
        elif p == start:
            for j in range(1, n):
                for y in one:
                    meta = dict(y.meta)
                    if "nn_module_stack" in meta:
                        meta["nn_module_stack"] = dict(cut.stack(y, j))
                    copies[j][y] = create(y, cut.target(y, j), in_copy(j), meta)
        elif p > end:
            made[x] = create(x, x.target, after, dict(x.meta))
    return new


__all__ = ["expand_fx", "fx_folded_op_graph"]
