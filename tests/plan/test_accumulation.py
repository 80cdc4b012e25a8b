"""Top-level `microbatches N` (gradient accumulation without a pipeline): parsed with its span, formatted
back, resolved into the plan (a hole too), completed, and checked (PL305 with the statement labelled,
PL411, PL417)."""
import textwrap

from planlang.lang import ast as A
from planlang.lang.fmt import format_text
from planlang.lang.parser import parse
from planlang.plan import types as T
from planlang.plan.checker import check_text
from planlang.plan.complete import CompleteAccumulation, complete

PLAN = textwrap.dedent("""\
    device gpu { memory = 80 GiB }
    link nv { bandwidth = 300 GB/s }
    model m = "examples.mlp.model:build"
    input x : f32[batch = BATCH, features = 8]
    mesh ranks of 4 x gpu {
        dp = 2 over nv
        tp = 2 over nv
    }
    budget 40 GiB per device
    data x : [dp, _]
    MICRO
""")


def plan_text(micro: str = "microbatches 4", batch: int = 16) -> str:
    return PLAN.replace("MICRO", micro).replace("BATCH", str(batch))


def codes(result) -> list[str]:
    return [d.code for d in result.diagnostics]


def test_parsed_with_its_span():
    text = "microbatches   4  # two lines below\nmicrobatches ?\n"
    stmts = parse(text).module.statements
    assert stmts == (A.MicrobatchesDecl(A.Int(4)), A.MicrobatchesDecl(A.Hole()))
    assert (stmts[0].span.line, stmts[0].span.col, stmts[0].span.end_col) == (1, 1, 17)
    assert stmts[1].count.span.col == 14
    # a soft keyword still: a module may be named `microbatches`
    shard = parse("shard microbatches.w : [_]\n").module.statements[0]
    assert str(shard.target) == "microbatches.w"


def test_formatted_back():
    assert format_text("microbatches    8\nmicrobatches ?   # solve it\n") == \
        "microbatches 8\nmicrobatches ?  # solve it\n"
    text = plan_text()
    assert parse(format_text(text)).module == parse(text).module


def test_resolved_and_completed():
    res = check_text(plan_text())
    assert not res.diagnostics, res.diagnostics
    acc = res.plan.accumulation
    assert acc == T.Accumulation(4) and acc.span.line == 11
    plan = complete(res.plan)
    assert isinstance(plan.accumulation, CompleteAccumulation) and plan.microbatches == 4
    assert complete(check_text(plan_text("")).plan).microbatches == 1


def test_a_hole_the_solver_fills():
    plan = check_text(plan_text("microbatches ?")).plan
    holes = plan.holes()
    assert [h.what for h in holes] == ["microbatches"] and holes[0].span.line == 11


def test_per_rank_batch_must_divide():
    res = check_text(plan_text(batch=12))  # 12 / dp(2) = 6 a rank, not 4 microbatches
    (d,) = res.diagnostics
    assert d.code == "PL305" and "batch 12 is not divisible by dp(2) * microbatches(4) = 8" in d.message
    assert d.span.line == 10  # the data statement's dp
    assert [lb.span.line for lb in d.labels] == [4, 11] and "fewer microbatches" in d.help
    assert codes(check_text(plan_text(batch=8))) == []


def test_at_least_one():
    assert codes(check_text(plan_text("microbatches 0"))) == ["PL411"]


def test_said_once():
    res = check_text(plan_text("microbatches 2\nmicrobatches 4"))
    assert codes(res) == ["PL210"]
    piped = plan_text("microbatches 2").replace("tp = 2", "pp = 2") + (
        "pipeline over pp schedule gpipe microbatches 2 {\n    stage fc1\n    stage fc2\n}\n")
    assert "PL417" in codes(check_text(piped))
