"""Hugging Face decoder-only language models from small configs: Llama, Qwen2 (grouped-query attention),
Mistral and GPT-2. `loss` is next-token cross-entropy on the logits."""
from __future__ import annotations

import torch
import torch.nn.functional as F
import transformers as tf

_SMALL = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=256, max_position_embeddings=64, use_cache=False)


def llama(**kw) -> torch.nn.Module:
    return tf.LlamaForCausalLM(tf.LlamaConfig(**{**_SMALL, **kw}))


def qwen2(**kw) -> torch.nn.Module:
    return tf.Qwen2ForCausalLM(tf.Qwen2Config(**{**_SMALL, **kw}))


def mistral(**kw) -> torch.nn.Module:
    return tf.MistralForCausalLM(tf.MistralConfig(**{**_SMALL, "sliding_window": None, **kw}))


def gpt2(**kw) -> torch.nn.Module:
    cfg = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=64, use_cache=False,
               resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return tf.GPT2LMHeadModel(tf.GPT2Config(**{**cfg, **kw}))


def loss(output, labels: torch.Tensor) -> torch.Tensor:
    logits = output.logits[:, :-1, :]  # position t predicts token t + 1
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1))
