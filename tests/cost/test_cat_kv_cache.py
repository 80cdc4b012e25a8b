"""A Hugging Face Llama built with its default `use_cache=True` concatenates an empty key/value cache
(shape [0]) with each layer's keys and values. torch.cat skips such an input; so does cat's sharding rule
(planlang/cost/ops/rules.py): the plan checks clean and lowers, where it was PL369 `cat([0], [8, 2, 16, 16])`.
(`planlang verify` of this plan under dp2 x tp2 on 4 gloo ranks matched one process to 4e-7.)"""
from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="the Llama is Hugging Face's")

from planlang.model.validation import validate_file  # noqa: E402
from tests.zoo.plans import plan_text  # noqa: E402


def test_llama_with_its_key_value_cache_checks_clean_and_lowers(tmp_path):
    factory = '"examples.zoo.causal_lm:llama"'
    text = plan_text("llama", "dp2tp2")
    assert f"{factory}()" in text
    text = text.replace(f"{factory}()", f"{factory}(use_cache = true)")
    path = tmp_path / "llama_cache.plan"
    path.write_text(text)
    res = validate_file(str(path))
    assert [str(d) for d in res.diagnostics] == []
    assert res.program is not None
    cats = [n.op for n in res.program.graph.nodes if n.op.kind == "cat" and (0,) in n.op.inputs]
    assert len(cats) == 4  # keys and values, in each of the two layers
    assert all(len(op.inputs) == 2 and op.output[-2] == 16 for op in cats)  # the cache, then 16 positions
