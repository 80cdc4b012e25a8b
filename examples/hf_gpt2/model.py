"""GPT-2 from Hugging Face ``transformers`` (``GPT2LMHeadModel``), built from a config: no download.

Needs the optional ``transformers`` package: ``pip install -e .[hf]`` (or ``pip install
transformers``). The import is lazy, inside :func:`build`, so this module imports without it.

Unlike :mod:`examples.gpt2.model`, HF's module names carry a ``transformer.`` prefix:
``transformer.wte``, ``transformer.wpe``, ``transformer.drop``, ``transformer.h[i]`` (``ln_1``,
``attn.c_attn``, ``attn.c_proj``, ``ln_2``, ``mlp.c_fc``, ``mlp.act``, ``mlp.c_proj``),
``transformer.ln_f`` and ``lm_head``, which HF ties to ``transformer.wte.weight`` (one parameter,
124,439,808 in all for the defaults, GPT-2 small). Dropouts are 0 and ``use_cache=False``.

Input ``input_ids``: int64 ``[batch, seq]``; the forward returns HF's ``CausalLMOutput...`` whose
``.logits`` is ``[batch, seq, vocab]``. HF models do not trace with plain
``torch.fx.symbolic_trace``; use ``torch.export`` (or ``transformers.utils.fx`` in transformers 4).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def build(
    layers: int = 12,
    hidden: int = 768,
    heads: int = 12,
    vocab: int = 50257,
    seq: int = 1024,
) -> nn.Module:
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "examples.hf_gpt2 needs the optional `transformers` package: "
            "run `pip install -e .[hf]` (or `pip install transformers`)"
        ) from e
    config = GPT2Config(
        n_layer=layers,
        n_embd=hidden,
        n_head=heads,
        vocab_size=vocab,
        n_positions=seq,
        use_cache=False,
        attn_pdrop=0.0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        # GPT-2's <|endoftext|> is token 50256; keep it inside smaller test vocabularies
        bos_token_id=min(50256, vocab - 1),
        eos_token_id=min(50256, vocab - 1),
    )
    return GPT2LMHeadModel(config)


def example_inputs(batch: int = 2, seq: int = 1024, vocab: int = 50257) -> tuple[torch.Tensor]:
    return (torch.randint(0, vocab, (batch, seq), dtype=torch.int64),)


def loss(output, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy, as HF computes it when given ``labels`` (usually the input ids):
    position ``t`` is scored against ``labels[:, t + 1]``; label ``-100`` is ignored. ``output``
    is the model's output object (its ``.logits`` is used) or a logits tensor."""
    logits = output.logits if hasattr(output, "logits") else output
    shifted = logits[:, :-1, :]
    return F.cross_entropy(
        shifted.reshape(-1, shifted.size(-1)), labels[:, 1:].reshape(-1), ignore_index=-100
    )
