"""Hugging Face vision models from small configs: ViT and ConvNeXt with their classification heads. `loss` is
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


def convnext(**kw) -> nn.Module:
    # two stages of one block each (depthwise 7x7 conv, LayerNorm over channels, MLP, layer scale)
    cfg = dict(num_channels=3, patch_size=4, num_stages=2, hidden_sizes=[32, 64], depths=[1, 1], num_labels=10,
               image_size=32, drop_path_rate=0.0)
    return tf.ConvNextForImageClassification(tf.ConvNextConfig(**{**cfg, **kw}))


def loss(output, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(output.logits, labels)
