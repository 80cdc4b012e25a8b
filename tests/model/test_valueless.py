"""Running a model without values (planlang.model.capture.valueless): plain meta when the model reads no
value, meta as a trace when its code asks `torch.compiler.is_compiling()` before it reads one (Hugging
Face's mask creation), fake tensors only for code that asks whether a tensor is fake. Reference for the
traced runs' figures: the same model run for real on the CPU under the same live-bytes tracker."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from planlang.model.capture import valueless
from planlang.model.capture.load import build_model
from planlang.model.facts import probe_facts
from planlang.plan.resolve import Resolver
from planlang.model.capture.simulate import simulate_step
from planlang.model.capture.trace import record_run


class Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)

    def forward(self, x):
        return self.a(x).sum()


class ReadsUnlessTraced(Plain):
    """Reads a value outside a trace, as Hugging Face's packed-sequence check does."""

    def forward(self, x):
        if not torch.compiler.is_compiling() and bool((x[:, -1] == 0).all()):
            x = x + 1
        return super().forward(x)


class ReadsUnlessFake(Plain):
    """Reads a value unless its tensor is fake."""

    def forward(self, x):
        last = x[:, -1] == 0
        if not isinstance(last, FakeTensor) and bool(last.all()):
            x = x + 1
        return super().forward(x)


@pytest.mark.parametrize("cls, how", [(Plain, "meta"), (ReadsUnlessTraced, "traced"), (ReadsUnlessFake, "fake")])
def test_a_model_runs_in_the_first_way_that_reads_no_value(cls, how):
    with torch.device("meta"):
        model, x = cls(), torch.zeros(4, 8)
    run = record_run(model, {"x": x})
    assert run.how == how
    assert run.order == ["a"] and run.calls["a"].output == (4, 8)
    assert torch.compiler.is_compiling() is False  # the flag is as it was after the run


def test_the_trace_flag_is_restored_when_the_run_raises():
    def fails():
        if not torch.compiler.is_compiling():
            torch.empty(1, device="meta").item()  # reads a value: tried again as a trace
        raise ValueError("the model's own error")

    with pytest.raises(ValueError, match="own error"):
        valueless.run_without_values(fails)
    assert torch.compiler.is_compiling() is False


def test_an_error_that_is_no_value_read_is_not_retried():
    tries = []

    def fails():
        tries.append(1)
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        valueless.run_without_values(fails)
    assert tries == [1]


def _step_figures(model, inputs):
    s = simulate_step(model, inputs)
    return s.saved, s.forward_peak, s.backward_peak


@pytest.mark.parametrize("name", ["bart", "bert", "t5"])
def test_hf_models_simulated_as_a_trace_hold_what_the_cpu_run_holds(name, monkeypatch):
    """The traced run takes the paths the eager run takes where they are shape-only. (BART under fake
    tensors kept a decoder mask the CPU run does not make: 16 KiB more in each figure.)"""
    pytest.importorskip("transformers")
    from examples.zoo import masked_lm, seq2seq  # lazy: the zoo's factories import transformers

    build = {"bart": seq2seq.bart, "bert": masked_lm.bert, "t5": seq2seq.t5}[name]
    torch.manual_seed(0)
    model = build()
    ids = torch.randint(3, 100, (8, 16))
    inputs = {"input_ids": ids} if name == "bert" else {"input_ids": ids, "decoder_input_ids": ids}
    real = _step_figures(model, inputs)
    on_meta = copy.deepcopy(model).to("meta")
    meta_inputs = {k: v.to("meta") for k, v in inputs.items()}
    how = []
    orig = valueless.run_without_values

    def spy(fn):
        out = orig(fn)
        how.append(out[1])
        return out

    monkeypatch.setattr(valueless, "run_without_values", spy)
    assert _step_figures(on_meta, meta_inputs) == real
    assert how and set(how) <= {"meta", "traced"}


_READS = '''import torch
from torch import nn


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 16)

    def forward(self, x):
        if {guard}x.sum() > 0:
            x = x * 2
        return self.a(x)


def build():
    return M()
'''


@pytest.mark.parametrize("guarded", [False, True], ids=["reads", "guarded"])
def test_a_model_that_reads_a_value_is_told_where_and_how_to_fix_it(tmp_path, guarded):
    """A read in every way the model runs without values is PL261 naming the user's line; the guard its
    help suggests makes the same model check."""
    name = f"reads_{'guarded' if guarded else 'plain'}"
    (tmp_path / f"{name}.py").write_text(_READS.format(guard="not torch.compiler.is_compiling() and " if guarded
                                                       else ""))
    text = f'model m = "{name}:build"()\ninput x : f32[batch = 8, d = 16]\n'
    plan = Resolver().resolve_text(text, str(tmp_path / "reads.plan")).plan
    facts, diags = probe_facts(plan, build_model(plan.model, plan.path))
    if guarded:
        assert facts is not None and diags == []
        return
    assert facts is None and [d.code for d in diags] == ["PL261"]
    assert f"{name}.py:11: `if x.sum() > 0:`" in diags[0].message
    assert "is_compiling()" in (diags[0].help or "")


_LOSS_READS = '''import torch
import torch.nn.functional as F
from torch import nn


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 4)

    def forward(self, x):
        return self.a(x)


def build():
    return M()


def loss(out, y):
    if {guard}(y >= 4).any():
        raise ValueError("labels past the classes")
    return F.cross_entropy(out, y)
'''


@pytest.mark.parametrize("guarded", [False, True], ids=["reads", "guarded"])
def test_a_loss_that_reads_a_value_is_told_where_and_how_to_fix_it(tmp_path, guarded):
    """A loss that checks its targets' values fits no target planlang makes: PL369 says it reads a value and
    where (not that no target has the right shape); the guard its help suggests makes the plan check."""
    from planlang.model.validation import check_with_model  # lazy: the whole validation, for this test only

    name = f"loss_reads_{'guarded' if guarded else 'plain'}"
    (tmp_path / f"{name}.py").write_text(_LOSS_READS.format(
        guard="not torch.compiler.is_compiling() and " if guarded else ""))
    text = (f'use hardware\nmodel m = "{name}:build"()\ninput x : f32[batch = 8, d = 16]\n'
            "mesh m of 2 x hardware.cpu { dp = 2 over hardware.loopback }\nbudget 1 GiB per device\n"
            "data x : [dp, _]\n")
    path = tmp_path / "loss.plan"
    path.write_text(text)
    res = check_with_model(str(path), text=text)
    errors = [d for d in res.diagnostics if d.severity.name.lower() == "error"]
    if guarded:
        assert errors == []
        return
    assert [d.code for d in errors] == ["PL369"]
    assert "reads a tensor's value (" in errors[0].message
    assert f"{name}.py:20: `if (y >= 4).any():`)" in errors[0].message
    assert "is_compiling()" in (errors[0].help or "")
