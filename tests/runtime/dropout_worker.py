"""Worker for tests/runtime/test_verify_dropout_gloo.py: one group of 4 gloo ranks runs
planlang.runtime.verify for one step on models with dropout 0.1 (GPT-2 of examples/ under dp 2 x tp 2: the
lowered program's dropout ops; Hugging Face BERT, whose attention passes `dropout_p` to scaled-dot-product
attention, under dp 2 x tp 2, an opaque call in the program, and pp 2 x dp 2, stages running the model's own
modules); each rank writes every plan's rows and how many dropout calls ran as the identity."""
from __future__ import annotations

import os
import tempfile

WORLD = 4
GPT2 = 'model gpt2 = "examples.gpt2.model:build"(layers = 4, hidden = 64, heads = 4, vocab = 128, seq = 16, dropout = 0.1)'
BERT = ('model bert = "examples.zoo.masked_lm:bert"(hidden_dropout_prob = 0.1, '
        'attention_probs_dropout_prob = 0.1)')
DP_TP = """mesh ranks of 4 x hardware.cpu {
    dp = 2 over hardware.loopback
    tp = 2 over hardware.loopback
}
optimizer adamw(lr = 0.01, eps = 0.0001)
"""
PP_DP = """mesh ranks of 4 x hardware.cpu {
    pp = 2 over hardware.loopback
    dp = 2 over hardware.loopback
}
optimizer adamw(lr = 0.01, eps = 0.0001)
"""
CONFIGS = {
    "gpt2_dp2_tp2": f"""use hardware
use patterns.megatron
{GPT2}
input idx : i64[batch = 8, seq = 16]
{DP_TP}data idx : [dp, _]
for block in h[*] {{
    apply megatron.attention(tp) to block.attn
    apply megatron.mlp(tp) to block.mlp
}}
""",
    "bert_dp2_tp2": f"""use hardware
use patterns.megatron
{BERT}
input input_ids : i64[batch = 8, seq = 16]
{DP_TP}data input_ids : [dp, _]
for layer in bert.encoder.layer[*] {{
    apply megatron.bert_layer(tp) to layer
}}
""",
    "bert_pp2_dp2": f"""use hardware
{BERT}
input input_ids : i64[batch = 8, seq = 16]
{PP_DP}data input_ids : [dp, _]
pipeline over pp schedule 1f1b microbatches 2 {{
    stage bert.embeddings, bert.encoder.layer[0]
    stage bert.encoder.layer[1], cls
}}
""",
}


def worker(rank: int, port: int, outdir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD))
    from tests.runtime.spawned import write_rank

    def body():
        import dataclasses

        import torch.distributed as dist

        from planlang.runtime.verify import verify

        dist.init_process_group("gloo", rank=rank, world_size=WORLD)
        out = {}
        for name, text in CONFIGS.items():
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, f"{name}.plan")
                with open(path, "w") as f:
                    f.write(text)
                report: dict = {}
                rows = verify(path, steps=1, report=report)
            out[name] = {"rows": [dataclasses.asdict(r) for r in rows],
                         "ok": [r.ok() for r in rows], "dropout_off": report.get("dropout_off")}
        return out

    write_rank(outdir, rank, body)
