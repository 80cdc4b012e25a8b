"""The module probe of a model's repeated blocks run as a few (planlang.model.capture.fold_probe) finds what
the whole model's run finds: ModuleFacts field by field, the loss check's targets and diagnostics, on
Hugging Face Llama, Qwen2, Mistral, GPT-2, BERT and T5 configurations and the bundled GPT-2, BERT and T5
on meta; a model whose forward does not run its block list entry by entry, or whose output depends on the
number of blocks, is probed whole, and says why."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from planlang.model.capture import load, trace
from planlang.model.capture.fold import Fold
from planlang.model.capture.load import build_model, guess_targets, meta_inputs, plan_loss
from planlang.model.capture.trace import probe_run
from planlang.model.capture.valueless import context
from planlang.model.facts import StrictMeta, probe_facts
from planlang.plan.resolve import Resolver

HF_IDS = "input input_ids : i64[batch = 2, seq = 16]"
HF_T5 = HF_IDS + "\ninput decoder_input_ids : i64[batch = 2, seq = 8]"

# name -> (factory and arguments, inputs, the blocks that fold (None: the model runs whole))
MODELS = {
    "llama": ('"examples.zoo.causal_lm:llama"(num_hidden_layers = 7)', HF_IDS, Fold("model.layers", 7)),
    "qwen2": ('"examples.zoo.causal_lm:qwen2"(num_hidden_layers = 8)', HF_IDS, Fold("model.layers", 8)),
    # sliding-window attention in layers 4 .. 7 only, and Gemma2's alternate sliding and global layers: the
    # layers differ, nothing folds
    "qwen2_sliding": ('"examples.zoo.causal_lm:qwen2"(num_hidden_layers = 8, use_sliding_window = true, '
                      'sliding_window = 8, max_window_layers = 4)', HF_IDS, None),
    "gemma2": ('"examples.zoo.causal_lm:gemma2"(num_hidden_layers = 6)', HF_IDS, None),
    "mistral": ('"examples.zoo.causal_lm:mistral"(num_hidden_layers = 6)', HF_IDS, Fold("model.layers", 6)),
    "hf_gpt2": ('"examples.zoo.causal_lm:gpt2"(n_layer = 7)', HF_IDS, Fold("transformer.h", 7)),
    "hf_bert": ('"examples.zoo.masked_lm:bert"(num_hidden_layers = 6)', HF_IDS, Fold("bert.encoder.layer", 6)),
    # block 0 of each stack holds the relative position bias: no list of identical blocks
    "hf_t5": ('"examples.zoo.seq2seq:t5"(num_layers = 6, num_decoder_layers = 8)', HF_T5, None),
    "gpt2": ('"examples.gpt2.model:build"(layers = 8, hidden = 64, heads = 4, vocab = 256, seq = 64)',
             "input idx : i64[batch = 2, seq = 16]", Fold("h", 8)),
    "bert": ('"examples.bert.model:build"(layers = 6, hidden = 64, heads = 4, intermediate = 128, vocab = 256, '
             'seq = 64)', HF_IDS, Fold("encoder.layer", 6)),
    # an encoder and a decoder of 7 blocks each: the first list of the largest size folds, the other runs whole
    "t5": ('"examples.t5.model:build"(layers = 7, d_model = 64, heads = 4, d_ff = 128, vocab = 256)',
           HF_T5, Fold("encoder.block", 7)),
}


def _plan(tmp_path, factory: str, inputs: str):
    text = f"model m = {factory}\n{inputs}\n"
    return Resolver().resolve_text(text, str(tmp_path / "fold.plan")).plan


def _probed(plan, fold: bool):
    module = build_model(plan.model, plan.path)
    with StrictMeta():
        return probe_run(module, meta_inputs(plan.inputs), fold)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_folded_probe_is_the_whole_probe(tmp_path, name):
    pytest.importorskip("transformers")
    factory, inputs, blocks = MODELS[name]
    plan = _plan(tmp_path, factory, inputs)
    folded, run = _probed(plan, True)
    whole, whole_run = _probed(plan, False)
    assert run.fold == blocks, run.whole
    assert run.whole == ("" if blocks else "no list of identical blocks")
    assert whole_run.fold is None
    for f in dataclasses.fields(whole):
        assert getattr(folded, f.name) == getattr(whole, f.name), f.name
    assert list(folded.calls) == folded.order == whole.order
    if blocks is not None:  # the run returned is the cut one; its output is the whole model's, shape for shape
        assert len(run.order) < len(whole_run.order)
        out, full = (torch.utils._pytree.tree_flatten(r.output)[0] for r in (run, whole_run))
        assert [(t.shape, t.dtype) for t in out] == [(t.shape, t.dtype) for t in full]


def _unfolded(monkeypatch):
    monkeypatch.setattr(trace, "folded_run", lambda module, inputs, record: (None, "off"))


@pytest.mark.parametrize("name", ["llama", "hf_bert", "gpt2", "t5", "hf_t5"])
def test_loss_facts_are_the_whole_models(tmp_path, name, monkeypatch):
    """probe_facts (the probe, the targets guessed for the loss, the loss under StrictMeta) folded and not."""
    pytest.importorskip("transformers")
    factory, inputs, _ = MODELS[name]
    plan = _plan(tmp_path, factory, inputs)
    got = []
    for fold in (True, False):
        if not fold:
            _unfolded(monkeypatch)
        module = build_model(plan.model, plan.path)
        facts, diags = probe_facts(plan, module)
        ins = meta_inputs(plan.inputs)
        targets = guess_targets(module, plan_loss(plan, module), ins)  # kept from the check: not run again
        got.append((facts, diags, [(t.shape, t.dtype) for t in targets or ()]))
    assert got[0] == got[1]
    assert got[0][0] is not None and got[0][2]


def test_a_loss_strict_meta_refuses_is_refused_alike(tmp_path, monkeypatch):
    """An int32 token input: the loss's class indices are int32 (PL261), folded or not."""
    pytest.importorskip("transformers")
    factory, _, _ = MODELS["llama"]
    plan = _plan(tmp_path, factory, "input input_ids : i32[batch = 2, seq = 16]")
    folded = probe_facts(plan, build_model(plan.model, plan.path))
    _unfolded(monkeypatch)
    whole = probe_facts(plan, build_model(plan.model, plan.path))
    assert folded == whole
    assert [d.code for d in folded[1]] == ["PL261"] and "int32" in folded[1][0].message


def test_the_guess_on_the_cut_model_is_kept_for_the_whole(tmp_path):
    """guess_targets with a fold runs the cut model once; asked again without it, the answer is kept."""
    pytest.importorskip("transformers")
    factory, inputs, blocks = MODELS["llama"]
    plan = _plan(tmp_path, factory, inputs)
    module = build_model(plan.model, plan.path)
    loss, ins = plan_loss(plan, module), meta_inputs(plan.inputs)
    cut = guess_targets(module, loss, ins, blocks)
    assert len(load._TARGETS[module]) == 1
    assert [t.shape for t in guess_targets(module, loss, ins) or ()] == [t.shape for t in cut or ()]
    other = build_model(plan.model, plan.path)
    assert [t.shape for t in guess_targets(other, loss, ins) or ()] == [t.shape for t in cut or ()]


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_the_guess_on_the_probes_output_is_the_guess_by_a_forward(tmp_path, name):
    """guess_targets on the output of the probe's run (a trace: these models read a value) finds the
    targets its own forward of the cut model finds, without running it."""
    pytest.importorskip("transformers")
    factory, inputs, _ = MODELS[name]
    plan = _plan(tmp_path, factory, inputs)
    ins = meta_inputs(plan.inputs)
    module = build_model(plan.model, plan.path)
    _, run = probe_run(module, ins)
    assert run.how == "traced"  # they read a value on plain meta; a trace is enough
    loss = plan_loss(plan, module)
    calls = []
    forward = module.forward
    module.forward = lambda *a, **k: calls.append(1) or forward(*a, **k)
    reused = guess_targets(module, loss, ins, run.fold, run.output, context(run.how))
    assert calls == []
    other = build_model(plan.model, plan.path)
    ran = guess_targets(other, plan_loss(plan, other), ins, run.fold)
    assert reused is not None and [(t.shape, t.dtype) for t in reused] == [(t.shape, t.dtype) for t in ran or ()]


# ------------------------------------------------------------------ models that do not fold
class Block(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return torch.relu(self.fc(x))


class Stack(nn.Module):
    """Six identical blocks; `how` says which the forward runs."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how
        self.embed = nn.Linear(4, 8)
        self.layers = nn.ModuleList(Block() for _ in range(6))
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        x = self.embed(x)
        if self.how == "first twice":
            x = self.layers[0](self.layers[0](x))
        elif self.how == "skip one":
            x = x + 0
            for i, layer in enumerate(self.layers):
                if i != 2:
                    x = layer(x)
        elif self.how == "counts":  # a forward that cannot run cut
            assert len(self.layers) == 6, "six layers"
            for layer in self.layers:
                x = layer(x)
        elif self.how == "stacked":  # the head sees every block's output: its shape follows the count
            outs = []
            for layer in self.layers:
                x = layer(x)
                outs.append(x)
            return self.head(torch.stack(outs, dim=1))
        else:
            for layer in self.layers:
                x = layer(x)
        return self.head(x)


class SharedNorm(Stack):
    """Every block holds the one norm module."""

    def __init__(self):
        super().__init__("all")
        norm = nn.LayerNorm(8)
        for layer in self.layers:
            layer.norm = norm


def stack(how: str = "all") -> nn.Module:
    return SharedNorm() if how == "shared" else Stack(how)


def loss(output, target):
    return F.cross_entropy(output.flatten(0, -2), target.flatten())


@pytest.mark.parametrize("how,why", [("all", None), ("first twice", "does not run its block list"),
                                     ("skip one", "does not run its block list"),
                                     ("stacked", "expand differently"), ("shared", "a module shared with a block"),
                                     ("counts", "raised AssertionError: six layers")])
def test_a_model_that_does_not_run_its_blocks_alike_is_probed_whole(tmp_path, how, why):
    plan = _plan(tmp_path, f'"tests.model.test_fold_probe:stack"(how = "{how}")', "input x : f32[batch = 2, n = 4, d = 4]")
    folded, run = _probed(plan, True)
    whole, _ = _probed(plan, False)
    assert folded == whole
    if why is None:
        assert run.fold == Fold("layers", 6)
    else:
        assert run.fold is None and why in run.whole
    if how == "first twice":
        assert folded.order == ["embed", "layers.0", "layers.0.fc", "head"]
    if how == "skip one":
        assert "layers.2" not in folded.order and "layers.5.fc" in folded.order
    assert probe_facts(plan, build_model(plan.model, plan.path))[1] == []


def test_a_model_off_meta_runs_whole():
    module = Stack("all")
    facts, run = probe_run(module, {"x": torch.zeros(2, 4)})
    assert run.fold is None and run.whole == "not on meta"
    assert len([n for n in facts.order if n.startswith("layers.") and n.count(".") == 1]) == 6


def test_a_forward_strict_meta_refuses_is_refused_alike(tmp_path, monkeypatch):
    """f64 inputs into f32 weights: the cut run raises, the whole run says so (PL261), as unfolded."""
    plan = _plan(tmp_path, '"tests.model.test_fold_probe:stack"()', "input x : f64[batch = 2, n = 4, d = 4]")
    folded = probe_facts(plan, build_model(plan.model, plan.path))
    _unfolded(monkeypatch)
    whole = probe_facts(plan, build_model(plan.model, plan.path))
    assert folded == whole
    assert [d.code for d in folded[1]] == ["PL261"] and "float64" in folded[1][0].message
