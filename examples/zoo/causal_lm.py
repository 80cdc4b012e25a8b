"""Hugging Face decoder-only language models from small configs: Llama, Qwen2 (grouped-query attention),
Mistral, GPT-2, Falcon (multi-query attention: one k/v head), GPT-J (interleaved rotary: x[..., ::2],
stack, flatten), Gemma2 (type_as, softmax in float32, logit soft-capping) and Phi (partial rotary).
`loss` is next-token cross-entropy on the logits."""
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


# the architectures added for issue 27: hidden 64 and 4 heads (head dim 16: with hidden 32 it would be 8,
# the batch size the zoo's tests recognise the batch by), vocab 128, no dropout, no cache
_TINY = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, vocab_size=128,
             max_position_embeddings=64, use_cache=False)


def falcon(**kw) -> torch.nn.Module:
    # multi-query attention (one k/v head broadcast over the query heads), sequential attention + MLP
    cfg = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=128, multi_query=True,
               new_decoder_architecture=False, parallel_attn=False, bias=False, alibi=False, use_cache=False,
               hidden_dropout=0.0, attention_dropout=0.0, max_position_embeddings=64)
    return tf.FalconForCausalLM(tf.FalconConfig(**{**cfg, **kw}))


def gptj(**kw) -> torch.nn.Module:
    # rotary over the first 16 dims of each head, rotated pairwise (x[..., ::2], x[..., 1::2], stack)
    cfg = dict(n_layer=2, n_embd=64, n_head=4, rotary_dim=16, vocab_size=128, n_positions=64, use_cache=False,
               resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return tf.GPTJForCausalLM(tf.GPTJConfig(**{**cfg, **kw}))


def gemma2(**kw) -> torch.nn.Module:
    cfg = dict(_TINY, num_key_value_heads=2, head_dim=16, sliding_window=64, attention_dropout=0.0,
               pad_token_id=0, bos_token_id=0, eos_token_id=0)
    return tf.Gemma2ForCausalLM(tf.Gemma2Config(**{**cfg, **kw}))


def phi(**kw) -> torch.nn.Module:
    cfg = dict(_TINY, partial_rotary_factor=0.5, resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0,
               pad_token_id=0, bos_token_id=0, eos_token_id=0)
    return tf.PhiForCausalLM(tf.PhiConfig(**{**cfg, **kw}))


def loss(output, labels: torch.Tensor) -> torch.Tensor:
    logits = output.logits[:, :-1, :]  # position t predicts token t + 1
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1))
