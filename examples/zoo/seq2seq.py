"""Hugging Face encoder-decoders from small configs: T5 and BART with their language-model heads. The plan feeds
`input_ids` to the encoder and `decoder_input_ids` to the decoder (by those names); `loss` is
cross-entropy of the decoder's logits against the labels."""
from __future__ import annotations

import torch
import torch.nn.functional as F
import transformers as tf


def t5(**kw) -> torch.nn.Module:
    cfg = dict(num_layers=2, num_decoder_layers=2, d_model=64, d_kv=16, d_ff=128, num_heads=4, vocab_size=256,
               dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, use_cache=False)
    return tf.T5ForConditionalGeneration(tf.T5Config(**{**cfg, **kw}))


def bart(**kw) -> torch.nn.Module:
    cfg = dict(encoder_layers=2, decoder_layers=2, d_model=64, encoder_attention_heads=4, decoder_attention_heads=4,
               encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=128, max_position_embeddings=64, dropout=0.0,
               attention_dropout=0.0, activation_dropout=0.0, pad_token_id=1, bos_token_id=0, eos_token_id=2,
               decoder_start_token_id=2, forced_eos_token_id=None, use_cache=False)
    return tf.BartForConditionalGeneration(tf.BartConfig(**{**cfg, **kw}))


def loss(output, labels: torch.Tensor) -> torch.Tensor:
    logits = output.logits
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1))
