"""`torch.autocast` for tensors on the meta device, where torch has none (`torch.autocast("meta")` is refused
and CPU autocast leaves meta tensors alone), so that the estimator's simulated step and the runtime's
program run on meta (planlang.runtime.program_memory) keep what a real autocast step keeps.

Autocast sits above autograd: it casts the floating inputs of the ops on its lower-precision list to the
compute dtype and those on its f32 list to f32, and autograd saves the cast copies. This mode does the
same one level up, on torch functions (which is also above autograd): the functions below are the Python
entry points of the ops on CPU autocast's lists (aten/src/ATen/autocast_mode.cpp, `lower_precision_fp`
and `fp32`, the ones models call; checked against real CPU autocast in tests/model/test_precision.py).
Like autocast, it casts a parameter (a leaf that requires grad) once per region and keeps the copy until
the region ends (autocast's weight cache). Every other op runs on its inputs as they are, with torch's
own type promotion, as under autocast.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack

LOWER = {
    F.linear, torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.Tensor.__rmatmul__,
    torch.mm, torch.Tensor.mm, torch.bmm, torch.Tensor.bmm, torch.addmm, torch.Tensor.addmm,
    torch.baddbmm, torch.Tensor.baddbmm, torch.addbmm, torch.einsum, F.conv1d, F.conv2d, F.conv3d,
    F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d, F.prelu, F.scaled_dot_product_attention,
}
FP32 = {
    F.cross_entropy, F.nll_loss, F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.huber_loss, F.kl_div,
    F.binary_cross_entropy, F.binary_cross_entropy_with_logits, F.soft_margin_loss, F.margin_ranking_loss,
}


class MetaAutocast(TorchFunctionMode):
    """Autocast to `dtype` for tensors on meta (see the module docstring)."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype
        self._cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(param) -> (param, its cast)

    def __exit__(self, *exc):
        self._cache.clear()
        return super().__exit__(*exc)

    def recompute_context(self):
        """The context torch.utils.checkpoint's recomputation runs in (its `context_fn`): autocast again, as
        torch's checkpoint re-enters autocast for it, a region of its own with its own cache."""
        return MetaAutocast(self.dtype)

    def release(self) -> None:
        """Drop the cached parameter casts (`torch.autocast` clears its cache when its region ends)."""
        self._cache.clear()

    def _cast(self, x, dtype: torch.dtype):
        if isinstance(x, (list, tuple)):
            return type(x)(self._cast(v, dtype) for v in x)
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dtype in (dtype, torch.float64):
            return x
        if x.is_leaf and x.requires_grad:  # a parameter: cast once per region, as autocast's cache does
            hit = self._cache.get(id(x))
            if hit is None or hit[0] is not x:
                hit = self._cache[id(x)] = (x, x.to(dtype))
            return hit[1]
        return x.to(dtype)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        dtype = self.dtype if func in LOWER else torch.float32 if func in FP32 else None
        if dtype is not None:
            args = self._cast(tuple(args), dtype)
            kwargs = {k: self._cast(v, dtype) for k, v in kwargs.items()}
        return func(*args, **kwargs)


def active_meta_autocast() -> "MetaAutocast | None":
    """The innermost MetaAutocast on the torch-function mode stack, or None."""
    return next((m for m in reversed(_get_current_function_mode_stack()) if isinstance(m, MetaAutocast)), None)


__all__ = ["MetaAutocast", "LOWER", "FP32", "active_meta_autocast"]
