"""A checkpoint group of several HF decoder layers is estimated module by module, not as a chain: each
layer is called with keyword arguments (attention_mask, position embeddings; Gemma2's differ from layer to
layer), which a chain's single-tensor call would drop. The estimate raised "unexpected keyword argument
'attention_mask'" (PL369 on `checkpoint model.layers[*] every 3`; found by bench/mutants.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the zoo's Hugging Face models need transformers")

from planlang.lang.diagnostics import Severity  # noqa: E402
from planlang.model.validation import check_with_model  # noqa: E402
from tests.zoo.plans import plan_text  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_layers_called_with_keywords_are_recorded_so():
    import torch

    from examples.zoo.causal_lm import mistral
    from planlang.model.capture.trace import probe_modules

    facts = probe_modules(mistral().to("meta"), {"input_ids": torch.zeros(2, 16, dtype=torch.long, device="meta")})
    assert "attention_mask" in facts.calls["model.layers.0"].keywords
    assert facts.calls["lm_head"].keywords == ()


@pytest.mark.parametrize("model", ["mistral", "gpt2"])
def test_a_group_of_decoder_layers_is_estimated(tmp_path, model, monkeypatch):
    monkeypatch.chdir(ROOT)
    blocks = "model.layers" if model == "mistral" else "transformer.h"
    plan = tmp_path / f"{model}.plan"
    plan.write_text(plan_text(model, "dp4") + f"checkpoint {blocks}[*] every 2\n")
    res = check_with_model(str(plan))
    assert [d.code for d in res.diagnostics if d.severity is Severity.ERROR] == []
