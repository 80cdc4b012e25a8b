"""Opaque calls that act on each sample alone, so they run on a data-parallel rank's own samples.

An op without a sharding rule is "opaque": the runtime runs its original call. Run on whole inputs it
would need the whole batch on every rank (a gather over the data axes and compute repeated there), so
the lowering runs the calls named here on the local batch instead: every activation input split on dim 0
as the op's first activation is, parameters and constants whole. What is listed acts independently on
each index of dim 0 whatever its arguments (pooling over spatial dims, per-sample normalization,
elementwise math, masked attention whose mask is per sample or broadcast).

`BATCH_STATISTICS` ops (BatchNorm in training) are not per-sample: their statistics span the batch. The
runtime runs them on the local batch with the statistics all-reduced over the data axes, which is one
process's BatchNorm on the global batch (SyncBatchNorm's semantics).

Names are the call's target as the op graph records it: a module's class name (fx), a function's
`__name__` (fx), or an ATen op's name (torch.export), without a leading `_` or a tuple index `[i]`.
"""
from __future__ import annotations

import re

PER_SAMPLE = frozenset({
    # pooling and resizing over the trailing (spatial) dims
    "MaxPool1d", "MaxPool2d", "MaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d",
    "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d",
    "max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d",
    "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d", "adaptive_max_pool1d",
    "adaptive_max_pool2d", "max_pool2d_with_indices", "adaptive_max_pool2d_with_indices",
    "Upsample", "interpolate", "upsample_nearest2d", "upsample_bilinear2d",
    # per-sample normalization
    "GroupNorm", "group_norm", "native_group_norm", "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d",
    "instance_norm", "LocalResponseNorm", "local_response_norm",
    # elementwise math and activations without a rule
    "abs", "clamp", "clamp_min", "clamp_max", "clip", "pow", "erf", "log", "log1p", "expm1", "reciprocal",
    "where", "masked_fill", "sign", "floor", "ceil", "round", "square",
    "hardtanh", "leaky_relu", "elu", "selu", "celu", "mish", "softplus", "hardswish", "hardsigmoid", "relu6",
    "LeakyReLU", "ELU", "SELU", "CELU", "Mish", "Softplus", "Hardswish", "Hardsigmoid", "ReLU6", "Hardtanh",
    "PReLU", "prelu",
    # new tensors shaped like their input (values that do not depend on it)
    "zeros_like", "ones_like", "full_like", "empty_like",
    # attention with a per-sample (or broadcast) mask
    "scaled_dot_product_attention",
})

BATCH_STATISTICS = frozenset({"BatchNorm1d", "BatchNorm2d", "BatchNorm3d"})


def call_name(target: str) -> str:
    """The registry's name of an opaque call's recorded target."""
    return re.sub(r"\[\d+\]$", "", str(target)).split(".")[-1].lstrip("_")


def is_per_sample(target: str) -> bool:
    return call_name(target) in PER_SAMPLE


def has_batch_statistics(target: str) -> bool:
    return call_name(target) in BATCH_STATISTICS
