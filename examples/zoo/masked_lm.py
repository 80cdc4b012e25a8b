"""Hugging Face encoders from small configs: BERT and DistilBERT with their masked-language-model heads. `loss` is
cross-entropy of every position's logits against its label."""
from __future__ import annotations

import torch
import torch.nn.functional as F
import transformers as tf


def bert(**kw) -> torch.nn.Module:
    cfg = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, vocab_size=256,
               max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return tf.BertForMaskedLM(tf.BertConfig(**{**cfg, **kw}))


def distilbert(**kw) -> torch.nn.Module:
    cfg = dict(n_layers=2, dim=64, hidden_dim=128, n_heads=4, vocab_size=128, max_position_embeddings=64,
               dropout=0.0, attention_dropout=0.0, pad_token_id=0)
    return tf.DistilBertForMaskedLM(tf.DistilBertConfig(**{**cfg, **kw}))



def loss(output, labels: torch.Tensor) -> torch.Tensor:
    logits = output.logits
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1))
