"""Pipeline x tensor parallelism: the collectives one step issues on each rank equal the prediction for
the rank's stage (planlang.runtime.traffic.stage_traffic: the stage's instructions once per microbatch, the
loss on the last stage, its parameters' gradient sums once). 4 gloo ranks run one step of GPT-2 pp2 x tp2
under planlang.apply (after one step that builds the stages) while CollectiveSpy records every collective
call; totals of S per (kind, axes) are compared (the schedule interleaves microbatches, so call order is
not; the point-to-point sends between stages are not predicted). The same predicted counts are
what bench/runtime_overhead.py's gpt2-pp2xtp2 case measured with torch.profiler on rank 0."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from tests.runtime import traffic_worker

PLANS = Path(__file__).parent / "plans"
CONFIGS = ["gpt2_pp2_tp2", "gpt2_3d_cpu_4"]


def _plan_path(config: str, out: Path) -> str:
    if config == "gpt2_pp2_tp2":
        return str(PLANS / "gpt2_pp2_tp2.plan")
    # the README's 3-D plan on 4 ranks (pp2 x tp2: dp 1): Megatron attention and MLP, checkpoints every 2
    text = (PLANS / "gpt2_3d_cpu.plan").read_text().replace("mesh cluster of 8 x", "mesh cluster of 4 x")
    text = text.replace("    dp = 2 over hardware.loopback\n", "    dp = 1 over hardware.loopback\n")
    path = out / f"{config}.plan"
    path.write_text(text)
    return str(path)


def _predict(plan_path: str):
    from planlang.runtime.traffic import stage_traffic

    plan, prog, inputs, targets = traffic_worker.lowered_with_batch(plan_path, microbatch=True)
    return inputs, targets, [traffic_worker.rows(t) for t in stage_traffic(plan, prog)]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("pp_traffic")
    jobs, predicted = [], {}
    for c in CONFIGS:
        path = _plan_path(c, out)
        inputs, targets, predicted[c] = _predict(path)
        jobs.append((path, inputs, targets))
    data = traffic_worker.launch(jobs, str(out))
    return {Path(k).stem: {"predicted": predicted[Path(k).stem], "measured": v} for k, v in data.items()}


def _totals(rows) -> dict:
    """S per (kind, axes) of the collectives (the stages' point-to-point sends are not predicted)."""
    full = defaultdict(int)
    for kind, axes, s, _b, _phase, _what in rows:
        if kind != "send_recv":
            full[(kind, tuple(axes))] += s
    return dict(full)


@pytest.mark.parametrize("config", CONFIGS)
def test_each_rank_issues_its_stages_predicted_collectives(results, config):
    r = results[config]
    for rank, got in enumerate(r["measured"]):
        assert "error" not in got, got.get("error")
        stage = rank // 2  # mesh (pp, tp) row-major; one stage per pipeline rank
        want = _totals(r["predicted"][stage])
        assert want, "nothing predicted"
        assert _totals(got["rows"]) == want, f"rank {rank} (stage {stage})"


def test_traffic_table_has_a_table_per_stage_and_the_step_time_prices_each_stage_s():
    from planlang.cost.comm import collective_time, group
    from planlang.model.capture.load import build_model
    from planlang.model.program.pipeline_program import microbatch_plan
    from planlang.runtime.apply import load_plan, lower_plan
    from planlang.model.price.estimate import estimate_plan
    from planlang.runtime.traffic import stage_traffic, traffic_table

    path = PLANS / "gpt2_3d_cpu.plan"
    text = traffic_table(str(path))
    assert text.count("stage 0 (4 microbatches)") == 1 and text.count("stage 1 (4 microbatches)") == 1
    assert "\nrecompute " in text and "\ngrad_sync " in text and "\nloss " in text
    plan = load_plan(path)
    prog = lower_plan(build_model(plan.model, plan.path), microbatch_plan(plan))
    stages = stage_traffic(plan, prog)
    # the last stage's forward sums: the boundary's partial value (1) and its two blocks' (2 x 2), per microbatch
    forward = [t for t in stages[1].transfers if t.phase == "forward" and t.axes == ("tp",)]
    assert len(forward) == 4 * 5
    # the step-time model (estimate and solve) puts each stage's in-line collectives on its critical path
    rows = estimate_plan(plan)
    for row, st in zip(rows, stages):
        inline = sum(collective_time(t.kind, group(plan.mesh, t.axes), t.full_bytes) for t in st.transfers
                     if t.phase in ("forward", "loss", "recompute", "backward"))
        assert inline > 0 and row.step.tensor == pytest.approx(inline)
