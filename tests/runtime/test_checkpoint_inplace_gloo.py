"""An in-place op on a constant inside a checkpoint group (HF T5's relative-position buckets, `add_`-ed)
writes into a copy every time it runs: the recomputation in backward added into the constant a second
time, and autograd raised "modified by an inplace operation" for the LongTensor the embedding saved
(found by bench/mutants.py). 4 gloo ranks, T5 under dp4 with every encoder block checkpointed."""
from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="HF T5 needs transformers")

from tests.runtime.verify_cli import verify_text  # noqa: E402
from tests.zoo.plans import plan_text  # noqa: E402


def test_t5_with_checkpointed_blocks_trains_like_one_process(tmp_path):
    verify_text(plan_text("t5", "dp4") + "checkpoint encoder.block[*] every 1\n", tmp_path, "t5_dp4_ckpt")
