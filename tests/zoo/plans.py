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
STAGES["qwen2"] = STAGES["mistral"] = STAGES["llama"]

LAYOUTS = ("dp4", "zero3", "pp2dp2")


def plan_text(model: str, layout: str = "dp4") -> str:
    factory, inp, spec = ZOO[model]
    name = inp.split(":")[0].strip()
    zero = "{\n    zero = 3 over dp\n}" if layout == "zero3" else ""
    if layout == "pp2dp2":
        first, second = STAGES[model]
        mesh = "    pp = 2 over hardware.loopback\n    dp = 2 over hardware.loopback"
        pipeline = (f"pipeline over pp schedule 1f1b microbatches 2 {{\n    stage {first}\n    stage {second}\n}}\n")
    else:
        mesh, pipeline = "    dp = 4 over hardware.loopback", ""
    return f"""use hardware
model {model} = "{factory}"()
input {inp}
mesh cluster of 4 x hardware.cpu {{
{mesh}
}}
budget 2 GiB per device
optimizer adamw(lr = 1e-3) {zero}
data {name} : {spec}
{pipeline}"""
