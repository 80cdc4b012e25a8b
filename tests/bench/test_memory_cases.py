"""The memory ground-truth cases (bench/memory_cases.py): every plan checks clean; a smoke measurement."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from memory_cases import CASES, CASES_BY_NAME, STRATEGIES, to_plan  # noqa: E402

from planlang.plan.checker import check_text  # noqa: E402


def test_enough_cases_over_every_strategy_and_model():
    assert len(CASES) >= 32
    assert {c.strategy for c in CASES} == set(STRATEGIES)
    assert {c.model for c in CASES} == {"mlp", "gpt2", "bert", "t5", "resnet", "moe", "ncf"}
    for c in CASES:
        assert c.batch % (c.dp_size * c.microbatches) == 0, c.name


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_plan_checks_clean(case):
    # the plan's `use` paths resolve against the stdlib; give it a path inside the repo
    res = check_text(to_plan(case), path=str(ROOT / "bench" / f"{case.name}.plan"))
    assert res.errors == 0 and res.warnings == 0, "\n".join(f"{d.code} {d.message}" for d in res.diagnostics)
    assert res.plan is not None


@pytest.mark.parametrize("name", ["mlp_tp_2", "gpt2_pp_1f1b_2_mb4", "bert_ckpt_every1"])
def test_plan_checks_clean_with_model(name):
    from planlang.model.validation import check_with_model

    path = ROOT / "bench" / f"_tmp_{name}.plan"
    path.write_text(to_plan(CASES_BY_NAME[name]))
    try:
        res = check_with_model(str(path))
    finally:
        path.unlink()
    errors = [d for d in res.diagnostics if d.severity.value == "error"]
    assert not errors, "\n".join(f"{d.code} {d.message}" for d in errors)


@pytest.mark.parametrize("name", ["mlp_single", "mlp_ddp_2", "mlp_tp_2"])
def test_measure_smoke(name):
    from memory_measure import build_model, measure

    case = CASES_BY_NAME[name]
    res = measure(case)
    assert len(res["ranks"]) == case.world
    full = sum(p.numel() * p.element_size() for p in build_model(case).parameters())
    for r in res["ranks"]:
        peak = r["peak"]
        assert peak["Total"] > 0
        assert peak["Total"] == sum(v for k, v in peak.items() if k != "Total")
        expected = full if case.tp_size == 1 else r["param_bytes"]
        assert peak["parameters"] == expected == r["param_bytes"]
        if case.tp_size > 1:
            assert expected < full
        # AdamW: two moments per parameter survive the step
        assert r["end"]["optimizer"] >= 2 * expected
        # DDP's gradient buckets (registered with the tracker) hold a copy of every gradient
        assert peak["buffers"] == (full if case.strategy == "ddp" else 0)


def test_measure_pipeline_receive_buffers():
    """A pipeline stage keeps one receive buffer per microbatch: the activation from the previous stage
    (stage 1) and the gradient from the next one (stage 0): [microbatch, hidden] f32 each."""
    from memory_measure import measure

    case = CASES_BY_NAME["mlp_pp_1f1b_2_mb4"]
    res = measure(case)
    per_microbatch = case.batch // case.microbatches * case.kwargs["hidden"] * 4
    for r in res["ranks"]:
        assert r["runtime_buffer_bytes"] == case.microbatches * per_microbatch
        assert r["peak"]["buffers"] == r["end"]["buffers"] == r["runtime_buffer_bytes"]


def test_measure_planlang_runtime_smoke():
    """The same case on the planlang runtime: its parameters are the plan's local pieces."""
    from memory_measure import PLANLANG_CASES, measure

    case = CASES_BY_NAME["mlp_tp_2"]
    assert case.name in PLANLANG_CASES
    res = measure(case, "planlang")
    assert res["runtime"] == "planlang" and len(res["ranks"]) == 2
    torch_res = measure(case)
    for r, t in zip(res["ranks"], torch_res["ranks"]):
        assert r["param_bytes"] == t["param_bytes"]  # the same Megatron split
        assert r["peak"]["Total"] > r["param_bytes"] * 3  # parameters, gradients, AdamW moments
