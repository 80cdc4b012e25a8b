"""Plans for the model-zoo conformance tests and bench/model_zoo.py: each architecture of examples/zoo
under a layout (dp4, ZeRO-3 over dp4, ...), written as a user would."""
from __future__ import annotations

BATCH = 8  # no other dim of the zoo's models is 8, so a dim 0 of 8 is the batch

# name -> (factory, the input declaration, its data spec)
ZOO = {
    "llama": ("examples.zoo.causal_lm:llama", "input_ids : i64[batch = 8, seq = 16]", "[dp, _]"),
    "qwen2": ("examples.zoo.causal_lm:qwen2", "input_ids : i64[batch = 8, seq = 16]", "[dp, _]"),
    "mistral": ("examples.zoo.causal_lm:mistral", "input_ids : i64[batch = 8, seq = 16]", "[dp, _]"),
    "gpt2": ("examples.zoo.causal_lm:gpt2", "input_ids : i64[batch = 8, seq = 16]", "[dp, _]"),
    "bert": ("examples.zoo.masked_lm:bert", "input_ids : i64[batch = 8, seq = 16]", "[dp, _]"),
    "vit": ("examples.zoo.vision:vit", "pixel_values : f32[batch = 8, c = 3, h = 32, w = 32]", "[dp, _, _, _]"),
    "resnet": ("examples.zoo.cnn:resnet", "images : f32[batch = 8, c = 3, h = 16, w = 16]", "[dp, _, _, _]"),
    # an encoder-decoder: two inputs, passed to forward by name
    "t5": ("examples.zoo.seq2seq:t5",
           "input_ids : i64[batch = 8, seq = 16]\ninput decoder_input_ids : i64[batch = 8, seq = 16]", "[dp, _]"),
    "falcon": ("examples.zoo.causal_lm:falcon", "input_ids : i64[batch = 8, seq = 16]", "[dp, _]"),
    "gptj": ("examples.zoo.causal_lm:gptj", "input_ids : i64[batch = 8, seq = 16]", "[dp, _]"),
    "gemma2": ("examples.zoo.causal_lm:gemma2", "input_ids : i64[batch = 8, seq = 16]", "[dp, _]"),
    "phi": ("examples.zoo.causal_lm:phi", "input_ids : i64[batch = 8, seq = 16]", "[dp, _]"),
    "distilbert": ("examples.zoo.masked_lm:distilbert", "input_ids : i64[batch = 8, seq = 16]", "[dp, _]"),
    "bart": ("examples.zoo.seq2seq:bart",
             "input_ids : i64[batch = 8, seq = 16]\ninput decoder_input_ids : i64[batch = 8, seq = 16]", "[dp, _]"),
    "convnext": ("examples.zoo.vision:convnext", "pixel_values : f32[batch = 8, c = 3, h = 32, w = 32]",
                 "[dp, _, _, _]"),
}

# the two pipeline stages of each model, as its modules are named (`planlang inspect` lists them)
STAGES = {
    "llama": ("model.embed_tokens, model.rotary_emb, model.layers[0]", "model.layers[1], model.norm, lm_head"),
    "gpt2": ("transformer.wte, transformer.wpe, transformer.drop, transformer.h[0]",
             "transformer.h[1], transformer.ln_f, lm_head"),
    "bert": ("bert.embeddings, bert.encoder.layer[0]", "bert.encoder.layer[1], cls"),
    "vit": ("vit.embeddings, vit.layers[0]", "vit.layers[1], vit.layernorm, classifier"),
    "resnet": ("stem, bn, blocks[0]", "blocks[1], pool, fc"),
}
STAGES["qwen2"] = STAGES["mistral"] = STAGES["gemma2"] = STAGES["llama"]
STAGES["t5"] = ("shared, encoder", "decoder, lm_head")
STAGES.update({
    "falcon": ("transformer.word_embeddings, transformer.rotary_emb, transformer.h[0]",
               "transformer.h[1], transformer.ln_f, lm_head"),
    "gptj": ("transformer.wte, transformer.drop, transformer.rotary_emb, transformer.h[0]",
             "transformer.h[1], transformer.ln_f, lm_head"),
    "phi": ("model.embed_tokens, model.rotary_emb, model.embed_dropout, model.layers[0]",
            "model.layers[1], model.final_layernorm, lm_head"),
    "distilbert": ("distilbert.embeddings, distilbert.transformer.layer[0]",
                   "distilbert.transformer.layer[1], activation, vocab_transform, vocab_layer_norm, vocab_projector"),
    "bart": ("model.shared, model.encoder", "model.decoder, lm_head"),
    "convnext": ("convnext.embeddings, convnext.encoder.stages[0]",
                 "convnext.encoder.stages[1], convnext.layernorm, classifier"),
})

# Megatron tensor parallelism over tp, as each architecture's modules are named (patterns.megatron)
_LLAMA_TP = """for layer in model.layers[*] {
    apply megatron.llama_attention(tp) to layer.self_attn
    apply megatron.llama_mlp(tp) to layer.mlp
}"""
TENSOR_PARALLEL = {
    "llama": _LLAMA_TP,
    "mistral": _LLAMA_TP,
    # Qwen2's q, k and v projections have biases: split with their outputs
    "qwen2": _LLAMA_TP[:-2] + """
    shard layer.self_attn.q_proj.bias : [tp]
    shard layer.self_attn.k_proj.bias : [tp]
    shard layer.self_attn.v_proj.bias : [tp]
}""",
    "gpt2": """for block in transformer.h[*] {
    apply megatron.attention(tp) to block.attn
    apply megatron.mlp(tp) to block.mlp
}""",
    "bert": """for layer in bert.encoder.layer[*] {
    apply megatron.bert_layer(tp) to layer
}""",
    "vit": """for layer in vit.layers[*] {
    apply megatron.llama_attention(tp) to layer.attention
    shard layer.attention.q_proj.bias : [tp]
    shard layer.attention.k_proj.bias : [tp]
    shard layer.attention.v_proj.bias : [tp]
    shard layer.attention.o_proj.bias : [_]
    apply megatron.linear_mlp(tp) to layer.mlp
}""",
    # T5: attention q, k, v, o and the feed-forward wi, wo without biases; block 0's relative
    # position bias is an embedding [buckets, heads]: split by heads with them
    "t5": "\n".join(f"""for block in {stack}.block[*] {{
    apply megatron.t5_attention(tp) to block.layer[0].SelfAttention
{extra}    apply megatron.t5_feed_forward(tp) to block.layer[{ff}].DenseReluDense
}}
shard {stack}.block[0].layer[0].SelfAttention.relative_attention_bias.weight : [_, tp]"""
                     for stack, extra, ff in (("encoder", "", 1), ("decoder", "    apply megatron.t5_attention(tp) to block.layer[1].EncDecAttention\n", 2))),
    "gemma2": _LLAMA_TP,
    # GPT-J: q, k, v and out_proj without biases; the MLP's fc_in and fc_out with theirs. The rotary's
    # x[..., ::2] cuts each head's own dims: the heads stay split over tp through it
    "gptj": """for block in transformer.h[*] {
    shard block.attn.q_proj.weight : [tp, _]
    shard block.attn.k_proj.weight : [tp, _]
    shard block.attn.v_proj.weight : [tp, _]
    shard block.attn.out_proj.weight : [_, tp]
    shard block.mlp.fc_in.weight : [tp, _]
    shard block.mlp.fc_in.bias : [tp]
    shard block.mlp.fc_out.weight : [_, tp]
}""",
    # Phi: q, k, v and dense with biases, partial rotary on each head's first half
    "phi": """for layer in model.layers[*] {
    shard layer.self_attn.q_proj.weight : [tp, _]
    shard layer.self_attn.q_proj.bias : [tp]
    shard layer.self_attn.k_proj.weight : [tp, _]
    shard layer.self_attn.k_proj.bias : [tp]
    shard layer.self_attn.v_proj.weight : [tp, _]
    shard layer.self_attn.v_proj.bias : [tp]
    shard layer.self_attn.dense.weight : [_, tp]
    apply megatron.linear_mlp(tp) to layer.mlp
}""",
    # Falcon's query_key_value is one fused projection of 4 query heads and the single key/value head
    # (multi-query): not cut into equal per-head pieces, so attention stays whole; the MLP is split
    "falcon": """for block in transformer.h[*] {
    shard block.mlp.dense_h_to_4h.weight : [tp, _]
    shard block.mlp.dense_4h_to_h.weight : [_, tp]
}""",
    "distilbert": """for layer in distilbert.transformer.layer[*] {
    shard layer.attention.q_lin.weight : [tp, _]
    shard layer.attention.q_lin.bias : [tp]
    shard layer.attention.k_lin.weight : [tp, _]
    shard layer.attention.k_lin.bias : [tp]
    shard layer.attention.v_lin.weight : [tp, _]
    shard layer.attention.v_lin.bias : [tp]
    shard layer.attention.out_lin.weight : [_, tp]
    shard layer.ffn.lin1.weight : [tp, _]
    shard layer.ffn.lin1.bias : [tp]
    shard layer.ffn.lin2.weight : [_, tp]
}""",
    # BART: fairseq names (q_proj, k_proj, v_proj, out_proj; the layer's own fc1 and fc2)
    "bart": """for layer in model.encoder.layers[*] {
    apply megatron.linear_attention(tp) to layer.self_attn
    apply megatron.linear_mlp(tp) to layer
}
for layer in model.decoder.layers[*] {
    apply megatron.linear_attention(tp) to layer.self_attn
    apply megatron.linear_attention(tp) to layer.encoder_attn
    apply megatron.linear_mlp(tp) to layer
}""",
    # ConvNeXt: each block's pointwise MLP (pwconv1, pwconv2: nn.Linear over channels last) is split
    "convnext": "\n".join(f"""shard convnext.encoder.stages[{i}].layers[0].pwconv1.weight : [tp, _]
shard convnext.encoder.stages[{i}].layers[0].pwconv1.bias : [tp]
shard convnext.encoder.stages[{i}].layers[0].pwconv2.weight : [_, tp]""" for i in (0, 1)),
    # a CNN has no attention or MLP block: its classifier is split by classes (column-parallel)
    "resnet": """shard fc.weight : [tp, _]
shard fc.bias : [tp]
shard output of fc : [_, tp]""",
}

# four stages of each decoder, for interleaved 1F1B over two pipeline ranks (two chunks each)
STAGES4 = {
    "llama": ("model.embed_tokens, model.rotary_emb", "model.layers[0]", "model.layers[1]", "model.norm, lm_head"),
    "gpt2": ("transformer.wte, transformer.wpe, transformer.drop", "transformer.h[0]", "transformer.h[1]",
             "transformer.ln_f, lm_head"),
}
STAGES4["qwen2"] = STAGES4["mistral"] = STAGES4["llama"]

LAYOUTS = ("dp4", "dp2tp2", "zero3", "pp2dp2", "pp2tp2")
# measured by bench/zoo_memory.py only: interleaved 1F1B, pp2 x dp2, two chunks per rank; pp2dp2bfs: the same
# stages under looped BFS, pp2dp2zb under zero bubble, pp2dp2zbv and pp2dp2dpv under ZB-V and DualPipeV (V
# placement) (all also verified on gloo by tests/zoo/test_zoo_gloo.py)
EXTRA_LAYOUTS = ("pp2dp2i", "pp2dp2bfs", "pp2dp2zb", "pp2dp2zbv", "pp2dp2dpv", "bf16", "pp2het")
# pp2het (8 devices): stages of their own degrees, stage 0 on dp4 and stage 1 on dp2 x tp2 (issue #31)
#: the layouts of four stages on pp2 x dp2, by schedule
FOUR_STAGES = {"pp2dp2i": "interleaved", "pp2dp2bfs": "looped_bfs", "pp2dp2zb": "zero_bubble", "pp2dp2zbv": "zbv",
               "pp2dp2dpv": "dualpipev"}  # bf16: dp4 under `precision = bf16` (bench/model_zoo.py)
BATCH_NORM = {"resnet"}  # models with BatchNorm


# each architecture's dropout settings (Hugging Face config names; the zoo's factories set them to 0), for
# runs with dropout as the models train by default (bench/model_zoo.py --dropout); the CNNs have none
DROPOUT = {
    "llama": ("attention_dropout",), "qwen2": ("attention_dropout",), "mistral": ("attention_dropout",),
    "gpt2": ("resid_pdrop", "embd_pdrop", "attn_pdrop"), "gptj": ("resid_pdrop", "embd_pdrop", "attn_pdrop"),
    "bert": ("hidden_dropout_prob", "attention_probs_dropout_prob"),
    "vit": ("hidden_dropout_prob", "attention_probs_dropout_prob"), "t5": ("dropout_rate",),
    "falcon": ("hidden_dropout", "attention_dropout"), "gemma2": ("attention_dropout",),
    "phi": ("resid_pdrop", "embd_pdrop", "attention_dropout"), "distilbert": ("dropout", "attention_dropout"),
    "bart": ("dropout", "attention_dropout", "activation_dropout"),
}


def plan_text(model: str, layout: str = "dp4", dropout: float = 0.0) -> str:
    """`model` under `layout`; with `dropout`, every dropout setting of the model's config at it."""
    factory, inp, spec = ZOO[model]
    args = ", ".join(f"{k} = {dropout}" for k in DROPOUT[model]) if dropout else ""
    data = "\n".join(f"data {line.split(':')[0].replace('input ', '').strip()} : {spec}" for line in inp.splitlines())
    zero = "{\n    zero = 3 over dp\n}" if layout == "zero3" else ""
    if layout == "bf16":  # dp4, parameters and compute in bf16, f32 reduction and master weights
        zero = "{\n    precision = bf16\n}"
    uses, mesh, rest = "use hardware", "    dp = 4 over hardware.loopback", ""
    if layout == "dp2tp2":
        uses += "\nuse patterns.megatron" if "megatron." in TENSOR_PARALLEL[model] else ""
        mesh = "    dp = 2 over hardware.loopback\n    tp = 2 over hardware.loopback"
        rest = TENSOR_PARALLEL[model] + "\n"
    elif layout == "pp2dp2":
        first, second = STAGES[model]
        mesh = "    pp = 2 over hardware.loopback\n    dp = 2 over hardware.loopback"
        # BatchNorm's statistics are the batch's only with one microbatch, which 1F1B cannot run (PL466's
        # help): the CNN's pipeline is GPipe over one microbatch, its BatchNorm synced over dp
        schedule = "gpipe microbatches 1" if model in BATCH_NORM else "1f1b microbatches 2"
        rest = f"pipeline over pp schedule {schedule} {{\n    stage {first}\n    stage {second}\n}}\n"
    elif layout == "pp2tp2":  # pipeline x tensor parallelism: the lowered program cut into the stages
        uses += "\nuse patterns.megatron" if "megatron." in TENSOR_PARALLEL[model] else ""
        first, second = STAGES[model]
        mesh = "    pp = 2 over hardware.loopback\n    tp = 2 over hardware.loopback"
        data = ""
        schedule = "gpipe microbatches 1" if model in BATCH_NORM else "1f1b microbatches 2"
        rest = (f"pipeline over pp schedule {schedule} {{\n    stage {first}\n    stage {second}\n}}\n"
                + TENSOR_PARALLEL[model] + "\n")
    elif layout == "pp2het":  # 8 devices: stage 0 data parallel over its 4, stage 1 dp2 x tp2
        uses += "\nuse patterns.megatron" if "megatron." in TENSOR_PARALLEL[model] else ""
        first, second = STAGES[model]
        mesh = ("    pp = 2 over hardware.loopback\n    dp = 2 over hardware.loopback\n"
                "    tp = 2 over hardware.loopback")
        rest = (f"pipeline over pp schedule 1f1b microbatches 2 {{\n    stage {first} with dp = 4, tp = 1\n"
                f"    stage {second}\n}}\n" + TENSOR_PARALLEL[model] + "\n")
    elif layout in FOUR_STAGES:
        mesh = "    pp = 2 over hardware.loopback\n    dp = 2 over hardware.loopback"
        stages = "".join(f"    stage {s}\n" for s in STAGES4[model])
        schedule = FOUR_STAGES[layout]
        rest = f"pipeline over pp schedule {schedule} chunks 2 microbatches 4 {{\n{stages}}}\n"
    return f"""{uses}
model {model} = "{factory}"({args})
input {inp}
mesh cluster of {8 if layout == "pp2het" else 4} x hardware.cpu {{
{mesh}
}}
budget 2 GiB per device
optimizer adamw(lr = 1e-3) {zero}
{data}
{rest}"""
