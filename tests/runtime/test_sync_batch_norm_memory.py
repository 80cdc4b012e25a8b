"""planlang's data-parallel BatchNorm (runtime.executor.sync_batch_norm) uses no more memory than torch's."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from planlang.model.capture.simulate import Existing, LiveBytes
from planlang.runtime.executor import sync_batch_norm


def _backward_peak(fn, x: torch.Tensor, bn: torch.nn.BatchNorm2d) -> tuple[int, torch.Tensor]:
    y = fn(x)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(1))
    mode = LiveBytes(Existing([x, dy, y, *bn.parameters(), *bn.buffers()]))
    with mode:
        (gx,) = torch.autograd.grad(y, x, dy)
    return mode.peak, gx


def test_backward_keeps_one_input_sized_buffer_like_torch():
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm2d(8)
    x = torch.randn(4, 8, 16, 16, requires_grad=True)
    # with no data axes (groups = []) the sums are this rank's: one process's BatchNorm
    mine, g_mine = _backward_peak(lambda t: sync_batch_norm(t, bn.weight, bn.bias, bn, []), x, bn)
    ref, g_ref = _backward_peak(lambda t: F.batch_norm(t, None, None, bn.weight, bn.bias, True), x, bn)
    torch.testing.assert_close(g_mine, g_ref, rtol=1e-4, atol=1e-5)
    size = x.numel() * x.element_size()
    assert ref >= size  # torch's backward makes the input gradient
    assert mine <= ref + size // 8, (mine, ref, size)
