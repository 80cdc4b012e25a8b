"""`planlang verify` on models with dropout (planlang.runtime.no_dropout): the plan's masks and one
process's cannot be the same draws, so both sides run dropout as the identity, say how many calls they
turned off, and a correct plan PASSes against rounding (before, every such plan FAILed: its gradient
errors were the difference of two random masks, 0.4-0.6 on GPT-2 dp 2 x tp 2). 4 gloo ranks
(tests/runtime/dropout_worker.py): GPT-2 under dp 2 x tp 2 (the lowered program's dropout ops), Hugging
Face BERT (attention's `dropout_p`) under dp 2 x tp 2 (an opaque call in the program, whose mask is now split
with the batch: tests/model/test_per_sample_constants.py) and pp 2 x dp 2 (stages of the model's own
modules). The switch itself, without processes: tests/runtime/test_no_dropout.py."""
from __future__ import annotations

import pytest

from tests.runtime import dropout_worker as W
from tests.runtime.spawned import written_results

TIMEOUT_S = 300


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return written_results(W.worker, W.WORLD, str(tmp_path_factory.mktemp("dropout")), TIMEOUT_S)[0]  # rank 0


@pytest.mark.parametrize("name", list(W.CONFIGS))
def test_a_model_with_dropout_verifies_with_dropout_off_on_both_sides(results, name):
    got = results[name]
    assert got["dropout_off"] > 0  # dropout was there, and was turned off (not silently)
    for row, ok in zip(got["rows"], got["ok"]):
        assert ok, f"step {row['step']}: {row}"
        # judged against rounding, not only the floor: the two sides compute the same function
        assert row["grad_rel_err"] < 1e-5 and row["loss_rel_err"] < 1e-5, row
