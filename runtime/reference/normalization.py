"""Normalization ops: BatchNormalization, InstanceNormalization, GroupNormalization,
LayerNormalization, RMSNormalization, LpNormalization, MeanVarianceNormalization.

IR forms are the newest ONNX versions (GroupNormalization: scale and bias per channel, opset 21;
the frontend converts opset 18's per-group form). Statistics are computed in float32, or in
float64 when an input is float64 (or `stash_type` asks for it), and the result is cast back to
the output dtype once: float16 inputs neither overflow in x*x nor lose the mean.

This module holds the numpy kernels (what the interpreter and a CPU engine run); type
inference and traits are in graphc.ops.normalization.
"""

from __future__ import annotations

import numpy as np

from graphc.runtime.dtypes import DType
from graphc.runtime.reference.registry import register_kernel


def compute_dtype(*arrays: np.ndarray | None, stash_type: int | None = None) -> np.dtype:
    """float64 if any input (or the stash type) is float64, else float32."""
    if stash_type == DType.float64.value:
        return np.dtype(np.float64)
    if any(a is not None and a.dtype == np.float64 for a in arrays):
        return np.dtype(np.float64)
    return np.dtype(np.float32)


def _channel_view(v: np.ndarray, ndim: int, cd: np.dtype) -> np.ndarray:
    """A per-channel vector (C,) shaped to broadcast against (N, C, D1, ...)."""
    return np.asarray(v, dtype=cd).reshape((-1,) + (1,) * (ndim - 2))


def _bn_compute(ins: list, attrs, n: int) -> list[np.ndarray]:
    x, scale, bias, mean, var = ins[:5]
    cd = compute_dtype(x, scale, bias, mean, var)
    xc = x.astype(cd)
    if attrs.training_mode:
        axes = (0, *range(2, x.ndim))
        cur_mean = xc.mean(axis=axes)
        cur_var = ((xc - _channel_view(cur_mean, x.ndim, cd)) ** 2).mean(axis=axes)
        use_mean, use_var = cur_mean, cur_var
    else:
        use_mean, use_var = mean.astype(cd), var.astype(cd)
    inv = 1.0 / np.sqrt(use_var + cd.type(attrs.epsilon))
    y = (xc - _channel_view(use_mean, x.ndim, cd)) * _channel_view(inv * scale.astype(cd), x.ndim, cd)
    y = y + _channel_view(bias, x.ndim, cd)
    outs = [y.astype(x.dtype)]
    if n > 1:
        m = cd.type(attrs.momentum)
        one = cd.type(1)
        running_mean = mean.astype(cd) * m + cur_mean * (one - m)
        running_var = var.astype(cd) * m + cur_var * (one - m)
        outs += [running_mean.astype(mean.dtype), running_var.astype(var.dtype)]
    return outs[: max(n, 1)]


def _normalize(xc: np.ndarray, axes: tuple[int, ...], eps: float) -> np.ndarray:
    """(x - mean) / sqrt(var + eps) over `axes`, variance in two passes (never negative)."""
    mean = xc.mean(axis=axes, keepdims=True)
    d = xc - mean
    var = (d * d).mean(axis=axes, keepdims=True)
    return d / np.sqrt(var + xc.dtype.type(eps))


def _in_compute(ins: list, attrs, n: int) -> list[np.ndarray]:
    x, scale, bias = ins[:3]
    cd = compute_dtype(x, scale, bias)
    y = _normalize(x.astype(cd), tuple(range(2, x.ndim)), attrs.epsilon)
    y = y * _channel_view(scale, x.ndim, cd) + _channel_view(bias, x.ndim, cd)
    return [y.astype(x.dtype)]


def _gn_compute(ins: list, attrs, n: int) -> list[np.ndarray]:
    x, scale, bias = ins[:3]
    cd = compute_dtype(x, stash_type=attrs.stash_type)
    g = attrs.num_groups
    grouped = x.astype(cd).reshape(x.shape[0], g, -1)
    y = _normalize(grouped, (2,), attrs.epsilon).reshape(x.shape)
    y = y * _channel_view(scale, x.ndim, cd) + _channel_view(bias, x.ndim, cd)
    return [y.astype(x.dtype)]


def _ln_compute(ins: list, attrs, n: int) -> list[np.ndarray]:
    x, scale = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    cd = compute_dtype(x, stash_type=attrs.stash_type)
    axis = attrs.axis + x.ndim if attrs.axis < 0 else attrs.axis
    axes = tuple(range(axis, x.ndim))
    xc = x.astype(cd)
    mean = xc.mean(axis=axes, keepdims=True)
    d = xc - mean
    inv_std = 1.0 / np.sqrt((d * d).mean(axis=axes, keepdims=True) + cd.type(attrs.epsilon))
    y = d * inv_std * scale.astype(cd)
    if bias is not None:
        y = y + bias.astype(cd)
    stash = DType.from_onnx(attrs.stash_type).numpy
    return [y.astype(x.dtype), mean.astype(stash), inv_std.astype(stash)][: max(n, 1)]


def _rms_compute(ins: list, attrs, n: int) -> list[np.ndarray]:
    x, scale = ins[0], ins[1]
    cd = compute_dtype(x, stash_type=attrs.stash_type)
    axis = attrs.axis + x.ndim if attrs.axis < 0 else attrs.axis
    xc = x.astype(cd)
    ms = (xc * xc).mean(axis=tuple(range(axis, x.ndim)), keepdims=True)
    y = xc / np.sqrt(ms + cd.type(attrs.epsilon)) * scale.astype(cd)
    return [y.astype(scale.dtype)]


def _lp_compute(ins: list, attrs, n: int) -> list[np.ndarray]:
    x = ins[0]
    xc = x.astype(compute_dtype(x))
    if attrs.p == 1:
        norm = np.sum(np.abs(xc), axis=attrs.axis, keepdims=True)
    else:
        norm = np.sqrt(np.sum(xc * xc, axis=attrs.axis, keepdims=True))
    # A zero norm (all zeros along the axis) gives zeros, not 0/0 (opset 22 spells this out).
    y = np.where(norm == 0, xc.dtype.type(0), xc / np.where(norm == 0, 1, norm))
    return [y.astype(x.dtype)]


# The spec's function adds this to the standard deviation (not the variance).
MVN_EPSILON = 1e-9


def _mvn_compute(ins: list, attrs, n: int) -> list[np.ndarray]:
    x = ins[0]
    xc = x.astype(compute_dtype(x))
    axes = tuple(sorted({a + x.ndim if a < 0 else a for a in attrs.axes}))
    mean = xc.mean(axis=axes, keepdims=True)
    d = xc - mean
    # Two-pass variance: the spec's E[x^2] - E[x]^2 can go slightly negative (NaN after sqrt)
    # for near-constant inputs; both agree up to rounding otherwise.
    std = np.sqrt((d * d).mean(axis=axes, keepdims=True))
    return [(d / (std + xc.dtype.type(MVN_EPSILON))).astype(x.dtype)]


register_kernel("BatchNormalization", _bn_compute)
register_kernel("InstanceNormalization", _in_compute)
register_kernel("GroupNormalization", _gn_compute)
register_kernel("LayerNormalization", _ln_compute)
# RMSNormalization's kernel is registered whether or not the installed onnx has the op (opset 23).
register_kernel("RMSNormalization", _rms_compute)
register_kernel("LpNormalization", _lp_compute)
register_kernel("MeanVarianceNormalization", _mvn_compute)
