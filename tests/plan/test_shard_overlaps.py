"""PL310 for shard statements whose patterns overlap on the model's real names (issue 27): the language
has no precedence between two statements that select the same parameter (docs/language.md §14.1), so
`check` with the model's names reports the later one, naming both statements and the parameters.
Torch-free: the model's names are given as plain facts, as planlang.model.checks passes its probe."""
from __future__ import annotations

from types import SimpleNamespace

from planlang.plan.checker import check_text
from planlang.plan.resolve import Resolver
from planlang.plan.shard_overlaps import plan_name, shard_overlaps

HEAD = """\
device d { memory = 80 GiB; flops.f32 = 10 TFLOPS }
link l { bandwidth = 100 GB/s; latency = 2 us }
mesh m of 4 x d {
    dp = 2 over l
    tp = 2 over l
}
"""

MLP = SimpleNamespace(params={"fc1.weight": ((64, 16), "f32"), "fc1.bias": ((64,), "f32"),
                              "fc2.weight": ((16, 64), "f32"), "fc2.bias": ((16,), "f32")},
                      all_modules=["", "fc1", "act", "fc2"])


def pl310(body: str, facts=MLP):
    res = check_text(HEAD + body, "p.plan", facts=None if facts is None else {"model": facts})
    return [d for d in res.diagnostics if d.code == "PL310"]


def test_a_glob_and_a_name_that_overlap_with_different_specs_are_pl310_at_the_later():
    got = pl310("shard fc*.weight : [tp, _]\nshard fc2.weight : [_, tp]\n")
    assert len(got) == 1, got
    d = got[0]
    assert d.span.line == 8  # `shard fc2.weight : [_, tp]`
    assert "`fc2.weight` is sharded twice" in d.message
    assert "[tp, _] by `shard fc*.weight : [tp, _]` (line 7)" in d.message
    assert "[_, tp] by `shard fc2.weight : [_, tp]`" in d.message
    assert [lab.span.line for lab in d.labels] == [7]  # the earlier statement is marked too
    assert "no statement takes precedence" in d.help


def test_without_the_models_names_the_texts_differ_and_nothing_is_said():
    # the model-free check compares targets as written: it cannot know that fc*.weight selects fc2.weight
    assert pl310("shard fc*.weight : [tp, _]\nshard fc2.weight : [_, tp]\n", facts=None) == []


def test_overlaps_with_the_same_spec_or_on_different_names_are_fine():
    assert pl310("shard fc*.weight : [tp, _]\nshard fc1.weight : [tp, _]\n") == []
    assert pl310("shard fc1.weight : [tp, _]\nshard fc2.weight : [_, tp]\n") == []
    assert pl310("shard **.bias : [_]\nshard fc*.weight : [tp, _]\n") == []


def test_a_bias_pattern_against_one_bias_names_every_parameter_once():
    got = pl310("shard fc1.bias : [tp]\nshard **.bias : [_]\n")
    assert len(got) == 1 and "`fc1.bias` is sharded twice" in got[0].message and "fc2.bias" not in got[0].message


def test_activation_patterns_overlap_on_modules():
    got = pl310("shard output of fc* : [dp, tp]\nshard output of fc2 : [dp, _] partial(tp)\n")
    assert len(got) == 1 and "`fc2`" in got[0].message


def test_a_literal_duplicate_stays_the_model_free_diagnostic_only():
    got = pl310("shard fc2.weight : [tp, _]\nshard fc2.weight : [_, tp]\n")
    assert len(got) == 1 and got[0].message == "`fc2.weight` is sharded twice: [tp, _] and [_, tp]"


def test_a_template_applied_to_every_block_is_reported_once_at_its_line():
    blocks = SimpleNamespace(params={f"h.{i}.{n}.weight": ((8, 8), "f32") for i in range(4) for n in ("a", "b")},
                             all_modules=[""] + [f"h.{i}" for i in range(4)])
    got = pl310("for blk in h[*] {\n    shard blk.*.weight : [tp, _]\n    shard blk.b.weight : [_, tp]\n}\n",
                facts=blocks)
    assert len(got) == 1, got
    assert got[0].span.line == 9 and "`h[0].b.weight`" in got[0].message


def test_shard_overlaps_pairs_and_names():
    res = Resolver().resolve_text(HEAD + "shard fc*.weight : [tp, _]\nshard fc2.weight : [_, tp]\n"
                                  "shard fc1.weight : [_, tp]\n", "p.plan")
    got = shard_overlaps(res.plan.shards, {"param": list(MLP.params)})
    assert [(str(o.later.target), str(o.earlier.target), o.names) for o in got] == [
        ("fc2.weight", "fc*.weight", ("fc2.weight",)), ("fc1.weight", "fc*.weight", ("fc1.weight",))]
    assert plan_name("h.0.attn.c_attn.weight") == "h[0].attn.c_attn.weight"
