"""Model-aware checks: located at the plan line, with the real shapes and arithmetic."""
import textwrap

import pytest

from planlang.model.validation import check_with_model
from planlang.plan.selection import to_plan_name
from planlang.model.capture.load import ModelLoadError, build_model, meta_inputs
from planlang.model.capture.trace import probe_modules, trace_graph
from planlang.plan.types import Input, ModelRef

HEAD = """\
device d {{ memory = 80 GiB; flops.f32 = 10 TFLOPS }}
link l {{ bandwidth = 100 GB/s; latency = 2 us }}
model net = "tests.model.tinynet:build"(hidden = 32, layers = 4{tie})
input idx : i64[batch = 8, seq = 16]
budget 40 GiB per device
mesh m of 4 x d {{
    pp = 2 over l
    tp = 2 over l
}}
"""


def check(body: str, tmp_path, tie=False):
    p = tmp_path / "p.plan"
    p.write_text(HEAD.format(tie=", tie = true" if tie else "") + textwrap.dedent(body))
    return [(d.code, d.span.line, d.message) for d in check_with_model(str(p)).diagnostics]


def test_build_on_meta_allocates_nothing():
    m = build_model(ModelRef("net", "tests.model.tinynet:build", (("hidden", 4096),)))
    assert all(p.is_meta for p in m.parameters())


def test_load_errors_have_codes():
    with pytest.raises(ModelLoadError) as e:
        build_model(ModelRef("n", "tests.model.nosuch:build"))
    assert e.value.code == "PL260"
    with pytest.raises(ModelLoadError) as e:
        build_model(ModelRef("n", "tests.model.tinynet:buld"))
    assert e.value.code == "PL260" and "build" in e.value.help
    with pytest.raises(ModelLoadError) as e:
        build_model(ModelRef("n", "tests.model.tinynet:broken"))
    assert e.value.code == "PL261" and "boom" in e.value.message


def test_probe_and_trace_record_order_shapes_and_paths():
    m = build_model(ModelRef("n", "tests.model.tinynet:build"))
    inputs = meta_inputs((Input("idx", "i64", (("batch", 2), ("seq", 5))),))
    facts = probe_modules(m, inputs)
    assert facts.order[:5] == ["emb", "h", "h.0", "h.0.ln", "h.0.fc"] or facts.order[:4] == ["emb", "h.0", "h.0.ln", "h.0.fc"]
    assert facts.calls["h.0.fc"].output == (2, 5, 128)
    assert facts.params["h.3.proj.weight"][0] == (32, 128)
    g = trace_graph(m, inputs)
    assert g.method == "symbolic_trace"
    fc = [n for n in g.nodes if n.op == "call_module" and n.target == "h.1.fc"]
    assert fc and fc[0].shape == (2, 5, 128) and fc[0].module == "h.1.fc"
    add = [n for n in g.nodes if n.op == "call_function" and n.module == "h.2"]
    assert add, "function nodes keep the path of the module they run in"


def test_tied_parameters_are_one_group():
    m = build_model(ModelRef("n", "tests.model.tinynet:build", (("tie", True),)))
    facts = probe_modules(m, meta_inputs((Input("idx", "i64", (("batch", 2), ("seq", 5))),)))
    assert facts.shared == [("emb.weight", "head.weight")]


def test_plan_names():
    assert to_plan_name("h.0.attn.c_attn") == "h[0].attn.c_attn"
    assert to_plan_name("0.weight") == "[0].weight"


def test_clean_plan(tmp_path):
    body = """
    shard h[*].fc.weight : [tp, _]
    shard h[*].proj.weight : [_, tp]
    shard output of h[*].fc : [_, _, tp]
    pipeline over pp schedule 1f1b microbatches 2 {
        stage emb, h[0:2]
        stage h[2:4], head
    }
    checkpoint h[0:2]
    checkpoint h[2:4]
    """
    # every model-aware rule is satisfied, tensor parallelism inside the pipeline included
    assert [d[0] for d in check(body, tmp_path)] == []


def test_unknown_path_rank_divisibility_module_target(tmp_path):
    body = """
    shard h[*].fc.wieght : [tp, _]
    shard h[0].fc : [tp, _]
    shard h[1].fc.weight : [tp]
    shard head.weight : [(pp, tp), _]
    """
    got = check(body, tmp_path)
    codes = [(c, line) for c, line, _ in got]
    assert ("PL360", 11) in codes and ("PL363", 12) in codes and ("PL361", 13) in codes
    msg = {c: m for c, _, m in got}
    assert "[128, 32]" in msg["PL361"]
    # an unknown axis is a model-free finding: it ends the check before the model is built
    got = check(body.replace("shard head.weight", "shard emb.weight : [tp, tp2]\n    shard head.weight"), tmp_path)
    assert [(c, line) for c, line, _ in got] == [("PL201", 14)]


def test_divisibility_message_shows_arithmetic(tmp_path):
    p = tmp_path / "p.plan"
    p.write_text(HEAD.format(tie="").replace("tp = 2 over l", "tp = 2 over l").replace("4 x d", "4 x d")
                 + "shard emb.weight : [tp, _]\n".replace("emb.weight", "emb.weight"))
    # vocab 96 / tp 2 divides; make it fail with a 3-way axis instead
    text = p.read_text().replace("mesh m of 4 x d {\n    pp = 2 over l\n    tp = 2 over l\n}",
                                 "mesh m of 3 x d {\n    tp = 3 over l\n}").replace("[tp, _]", "[_, tp]")
    p.write_text(text)
    (d,) = [d for d in check_with_model(str(p)).diagnostics if d.code == "PL362"]
    assert d.message == "`emb.weight` [96, 32]: dim 1 is 32, not divisible by tp(3) = 3"
    assert d.span.line == text.splitlines().index("shard emb.weight : [_, tp]") + 1


def test_stage_coverage_order_and_tied_split(tmp_path):
    body = """
    pipeline over pp schedule 1f1b microbatches 2 {
        stage head
        stage emb, h[0:3]
    }
    """
    got = {c for c, _, _ in check(body, tmp_path, tie=True)}
    assert {"PL460", "PL462", "PL463"} <= got
    # stages out of order by their indices alone: the model-free PL407, and no model work after it
    got = {c for c, _, _ in check(body.replace("stage head", "stage h[3:4], head"), tmp_path, tie=True)}
    assert got == {"PL407"}


def test_checkpoint_contiguity(tmp_path):
    got = check("checkpoint h[0], h[2]\n", tmp_path)
    assert [(c, m) for c, _, m in got] == [("PL464", "checkpoint group skips `h[1]`")]


def test_model_that_cannot_load_is_located(tmp_path):
    p = tmp_path / "p.plan"
    p.write_text(HEAD.format(tie="").replace("tinynet:build", "tinynet:broken"))
    (d,) = check_with_model(str(p)).diagnostics
    assert d.code == "PL261" and d.span.line == 3


ROOT_PLAN = """\
device d {{ memory = 80 GiB; flops.f32 = 10 TFLOPS }}
link l {{ bandwidth = 100 GB/s; latency = 2 us }}
model net = "tests.runtime.pipeline_worker:build_root"()
input x : f32[batch = 8, features = 16]
budget 40 GiB per device
mesh m of 2 x d {{
    pp = 2 over l
}}
pipeline over pp schedule 1f1b microbatches 2 {{
    stage a, {first}b
    stage c{last}
}}
"""


def test_root_parameters_live_in_the_stage_that_names_them(tmp_path):
    # parameters of the root module itself (`pos`, `scale`: no submodule holds them) are named in a stage
    from planlang.model.validation import validate_file
    from planlang.model.program.stages import StageSplitError, split_model

    p = tmp_path / "p.plan"
    p.write_text(ROOT_PLAN.format(first="", last=""))
    (d,) = [d for d in check_with_model(str(p)).diagnostics if d.code == "PL460"]
    assert "`pos`, `scale` of the root module in no stage" in d.message and "`stage ..., pos`" in d.help
    p.write_text(ROOT_PLAN.format(first="pos, ", last=", scale"))
    v = validate_file(str(p))
    assert not [d for d in v.check.diagnostics if d.severity.name == "ERROR"], v.check.diagnostics
    # the estimate holds each in the stage naming it: stage 0 has a, pos, b; stage 1 c, scale (f32)
    w = 16 * 16 + 16
    assert [e.parameters for e in v.estimate] == [(2 * w + 16) * 4, (w + 16) * 4]
    # the runtime's cut: an unnamed root parameter is PL460 with the same fix
    from tests.runtime.pipeline_worker import build_root

    with pytest.raises(StageSplitError) as err:
        split_model(build_root(), [["a", "b"], ["c", "scale"]])
    assert err.value.code == "PL460" and "`pos` of the root module" in err.value.message
    assert "`stage ..., pos`" in err.value.help
    stages = split_model(build_root(), [["a", "pos", "b"], ["c", "scale"]])
    assert [sorted(n for n, _ in s.named_parameters()) for s in stages] == [
        ["a.bias", "a.weight", "b.bias", "b.weight", "pos"], ["c.bias", "c.weight", "scale"]]
