"""One validation (planlang.model.validation), for every command and the editor: the language server,
`report` and `check --model` give the same diagnostics for the same plan (the zoo's plans, the mutation
suite's seeds and some of its mutants; `report` for those without errors, which it refuses), and `check --model`, `estimate` and `solve` run the model's factory once and
lower each program once."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from typer.testing import CliRunner  # noqa: E402

from bench.mutants import generate, seeds  # noqa: E402
from planlang.cli import app  # noqa: E402
from planlang.lsp.model_checks import ModelChecker  # noqa: E402
from planlang.model.capture import load  # noqa: E402
from planlang.model.program import lowering  # noqa: E402
from planlang.model.validation import check_with_model  # noqa: E402
from planlang.report.build import ReportError, build_report_data  # noqa: E402
from tests.zoo.plans import plan_text  # noqa: E402


def _seen(diags) -> list[tuple]:
    return sorted((d.code, d.span.line, d.span.col, d.message) for d in diags)


ZOO_CASES = [("llama", "dp4"), ("llama", "dp2tp2"), ("llama", "pp2dp2"), ("llama", "pp2tp2"), ("gpt2", "pp2dp2"),
             ("resnet", "pp2dp2"), ("resnet", "zero3"), ("falcon", "dp2tp2"), ("t5", "dp4")]
SEEDS = ["mlp_2d", "gpt2_3d", "bert_tp", "gpt2_pp2_dp2_zero2", "gpt2_pp4_1f1b", "hf_gpt2_dp2_tp2", "convnext_dp4"]


def _texts():
    out = [(f"{m}_{lay}", plan_text(m, lay)) for m, lay in ZOO_CASES]
    found = seeds()
    out += [(name, found[name][0]) for name in SEEDS]
    # mutants: one of each class from the suite's generator (the same every run)
    by_cls: dict[str, tuple[str, str]] = {}
    for m in generate(160, seed=1):
        if m.seed in SEEDS and m.cls not in by_cls:
            by_cls[m.cls] = (m.id, m.text)
    return out + sorted(by_cls.values())


@pytest.mark.parametrize("name,text", _texts(), ids=lambda v: v if isinstance(v, str) and len(v) < 60 else "")
def test_the_editor_and_check_model_give_the_same_diagnostics(name, text, tmp_path):
    path = tmp_path / f"{name}.plan"
    path.write_text(text)
    checked = check_with_model(str(path))
    edited = ModelChecker().run(text, str(path))
    assert _seen(edited.diagnostics) == _seen(checked.diagnostics)
    if checked.errors or "?" in text:
        with pytest.raises(ReportError):
            build_report_data(str(path))
        return
    assert _seen(build_report_data(str(path)).diagnostics) == _seen(checked.diagnostics)


class _Counts:
    """Factory calls (the model's own code building it) and lowerings (planlang.model.program.lowering.lower
    computes the parameters' specs once per program)."""

    def __init__(self, monkeypatch):
        self.factory = self.lower = 0
        imp, specs = load.import_factory, lowering.param_specs

        def counted_import(*a, **k):
            fn = imp(*a, **k)

            def call(*x, **y):
                self.factory += 1
                return fn(*x, **y)
            return call

        def counted_specs(*a, **k):
            self.lower += 1
            return specs(*a, **k)

        monkeypatch.setattr(load, "import_factory", counted_import)
        monkeypatch.setattr(lowering, "param_specs", counted_specs)
        load._BUILT.clear()


@pytest.mark.parametrize("plan", ["examples/mlp/mlp_2d.plan", "examples/gpt2/gpt2_3d.plan"])
def test_check_model_builds_the_model_and_lowers_the_program_once(plan, monkeypatch):
    counts = _Counts(monkeypatch)
    res = check_with_model(str(ROOT / plan))
    assert not res.errors
    assert (counts.factory, counts.lower) == (1, 1)


def test_estimate_builds_the_model_and_lowers_the_program_once(monkeypatch):
    counts = _Counts(monkeypatch)
    out = CliRunner().invoke(app, ["estimate", str(ROOT / "examples/mlp/mlp_2d.plan")])
    assert out.exit_code == 0, out.output
    assert "peak" in out.stdout
    assert (counts.factory, counts.lower) == (1, 1)


def test_solve_builds_the_model_once(monkeypatch, tmp_path):
    counts = _Counts(monkeypatch)
    out = CliRunner().invoke(app, ["solve", str(ROOT / "examples/partial/gpt2_cpu_partial.plan"), "-o",
                                   str(tmp_path / "solved.plan")])
    assert out.exit_code == 0, out.output
    assert counts.factory == 1


def test_check_model_estimates_memory_only_and_does_not_profile(monkeypatch):
    """`check --model` reads only the estimate's peaks (PL560): its validation skips the profile that
    prices the step, and its rows' memory equals the full estimate's."""
    from planlang.model.capture import profile as profiling
    from planlang.model.price import local_fold
    from planlang.model.price.caches import caller_caches
    from planlang.model.validation import validate_file

    path = str(ROOT / "examples" / "gpt2" / "gpt2_3d.plan")
    full = validate_file(path)
    assert full.estimate and all(r.step_time > 0 for r in full.estimate)
    for c in caller_caches(None):  # the module's caches: the memory-only run must not find a profile
        c.clear()
    profiled = []
    real_profile, real_fold = profiling.profile_model, local_fold.folded_run
    def profile(*a, **k):
        profiled.append("profile")
        return real_profile(*a, **k)

    def fold(*a, **k):
        if k.get("profile"):
            profiled.append("folded profile")
        return real_fold(*a, **k)

    monkeypatch.setattr("planlang.model.price.local_step.profile_model", profile)
    monkeypatch.setattr("planlang.model.price.local_step.folded_run", fold)
    memory = validate_file(path, steps=False)
    assert not profiled
    assert [r.step_time != r.step_time for r in memory.estimate] == [True] * len(full.estimate)  # NaN
    assert [(r.device, r.peak, r.activations) for r in memory.estimate] == \
        [(r.device, r.peak, r.activations) for r in full.estimate]
    assert memory.diagnostics == full.diagnostics
