"""The estimate of a model of N identical blocks runs its local model cut to a few blocks and extrapolates
(planlang.model.capture.fold_step, issue #29): every figure must be the whole model's. Each plan is
estimated folded and unfolded (fold_step.ENABLED off) and compared field for field: the rows, the raw
simulated step (StepMemory) and profile, the parameters that train, and estimate_steps' inputs."""
from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("transformers", reason="the zoo's Hugging Face models need transformers")

from planlang.model.capture import fold_step  # noqa: E402
from planlang.model.price import estimate as E  # noqa: E402
from planlang.plan.checker import check_text  # noqa: E402
from planlang.plan.complete import complete  # noqa: E402

# name -> (factory call, input, the blocks' selector)
MODELS = {
    "llama": ('"examples.zoo.causal_lm:llama"(num_hidden_layers = 7)', "input_ids", "model.layers"),
    # Qwen2 without a sliding window (its layers are then all alike)
    "qwen2": ('"examples.zoo.causal_lm:qwen2"(num_hidden_layers = 6)', "input_ids", "model.layers"),
    "mistral": ('"examples.zoo.causal_lm:mistral"(num_hidden_layers = 8)', "input_ids", "model.layers"),
    "gpt2": ('"examples.gpt2.model:build"(layers = 6, hidden = 64, heads = 4, vocab = 128, seq = 32)', "idx", "h"),
}
TP = {
    "llama": """use patterns.megatron
for layer in model.layers[*] {
    apply megatron.llama_attention(tp) to layer.self_attn
    apply megatron.llama_mlp(tp) to layer.mlp
}""",
    "gpt2": """use patterns.megatron
for block in h[*] {
    apply megatron.attention(tp) to block.attn
    apply megatron.mlp(tp) to block.mlp
}""",
}
TP["mistral"] = TP["llama"]
TP["qwen2"] = TP["llama"][:-2] + """
    shard layer.self_attn.q_proj.bias : [tp]
    shard layer.self_attn.k_proj.bias : [tp]
    shard layer.self_attn.v_proj.bias : [tp]
}"""


def plan_of(model: str, layout: str, extra: str = ""):
    factory, inp, blocks = MODELS[model]
    mesh, opt, rest = "    dp = 4 over hardware.loopback", "", ""
    if layout == "dptp":
        mesh = "    dp = 2 over hardware.loopback\n    tp = 2 over hardware.loopback"
        rest = TP[model]
    elif layout == "zero3":  # every block checkpointed on its own (GPT-2's blocks would chain: `every 1`)
        opt = "{\n    zero = 3 over dp\n    precision = bf16\n}"
        rest = f"checkpoint {blocks}[*]" + (" every 1" if model == "gpt2" else "")
    elif layout == "accumulate":
        rest = "microbatches 2"
    text = f"""use hardware
model m = {factory}
input {inp} : i64[batch = 16, seq = 16]
mesh cluster of 4 x hardware.cpu {{
{mesh}
}}
optimizer adamw(lr = 1e-3) {opt}
data {inp} : [dp, _]
{rest}
{extra}"""
    res = check_text(text, path="tests/model/fold.plan")
    assert [d for d in res.diagnostics if d.severity.value == "error"] == [], res.diagnostics
    return complete(res.plan)


def run(plan, folded: bool, monkeypatch) -> tuple:
    """The estimate's rows, its local model's (step, profile, trained, notes), estimate_steps' inputs,
    and how the local model ran (fold_step.LOG). Models of 6 to 8 blocks fold here (they run whole by
    default: as fast)."""
    monkeypatch.setattr(fold_step, "ENABLED", folded)
    monkeypatch.setattr(fold_step, "FOLD_FROM", 6)
    fold_step.LOG.clear()
    got = []
    real = E._simulate_local

    def spy(*a, **k):
        got.append(real(*a, **k))
        return got[-1]

    monkeypatch.setattr(E, "_simulate_local", spy)
    rows = [r.as_dict() for r in E.estimate_plan(plan, cache={})]
    steps = E.estimate_steps(plan, cache={})
    return rows, got[0], steps, list(fold_step.LOG)


def assert_same(plan, monkeypatch) -> list:
    rows, (sim, prof, trained, notes), steps, log = run(plan, True, monkeypatch)
    rows0, (sim0, prof0, trained0, notes0), steps0, log0 = run(plan, False, monkeypatch)
    assert log0 == []
    for f in dataclasses.fields(sim0):
        assert getattr(sim, f.name) == getattr(sim0, f.name), f.name
    assert list(prof.modules) == list(prof0.modules)  # execution order
    for name, m in prof0.modules.items():
        assert prof.modules[name] == m, name
    assert prof == prof0
    assert (trained, notes) == (trained0, notes0)
    assert steps == steps0
    assert rows == rows0
    return log


# every model under two layouts and every layout on two models (all 16 pairs passed when written; each
# runs the model whole and folded, ~7 CPU-s, so the suite keeps a covering half)
PAIRS = [("llama", "dp"), ("llama", "zero3"), ("qwen2", "dptp"), ("qwen2", "accumulate"),
         ("mistral", "zero3"), ("mistral", "dptp"), ("gpt2", "dp"), ("gpt2", "accumulate")]


@pytest.mark.parametrize("model, layout", PAIRS)
def test_folded_estimate_is_the_whole_models(model, layout, monkeypatch):
    plan = plan_of(model, layout)
    log = assert_same(plan, monkeypatch)
    # estimate_plan's local model and estimate_steps' profile both ran folded
    count = {"llama": 7, "qwen2": 6, "mistral": 8, "gpt2": 6}[model]
    assert len(log) == 2 and all(fold is not None and fold.count == count for fold, _ in log), log


def test_a_block_treated_differently_is_not_folded(monkeypatch):
    plan = plan_of("llama", "dp", "checkpoint model.layers[3]")
    log = assert_same(plan, monkeypatch)
    assert log and all(fold is None and "model.layers.3 unlike model.layers.0" in why for fold, why in log), log


def test_a_chain_over_every_block_is_not_folded(monkeypatch):
    # GPT-2's blocks take one tensor: `checkpoint h[*]` recomputes them all as one checkpoint
    plan = plan_of("gpt2", "dp", "checkpoint h[*]")
    log = assert_same(plan, monkeypatch)
    assert log and all(fold is None and why == "a checkpoint group spans blocks" for fold, why in log), log


def test_a_small_model_runs_whole_by_default(monkeypatch):
    plan = plan_of("qwen2", "dp")
    monkeypatch.setattr(E, "_simulate_local", E._simulate_local)
    fold_step.LOG.clear()
    E.estimate_plan(plan, cache={})
    assert [why for _, why in fold_step.LOG] == [f"model.layers x6: fewer than {fold_step.FOLD_FROM} blocks run "
                                                 "whole (as fast)"]


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(32, 32)

    def forward(self, x, wide: bool = False):
        y = self.lin(x)
        return torch.cat([y, y], -1)[..., :32] * y if wide else y.relu()


class _Alternating(torch.nn.Module):
    """Identical blocks the root code runs differently by their index (every even one wide): a model the
    runs of 3 and 4 blocks cannot speak for."""

    def __init__(self, n: int = 8):
        super().__init__()
        self.blocks = torch.nn.ModuleList(_Block() for _ in range(n))

    def forward(self, x):
        for i, b in enumerate(self.blocks):
            x = b(x, wide=i % 2 == 0)
        return x


def test_blocks_run_unalike_are_not_extrapolated():
    from planlang.model.capture.fold import FoldError, find_fold
    from planlang.model.capture.fold_step import run_folded

    model = _Alternating().to("meta")
    fold = find_fold(model)
    assert fold is not None and fold.count == 8
    x = {"x": torch.zeros(4, 32, device="meta", requires_grad=True)}
    for what in ({"simulate": True, "profile": False}, {"simulate": False, "profile": True}):
        with pytest.raises(FoldError, match="interior blocks|measured differently"):
            run_folded(model, fold, x, None, **what, blocks=tuple(fold.block(i) for i in range(8)))


def test_a_model_holding_on_to_its_blocks_is_not_extrapolated():
    # one checkpoint over every block (wrap_chain): block 0's forward runs all of them, cut model or not
    from examples.gpt2.model import build
    from planlang.model.capture.fold import FoldError, find_fold
    from planlang.model.capture.fold_step import run_folded
    from planlang.model.program.recompute import wrap_chain

    model = build(layers=6, hidden=64, heads=4, vocab=128, seq=32).to("meta")
    wrap_chain(list(model.h))
    fold = find_fold(model)
    assert fold is not None and fold.count == 6
    with pytest.raises(FoldError, match="left out ran"):
        run_folded(model, fold, {"idx": torch.zeros(2, 16, dtype=torch.long, device="meta")}, None,
                   simulate=True, profile=False)
