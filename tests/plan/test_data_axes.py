"""planlang.plan.data: the one definition of an input's batch dim and the plan's data axes."""
import textwrap

from planlang.plan.checker import check_text
from planlang.plan.data import batch_axes, batch_dim, batch_split_conflict, data_axes, data_degree

HEAD = textwrap.dedent("""\
    device gpu { memory = 80 GiB }
    link nv { bandwidth = 300 GB/s }
    mesh m of 8 x gpu {
        dp = 2 over nv
        sp = 2 over nv
        one = 1 over nv
        tp = 2 over nv
    }
""")


def plan(body: str):
    res = check_text(HEAD + textwrap.dedent(body), "p.plan")
    assert res.plan is not None, res.diagnostics
    return res


def test_the_batch_dim_is_the_one_named_batch_else_the_first():
    p = plan("""\
        input x : f32[seq = 16, batch = 8, features = 4]
        input y : f32[n = 8]
        data x : [sp, (dp, one), _]
        data y : [(dp, one)]
    """).plan
    assert batch_dim(p.input("x")) == 1 and batch_dim(p.input("y")) == 0
    # sp splits x's sequence: not a data axis; an axis of size 1 is kept unless trivial=False
    assert batch_axes(p) == {"x": ("dp", "one"), "y": ("dp", "one")}
    assert data_axes(p) == ("dp", "one") and data_axes(p, trivial=False) == ("dp",)
    assert data_degree(p) == 2 and batch_split_conflict(p) is None


def test_inputs_that_split_their_batch_differently_are_named():
    p = plan("""\
        input x : f32[batch = 8, features = 4]
        input y : f32[batch = 8]
        data x : [dp, _]
        data y : [tp]
    """).plan
    assert "x: dp" in batch_split_conflict(p) and "y: tp" in batch_split_conflict(p)


def test_zero_over_an_axis_that_splits_only_the_sequence_is_pl504():
    res = plan("""\
        input x : f32[seq = 16, batch = 8]
        data x : [sp, dp]
        optimizer adamw { zero = 1 over sp }
    """)
    assert [d.code for d in res.diagnostics if d.code == "PL504"] == ["PL504"]
    assert "PL504" not in [d.code for d in plan("""\
        input x : f32[seq = 16, batch = 8]
        data x : [sp, dp]
        optimizer adamw { zero = 1 over dp }
    """).diagnostics]
