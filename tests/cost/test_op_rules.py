"""Op sharding rules, torch-free: strategy counts, divisibility pruning, unshardable dims, costs."""
import pytest

from planlang.cost.comm import Collective
from planlang.cost.layout import is_valid
from planlang.cost.ops import OpSpec, UnknownOp, registry, strategies
from planlang.cost.ops import rules  # noqa: F401  (registers the rules)
from planlang.cost.ops.einsum import Equation, EquationError, einsum_strategies
from planlang.cost.ops.rules import reshape_groups, slice_bounds
from planlang.plan.types import Axis, Link, Mesh, Spec

IB = Link("ib", 25e9, 5e-6)
NV = Link("nv", 300e9, 2e-6)
M = Mesh("m", None, (Axis("dp", 2, IB), Axis("tp", 2, NV)))
M1 = Mesh("m1", None, (Axis("x", 4, NV),))


def op(kind, inputs, output, ints=(), **attrs):
    dts = tuple("i64" if i in ints else "f32" for i in range(len(inputs)))
    return OpSpec(kind, tuple(map(tuple, inputs)), tuple(output), "f32", tuple(attrs.items()), dts)


def S(*dims, partial=()):
    return Spec(tuple(tuple(d) if isinstance(d, (tuple, list)) else ((d,) if d else ()) for d in dims), tuple(partial))


def by_name(ss):
    return {s.name: s for s in ss}


KINDS = {"linear", "matmul", "bmm", "addmm", "conv2d", "embedding", "layer_norm", "rms_norm", "softmax",
         "log_softmax", "gelu", "relu", "silu", "tanh", "exp", "neg", "add", "sub", "mul", "div", "sum", "mean",
         "amax", "view", "reshape", "flatten", "unflatten", "transpose", "permute", "cat", "split", "slice",
         "getitem", "scaled_dot_product_attention", "cross_entropy", "dropout"}


def test_every_kind_registered():
    assert KINDS <= set(registry())


def test_unknown_op():
    with pytest.raises(UnknownOp, match="no sharding rule for op kind 'fft'"):
        strategies(op("fft", [(4,)], (4,)), M)


# (op, number of strategies on the 2x2 mesh): per axis the choices are none / a shardable letter /
# a pass-through partial (one per linear input, or one for "all"), squared, less what divisibility prunes
COUNTS = [
    (op("matmul", [(8, 8), (8, 4)], (8, 4)), 36),  # none, m, k, n, P(a), P(b)
    (op("linear", [(4, 8, 8), (8, 8), (8,)], (4, 8, 8)), 49),  # none, b, s, k, n, P(x), P(w)
    (op("bmm", [(4, 8, 4), (4, 4, 8)], (4, 8, 8)), 49),
    (op("addmm", [(8,), (4, 8), (8, 8)], (4, 8)), 36),
    (op("conv2d", [(4, 4, 8, 8), (4, 4, 3, 3), (4,)], (4, 4, 8, 8), padding=1), 36),  # none, n, c, o, P, P
    (op("embedding", [(4, 8), (16, 8)], (4, 8, 8), ints=(0,)), 36),  # none, b, s, v, h, P(w)
    (op("layer_norm", [(4, 4, 8), (8,), (8,)], (4, 4, 8)), 9),
    (op("softmax", [(4, 8, 8)], (4, 8, 8), dim=-1), 9),
    (op("relu", [(4, 8)], (4, 8)), 9),
    (op("neg", [(4, 8)], (4, 8)), 16),
    (op("dropout", [(4, 8)], (4, 8), p=0.1, seed=0), 16),
    (op("add", [(4, 8), (8,)], (4, 8)), 16),
    (op("mul", [(4, 8), (4, 8)], (4, 8)), 25),  # none, a, b, P(a), P(b)
    (op("div", [(4, 8), (1, 8)], (4, 8)), 16),
    (op("sum", [(4, 8, 8)], (4, 8), dim=1), 25),
    (op("amax", [(4, 8, 8)], (4, 8), dim=-1), 9),
    (op("reshape", [(4, 8, 8)], (4, 64)), 16),
    (op("transpose", [(4, 8, 4)], (4, 8, 4), dim0=0, dim1=2), 25),
    (op("cat", [(4, 8), (4, 4)], (4, 12), dim=1), 9),  # none, a, P(all)
    (op("split", [(8, 12)], (8, 4), dim=1, split_size=4, index=1), 9),
    (op("scaled_dot_product_attention", [(4, 4, 8, 4)] * 3, (4, 4, 8, 4)), 16),  # none, b, h, s
    (op("cross_entropy", [(8, 16), (8,)], (), ints=(1,)), 9),  # none, n, v
]


@pytest.mark.parametrize("o,n", COUNTS, ids=[o.kind + str(i) for i, (o, _) in enumerate(COUNTS)])
def test_counts_and_validity(o, n):
    ss = strategies(o, M)
    assert len(ss) == n, [str(s) for s in ss]
    for s in ss:
        assert len(s.inputs) == len(o.inputs)
        for shape, spec in zip(o.inputs, s.inputs):
            assert is_valid(shape, spec, M), (str(s), shape)
        assert is_valid(o.output, s.output, M), str(s)
        assert s.memory > 0 and s.flops >= 0
    assert len({(s.inputs, s.output) for s in ss}) == n
    # a 1-axis mesh of size 4: choices once, no squares
    assert len(strategies(o, M1)) <= n


def test_divisibility_prunes():
    # m = 2 cannot take both axes; k = 2 neither; in the 4-way mesh neither can take the axis at all
    ss = strategies(op("matmul", [(2, 8), (8, 8)], (2, 8)), M)
    assert len(ss) == 35
    assert all(s.output.dims[0] != ("dp", "tp") for s in ss)
    ss1 = strategies(op("matmul", [(2, 8), (8, 8)], (2, 8)), M1)
    assert all(not s.inputs[0].dims[0] for s in ss1)
    # an axis of size 1 is never assigned
    m = Mesh("m", None, (Axis("pp", 1), Axis("tp", 2)))
    assert all("pp" not in s.output.used_axes() for s in strategies(op("relu", [(4, 4)], (4, 4)), m))


def _sharded_dims(spec):
    return {i for i, d in enumerate(spec.dims) if d}


@pytest.mark.parametrize("o,forbidden", [
    (op("softmax", [(4, 8, 8)], (4, 8, 8), dim=1), [(0, 1), ("out", 1)]),
    (op("log_softmax", [(4, 8)], (4, 8), dim=-1), [(0, 1)]),
    (op("layer_norm", [(4, 4, 8), (8,), (8,)], (4, 4, 8)), [(0, 2), (1, 0), (2, 0), ("out", 2)]),
    (op("rms_norm", [(4, 8, 8), (8, 8)], (4, 8, 8), normalized_ndim=2), [(0, 1), (0, 2), (1, 0), (1, 1)]),
    (op("amax", [(4, 8, 8)], (4,), dim=(1, 2)), [(0, 1), (0, 2)]),
    (op("conv2d", [(4, 4, 8, 8), (4, 4, 4, 4)], (4, 4, 5, 5)), [(0, 2), (0, 3), (1, 2), (1, 3), ("out", 2), ("out", 3)]),
    (op("scaled_dot_product_attention", [(4, 4, 8, 4)] * 3, (4, 4, 8, 4)),
     [(0, 3), (1, 2), (1, 3), (2, 2), (2, 3), ("out", 3)]),
    (op("cat", [(4, 8), (4, 4)], (4, 12), dim=1), [(0, 1), (1, 1), ("out", 1)]),
    (op("slice", [(8, 8)], (4, 8), dim=0, start=2, end=6), [(0, 0), ("out", 0)]),
    (op("add", [(4, 1, 8), (4, 4, 8)], (4, 4, 8)), [(0, 1)]),
])
def test_unshardable_dims_never_split(o, forbidden):
    ss = strategies(o, M)
    assert ss
    for s in ss:
        for who, dim in forbidden:
            spec = s.output if who == "out" else s.inputs[who]
            assert not spec.dims[dim], f"{s} splits {who}:{dim}"


def test_matmul_flops_and_partial():
    o = op("matmul", [(8, 16), (16, 4)], (8, 4))
    ss = by_name(strategies(o, M))
    full = 2 * 8 * 16 * 4
    assert ss["replicate"].flops == full
    assert ss["dp:m tp:n"].flops == full / 4
    assert ss["dp:k"].flops == full / 2
    assert ss["dp:k"].output == S(None, None, partial=("dp",))
    assert ss["dp:k tp:k"].inputs[0] == S(None, ("dp", "tp"))
    # pass-through: one input partial, output partial, no work saved
    p = ss["tp:partial(in0)"]
    assert p.inputs == (S(None, None, partial=("tp",)), S(None, None)) and p.output.partial == ("tp",)
    assert p.flops == full
    # memory: local output bytes
    assert ss["dp:m tp:n"].memory == 4 * 2 * 4 and ss["dp:k"].memory == 8 * 4 * 4


def test_linear_megatron_costs():
    o = op("linear", [(4, 8, 16), (32, 16), (32,)], (4, 8, 32))
    ss = by_name(strategies(o, M))
    col = ss["dp:a tp:n"]  # DP on batch, column-parallel weight
    assert col.inputs == (S("dp", None, None), S("tp", None), S("tp")) and col.output == S("dp", None, "tp")
    ar = {c.axes: c for c in col.backward}
    # weight and bias gradients all-reduced over dp (the local gradients are partial sums)
    assert ar[("dp",)].kind == Collective.ALL_REDUCE
    assert sorted(c.size_bytes for c in col.backward if c.axes == ("dp",)) == [16 * 4, 16 * 16 * 4]
    # the input gradient is partial over tp (column-parallel): all-reduce of the local x bytes
    assert [c.size_bytes for c in col.backward if c.axes == ("tp",)] == [2 * 8 * 16 * 4]
    row = ss["tp:k"]  # row-parallel: output partial, bias partial too (added once in the sum)
    assert row.output.partial == ("tp",) and row.inputs[2] == S(None, partial=("tp",))
    assert row.backward == ()
    assert ss["replicate"].flops == 2 * 4 * 8 * 16 * 32 + 4 * 8 * 32


def test_bias_partial_whenever_output_partial():
    for o, b in [(op("linear", [(8, 8), (8, 8), (8,)], (8, 8)), 2),
                 (op("addmm", [(8,), (8, 8), (8, 8)], (8, 8)), 0),
                 (op("conv2d", [(4, 4, 8, 8), (4, 4, 3, 3), (4,)], (4, 4, 6, 6)), 2)]:
        for s in strategies(o, M):
            assert s.inputs[b].partial == s.output.partial, str(s)


def test_embedding_vocab_parallel():
    o = op("embedding", [(4, 8), (16, 8)], (4, 8, 8), ints=(0,))
    ss = by_name(strategies(o, M))
    v = ss["tp:v"]
    assert v.inputs == (S(None, None), S("tp", None)) and v.output == S(None, None, None, partial=("tp",))
    assert ss["tp:h"].output == S(None, None, "tp")
    assert all(not s.inputs[0].partial for s in ss.values())  # indices are never partial
    # data-parallel indices: the weight gradient is all-reduced; no gradient for integer indices
    assert [c.axes for c in ss["dp:a"].backward] == [("dp",)] and ss["dp:a"].backward[0].size_bytes == 16 * 8 * 4


def test_cross_entropy_vocab_parallel():
    o = op("cross_entropy", [(8, 16), (8,)], (), ints=(1,))
    ss = by_name(strategies(o, M))
    # split rows: a partial sum over dp, and the mean's count of rows not ignored (one int64) summed over dp
    n = ss["dp:n"]
    assert n.output == Spec((), ("dp",)) and [(c.kind, c.axes, c.size_bytes) for c in n.forward] == [
        (Collective.ALL_REDUCE, ("dp",), 8)]
    assert by_name(strategies(op("cross_entropy", [(8, 16), (8,)], (), ints=(1,), reduction="sum"), M))[
        "dp:n"].forward == ()
    v = ss["tp:v (vocab-parallel)"]
    assert v.output == Spec(()) and v.inputs[1] == S(None)
    assert [c.kind for c in v.forward] == [Collective.ALL_REDUCE, Collective.ALL_REDUCE]
    assert [c.size_bytes for c in v.forward] == [8 * 4, 2 * 8 * 4]
    both = ss["dp:n tp:v (vocab-parallel)"]
    assert both.output == Spec((), ("dp",)) and [c.size_bytes for c in both.forward] == [4 * 4, 2 * 4 * 4, 8]
    none = by_name(strategies(op("cross_entropy", [(8, 16), (8,)], (8,), ints=(1,), reduction="none"), M))
    assert none["dp:n"].output == S("dp")


def test_reductions():
    ss = by_name(strategies(op("mean", [(4, 8, 8)], (1, 8, 1), dim=(0, 2), keepdim=True), M))
    assert ss["dp:a"].output == S(None, None, None, partial=("dp",))
    assert ss["dp:b"].output == S(None, "dp", None)
    assert ss["tp:partial(in0)"].inputs[0].partial == ("tp",)
    amax = strategies(op("amax", [(4, 8, 8)], (4, 8), dim=-1), M)
    assert all(not s.output.partial for s in amax)


def test_sdpa_sequence_parallel_query():
    ss = by_name(strategies(op("scaled_dot_product_attention", [(4, 4, 8, 4)] * 3, (4, 4, 8, 4)), M))
    s = ss["tp:s"]
    assert s.inputs == (S(None, None, "tp", None), S(None, None, None, None), S(None, None, None, None))
    assert s.output == S(None, None, "tp", None)
    # k and v gradients are partial over the query split: all-reduced
    assert [c.axes for c in s.backward] == [("tp",), ("tp",)]
    assert ss["replicate"].flops == 4 * 4 * 4 * 8 * 8 * 4


def test_reshape_groups_and_pruning():
    assert reshape_groups((4, 8, 8), (4, 64)) == [([0], [0]), ([1, 2], [1])]
    assert reshape_groups((1, 8), (8,)) == [([0, 1], [0])]
    assert reshape_groups((32, 4), (4, 8, 4)) == [([0], [0, 1]), ([1], [2])]
    # (6, 4) -> (3, 8): one group whose output major dim (3) does not divide by 2: nothing sharded
    ss = strategies(op("reshape", [(6, 4)], (3, 8)), M)
    assert all(not s.output.used_axes() or s.output.partial for s in ss)
    assert all(not any(s.inputs[0].dims) for s in ss)
    ss = by_name(strategies(op("view", [(32, 4)], (4, 8, 4)), M))
    assert ss["dp:dim0 tp:dim0"].output == S(("dp", "tp"), None, None)
    with pytest.raises(EquationError):
        strategies(op("reshape", [(4, 4)], (3, 5)), M)


def test_slice_bounds():
    assert slice_bounds(op("split", [(8, 12)], (8, 4), dim=1, split_size=4, index=2)) == (1, 8, 4)
    assert slice_bounds(op("split", [(8, 10)], (8, 2), dim=1, split_size=4, index=2)) == (1, 8, 2)
    assert slice_bounds(op("split", [(8, 10)], (8, 3), dim=-1, split_size=[5, 2, 3], index=2)) == (1, 7, 3)
    assert slice_bounds(op("slice", [(8, 8)], (4, 8), dim=0, start=-6, end=-2)) == (0, 2, 4)


def test_broadcast_dims_of_size_one_stay_replicated():
    ss = strategies(op("div", [(4, 8), (1, 8)], (4, 8)), M)
    assert all(not s.inputs[1].dims[0] for s in ss)
    assert any(s.inputs[0].dims[0] for s in ss)
    # div is linear in the numerator only
    assert all(not s.inputs[1].partial for s in ss)
    # add with all inputs partial
    add = by_name(strategies(op("add", [(4, 8), (8,)], (4, 8)), M))
    assert add["tp:partial(all)"].inputs == (S(None, None, partial=("tp",)), S(None, partial=("tp",)))


def test_engine_rejects_inconsistent_letters_and_holes():
    with pytest.raises(EquationError):
        einsum_strategies(op("matmul", [(4, 8), (4, 8)], (4, 8)), M, Equation.parse("mk,kn->mn"), 0.0)
    m = Mesh("h", None, (Axis("x", 2), Axis("y", __import__("planlang.plan.types").plan.types.Hole("size"))))
    with pytest.raises(ValueError, match="hole"):
        strategies(op("relu", [(4,)], (4,)), m)


def test_cat_skips_an_empty_1d_input_as_torch_does():
    """Hugging Face's key/value cache is a tensor of shape [0] before its first step, concatenated with
    the step's keys: torch.cat skips it. The strategies are those of the keys alone, with the empty input
    replicated (or partial where all are: it holds nothing), and no gradient sum for it."""
    keys = (8, 2, 64, 16)
    alone = strategies(op("cat", [keys], keys, dim=-2), M)
    with_cache = strategies(op("cat", [(0,), keys], keys, dim=-2), M)
    assert len(alone) == len(with_cache) > 9
    for a, b in zip(alone, with_cache):
        assert (b.name, b.inputs[1], b.output, b.flops, b.memory, b.backward) == \
            (a.name, a.inputs[0], a.output, a.flops, a.memory, a.backward)
        assert b.inputs[0].dims == ((),) and set(b.inputs[0].partial) == set(b.output.partial)
        assert [i for i, _ in dict(b.extra)["grad_partial"]] == [1]
    # a 1-D cat: an empty input is concatenated like any other (its dim may be split: it divides)
    assert len(strategies(op("cat", [(0,), (8,)], (8,)), M1)) == len(strategies(op("cat", [(4,), (4,)], (8,)), M1))
    with pytest.raises(EquationError):  # an empty input of more dims is no legacy empty tensor: torch refuses it
        strategies(op("cat", [(0, 16), keys], keys, dim=-2), M)
