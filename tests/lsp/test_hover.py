"""Hover texts that need no model (planlang.lsp.hover)."""
from planlang.lang.codes import CODES
from planlang.lsp.analysis import analyze
from planlang.lsp.hover import MODEL_HINT, SCHEDULE_TEXT, hover
from planlang.lsp.positions import LineIndex
from planlang.plan import types

from .conftest import at


def _hover(analysis, offset, **kw):
    h = hover(analysis, offset, **kw)
    assert h is not None
    return h.contents.value, h.range


def test_axis_shows_size_and_link_and_range_covers_the_name(gpt2):
    off = at(gpt2.text, "attention(tp)", len("attention(t"))
    text, rng = _hover(gpt2, off)
    mesh = gpt2.plan.mesh
    tp = mesh.axis("tp")
    assert f"size **{tp.size}**" in text and tp.link_ref in text
    assert f"{tp.link.bandwidth / 1e9:g} GB/s" in text
    assert f"= {mesh.size} devices" in text
    index = LineIndex(gpt2.text)
    start = index.offset(rng.start)
    assert gpt2.text[start:index.offset(rng.end)] == "tp"


def test_code_in_a_suppression_comment_explains_it(plan_in):
    a = plan_in("use hardware  # plan: ignore[PL218]\n")
    text, _ = _hover(a, at(a.text, "PL218", 2))
    assert CODES["PL218"].title in text and CODES["PL218"].explanation.split("\n")[0] in text


def test_keyword_shows_syntax_and_section(gpt2):
    text, _ = _hover(gpt2, at(gpt2.text, "pipeline over", 2))
    assert "**pipeline** (keyword)" in text and "§15" in text


def test_every_schedule_has_a_hover(gpt2):
    for kind in types.SCHEDULES:
        text = gpt2.text.replace("schedule 1f1b", f"schedule {kind}")
        a = analyze(text, gpt2.path)
        h = hover(a, at(text, f"schedule {kind}", len("schedule ") + 1))
        assert h is not None and h.contents.value == SCHEDULE_TEXT[kind], kind
    assert "all microbatches" in SCHEDULE_TEXT["looped_bfs"]  # GPipe's memory
    assert "weight gradient" in SCHEDULE_TEXT["zero_bubble"] and "until its W" in SCHEDULE_TEXT["zero_bubble"]
    for v_shape in types.V_SHAPED:  # two stages per rank, placed in a V, written `chunks 2`
        assert "`chunks 2`" in SCHEDULE_TEXT[v_shape] and "2p - 1 - r" in SCHEDULE_TEXT["zbv"], v_shape
    assert "overlapped" in SCHEDULE_TEXT["dualpipev"] and "microbatches >= 2p" in SCHEDULE_TEXT["dualpipev"]
    assert set(SCHEDULE_TEXT) == set(types.SCHEDULES)


def test_template_shows_signature_and_doc_comment(gpt2):
    text, _ = _hover(gpt2, at(gpt2.text, "megatron.mlp", len("megatron.m")))
    assert "template mlp(tp: axis)" in text
    assert "Apply to a GPT2MLP module" in text  # the comment right above the template in megatron.plan


def test_module_path_without_model_says_how_to_get_shapes(gpt2):
    text, _ = _hover(gpt2, at(gpt2.text, "checkpoint h[*]", len("checkpoint h")))
    assert "`h[*]`" in text and MODEL_HINT in text


def test_stage_without_model_lists_its_modules(gpt2):
    text, _ = _hover(gpt2, at(gpt2.text, "stage h[6:12]", 2))
    assert text.startswith("**stage 1** of 2") and "`ln_f`" in text


def test_unit_and_hole(plan_in):
    a = plan_in("use hardware\nmesh m of 8 x hardware.cpu {\n    dp = ?\n}\nbudget 4 GiB per device\n")
    text, _ = _hover(a, at(a.text, "GiB", 1))
    assert "1 GiB = 1,073,741,824 bytes" in text
    text, _ = _hover(a, at(a.text, "?"))
    assert "mesh axis size" in text


def test_blank_space_has_no_hover(gpt2):
    assert hover(gpt2, at(gpt2.text, "\n\n", 1)) is None
