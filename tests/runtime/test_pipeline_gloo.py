"""Pipeline parallelism on 4 gloo ranks against single-process training.

One group of 4 processes is spawned for the module (tests/runtime/pipeline_worker.py); every rank runs
every config — GPT-2 (4 layers, hidden 64) and the 2-layer MLP under 1F1B, GPipe, interleaved 1F1B
(4 stages on 2 ranks) and pp x dp, plus a model whose values and inputs skip stages — for 3 optimizer
steps, and compares the loss and every gradient of its stages with a single-process model trained on the
whole batch. Relative errors are norm-wise per parameter.
"""
from __future__ import annotations

import json
import os
import socket
import time

import pytest
import torch.multiprocessing as mp

from tests.runtime import pipeline_worker as W

TIMEOUT_S = 150
TOL = 1e-5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    outdir = str(tmp_path_factory.mktemp("pipeline"))
    ctx = mp.start_processes(W.worker, args=(_free_port(), outdir, time.time()), nprocs=W.WORLD, join=False,
                             start_method="spawn")
    deadline = time.time() + TIMEOUT_S
    failed = None
    try:
        while not ctx.join(timeout=2):
            if time.time() > deadline:
                failed = "pipeline workers timed out"
                break
    except Exception as err:  # noqa: BLE001 - a worker raised; its JSON says why
        failed = str(err)
    for p in ctx.processes:
        if p.is_alive():
            p.kill()
    out = []
    for r in range(W.WORLD):
        path = os.path.join(outdir, f"rank{r}.json")
        out.append(json.load(open(path)) if os.path.exists(path) else {"configs": {}})
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


def test_interleaved_places_stages_round_robin(results):
    by_pp = {res["configs"]["gpt2-interleaved"]["coords"]["pp"]: res["configs"]["gpt2-interleaved"]["stages"]
             for res in results}
    assert by_pp == {0: [0, 2], 1: [1, 3]}



def test_uneven_microbatches_are_refused(results):
    for res in results:
        for name, c in res["configs"].items():
            m = 4 if "microbatches 4" in W.CONFIGS[name][0] else 2
            if 6 % m:
                assert c["uneven"] and f"does not split into {m} equal microbatches" in c["uneven"]
            else:
                assert c["uneven"] is None
