"""A Hugging Face vision transformer from a small config: ViT with its classification head. `loss` is
cross-entropy of the logits against class labels."""
from __future__ import annotations

import torch
import torch.nn.functional as F
import transformers as tf
from torch import nn


def vit(**kw) -> nn.Module:
    cfg = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, image_size=32,
               patch_size=8, num_labels=10, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return tf.ViTForImageClassification(tf.ViTConfig(**{**cfg, **kw}))


def loss(output, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(output.logits, labels)
