"""The rules added for issue 27's PL364 fallbacks, torch-free: slice with a step, stack, roll,
index_select, einsum, and attention with fewer key/value heads than query heads (multi-query,
grouped-query). Each keeps the batch splittable (the op is per sample under data parallelism) and never
splits what the op reads across (a rolled dim, a stacked dim, k/v heads shared by query heads)."""
import pytest

from planlang.cost.ops import OpSpec, op_kind, strategies
from planlang.cost.ops.einsum import EquationError
from planlang.cost.ops.rules import sdpa_heads_fit, slice_bounds
from planlang.cost.ops.tensor_ops import einsum_equation, einsum_fits
from planlang.plan.types import Axis, Link, Mesh, Spec

NV = Link("nv", 300e9, 2e-6)
DP4 = Mesh("dp4", None, (Axis("dp", 4, NV),))
DPTP = Mesh("m", None, (Axis("dp", 2, NV), Axis("tp", 2, NV)))


def op(kind, inputs, output, ints=(), **attrs):
    dts = tuple("i64" if i in ints else "f32" for i in range(len(inputs)))
    return OpSpec(kind, tuple(map(tuple, inputs)), tuple(output), "f32", tuple(attrs.items()), dts)


def batch_split(o: OpSpec, mesh=DP4) -> list:
    """The strategies that take input 0 and give the output split on dim 0 over dp, and nothing else."""
    want = Spec((("dp",),) + ((),) * (len(o.output) - 1))
    return [s for s in strategies(o, mesh) if s.output == want and s.inputs[0].axes_of(0) == ("dp",)]


def split_dims(spec: Spec) -> set[int]:
    return {d for d, axes in enumerate(spec.dims) if axes}


def test_slice_with_a_step_is_per_sample_and_keeps_its_cut_dim_whole():
    o = op("slice", [(8, 16, 4, 16)], (8, 16, 4, 8), dim=3, start=0, end=16, step=2)  # x[..., ::2]
    assert slice_bounds(o) == (3, 0, 8)
    assert slice_bounds(op("slice", [(8, 16)], (8, 8), dim=1, start=1, end=16, step=2)) == (1, 1, 8)
    assert batch_split(o)
    assert all(3 not in split_dims(s.inputs[0]) | split_dims(s.output) for s in strategies(o, DPTP))


def test_stack_is_per_sample_and_never_splits_the_new_dim():
    o = op("stack", [(8, 16, 4, 8)] * 2, (8, 16, 4, 8, 2), dim=-1)
    s = batch_split(o)
    assert s and all(i == Spec((("dp",), (), (), ())) for i in s[0].inputs)
    assert all(4 not in split_dims(s.output) for s in strategies(o, DPTP))
    # linear in its inputs together: partial pieces of every input stack to a partial output
    assert any(s.output.partial == ("tp",) and all(i.partial == ("tp",) for i in s.inputs)
               for s in strategies(o, DPTP))


def test_roll_is_per_sample_along_the_other_dims_and_keeps_rolled_dims_whole():
    o = op("roll", [(8, 16, 16, 32)], (8, 16, 16, 32), shifts=(3, 3), dims=(1, 2))
    assert batch_split(o)
    assert all(not {1, 2} & split_dims(s.output) for s in strategies(o, DPTP))
    # rolled along the batch, no strategy splits the batch: the lowering would have to gather it
    along_batch = op("roll", [(8, 16)], (8, 16), shifts=(1,), dims=(0,))
    assert not batch_split(along_batch)


def test_index_select_is_per_sample_and_keeps_the_index_whole():
    o = op("index_select", [(8, 16, 6, 16), (4,)], (8, 16, 4, 16), ints=(1,), dim=2)
    s = batch_split(o)
    assert s and s[0].inputs[1] == Spec(((),))
    assert all(2 not in split_dims(s.output) and not split_dims(s.inputs[1]) for s in strategies(o, DPTP))
    assert op_kind("index_select").saves == (1,)  # backward scatters into x's shape: only the index is kept


def test_einsum_attention_scores_split_the_batch_heads_or_contract_a_split_dim():
    o = op("einsum", [(8, 16, 4, 16), (8, 16, 4, 16)], (8, 4, 16, 16), equation="bthd,bshd->bhts")
    s = batch_split(o)
    assert s and s[0].inputs[1].axes_of(0) == ("dp",) and s[0].backward == ()  # per sample: no gradient sum
    names = {x.name: x for x in strategies(o, DPTP)}
    heads = names["dp:b tp:h"]  # head parallelism: q, k and the scores split by heads
    assert heads.inputs[0].axes_of(2) == ("tp",) and heads.output.axes_of(1) == ("tp",)
    contracted = names["dp:b tp:d"]  # the head dim split: a partial sum of the scores over tp
    assert contracted.output.partial == ("tp",) and contracted.inputs[0].axes_of(3) == ("tp",)
    assert o.attr("equation") and op_kind("einsum").saves == (0, 1) and op_kind("einsum").backward_ratio == 2.0
    # flops: 2 per point of b t s h d, divided by the axes that split a letter
    assert heads.flops == 2.0 * 8 * 16 * 16 * 4 * 16 / 4


def test_einsum_equation_expands_the_ellipsis_and_refuses_what_it_cannot_say():
    assert str(einsum_equation("...k,kn->...n", ((8, 16, 32), (32, 4)))) == "ABk,kn->ABn"
    assert str(einsum_equation("b...d,d->b...", ((8, 3, 5, 4), (4,)))) == "bABd,d->bAB"
    assert einsum_fits("bthd,bshd->bhts", ((8, 16, 4, 16), (8, 16, 4, 16)), (8, 4, 16, 16))
    assert not einsum_fits("ii->i", ((4, 4),), (4,))  # a diagonal
    assert not einsum_fits("ij,jk", ((4, 4), (4, 4)), (4, 4))  # implicit output
    assert not einsum_fits("bi,bi->bi", ((8, 4), (1, 4)), (8, 4))  # a broadcast operand
    with pytest.raises(EquationError):
        einsum_equation("ab,bc->ac", ((2, 3),))


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_attention_with_fewer_key_value_heads_keeps_them_whole_when_query_heads_are_split(kv_heads):
    q, kv = (8, 4, 16, 16), (8, kv_heads, 16, 16)
    assert sdpa_heads_fit(q, kv, kv, enable_gqa=kv_heads > 1)
    assert not sdpa_heads_fit(q, (8, 2, 16, 16), (8, 2, 16, 16), enable_gqa=False)  # torch would refuse it
    assert not sdpa_heads_fit(q, (8, 3, 16, 16), (8, 3, 16, 16), enable_gqa=True)
    o = op("scaled_dot_product_attention", [q, kv, kv], q, is_causal=True)
    s = batch_split(o)
    assert s and all(x.axes_of(0) == ("dp",) for x in s[0].inputs)  # under dp: per sample
    heads = [x for x in strategies(o, DPTP) if x.output.axes_of(1) == ("tp",)]
    assert heads, "query heads can be split over tp"
    for x in heads:
        # each rank reads the k/v heads of its own query heads from the whole k and v (replicated over tp),
        # and their gradients are partial sums over tp, summed once
        assert x.inputs[1].axes_of(1) == () and x.inputs[2].axes_of(1) == ()
        grad = dict(dict(x.extra)["grad_partial"])
        assert "tp" in grad[1] and "tp" in grad[2] and "tp" not in grad[0]
    assert all(not x.inputs[1].axes_of(1) for x in strategies(o, DPTP))  # k/v heads are never split
