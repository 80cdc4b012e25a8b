"""`@rule` registrations for every op kind the solver knows (torch-free), each with its memory and cost
facts (`OpKind`: saved inputs and output, view, backward ratio, ILP follower).

Input conventions (what `planlang.model` must produce and `planlang.runtime.local_ops` executes):

    linear                 x[..., K], w[N, K] (, b[N])                     -> [..., N]
    matmul                 a[..., M, K] | a[K], b[..., K, N] | b[K]        -> torch.matmul shape
    bmm                    a[B, M, K], b[B, K, N]                          -> [B, M, N]
    addmm                  bias[N] | [M, N] | [1, N], m1[M, K], m2[K, N]   attrs beta, alpha
    conv2d                 x[N, C, H, W], w[O, C/g, kh, kw] (, b[O])       attrs stride, padding, dilation, groups
    embedding              idx[...] (integer), w[V, H]                     -> [..., H]
    layer_norm             x[..., *norm], weight[*norm]?, bias[*norm]?     attrs normalized_ndim (default 1), eps
    rms_norm               x[..., *norm], weight[*norm]?                   attrs normalized_ndim, eps
    softmax, log_softmax   x                                               attr dim
    gelu relu silu tanh exp neg rsqrt sqrt sigmoid sin cos   x             (neg is linear)
    cast                   x                                               attr dtype ("f32", "bf16", ...): x.to(it)
    add sub mul div        a, b broadcasting to the output
    sum mean amax          x                                               attrs dim (int | tuple | None), keepdim
    view reshape flatten unflatten   x -> output shape
    expand                 x -> output shape (x broadcast: size-1 or missing leading dims grow)
    transpose              x                                               attrs dim0, dim1
    permute                x                                               attr dims
    cat                    x1, x2, ...                                     attr dim (an input of shape [0] is
                           skipped when the output has more dims, as torch skips it: an empty KV cache)
    split                  x                                               attrs dim, split_size (int | list), index
    slice getitem          x                                               attrs dim, start, end, step (default 1)
    scaled_dot_product_attention   q[B, H, S, D], k[B, G, T, D], v[B, G, T, E]   attrs is_causal, scale
                           (G == H, or G < H dividing it: multi-query / grouped-query attention, query head
                           i reading key/value head i // (H / G), as torch's enable_gqa and a broadcast G = 1)
    stack roll einsum      see tensor_ops.py
    cross_entropy          logits[N, V], target[N] (integer)               attr reduction ("mean" | "sum" | "none")
    dropout                x                                               attrs p, seed, training
"""
from __future__ import annotations

import itertools
import math
from dataclasses import replace

from planlang.plan.types import Mesh, Spec

from ..comm import Collective, price
from .base import OpSpec, Strategy, on, rule
from .einsum import (
    UPPER, Equation, EquationError, broadcast_equation, einsum_strategies, letters_for, local_numel, mesh_axes,
)

numel = math.prod


def dims_attr(attr, rank: int) -> list[int]:
    if attr is None:
        return list(range(rank))
    if isinstance(attr, int):
        attr = [attr]
    return sorted(d % rank for d in attr)


# ------------------------------------------------------------------------------ matmuls
@rule("linear", saves=(0, 1), backward_ratio=2.0, product=(1, 0, 2),
      targets=on("torch.nn.functional.linear", modules=("torch.nn.Linear",), aten=("aten.linear.default",)))
def linear_rule(op: OpSpec, mesh: Mesh) -> list[Strategy]:
    x, w = op.inputs[0], op.inputs[1]
    batch = letters_for(len(x) - 1, skip="kn")
    ins = [batch + "k", "nk"] + (["n"] if len(op.inputs) > 2 else [])
    eq = Equation(tuple(ins), batch + "n", passthrough="one", linear=(0, 1),
                  affine=(2,) if len(op.inputs) > 2 else ())
    return einsum_strategies(op, mesh, eq, 2.0 * numel(x) * w[0] + (numel(op.output) if len(ins) > 2 else 0))


def _matmul_letters(a, b, out) -> tuple[list[str], str, set[str]]:
    if len(a) == 1 and len(b) == 1:
        return ["k", "k"], "", set()
    if len(a) == 1:
        bb = b[:-2]
        ins, ob, un = broadcast_equation((bb,), out[:-1])
        return ["k", ins[0] + "kn"], ob + "n", un
    if len(b) == 1:
        ins, ob, un = broadcast_equation((a[:-2],), out[:-1])
        return [ins[0] + "mk", "k"], ob + "m", un
    ins, ob, un = broadcast_equation((a[:-2], b[:-2]), out[:-2])
    return [ins[0] + "mk", ins[1] + "kn"], ob + "mn", un


@rule("matmul", "bmm", saves=(0, 1), backward_ratio=2.0, product={"matmul": (1, -1, None)},
      targets={"matmul": on("torch.matmul", "operator.matmul", aten=("aten.matmul.default", "aten.mm.default")),
               "bmm": on("torch.bmm", aten=("aten.bmm.default",))})
def matmul_rule(op: OpSpec, mesh: Mesh) -> list[Strategy]:
    a, b = op.inputs
    ins, o, un = _matmul_letters(a, b, op.output)
    eq = Equation(tuple(ins), o, frozenset(un), passthrough="one", linear=(0, 1))
    k = a[-1]
    return einsum_strategies(op, mesh, eq, 2.0 * numel(op.output) * k)


@rule("addmm", saves=(1, 2), backward_ratio=2.0, product=(2, 1, 0), targets=on("torch.addmm", aten=("aten.addmm.default",)))
def addmm_rule(op: OpSpec, mesh: Mesh) -> list[Strategy]:
    bias, m1, m2 = op.inputs
    (bl,), o, un = broadcast_equation((bias,), op.output)  # o == "ab"
    eq = Equation((bl, "ak", "kb"), "ab", frozenset(un), passthrough="one", linear=(1, 2), affine=(0,))
    return einsum_strategies(op, mesh, eq, 2.0 * m1[0] * m1[1] * m2[1] + numel(op.output))


@rule("conv2d", saves=(0, 1), backward_ratio=2.0, targets=on(modules=("torch.nn.Conv2d",), aten=("aten.conv2d.default",)))
def conv2d_rule(op: OpSpec, mesh: Mesh) -> list[Strategy]:
    w = op.inputs[1]
    groups = op.attr("groups", 1)
    ins = ["nchw", "ocyx" if groups == 1 else "oCyx"] + (["o"] if len(op.inputs) > 2 else [])
    un = {"h", "w", "y", "x", "p", "q"} | ({"c", "C", "o"} if groups != 1 else set())
    eq = Equation(tuple(ins), "nopq", frozenset(un), passthrough="one", linear=(0, 1),
                  affine=(2,) if len(ins) > 2 else ())
    flops = 2.0 * numel(op.output) * w[1] * w[2] * w[3]
    return einsum_strategies(op, mesh, eq, flops)


# ------------------------------------------------------------------------------ embedding
@rule("embedding", saves=(0,), targets=on("torch.nn.functional.embedding", modules=("torch.nn.Embedding",),
                                          aten=("aten.embedding.default",)))
def embedding_rule(op: OpSpec, mesh: Mesh) -> list[Strategy]:
    """idx split on its dims, weight split on the hidden dim (column-parallel), or on the vocab dim: each
    device looks up the rows it holds, zeros the rest (masked lookup), and the output is partial."""
    idx = op.inputs[0]
    il = letters_for(len(idx), skip="vh")
    eq = Equation((il, "vh"), il + "h", passthrough="one", linear=(1,))
    return einsum_strategies(op, mesh, eq, float(numel(op.output)))


# ------------------------------------------------------------------------------ norms, softmax
def _norm(op: OpSpec, mesh: Mesh, cost: float) -> list[Strategy]:
    x = op.inputs[0]
    k = op.attr("normalized_ndim", len(op.inputs[1]) if len(op.inputs) > 1 else 1)
    xl = letters_for(len(x))
    norm = xl[len(x) - k:]
    eq = Equation((xl,) + (norm,) * (len(op.inputs) - 1), xl, frozenset(norm))
    return einsum_strategies(op, mesh, eq, cost * numel(x))


@rule("layer_norm", saves=(0, 1), targets=on("torch.nn.functional.layer_norm", modules=("torch.nn.LayerNorm",),
                                             aten=("aten.layer_norm.default",)))
def layer_norm_rule(op: OpSpec, mesh: Mesh) -> list[Strategy]:
    return _norm(op, mesh, 8.0)


@rule("rms_norm", saves=(0, 1), targets=on(modules=("torch.nn.RMSNorm",)))
def rms_norm_rule(op: OpSpec, mesh: Mesh) -> list[Strategy]:
    return _norm(op, mesh, 5.0)


@rule("softmax", "log_softmax", saves_output=True,
      targets={"softmax": on("torch.nn.functional.softmax", "torch.softmax", methods=("softmax",),
                             aten=("aten.softmax.int", "aten._softmax.default")),
               "log_softmax": on("torch.nn.functional.log_softmax", "torch.log_softmax", methods=("log_softmax",),
                                 aten=("aten.log_softmax.int", "aten._log_softmax.default"))})
def softmax_rule(op: OpSpec, mesh: Mesh) -> list[Strategy]:
    x = op.inputs[0]
    xl = letters_for(len(x))
    d = op.attr("dim", -1) % len(x)
    eq = Equation((xl,), xl, frozenset(xl[d]))
    return einsum_strategies(op, mesh, eq, 5.0 * numel(x))


# ------------------------------------------------------------------------------ elementwise
UNARY = {"gelu": 8.0, "relu": 1.0, "silu": 4.0, "tanh": 4.0, "exp": 1.0, "neg": 1.0, "rsqrt": 2.0, "sqrt": 2.0,
         "sigmoid": 4.0, "sin": 4.0, "cos": 4.0}
LINEAR_UNARY = {"neg"}
UNARY_TARGETS = {
    "gelu": on("torch.nn.functional.gelu", modules=("torch.nn.GELU",), aten=("aten.gelu.default",)),
    "relu": on("torch.relu", "torch.nn.functional.relu", methods=("relu",), modules=("torch.nn.ReLU",),
               aten=("aten.relu.default",)),
    "silu": on("torch.nn.functional.silu", modules=("torch.nn.SiLU",), aten=("aten.silu.default",)),
    "tanh": on("torch.tanh", methods=("tanh",), modules=("torch.nn.Tanh",), aten=("aten.tanh.default",)),
    "exp": on("torch.exp", methods=("exp",), aten=("aten.exp.default",)),
    "neg": on("torch.neg", "operator.neg", methods=("neg",), aten=("aten.neg.default",)),
    "rsqrt": on("torch.rsqrt", methods=("rsqrt",), aten=("aten.rsqrt.default",)),
    "sqrt": on("torch.sqrt", methods=("sqrt",), aten=("aten.sqrt.default",)),
    "sigmoid": on("torch.sigmoid", "torch.nn.functional.sigmoid", methods=("sigmoid",), modules=("torch.nn.Sigmoid",),
                  aten=("aten.sigmoid.default",)),
    "sin": on("torch.sin", methods=("sin",), aten=("aten.sin.default",)),
    "cos": on("torch.cos", methods=("cos",), aten=("aten.cos.default",)),
}


@rule(*UNARY, saves={k: (0,) for k in ("gelu", "silu", "tanh", "sin", "cos")},
      saves_output={k: True for k in ("relu", "exp", "tanh", "rsqrt", "sqrt", "sigmoid")}, follower=True,
      targets=UNARY_TARGETS)
def unary_rule(op: OpSpec, mesh: Mesh) -> list[Strategy]:
    xl = letters_for(len(op.inputs[0]))
    lin = op.kind in LINEAR_UNARY
    eq = Equation((xl,), xl, passthrough="one" if lin else "none", linear=(0,) if lin else ())
    return einsum_strategies(op, mesh, eq, UNARY[op.kind] * numel(op.output))


# x.to(dtype) (torch.export) and x.type_as(y) where the dtypes differ at trace time (the front ends)
@rule("cast", follower=True, targets=on(methods=("type_as",), aten=("aten.to.dtype", "aten.type_as.default")))
def cast_rule(op: OpSpec, mesh: Mesh) -> list[Strategy]:
    """x.to(dtype) (attr dtype: "f32", "bf16", ...): elementwise and linear, any layout passes through;
    backward casts the gradient back and keeps nothing."""
    xl = letters_for(len(op.inputs[0]))
    eq = Equation((xl,), xl, passthrough="one", linear=(0,))
    return einsum_strategies(op, mesh, eq, 0.0)


# saves its mask: the input's size and dtype (local_ops); the identity in eval or with p = 0
@rule("dropout", saves=(0,), follower=True, random=True,
      identity=lambda op: not op.attr("training", True) or op.attr("p", 0.0) == 0,
      targets=on("torch.nn.functional.dropout", modules=("torch.nn.Dropout",), aten=("aten.dropout.default",)))
def dropout_rule(op: OpSpec, mesh: Mesh) -> list[Strategy]:
    """Elementwise and linear in x for a fixed mask; the runtime draws the global mask from `seed` and
    slices it, so every layout yields the single-process result."""
    xl = letters_for(len(op.inputs[0]))
    eq = Equation((xl,), xl, passthrough="one", linear=(0,))
    return einsum_strategies(op, mesh, eq, 2.0 * numel(op.output))


BINARY_PASSTHROUGH = {"add": ("all", (0, 1)), "sub": ("all", (0, 1)), "mul": ("one", (0, 1)), "div": ("one", (0,))}


@rule(*BINARY_PASSTHROUGH, saves={"mul": (0, 1), "div": (0, 1)}, targets={
    "add": on("operator.add", "torch.add", methods=("add",), aten=("aten.add.Tensor", "aten.add.Scalar")),
    "sub": on("operator.sub", "torch.sub", methods=("sub",), aten=("aten.sub.Tensor", "aten.sub.Scalar")),
    # x ** 2 and x ** 3 are products (as ATen computes them)
    "mul": on("operator.mul", "torch.mul", methods=("mul",),
              aten=("aten.mul.Tensor", "aten.mul.Scalar", "aten.pow.Tensor_Scalar")),
    "div": on("operator.truediv", "torch.div", methods=("div",), aten=("aten.div.Tensor", "aten.div.Scalar")),
})
def binary_rule(op: OpSpec, mesh: Mesh) -> list[Strategy]:
    ins, o, un = broadcast_equation(op.inputs, op.output)
    mode, lin = BINARY_PASSTHROUGH[op.kind]
    eq = Equation(tuple(ins), o, frozenset(un), passthrough=mode, linear=lin)
    return einsum_strategies(op, mesh, eq, float(numel(op.output)))


# ------------------------------------------------------------------------------ reductions
def _reduce_equation(op: OpSpec) -> tuple[str, str, list[int]]:
    x = op.inputs[0]
    xl = letters_for(len(x))
    red = dims_attr(op.attr("dim"), len(x)) if len(x) else []
    keep = op.attr("keepdim", False)
    fresh = iter("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
    ol = "".join((next(fresh) if keep else "") if i in red else c for i, c in enumerate(xl))
    return xl, ol, red


@rule("sum", "mean", targets={"sum": on("torch.sum", methods=("sum",), aten=("aten.sum.dim_IntList", "aten.sum.default")),
                             "mean": on("torch.mean", methods=("mean",), aten=("aten.mean.dim", "aten.mean.default"))})
def sum_rule(op: OpSpec, mesh: Mesh) -> list[Strategy]:
    """A split reduced dim leaves a partial sum (mean: each device divides by the global count)."""
    xl, ol, _ = _reduce_equation(op)
    eq = Equation((xl,), ol, frozenset(c for c in ol if c.isupper()), passthrough="one", linear=(0,))
    return einsum_strategies(op, mesh, eq, float(numel(op.inputs[0])))


@rule("amax", saves=(0,), saves_output=True, targets=on(aten=("aten.amax.default",)))
def amax_rule(op: OpSpec, mesh: Mesh) -> list[Strategy]:
    xl, ol, red = _reduce_equation(op)
    eq = Equation((xl,), ol, frozenset({xl[i] for i in red} | {c for c in ol if c.isupper()}))
    return einsum_strategies(op, mesh, eq, float(numel(op.inputs[0])))


# ------------------------------------------------------------------------------ views
@rule("transpose", "permute", alias=True, targets={
    "transpose": on("torch.transpose", methods=("transpose",), aten=("aten.transpose.int", "aten.t.default")),
    "permute": on(methods=("permute",), aten=("aten.permute.default", "aten.numpy_T.default"))})
def permute_rule(op: OpSpec, mesh: Mesh) -> list[Strategy]:
    x = op.inputs[0]
    xl = letters_for(len(x))
    if op.kind == "transpose":
        d0, d1 = op.attr("dim0", 0) % len(x), op.attr("dim1", 1) % len(x)
        perm = list(range(len(x)))
        perm[d0], perm[d1] = perm[d1], perm[d0]
    else:
        perm = [d % len(x) for d in op.attr("dims")]
    eq = Equation((xl,), "".join(xl[p] for p in perm), passthrough="one", linear=(0,))
    return einsum_strategies(op, mesh, eq, 0.0)


def reshape_groups(a: tuple[int, ...], b: tuple[int, ...]) -> list[tuple[list[int], list[int]]]:
    """Pair runs of input and output dims with equal products (size-1 dims join a neighbouring group)."""
    if numel(a) != numel(b):
        raise EquationError(f"cannot reshape {list(a)} to {list(b)}")
    res: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(a) and j < len(b):
        gi, gj, pa, pb = [i], [j], a[i], b[j]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb:
                gi.append(i)
                pa *= a[i]
                i += 1
            else:
                gj.append(j)
                pb *= b[j]
                j += 1
        res.append((gi, gj))
    rest_i, rest_j = list(range(i, len(a))), list(range(j, len(b)))
    if rest_i or rest_j:
        if res:
            res[-1][0].extend(rest_i)
            res[-1][1].extend(rest_j)
        else:
            res.append((rest_i, rest_j))
    return res


def _major(dims: list[int], shape) -> int | None:
    for d in dims:
        if shape[d] > 1:
            return d
    return None


@rule("view", "reshape", "flatten", "unflatten", alias=True, targets={
    "view": on(methods=("view",), aten=("aten.view.default", "aten._unsafe_view.default")),
    "reshape": on("torch.reshape", methods=("reshape",),
                  aten=("aten.reshape.default", "aten.unsqueeze.default", "aten.squeeze.dim", "aten.squeeze.dims")),
    "flatten": on("torch.flatten", methods=("flatten",), aten=("aten.flatten.using_ints",))})
def reshape_rule(op: OpSpec, mesh: Mesh) -> list[Strategy]:
    """A split survives a reshape when it is on the major (first non-1) dim of a group of input dims
    whose product equals that of a group of output dims, it lands on the group's major output dim, and
    both major dims divide by the axes' product. Linear: partial passes through."""
    x, y = op.inputs[0], op.output
    groups = []
    for gi, gj in reshape_groups(x, y):
        mi, mj = _major(gi, x), _major(gj, y)
        if mi is not None and mj is not None:
            groups.append((mi, mj))
    axes = mesh_axes(mesh)
    out = []
    for assign in itertools.product([None, "P"] + list(range(len(groups))), repeat=len(axes)):
        din: list[list[str]] = [[] for _ in x]
        dout: list[list[str]] = [[] for _ in y]
        for (a, _), ch in zip(axes, assign):
            if isinstance(ch, int):
                din[groups[ch][0]].append(a)
                dout[groups[ch][1]].append(a)
        size = dict(axes)
        if any(x[d] % numel(size[a] for a in din[d]) for d in range(len(x))) or \
                any(y[d] % numel(size[a] for a in dout[d]) for d in range(len(y))):
            continue
        part = tuple(a for (a, _), ch in zip(axes, assign) if ch == "P")
        ospec = Spec(tuple(map(tuple, dout)), part)
        name = " ".join(f"{a}:{f'dim{groups[ch][0]}' if isinstance(ch, int) else 'partial'}"
                        for (a, _), ch in zip(axes, assign) if ch is not None) or "replicate"
        out.append(Strategy(name, (Spec(tuple(map(tuple, din)), part),), ospec, flops=0.0,
                            memory=local_numel(y, ospec, mesh) * op.itemsize))
    return out


@rule("expand", alias=True, targets=on(methods=("expand", "expand_as"), aten=("aten.expand.default",)))
def expand_rule(op: OpSpec, mesh: Mesh) -> list[Strategy]:
    """x broadcast to the output shape: a dim x keeps passes its split through; a dim that grows from 1
    (or is new) may be split on the output with x whole there (each device expands to its local size).
    Linear; the gradient of a grown dim is a sum over it, partial where the output is split."""
    ins, o, un = broadcast_equation(op.inputs, op.output)
    eq = Equation(tuple(ins), o, frozenset(un), passthrough="one", linear=(0,))
    return einsum_strategies(op, mesh, eq, 0.0)


# ------------------------------------------------------------------------------ cat, split, slice
@rule("cat", targets=on("torch.cat", aten=("aten.cat.default",)))
def cat_rule(op: OpSpec, mesh: Mesh) -> list[Strategy]:
    """The inputs side by side along `dim`, which no strategy splits. torch.cat skips an input of shape
    [0] beside inputs of more dims (a legacy empty tensor: Hugging Face's key/value cache before its first
    step); such an input gets a letter of its own here, replicated, holding nothing."""
    rank = len(op.output)
    d = op.attr("dim", 0) % rank
    base = letters_for(rank)
    skipped = [rank > 1 and tuple(x) == (0,) for x in op.inputs]
    ins = tuple(UPPER[i] if skipped[i] else base[:d] + UPPER[i] + base[d + 1:] for i in range(len(op.inputs)))
    out = base[:d] + "Z" + base[d + 1:]
    eq = Equation(ins, out, frozenset(UPPER), passthrough="all",
                  linear=tuple(range(len(op.inputs))))
    return einsum_strategies(op, mesh, eq, 0.0)


# split: a chunk/split call is one "split" op per piece a getitem takes (the front ends)
@rule("split", "slice", "getitem", alias=True, targets={
    "split": on("torch.chunk", "torch.split", methods=("chunk", "split"),
                aten=("aten.split.Tensor", "aten.split_with_sizes.default", "aten.chunk.default")),
    "slice": on(aten=("aten.slice.Tensor", "aten.select.int"))})
def slice_rule(op: OpSpec, mesh: Mesh) -> list[Strategy]:
    """The cut dim whole. A piece of a value stored in blocks (`blocks`, `block_axes`: a fused projection
    split per head, planlang.model.program.head_blocks) may also keep the cut dim split over the block axes: each
    device's share of the value is its share of every block, so its share of a piece is a local piece."""
    rank = len(op.output)
    d = op.attr("dim", 0) % rank
    base = letters_for(rank)
    eq = Equation((base[:d] + "A" + base[d + 1:],), base[:d] + "B" + base[d + 1:], frozenset("AB"),
                  passthrough="one", linear=(0,))
    whole = einsum_strategies(op, mesh, eq, 0.0)
    axes = tuple(op.attr("block_axes", ()))
    if not op.attr("blocks") or not axes:
        return whole
    out = []
    for s in whole:
        if set(axes) & set(s.inputs[0].used_axes()):
            continue
        x = Spec(s.inputs[0].dims[:d] + (axes,) + s.inputs[0].dims[d + 1:], s.inputs[0].partial)
        y = Spec(s.output.dims[:d] + (axes,) + s.output.dims[d + 1:], s.output.partial)
        out.append(Strategy(s.name + " (per block)", (x,), y, s.forward, s.backward, s.flops,
                            local_numel(op.output, y, mesh) * op.itemsize, s.extra))
    return out + whole


def slice_bounds(op: OpSpec) -> tuple[int, int, int]:
    """(dim, start, length) of the piece a split/slice/getitem op keeps (a slice with a step keeps every
    `step`-th element from start: `length` of them, the output's size; its end is start + span)."""
    x = op.inputs[0]
    d = op.attr("dim", 0) % len(x)
    if op.kind == "split":
        ss, idx = op.attr("split_size"), op.attr("index", 0)
        sizes = list(ss) if isinstance(ss, (list, tuple)) else [ss] * -(-x[d] // ss)
        if not isinstance(ss, (list, tuple)):
            sizes[-1] = x[d] - ss * (len(sizes) - 1)
        return d, sum(sizes[:idx]), sizes[idx]
    start = op.attr("start", 0) or 0
    end = op.attr("end", x[d])
    start, end = start % x[d] if start < 0 else start, min(end + x[d] if end < 0 else end, x[d])
    step = op.attr("step", 1) or 1
    return d, start, len(range(start, end, step))


# ------------------------------------------------------------------------------ attention
@rule("scaled_dot_product_attention", saves=(0, 1, 2), saves_output=True, backward_ratio=2.5,
      random=lambda op: bool(op.attr("dropout_p", 0.0)),
      targets=on("torch.nn.functional.scaled_dot_product_attention", aten=("aten.scaled_dot_product_attention.default",)))
def sdpa_rule(op: OpSpec, mesh: Mesh) -> list[Strategy]:
    """Split batch and/or heads; or the query sequence (k, v replicated on it; causal masks offset by the
    chunk start). The head dim and the key sequence are never split. With fewer key/value heads than
    query heads (multi-query, grouped-query: `g`) k and v keep all of theirs wherever the query heads
    are split: each device reads the key/value head of each of its query heads (runtime.local_ops), and
    the gradients of k and v are partial sums over the axes splitting the query heads. With `dropout_p`
    the fused kernel drops attention weights itself: each device draws its piece's mask from the step's
    seed and its coordinates on the axes splitting the output (replicas on other axes draw the same)."""
    q, k = op.inputs[0], op.inputs[1]
    kv = "bhtd" if k[1] == q[1] else "bgtd"
    eq = Equation(("bhsd", kv, kv[:3] + "e"), "bhse", frozenset("dteg"))
    b, h, s, d = q
    return einsum_strategies(op, mesh, eq, 4.0 * b * h * s * k[2] * d)


def sdpa_heads_fit(q, k, v, enable_gqa: bool) -> bool:
    """Whether the attention rule describes q, k, v of these shapes: one batch, and k and v with the
    query's heads, or fewer dividing them under enable_gqa, or one broadcast (multi-query attention)."""
    if len(q) != 4 or len(k) != 4 or len(v) != 4 or k[0] != q[0] or v[:3] != k[:3] or k[3] != q[3]:
        return False
    return k[1] == q[1] or k[1] == 1 or (enable_gqa and k[1] > 0 and q[1] % k[1] == 0)


# ------------------------------------------------------------------------------ cross-entropy
@rule("cross_entropy", saves=(0, 1),
      targets=on("torch.nn.functional.cross_entropy", aten=("aten.cross_entropy_loss.default",)))
def cross_entropy_rule(op: OpSpec, mesh: Mesh) -> list[Strategy]:
    """Split N: each device sums its rows' losses (divided for mean by the global number of rows whose
    target is not ignore_index, one integer summed over the N axes) -> partial loss.
    Split V (vocab-parallel): all-reduce(max) and all-reduce(sum) of per-row statistics over the vocab
    axes (the sum carries the exp-sum and the target logit) give the exact loss, not partial."""
    logits = op.inputs[0]
    red = op.attr("reduction", "mean")
    eq = Equation(("nv", "n"), "n" if red == "none" else "")
    strategies = einsum_strategies(op, mesh, eq, 5.0 * numel(logits))
    out = []
    for s in strategies:
        vaxes = s.inputs[0].axes_of(1)
        naxes = s.inputs[0].axes_of(0)
        # a mean is over the rows whose target is not ignore_index (-100): their number is summed over the
        # axes splitting the rows (one int64; planlang.runtime.local_ops)
        count = (price(Collective.ALL_REDUCE, mesh, naxes, 8),) if red == "mean" and naxes else ()
        if not vaxes:
            out.append(replace(s, forward=s.forward + count) if count else s)
            continue
        rows = logits[0] // (s.inputs[0].shard_factor(0, mesh) or 1)
        fwd = (price(Collective.ALL_REDUCE, mesh, vaxes, rows * op.itemsize),
               price(Collective.ALL_REDUCE, mesh, vaxes, 2 * rows * op.itemsize)) + count
        ospec = Spec(s.output.dims, tuple(a for a in s.output.partial if a not in vaxes))
        out.append(Strategy(s.name + " (vocab-parallel)", s.inputs, ospec, fwd, s.backward, s.flops,
                            local_numel(op.output, ospec, mesh) * op.itemsize, s.extra))
    return out
