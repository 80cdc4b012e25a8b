"""Model-aware checks found by the mutation suite (bench/mutants.py): plans `check --model` accepted and
the runtime then refused, or that break a requirement the standard library states."""
from __future__ import annotations

import textwrap

from planlang.model.validation import check_with_model

GPT2 = """\
use hardware
use patterns.megatron
model gpt2 = "examples.gpt2.model:build"(layers = 2, hidden = 48, heads = {heads}, vocab = 128, seq = 16)
input idx : i64[batch = 8, seq = 16]
mesh ranks of 4 x hardware.cpu {{
    dp = 2 over hardware.loopback
    tp = 2 over hardware.loopback
}}
budget 2 GiB per device
optimizer adamw(lr = 0.001)
data idx : [dp, _]
for block in h[*] {{
    apply megatron.attention(tp) to block.attn
    apply megatron.mlp(tp) to block.mlp
}}
"""


def diags(tmp_path, text: str):
    p = tmp_path / "p.plan"
    p.write_text(textwrap.dedent(text))
    return [(d.code, d.span.line, d.message) for d in check_with_model(str(p)).diagnostics]


def test_heads_not_divisible_by_tp_is_reported_once_at_the_apply_line(tmp_path):
    got = [d for d in diags(tmp_path, GPT2.format(heads=3)) if d[0] == "PL365"]
    assert len(got) == 1, got
    code, line, msg = got[0]
    assert line == 13  # `apply megatron.attention(tp) to block.attn`, for every block at once
    assert "3 heads, not a multiple of 2" in msg and "tp(2) = 2" in msg


def test_heads_divisible_by_tp_is_clean(tmp_path):
    assert not [d for d in diags(tmp_path, GPT2.format(heads=4)) if d[0] == "PL365"]


def test_heads_of_a_bert_layer_cover_its_output_projection(tmp_path):
    # the heads are counted by `attention.self`; the row-parallel `attention.output.dense` is theirs too
    text = GPT2.replace('"examples.gpt2.model:build"(layers = 2, hidden = 48, heads = {heads}, vocab = 128, seq = 16)',
                        '"examples.bert.model:build"(layers = 2, hidden = 48, heads = 3, intermediate = 96, '
                        'vocab = 100, seq = 16)').replace("idx", "ids")
    text = text.replace("for block in h[*] {{\n    apply megatron.attention(tp) to block.attn\n"
                        "    apply megatron.mlp(tp) to block.mlp\n}}\n",
                        "shard encoder.layer[*].attention.output.dense.weight : [_, tp]\n")
    got = [d for d in diags(tmp_path, text.format()) if d[0] == "PL365"]
    assert len(got) == 1 and "`encoder.layer[0].attention.self` has 3 heads" in got[0][2], got


def test_a_split_outside_attention_is_not_about_heads(tmp_path):
    text = GPT2.format(heads=3).replace("    apply megatron.attention(tp) to block.attn\n", "")
    assert not [d for d in diags(tmp_path, text) if d[0] == "PL365"]


def test_input_longer_than_the_position_table_is_pl261(tmp_path):
    # meta tensors hold no values, so the lookup past the end of `wpe` is found from arange's arguments
    got = diags(tmp_path, GPT2.format(heads=4).replace("seq = 16]", "seq = 17]"))
    assert [d[0] for d in got if d[0].startswith("PL2")] == ["PL261"], got
    assert "position 16 is past the end of an embedding of 16 rows" in got[0][2]


def test_input_dtype_the_weights_do_not_take_is_pl261(tmp_path):
    text = GPT2.format(heads=4).replace('"examples.gpt2.model:build"(layers = 2, hidden = 48, heads = 4, vocab = 128, '
                                        'seq = 16)', '"examples.mlp.model:build"(in_features = 16, hidden = 32, '
                                        'out_features = 8)')
    text = text.replace("input idx : i64[batch = 8, seq = 16]", "input x : u8[batch = 8, features = 16]")
    text = text.replace("data idx", "data x").replace("use patterns.megatron\n", "").split("for block")[0]
    got = diags(tmp_path, text)
    assert [d[0] for d in got if d[0].startswith("PL2")] == ["PL261"], got
    assert "float32 and uint8" in got[0][2]
    assert not [d for d in diags(tmp_path, text.replace("u8[", "f32[")) if d[0] == "PL261"]


PIPELINE = """\
use hardware
model gpt2 = "examples.gpt2.model:build"(layers = 4, hidden = 64, heads = 4, vocab = 128, seq = 16)
input idx : i64[batch = 8, seq = 16]
mesh ranks of 4 x hardware.cpu {{
    pp = 2 over hardware.loopback
    dp = 2 over hardware.loopback
}}
budget 2 GiB per device
optimizer adamw(lr = 0.001)
data idx : [dp, _]
pipeline over pp schedule 1f1b microbatches 2 {{
    stage wte, wpe, drop, h[0:{cut}]
    stage h[{cut}:4], ln_f, lm_head
}}
checkpoint h[*] every {every}
"""


def test_checkpoint_every_groups_that_cross_a_stage_boundary_are_pl465(tmp_path):
    got = [d for d in diags(tmp_path, PIPELINE.format(cut=2, every=3)) if d[0] == "PL465"]
    assert len(got) == 1 and "h[0], h[1], h[2] spans stages 0, 1" in got[0][2], got
    assert got[0][1] == 15
    got = [d for d in diags(tmp_path, PIPELINE.format(cut=1, every=2)) if d[0] == "PL465"]
    assert len(got) == 1 and "h[0], h[1]" in got[0][2], got
    assert not [d for d in diags(tmp_path, PIPELINE.format(cut=2, every=2)) if d[0] == "PL465"]


def test_int32_token_ids_that_the_loss_takes_as_class_indices_are_pl261(tmp_path):
    # verify's targets for a language model are its own input; nll_loss on CPU and CUDA needs int64
    got = diags(tmp_path, GPT2.format(heads=4).replace("idx : i64", "idx : i32"))
    assert [d[0] for d in got if d[0].startswith("PL2")] == ["PL261"], got
    assert "class indices are int32" in got[0][2]
