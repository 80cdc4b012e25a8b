"""Completion contexts, read from the text before the cursor (planlang.lsp.completion)."""
from planlang.lang.codes import CODES
from planlang.lsp.analysis import analyze
from planlang.lsp.completion import completion, open_blocks
from planlang.lsp.positions import LineIndex
from planlang.plan.resolve import Resolver

from .conftest import GPT2, at


def _complete(good, text, marker, delta=None):
    """Completion with `text` as the document, the cursor right after `marker` (or `delta` into it)."""
    a = analyze(text, good.path)
    off = at(text, marker, len(marker) if delta is None else delta)
    return a, off, completion(a, off, good)


def _labels(result):
    return [i.label for i in result.items]


def test_axes_inside_a_spec_while_the_text_does_not_parse(gpt2):
    text = gpt2.text.replace("data idx : [dp, _]", "data idx : [d")
    a, off, res = _complete(gpt2, text, "data idx : [d")
    assert not a.parses
    assert set(_labels(res)) >= {"pp", "dp", "tp", "_"}
    edit = res.items[0].text_edit  # replaces the partial word `d`
    index = LineIndex(text)
    assert text[index.offset(edit.range.start):index.offset(edit.range.end)] == "d"


def test_stdlib_modules_after_use(gpt2):
    _, _, res = _complete(gpt2, gpt2.text + "\nuse pat", "use pat")
    assert set(Resolver().stdlib_modules()) <= set(_labels(res))


def test_templates_after_apply_with_their_signature(gpt2):
    _, _, res = _complete(gpt2, gpt2.text + "\napply megatron.", "apply megatron.")
    details = {i.label: i.detail for i in res.items}
    assert details["megatron.mlp"] == "template mlp(tp: axis)"
    assert "megatron.bert_layer" in details


def test_module_paths_from_the_file_and_loop_variables(gpt2):
    text = gpt2.text.replace("    apply megatron.mlp(tp) to block.mlp", "    apply megatron.mlp(tp) to bl")
    _, _, res = _complete(gpt2, text, "to bl\n", delta=len("to bl"))
    labels = _labels(res)
    assert labels[0] == "block"  # the loop variable in scope comes first
    assert {"h[*]", "ln_f", "lm_head", "block.attn"} <= set(labels)
    assert "bl" not in labels  # not the path being typed


def test_statement_keywords_depend_on_the_block(gpt2):
    _, _, res = _complete(gpt2, gpt2.text + "\nsh", "\nsh")
    assert {"shard", "pipeline", "template", "use"} <= set(_labels(res))
    text = gpt2.text.replace("    stage h[6:12], ln_f, lm_head\n", "    st\n")
    _, _, res = _complete(gpt2, text, "    st")
    assert _labels(res) == ["stage"]


def test_links_after_over_in_a_mesh_and_axes_elsewhere(gpt2):
    text = gpt2.text.replace("pp = 2 over hardware.infiniband_200g", "pp = 2 over hardware.inf")
    _, _, res = _complete(gpt2, text, "over hardware.inf")
    assert "hardware.infiniband_200g" in _labels(res) and "tp" not in _labels(res)
    text = gpt2.text.replace("zero = 1 over dp", "zero = 1 over ")
    _, _, res = _complete(gpt2, text, "zero = 1 over ")
    assert _labels(res) == ["pp", "dp", "tp"]


def test_schedules_and_codes_in_suppression_comments(gpt2):
    _, _, res = _complete(gpt2, gpt2.text.replace("schedule 1f1b", "schedule 1"), "schedule 1")
    assert _labels(res) == ["gpipe", "1f1b", "interleaved", "looped_bfs", "zero_bubble", "zbv", "dualpipev"]
    _, _, res = _complete(gpt2, gpt2.text + "\n# plan: ignore[PL2", "ignore[PL2")
    assert _labels(res) == sorted(CODES)
    _, _, res = _complete(gpt2, gpt2.text + "\n# a comment ", "a comment ")
    assert _labels(res) == []


def test_open_blocks_skip_braces_in_comments_and_strings():
    text = 'mesh m of d {  # {\n    x = "{"\n    '
    assert open_blocks(text, len(text)) == ["mesh m of d"]
    assert open_blocks(GPT2.read_text(), 0) == []


def test_axes_and_template_parameters_before_any_version_parsed():
    text = "use hardware\nmesh m of 4 x hardware.cpu {\n    pp = 2; dp = 2\n}\ntemplate t(ax: axis, n: int) {\n" \
           "    shard w : ["
    a = analyze(text, "/tmp/never_parsed.plan")
    assert not a.parses
    assert _labels(completion(a, len(text))) == ["pp", "dp", "ax", "_", "?"]  # `n` is an int parameter


def test_precision_fields_and_their_dtypes_in_the_optimizer_block(gpt2):
    text = gpt2.text + "\noptimizer adamw(lr = 0.001) {\n    pre\n}\n"
    _, _, res = _complete(gpt2, text, "    pre")
    assert {"zero", "precision", "params", "compute", "reduce", "master", "loss_scale"} <= set(_labels(res))
    text = gpt2.text + "\noptimizer adamw(lr = 0.001) {\n    precision = b\n}\n"
    _, _, res = _complete(gpt2, text, "precision = b")
    assert set(_labels(res)) == {"f32", "bf16", "f16"}
    text = gpt2.text + "\noptimizer adamw(lr = 0.001) {\n    loss_scale = d\n}\n"
    _, _, res = _complete(gpt2, text, "loss_scale = d")
    assert _labels(res) == ["dynamic"]
