"""ZeRO-2/3 through `planlang.apply` with one FSDP2 unit per block (planlang.runtime.zero_blocks): GPT-2 with
3 blocks over dp=2 on 2 gloo ranks, 3 AdamW steps against one process (loss and gradients within 1e-5,
parameters within verify's bound), and the hooks on the model's own block modules show the per-block
mechanism: under ZeRO-3 only the running block's parameters are whole in forward and in backward (each
block resharded after its forward and again after its backward), under ZeRO-2 the blocks stay whole from
their forward until their backward; in both each block's gradient is reduce-scattered when its own backward
ends, before the blocks before it run theirs."""
from __future__ import annotations

import pytest

from tests.runtime import zero_blocks_worker

TOL = 1e-5
G, S = "gathered", "sharded"


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return zero_blocks_worker.results()


@pytest.mark.parametrize("key", ["zero3", "zero2"])
def test_per_block_units_train_like_one_process(results, key):
    for r, res in enumerate(results):
        c = res[key]
        assert "error" not in c, f"rank {r}: {c.get('error')}"
        assert c["fsdp_units"] == [True, True, True], c["units"]  # each block its own FSDP2 unit
        assert c["report"]["fsdp_axes"] == ["dp"]
        rows = c["rows"]
        assert len(rows) == 3
        for row in rows:
            assert row["loss_rel_err"] <= TOL, row
            assert row["grad_rel_err"] <= TOL, row
            assert row["param_rel_err"] <= row["param_bound"], row
        assert rows[2]["loss_reference"] != rows[0]["loss_reference"]  # the optimizer stepped


def _log(results, key):
    for r, res in enumerate(results):
        assert "error" not in res[key], f"rank {r}: {res[key].get('error')}"
    return [(e["at"], e["params"], e.get("grads")) for e in results[0][key]["log"]]


def test_zero3_gathers_one_block_at_a_time(results):
    assert _log(results, "zero3") == [
        ("forward 0", [G, S, S], None),
        ("forward 1", [S, G, S], None),
        ("forward 2", [S, S, G], None),
        # a block's backward has run: its own gradient is still whole, the later blocks' are shards
        ("backward 2", [S, S, G], ["none", "none", "whole"]),
        ("backward 1", [S, G, S], ["none", "whole", "shard"]),
        ("backward 0", [G, S, S], ["whole", "shard", "shard"]),
    ]


def test_zero2_keeps_blocks_gathered_until_their_backward(results):
    assert _log(results, "zero2") == [
        ("forward 0", [G, S, S], None),
        ("forward 1", [G, G, S], None),
        ("forward 2", [G, G, G], None),
        ("backward 2", [G, G, G], ["none", "none", "whole"]),
        ("backward 1", [G, G, S], ["none", "whole", "shard"]),
        ("backward 0", [G, S, S], ["whole", "shard", "shard"]),
    ]
