"""Run one training step's forward and backward on meta tensors and follow every live tensor.

A dispatch mode sees each tensor an op creates; a finalizer on its storage sees it die. Tensors that
existed before the step (parameters, buffers, inputs) are not counted. The result is the live-bytes
curve of the step as eager PyTorch would run it — same ops, same frees, same autograd saving — with no
memory allocated (map-memory-aware-auto-parallel §4.1's meta execution, measured rather than modelled).
"""
from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .trace import bind_inputs, meta_or_fake


@contextlib.contextmanager
def fused_attention():
    """On meta, scaled_dot_product_attention falls back to the math path, which materialises and saves
    the attention matrix; real devices run a fused kernel (CPU flash attention, CUDA flash / memory
    efficient) that saves only the output and the log-sum-exp. Route meta calls to the CPU flash op so
    the simulated memory matches what the devices will do."""
    real = F.scaled_dot_product_attention

    def fused(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if (query.device.type == "meta" and attn_mask is None and dropout_p == 0.0 and not enable_gqa
                and query.dtype in (torch.float32, torch.bfloat16, torch.float16) and query.dim() == 4):
            return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                query, key, value, 0.0, is_causal, scale=scale)[0]
        return real(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                    enable_gqa=enable_gqa)

    F.scaled_dot_product_attention = fused
    try:
        yield
    finally:
        F.scaled_dot_product_attention = real


class LiveBytes(TorchDispatchMode):
    def __init__(self, ignore: set[int]):
        super().__init__()
        self.ignore = set(ignore)
        self.sizes: dict[int, int] = {}
        self.live = 0
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                key = st._cdata
                if key in self.ignore or key in self.sizes:
                    continue
                n = st.nbytes()
                self.sizes[key] = n
                self.live += n
                self.peak = max(self.peak, self.live)
                weakref.finalize(st, self._free, key)
        return out

    def _free(self, key: int) -> None:
        self.live -= self.sizes.pop(key, 0)

    def reset_peak(self) -> None:
        self.peak = self.live


@dataclass(frozen=True)
class StepMemory:
    """Bytes of one simulated forward + backward (parameters and inputs excluded)."""

    saved: int  # live at the end of forward: activations autograd keeps, plus the output and loss
    forward_peak: int  # peak during forward
    backward_peak: int  # peak during backward, gradients included
    grads: int  # live after backward: the parameter gradients (.grad)
    output: int = 0  # bytes of the loss (freed after backward in the canonical loop)


def simulate_step(module: torch.nn.Module, inputs: dict[str, torch.Tensor], loss=None) -> StepMemory:
    """Forward, loss (sum of the first output unless `loss(out, inputs)` is given) and backward on meta
    (or fake tensors, for models that read values; see trace.meta_or_fake)."""
    return meta_or_fake(lambda: _simulate(module, inputs, loss))


def _simulate(module: torch.nn.Module, inputs: dict[str, torch.Tensor], loss) -> StepMemory:
    ignore = {p.untyped_storage()._cdata for p in module.parameters()}
    ignore |= {b.untyped_storage()._cdata for b in module.buffers()}
    ignore |= {t.untyped_storage()._cdata for t in inputs.values()}
    for p in module.parameters():
        p.grad = None
    mode = LiveBytes(ignore)
    args, kwargs = bind_inputs(module, inputs)
    with fused_attention():  # forward and backward: checkpoint recomputation must take the same path
        with mode:
            out = module(*args, **kwargs)
            first = next(t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
            scalar = loss(out, inputs) if loss is not None else first.float().sum()
            # the canonical loop: `loss = loss_fn(model(x), y); loss.backward()` — the output itself is
            # dropped before backward (autograd keeps what it saved); the loss after it
            del out, first
        saved, fwd_peak = mode.live, mode.peak
        output = scalar.untyped_storage().nbytes()
        mode.reset_peak()
        with mode:
            scalar.backward()
    del scalar
    bwd_peak = mode.peak
    grads = sum(p.grad.untyped_storage().nbytes() for p in module.parameters() if p.grad is not None)
    return StepMemory(saved, fwd_peak, bwd_peak, grads, output)
