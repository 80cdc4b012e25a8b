"""BatchNorm inside a checkpoint group updates its running statistics once per step: the recomputation
in backward (planlang.model.program.recompute.is_recomputing) normalizes with the batch's statistics and leaves
the running ones alone. Before, they were updated twice and verify found blocks.0.bn.running_mean off by
0.9 (found by bench/mutants.py). 4 gloo ranks: dp4 (the lowered program's checkpoint, BatchNorm synced
over dp) and a GPipe pipeline over pp2 x dp2 (checkpointed stage modules)."""
from __future__ import annotations

import pytest

from tests.runtime.verify_cli import verify_text
from tests.zoo.plans import plan_text


@pytest.mark.parametrize("layout", ["dp4", "pp2dp2"])
def test_running_statistics_are_updated_once(tmp_path, layout):
    verify_text(plan_text("resnet", layout) + "checkpoint blocks[*] every 1\n", tmp_path, f"resnet_{layout}_ckpt")


def test_the_recomputation_is_marked():
    import torch

    from planlang.model.program.recompute import checkpoint, is_recomputing

    seen = []

    def f(x):
        seen.append(is_recomputing())
        return x.sin()

    x = torch.ones(3, requires_grad=True)
    checkpoint(f, x).sum().backward()
    assert seen == [False, True] and not is_recomputing()
