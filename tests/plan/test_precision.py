"""The precision fields of the optimizer block: resolved into one `Precision` (planlang.plan.types), checked
by rules.precision_support (PL509-PL513), formatted back as written. Pure: no torch."""
from __future__ import annotations

import pytest

from planlang.lang.fmt import format_text
from planlang.lang.parser import parse
from planlang.plan.checker import check_text
from planlang.plan.types import Precision

HEAD = """device gpu { memory = 80 GiB; flops.bf16 = 312 TFLOPS; flops.f16 = 312 TFLOPS; flops.f32 = 19.5 TFLOPS }
link nv { bandwidth = 300 GB/s }
mesh m of 4 x gpu { dp = 4 over nv }
budget 40 GiB per device
"""


def _plan(block: str, head: str = HEAD):
    res = check_text(head + f"optimizer adamw(lr = 0.001) {{\n{block}\n}}\n")
    return res.plan, sorted({d.code for d in res.diagnostics})


@pytest.mark.parametrize("block, expected", [
    ("    precision = bf16", Precision("bf16", "bf16", "f32", "f32")),
    ("    precision = bf16\n    master = bf16", Precision("bf16", "bf16", "f32", "bf16")),
    ("    compute = bf16", Precision("f32", "bf16", "f32", "f32")),
    ("    params = bf16", Precision("bf16", "bf16", "f32", "f32")),  # compute follows params
    ("    precision = bfloat16\n    reduce = bf16", Precision("bf16", "bf16", "bf16", "f32")),
    ("    precision = f16\n    loss_scale = dynamic", Precision("f16", "f16", "f32", "f32", "dynamic")),
    ("    precision = fp16\n    loss_scale = 1024", Precision("f16", "f16", "f32", "f32", 1024.0)),
])
def test_fields_resolve_to_one_precision(block, expected):
    plan, codes = _plan(block)
    assert codes == []
    assert plan.precision == expected
    assert plan.optimizer.precision == expected


def test_without_fields_the_step_is_all_f32():
    res = check_text(HEAD + "optimizer adamw(lr = 0.001) { zero = 1 over dp }\n")
    assert res.plan.optimizer.precision is None
    assert res.plan.precision == Precision() and not res.plan.precision.mixed
    assert check_text(HEAD).plan.precision == Precision()


def test_derived_facts():
    p = Precision("bf16", "bf16", "f32", "f32")
    assert p.mixed and p.master_copy and p.autocast
    assert p.bytes("params") == 2 and p.bytes("master") == 4
    amp = Precision("f32", "bf16", "f32", "f32")
    assert amp.autocast and not amp.master_copy
    assert str(p) == "params bf16, compute bf16, reduce f32, master f32"


@pytest.mark.parametrize("block, code", [
    ("    params = i8", "PL509"),
    ("    precision = tf32", "PL509"),
    ("    precision = bfloat17", "PL214"),
    ("    precision = 16", "PL221"),
    ("    precision = f16", "PL511"),
    ("    params = f32\n    master = bf16", "PL512"),
    ("    params = bf16\n    master = f16", "PL512"),
    ("    params = bf16\n    compute = f32", "PL513"),
    ("    precision = bf16\n    loss_scale = fast", "PL221"),
    ("    precisoin = bf16", "PL212"),
])
def test_checks(block, code):
    _, codes = _plan(block)
    assert code in codes


def test_the_device_must_declare_the_compute_dtype():
    head = HEAD.replace("flops.bf16 = 312 TFLOPS; ", "")
    _, codes = _plan("    precision = bf16", head)
    assert codes == ["PL510"]
    _, codes = _plan("    compute = f32", head)  # f32 is declared
    assert codes == []


def test_a_pipeline_runs_bf16_and_loss_scaling():
    def codes(fields: str) -> set[str]:
        text = HEAD.replace("dp = 4", "pp = 4") + f"""model gpt = "examples.gpt2.model:build"
optimizer adamw(lr = 0.001) {{
{fields}
}}
pipeline over pp schedule gpipe microbatches 4 {{
    stage wte, wpe, h[0:6]
    stage h[6:12], ln_f, lm_head
}}
"""
        return {d.code for d in check_text(text).diagnostics}

    # loss scaling runs in pipelines (PL514 is retired): an f16 pipeline checks clean of precision codes
    assert not {c for c in codes("    precision = bf16\n    loss_scale = dynamic") if c.startswith("PL51")}


def test_fmt_round_trips_the_fields():
    text = HEAD + "optimizer adamw(lr = 0.001) {\n    zero = 1 over dp\n    precision = bf16   # the recipe\n    master = f32\n    loss_scale = dynamic\n}\n"
    out = format_text(text)
    assert parse(out).module == parse(text).module
    assert format_text(out) == out
    assert "precision = bf16   # the recipe" in out or "precision = bf16  # the recipe" in out
