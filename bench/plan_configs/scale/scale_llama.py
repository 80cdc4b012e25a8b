"""Hugging Face Llama at the shapes bench/scale.py plans (issue #29): Llama-3-8B and Llama-3-70B."""
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM


def build(layers: int = 32, hidden: int = 4096, intermediate: int = 14336, heads: int = 32, kv_heads: int = 8,
          vocab: int = 128256, positions: int = 8192):
    return LlamaForCausalLM(LlamaConfig(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                                        num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab,
                                        max_position_embeddings=positions, use_cache=False))


def loss(output, input_ids):
    return F.cross_entropy(output.logits[:, :-1].flatten(0, 1), input_ids[:, 1:].flatten())
