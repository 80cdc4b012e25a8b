"""The op graph of a model of N identical blocks, exported cut to a few blocks and expanded to N (issue #29).

torch.export traces every block of a model again (4 of the 4.5 CPU-s of Llama-3-8B's op graph). The
exported graph of a model cut to its first `k` blocks (planlang.model.capture.fold.truncated) holds
everything the whole one does: the nodes before the blocks, the first block, an interior one, the last,
and the nodes after them. The whole model's graph is that graph with the interior block repeated, each
copy renamed as torch.export names the nodes of the block it stands for:

* a call node's name is its op's base with a counter (`linear_7`): the counter of a copy `j` blocks on
  is the interior block's plus `j` times the count of nodes of that base in a block, and the nodes after
  the blocks move on by the same amount per added block (`_Mover.call_name`);
* a placeholder of a block's parameter or buffer (`p_model_layers_1_mlp_up_proj_weight`) and the module
  paths of the nodes' `nn_module_stack` carry the block index;
* an argument from the block before (the hidden state) is the previous copy's node at the same place.

The expansion is then lowered by planlang.model.capture.export_graph exactly as the whole model's graph
is, so the op graph (names, modules, constants) is the whole model's when the expanded fx graph is its
graph. That is checked on what the cut graph shows before anything is expanded, and any doubt is a
`FoldError` (the caller exports the whole model):

* the blocks' nodes are contiguous and in order, each kept block ran once (`BlockCalls.check`);
* block b (b >= 2) is block 1 moved b - 1 blocks on: every node's name, op, arguments (in block-relative
  terms), value shape and dtype, module path, and every placeholder's name and FQN;
* a counter that moves appears before the interior block only below, and after the blocks only above,
  the interior blocks' counters (so no name there depends on the block count);
* every name the expansion asks for is free (the fx namespace gives it unchanged).

A model torch.fx traces (op_graph's first front end) is expanded from its fx trace
(planlang.model.capture.fold_fx), as op_graph would trace it whole. tests/model/test_fold_graph.py compares the expanded op graph with the whole model's node for
node (and their lowered programs, and `check --model`) on Hugging Face Llama, Qwen2, Mistral and GPT-2.
"""
from __future__ import annotations

import re
from typing import Any, Callable

import torch
from torch import fx, nn

from planlang.model.capture.export_builder import StepSignature, clean_path
from planlang.model.capture.export_graph import export_step, inline_wrappers, lower_export
from planlang.model.capture.fold import Fold, FoldError, truncated
from planlang.model.capture.fold_fx import fx_folded_op_graph
from planlang.model.capture.fx_builder import strip
from planlang.model.capture.graph_values import OpGraph, UnsupportedGraph
from planlang.model.capture.opgraph import op_graph

#: blocks the cut model keeps: the first, an interior one (the one repeated) and the last
CUT_BLOCKS = 3
_NAME = re.compile(r"^([a-zA-Z_][0-9a-zA-Z_]*?)(?:_(\d+))?$")  # torch.fx's: a base and a counter


def _parse(name: str) -> tuple[str, int]:
    m = _NAME.match(name)
    if m is None:
        raise FoldError(f"node name {name!r} is no fx name")
    return m.group(1), int(m.group(2) or 0)


def _named(base: str, num: int) -> str:
    return f"{base}_{num}" if num else base


def folded_op_graph(model: nn.Module, inputs: dict[str, torch.Tensor], loss_fn: Callable | None, fold: Fold,
                    targets: tuple[torch.Tensor, ...] = (), k: int = CUT_BLOCKS) -> OpGraph:
    """The op graph planlang.model.capture.opgraph.op_graph builds of `model` (and its loss), from the model
    exported cut to its first `k` blocks and expanded to `fold.count`. FoldError when that cannot be shown
    to be the whole model's graph (the caller builds that instead); UnsupportedGraph as op_graph's."""
    if not 3 <= k < fold.count:
        raise FoldError(f"{fold}: a cut to {k} blocks keeps no interior block to repeat, or all of them")
    try:  # op_graph's first front end: a model torch.fx traces is expanded as fx traced it
        return fx_folded_op_graph(model, inputs, loss_fn, fold, targets, k)
    except UnsupportedGraph:
        pass  # the cut does not trace with fx: op_graph exports the model, so is the cut exported
    with truncated(model, fold, k) as calls:
        ep, root = export_step(model, inputs, loss_fn, targets)
    calls.check()
    inline_wrappers(ep.graph_module)
    prefix = "model" if root is not model else ""
    graph, sig = expand(ep.graph, StepSignature.of(ep), fold, k, prefix)
    return lower_export(graph, sig, root, model, list(inputs), len(targets))


# ------------------------------------------------------------------------------ the expansion
class _Cut:
    """The cut graph's nodes by place: each block's placeholders and calls, the rest outside."""

    def __init__(self, graph: fx.Graph, sig: StepSignature, fold: Fold, k: int, prefix: str) -> None:
        self.fold, self.k, self.prefix = fold, k, prefix
        self.block_of: dict[fx.Node, int] = {}
        self.calls: list[list[fx.Node]] = [[] for _ in range(k)]
        self.phs: list[list[fx.Node]] = [[] for _ in range(k)]
        for node in graph.nodes:
            i = self._block(node, sig)
            if i is None:
                continue
            if i >= k:
                raise FoldError(f"{node.format_node()}: in block {i} of a model cut to {k}")
            self.block_of[node] = i
            (self.phs if node.op == "placeholder" else self.calls)[i].append(node)
        self.pos = {n: p for run in self.calls + self.phs for p, n in enumerate(run)}
        nodes = list(graph.nodes)
        for runs in (self.phs, self.calls):
            if not all(runs):
                raise FoldError("a kept block has no nodes or no parameters in the cut graph")
            at = [nodes.index(r[0]) for r in runs]
            for i, run in enumerate(runs):  # contiguous, in block order
                if nodes[at[i]:at[i] + len(run)] != run or (i and at[i] != at[i - 1] + len(runs[i - 1])):
                    raise FoldError(f"the nodes of {fold.block(i)} are not contiguous in the exported graph")

    def _block(self, node: fx.Node, sig: StepSignature) -> int | None:
        if node.op == "placeholder":
            fqn = sig.params.get(node.name) or sig.buffers.get(node.name)
            got = self.fold.split(strip(fqn, self.prefix)) if fqn else None
            return got[0] if got else None
        stack = node.meta.get("nn_module_stack") or {}
        for path, _ in stack.values():
            got = self.fold.split(strip(clean_path(str(path)), self.prefix))
            if got is not None:
                return got[0]
        return None


class _Mover:
    """Names, module paths and FQNs of block 1 moved to block j."""

    def __init__(self, cut: _Cut) -> None:
        fold, prefix = cut.fold, cut.prefix
        self.container = ".".join(p for p in (prefix, fold.container) if p)
        if not self.container:
            raise FoldError("the model's root is its block list")
        self.under = self.container.replace(".", "_")
        self._stacks: dict[tuple, dict] = {}
        self.counts: dict[str, int] = {}
        for n in cut.calls[1]:
            base, _ = _parse(n.name)
            self.counts[base] = self.counts.get(base, 0) + 1

    def call_name(self, name: str, blocks: int) -> str:
        base, num = _parse(name)
        if _named(base, num) != name:
            raise FoldError(f"node name {name!r} does not round-trip")
        return _named(base, num + blocks * self.counts.get(base, 0)) if blocks else name

    def path(self, path: str, j: int) -> str:
        head = self.container + ".1"
        if path == head or path.startswith(head + "."):
            return f"{self.container}.{j}{path[len(head):]}"
        return path

    def ph_name(self, name: str, j: int) -> str:
        head = f"{self.under}_1_"
        if head not in name:
            raise FoldError(f"placeholder {name!r} does not name its block")
        return name.replace(head, f"{self.under}_{j}_", 1)

    def stack(self, stack: dict, j: int) -> dict:
        """A node's nn_module_stack moved to block j (keys and paths cleaned: lowering reads the paths)."""
        key = (tuple(stack.items()), j)
        if key not in self._stacks:
            self._stacks[key] = {self.path(clean_path(str(k).replace("L__self__", "")), j):
                                 (self.path(clean_path(str(path)), j), cls) for k, (path, cls) in stack.items()}
        return dict(self._stacks[key])


def _val(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return ("tensor", tuple(int(s) for s in v.shape), v.dtype)
    if isinstance(v, (tuple, list)):
        return tuple(_val(x) for x in v)
    return v


def _check_moves(cut: _Cut, mv: _Mover, sig: StepSignature) -> None:
    """Block b (2 <= b < k) is block 1 moved on: every place in it, in block-relative terms."""
    def rel(a: Any, b: int) -> Any:
        if not isinstance(a, fx.Node):
            return a
        i = cut.block_of.get(a)
        if i is None:
            return ("outer", a.name)
        if a.op == "placeholder" and i == b:
            return ("ph", cut.pos[a])
        if a.op != "placeholder" and i in (b, b - 1):
            return ("same" if i == b else "prev", cut.pos[a])
        raise FoldError(f"a node of {cut.fold.block(b)} reads {a.name} of {cut.fold.block(i)}")

    def shape(n: fx.Node, b: int) -> tuple:
        return (n.op, n.target, fx.node.map_aggregate(n.args, lambda a: rel(a, b)),
                fx.node.map_aggregate(dict(n.kwargs), lambda a: rel(a, b)), _val(n.meta.get("val")))

    def fqn(name: str) -> str:
        return sig.params.get(name) or sig.buffers[name]

    one = cut.calls[1]
    for b in range(2, cut.k):
        if len(cut.calls[b]) != len(one) or len(cut.phs[b]) != len(cut.phs[1]):
            raise FoldError(f"{cut.fold.block(b)} has other nodes than {cut.fold.block(1)}")
        for x, y in zip(one, cut.calls[b]):
            if x.op != "call_function" or shape(x, 1) != shape(y, b):
                raise FoldError(f"`{y.format_node()}` of {cut.fold.block(b)} is not `{x.format_node()}` moved on")
            if mv.call_name(x.name, b - 1) != y.name:
                raise FoldError(f"{y.name} in {cut.fold.block(b)} is not {x.name} moved {b - 1} blocks on")
            if mv.stack(x.meta.get("nn_module_stack") or {}, b) != mv.stack(y.meta.get("nn_module_stack") or {}, b):
                raise FoldError(f"{y.name}'s modules are not {x.name}'s moved on")
        for x, y in zip(cut.phs[1], cut.phs[b]):
            if (mv.ph_name(x.name, b) != y.name or mv.path(fqn(x.name), b) != fqn(y.name)
                    or _val(x.meta.get("val")) != _val(y.meta.get("val"))
                    or (x.name in sig.params) != (y.name in sig.params)):
                raise FoldError(f"placeholder {y.name} of {cut.fold.block(b)} is not {x.name} moved on")


def expand(graph: fx.Graph, sig: StepSignature, fold: Fold, k: int, prefix: str) -> tuple[fx.Graph, StepSignature]:
    """The exported graph of the model with `fold.count` blocks, from its graph cut to `k` blocks (wrappers
    inlined) and that graph's signature; FoldError when the cut graph does not show how (module docstring)."""
    cut = _Cut(graph, sig, fold, k, prefix)
    mv = _Mover(cut)
    _check_moves(cut, mv, sig)
    n, extra = fold.count, fold.count - k
    nodes = list(graph.nodes)
    at = {x: p for p, x in enumerate(nodes)}
    start, end = at[cut.calls[1][0]], at[cut.calls[-1][-1]]
    # a moving counter is below the interior blocks' before them and above after them: no name outside
    # the blocks depends on how many there are
    lo: dict[str, int] = {}
    hi: dict[str, int] = {}
    for x in cut.calls[1]:
        base, num = _parse(x.name)
        lo[base] = min(lo.get(base, num), num)
    for x in cut.calls[-1]:
        base, num = _parse(x.name)
        hi[base] = max(hi.get(base, num), num)
    for x in nodes:
        if x.op in ("placeholder", "output") or cut.block_of.get(x, 0) >= 1:
            continue
        base, num = _parse(x.name)
        if base in lo and (num >= lo[base] if at[x] < start else num <= hi[base]):
            raise FoldError(f"{x.name} outside the repeated blocks is numbered among them")

    new = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}  # cut node -> its node in the expansion
    copies: list[dict[fx.Node, fx.Node]] = [{} for _ in range(n)]  # copy j (block j): block 1's node -> its node
    replaced = {x.name for b in range(1, k) for x in cut.phs[b]}  # the copies' placeholders stand for these
    params = {p: f for p, f in sig.params.items() if p not in replaced}
    buffers = {p: f for p, f in sig.buffers.items() if p not in replaced}
    renamed: dict[str, str] = {}

    def make(old: fx.Node, name: str, sub: Callable[[Any], Any], meta: dict) -> fx.Node:
        made = new.create_node(old.op, name if old.op == "placeholder" else old.target,
                               fx.node.map_aggregate(old.args, sub), fx.node.map_aggregate(dict(old.kwargs), sub),
                               name, old.type)
        if made.name != name:
            raise FoldError(f"the expansion's name {name} is taken")
        made.meta = meta
        return made

    def in_block(j: int) -> Callable[[Any], Any]:
        def sub(a: Any) -> Any:
            if not isinstance(a, fx.Node):
                return a
            i = cut.block_of.get(a)
            if i is None:
                return env[a]
            if i == 1:
                return copies[j][a]
            if i == 0 and a.op != "placeholder":  # the block before: block 0 itself, or the copy before
                return env[a] if j == 1 else copies[j - 1][cut.calls[1][cut.pos[a]]]
            raise FoldError(f"{fold.block(1)} reads {a.name} of {fold.block(i)}")
        return sub

    def outside(a: Any) -> Any:  # after the blocks: what is outside them, and the last block
        if not isinstance(a, fx.Node):
            return a
        if cut.block_of.get(a, k - 1) != k - 1:
            raise FoldError(f"{a.name} of {fold.block(cut.block_of[a])} is read after the blocks")
        return env[a]

    for x in nodes:
        i = cut.block_of.get(x)
        if i is None or i == 0:
            if x.op == "placeholder" or at[x] < start:
                env[x] = make(x, x.name, lambda a: env[a] if isinstance(a, fx.Node) else a, dict(x.meta))
            else:
                name = x.name if x.op == "output" else mv.call_name(x.name, extra)
                renamed[x.name] = name
                env[x] = make(x, name, outside, dict(x.meta))
            continue
        if x is not cut.phs[1][0] and x is not cut.calls[1][0]:
            continue  # made with block 1's run
        run = cut.phs[1] if x.op == "placeholder" else cut.calls[1]
        for j in range(1, n):
            for y in run:
                if y.op == "placeholder":
                    name = mv.ph_name(y.name, j)
                    table = params if y.name in sig.params else buffers
                    table[name] = mv.path(sig.params.get(y.name) or sig.buffers[y.name], j)
                    copies[j][y] = make(y, name, lambda a: a, dict(y.meta))
                else:
                    meta = dict(y.meta)
                    meta["nn_module_stack"] = mv.stack(y.meta.get("nn_module_stack") or {}, j)
                    copies[j][y] = make(y, mv.call_name(y.name, j - 1), in_block(j), meta)
        for b in range(1, k):  # the cut's blocks 1 .. k-2 are the expansion's, its last block the last
            mine = cut.phs[b] if x.op == "placeholder" else cut.calls[b]
            for z, y in zip(mine, run):
                env[z] = copies[n - 1 if b == k - 1 else b][y]
    out = StepSignature(params, buffers, dict(sig.lifted), dict(sig.constants), list(sig.user_inputs),
                        [renamed.get(o, o) for o in sig.user_outputs])
    return new, out


def op_graph_of(model: nn.Module, inputs: dict[str, torch.Tensor], loss_fn: Callable | None = None,
                targets: tuple[torch.Tensor, ...] = (), fold: Fold | None = None) -> tuple[OpGraph, str | None]:
    """op_graph's graph of `model` (and its loss): expanded from the model cut to a few of `fold`'s blocks
    where `folded_op_graph` can show it is the whole model's, else built from the whole model. Returns the
    graph and, when it was built whole, why it was not expanded (the graph is the same either way)."""
    why = "no list of identical blocks" if fold is None else None
    if fold is not None:
        try:
            return folded_op_graph(model, inputs, loss_fn, fold, targets), None
        except FoldError as e:
            why = str(e)
        except Exception as e:  # noqa: BLE001 - the whole model's export says it again, or goes through:
            why = f"the cut model: {type(e).__name__}: {e}"  # expanding changes how long, never the result
    return (op_graph(model, inputs, loss_fn, targets) if loss_fn is not None else op_graph(model, inputs)), why
