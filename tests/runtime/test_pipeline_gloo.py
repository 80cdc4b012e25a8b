"""Pipeline parallelism on 4 gloo ranks against single-process training.

One group of 4 processes is spawned for the module (tests/runtime/pipeline_worker.py); every rank runs
every config — GPT-2 (4 layers, hidden 64) and the 2-layer MLP under 1F1B, GPipe, interleaved 1F1B and
looped BFS and zero bubble (4 stages on 2 ranks, round robin), ZB-V and DualPipeV (4 stages in a V) and pp x dp, plus a model whose values and inputs skip stages — for 3 optimizer
steps, and compares the loss and every gradient of its stages with a single-process model trained on the
whole batch. Relative errors are norm-wise per parameter.
"""
from __future__ import annotations

import time

import pytest

from tests.runtime import pipeline_worker as W
from tests.runtime.spawned import spawn_ranks

TIMEOUT_S = 150
TOL = 1e-5


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    ranks, failed = spawn_ranks(W.worker, W.WORLD, str(tmp_path_factory.mktemp("pipeline")), TIMEOUT_S, time.time())
    out = [res if res is not None else {"configs": {}} for res in ranks]
    if failed:
        errors = [f"rank {r} {name}: {c['error']}" for r, res in enumerate(out)
                  for name, c in res["configs"].items() if "error" in c]
        pytest.fail(failed + "\n" + "\n".join(errors))
    return out


@pytest.mark.parametrize("name", list(W.CONFIGS))
def test_loss_and_gradients_match_single_process(results, name):
    lasts = 0
    for r, res in enumerate(results):
        c = res["configs"][name]
        assert "error" not in c, c.get("error")
        assert len(c["grad_rel"]) == W.STEPS
        assert max(c["grad_rel"]) < TOL, f"rank {r}: gradient relative errors {c['grad_rel']}"
        if c["has_last"]:
            lasts += 1
            assert len(c["loss_rel"]) == W.STEPS
            assert max(c["loss_rel"]) < TOL, f"rank {r}: loss relative errors {c['loss_rel']}"
        # parameters after the optimizer steps (Adam: without the key bias, see pipeline_worker)
        params = c["param_rel"] if c["optimizer"] == "sgd" else c["param_rel_masked"]
        assert max(params) < TOL, f"rank {r}: parameter relative errors {params}"
    assert lasts == 2  # two pipelines (replicas or data-parallel copies), one last stage each


@pytest.mark.parametrize("name", list(W.CONFIGS))
def test_stages_partition_the_parameters(results, name):
    """Within one pipeline, the ranks' stages hold every parameter of the model exactly once, under
    the model's own names; the transform hook saw exactly the rank's stages."""
    pipelines: dict[tuple, list] = {}
    for res in results:
        c = res["configs"][name]
        assert c["transformed"] == c["stages"]
        other = tuple(sorted((k, v) for k, v in c["coords"].items() if k != "pp"))
        pipelines.setdefault(other, []).append(c)
    assert len(pipelines) == 2
    for ranks in pipelines.values():
        names = [n for c in ranks for n in c["names"]]
        assert sorted(names) == ranks[0]["all_names"]
        stages = sorted(s for c in ranks for s in c["stages"])
        assert stages == list(range(len(stages)))


@pytest.mark.parametrize("name", [n for n in W.CONFIGS if "dp" in n])
def test_data_parallel_gradient_sums_start_during_the_last_backward(results, name):
    """Every bucket of a data-parallel pipeline's gradient sums starts (async) during the last backward
    of the rank's last stage to run, none after the schedule (GradSync.finish would run it blocking)."""
    for res in results:
        c = res["configs"][name]
        assert c["buckets"] >= 1
        if name == "unused-zb-dp":  # after the rank's last weight gradient every bucket starts, complete or not
            assert c["launches"] == [True] * (c["buckets"] * (W.STEPS + 1)), c["launches"]
            continue
        if name.startswith("unused"):  # its last stage's bucket waits for a gradient that never comes
            assert len(c["launches"]) == c["buckets"] * (W.STEPS + 1) and (False in c["launches"]) == (
                c["coords"]["pp"] == 1), c["launches"]
            continue
        assert c["launches"] == [True] * (c["buckets"] * (W.STEPS + 1)), c["launches"]


@pytest.mark.parametrize("name", ["gpt2-interleaved", "gpt2-looped-bfs", "gpt2-zero-bubble"])
def test_chunked_schedules_place_stages_round_robin(results, name):
    by_pp = {res["configs"][name]["coords"]["pp"]: res["configs"][name]["stages"] for res in results}
    assert by_pp == {0: [0, 2], 1: [1, 3]}


@pytest.mark.parametrize("name", ["gpt2-zbv-dp", "gpt2-dualpipev"])
def test_v_schedules_place_stages_in_a_v(results, name):
    for res in results:
        c = res["configs"][name]
        assert sorted(c["stages"]) == ([0, 3] if c["coords"]["pp"] == 0 else [1, 2])



def test_uneven_microbatches_are_refused(results):
    for res in results:
        for name, c in res["configs"].items():
            m = 4 if "microbatches 4" in W.CONFIGS[name][0] else 2
            if 6 % m:
                assert c["uneven"] and f"does not split into {m} equal microbatches" in c["uneven"]
            else:
                assert c["uneven"] is None
