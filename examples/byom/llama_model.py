"""A Hugging Face Llama built from a config (no download): the factory and loss of docs/byom.md."""
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM


def build(layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int = 2, vocab: int = 256,
          seq: int = 64) -> torch.nn.Module:
    """The factory: keyword arguments from the plan's `model` line, a fresh model on every call."""
    config = LlamaConfig(
        num_hidden_layers=layers, hidden_size=hidden, intermediate_size=4 * hidden,
        num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab,
        max_position_embeddings=seq, use_cache=False, attention_dropout=0.0,
    )
    return LlamaForCausalLM(config)


def loss(output, labels: torch.Tensor) -> torch.Tensor:
    """The loss: the model's output and the targets, in the order the training step passes them."""
    logits = output.logits[:, :-1, :]  # position t predicts token t + 1
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1))
