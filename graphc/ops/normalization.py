"""Normalization ops: BatchNormalization, InstanceNormalization, GroupNormalization,
LayerNormalization, RMSNormalization, LpNormalization, MeanVarianceNormalization.

IR forms are the newest ONNX versions (GroupNormalization: scale and bias per channel, opset 21;
the frontend converts opset 18's per-group form). Statistics are computed in float32, or in
float64 when an input is float64 (or `stash_type` asks for it), and the result is cast back to
the output dtype once: float16 inputs neither overflow in x*x nor lose the mean.
"""

from __future__ import annotations

import numpy as np
import onnx.defs

from graphc.ir.types import DType, Shape, TensorType
from graphc.ops.registry import Category, InferContext, register_op


def compute_dtype(*arrays: np.ndarray | None, stash_type: int | None = None) -> np.dtype:
    """float64 if any input (or the stash type) is float64, else float32."""
    if stash_type == DType.float64.value:
        return np.dtype(np.float64)
    if any(a is not None and a.dtype == np.float64 for a in arrays):
        return np.dtype(np.float64)
    return np.dtype(np.float32)


def _float_type(ctx: InferContext, i: int, name: str) -> TensorType:
    t = ctx.type(i)
    if not t.dtype.is_float:
        ctx.fail(f"{name} must be a float tensor, got {t.dtype.name}")
    return t


def _min_rank(ctx: InferContext, t: TensorType, name: str, n: int) -> None:
    if t.shape is not None and len(t.shape) < n:
        ctx.fail(f"{name} must have rank >= {n}, got {t}")


def _check_vector(ctx: InferContext, i: int, name: str, size: object) -> TensorType:
    """Input i is a float 1-D tensor of `size` elements (checked where both are known)."""
    t = _float_type(ctx, i, name)
    if t.shape is not None:
        if len(t.shape) != 1:
            ctx.fail(f"{name} must be 1-D, got {t}")
        if isinstance(size, int) and isinstance(t.shape[0], int) and t.shape[0] != size:
            ctx.fail(f"{name} has {t.shape[0]} elements, the input has {size} channels")
    return t


def _check_unidirectional(ctx: InferContext, x: TensorType, i: int, name: str) -> None:
    """Input i broadcasts to x's shape without changing it (ONNX unidirectional broadcasting)."""
    t = _float_type(ctx, i, name)
    if x.shape is None or t.shape is None:
        return
    if len(t.shape) > len(x.shape):
        ctx.fail(f"{name} {t} has a higher rank than the input {x}")
    for d_in, d_x in zip(reversed(t.shape), reversed(x.shape), strict=False):
        if isinstance(d_in, int) and d_in != 1 and isinstance(d_x, int) and d_in != d_x:
            ctx.fail(f"{name} {t} does not broadcast to the input {x}")


def _channel_view(v: np.ndarray, ndim: int, cd: np.dtype) -> np.ndarray:
    """A per-channel vector (C,) shaped to broadcast against (N, C, D1, ...)."""
    return np.asarray(v, dtype=cd).reshape((-1,) + (1,) * (ndim - 2))


# ---- BatchNormalization ------------------------------------------------------------------------


def _bn_infer(ctx: InferContext) -> list[TensorType]:
    x = _float_type(ctx, 0, "X")
    _min_rank(ctx, x, "X", 2)
    c = x.shape[1] if x.shape is not None else None
    for i, name in enumerate(("scale", "B", "input_mean", "input_var"), start=1):
        _check_vector(ctx, i, name, c)
    if ctx.type(3).dtype != ctx.type(4).dtype:
        ctx.fail(f"input_mean ({ctx.type(3).dtype.name}) and input_var ({ctx.type(4).dtype.name}) differ")
    if ctx.num_outputs > 1 and not ctx.attrs.training_mode:
        ctx.fail("running_mean/running_var outputs are only valid with training_mode=1")
    stat = ctx.type(3).with_shape((c,))
    return [x, stat, stat][: max(ctx.num_outputs, 1)]


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


register_op("BatchNormalization", category=Category.NORMALIZATION, infer=_bn_infer, compute=_bn_compute)

# ---- InstanceNormalization ---------------------------------------------------------------------


def _in_infer(ctx: InferContext) -> list[TensorType]:
    x = _float_type(ctx, 0, "input")
    _min_rank(ctx, x, "input", 2)
    c = x.shape[1] if x.shape is not None else None
    _check_vector(ctx, 1, "scale", c)
    _check_vector(ctx, 2, "B", c)
    return [x]


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


register_op("InstanceNormalization", category=Category.NORMALIZATION, infer=_in_infer, compute=_in_compute)

# ---- GroupNormalization ------------------------------------------------------------------------


def _gn_infer(ctx: InferContext) -> list[TensorType]:
    x = _float_type(ctx, 0, "X")
    _min_rank(ctx, x, "X", 2)
    g = ctx.attrs.num_groups
    if g <= 0:
        ctx.fail(f"num_groups must be positive, got {g}")
    c = x.shape[1] if x.shape is not None else None
    if isinstance(c, int) and c % g:
        ctx.fail(f"{c} channels do not divide into num_groups={g}")
    _check_vector(ctx, 1, "scale", c)
    _check_vector(ctx, 2, "bias", c)
    _stash_dtype(ctx)
    return [x]


def _gn_compute(ins: list, attrs, n: int) -> list[np.ndarray]:
    x, scale, bias = ins[:3]
    cd = compute_dtype(x, stash_type=attrs.stash_type)
    g = attrs.num_groups
    grouped = x.astype(cd).reshape(x.shape[0], g, -1)
    y = _normalize(grouped, (2,), attrs.epsilon).reshape(x.shape)
    y = y * _channel_view(scale, x.ndim, cd) + _channel_view(bias, x.ndim, cd)
    return [y.astype(x.dtype)]


def _stash_dtype(ctx: InferContext) -> DType:
    try:
        dt = DType.from_onnx(ctx.attrs.stash_type)
    except ValueError:
        dt = None
    if dt is None or not dt.is_float:
        ctx.fail(f"stash_type {ctx.attrs.stash_type} is not a float type")
    return dt


register_op("GroupNormalization", category=Category.NORMALIZATION, infer=_gn_infer, compute=_gn_compute)

# ---- LayerNormalization, RMSNormalization ------------------------------------------------------


def _trailing_axis(ctx: InferContext, x: TensorType) -> int | None:
    if x.shape is None:
        return None
    rank = len(x.shape)
    if rank == 0:
        ctx.fail("input must have rank >= 1")
    return ctx.axis(ctx.attrs.axis, rank)


def _ln_infer(ctx: InferContext) -> list[TensorType]:
    x = _float_type(ctx, 0, "X")
    axis = _trailing_axis(ctx, x)
    _check_unidirectional(ctx, x, 1, "Scale")
    if ctx.has_input(2):
        _check_unidirectional(ctx, x, 2, "B")
    stash = _stash_dtype(ctx)
    stat_shape: Shape | None = None
    if axis is not None:
        stat_shape = tuple(x.shape[:axis]) + (1,) * (len(x.shape) - axis)
    stat = TensorType(stash, stat_shape)
    return [x, stat, stat][: max(ctx.num_outputs, 1)]


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


register_op("LayerNormalization", category=Category.NORMALIZATION, infer=_ln_infer, compute=_ln_compute)


def _rms_infer(ctx: InferContext) -> list[TensorType]:
    x = _float_type(ctx, 0, "X")
    _trailing_axis(ctx, x)
    _check_unidirectional(ctx, x, 1, "scale")
    _stash_dtype(ctx)
    # Y has the type of scale (V), not of X.
    return [x.with_dtype(ctx.type(1).dtype)]


def _rms_compute(ins: list, attrs, n: int) -> list[np.ndarray]:
    x, scale = ins[0], ins[1]
    cd = compute_dtype(x, stash_type=attrs.stash_type)
    axis = attrs.axis + x.ndim if attrs.axis < 0 else attrs.axis
    xc = x.astype(cd)
    ms = (xc * xc).mean(axis=tuple(range(axis, x.ndim)), keepdims=True)
    y = xc / np.sqrt(ms + cd.type(attrs.epsilon)) * scale.astype(cd)
    return [y.astype(scale.dtype)]


def _has_schema(op: str) -> bool:
    try:
        onnx.defs.get_schema(op)
    except onnx.defs.SchemaError:
        return False
    return True


HAS_RMS_NORMALIZATION = _has_schema("RMSNormalization")  # opset 23; older onnx lacks it
if HAS_RMS_NORMALIZATION:
    register_op("RMSNormalization", category=Category.NORMALIZATION, infer=_rms_infer, compute=_rms_compute)

# ---- LpNormalization, MeanVarianceNormalization ------------------------------------------------


def _lp_infer(ctx: InferContext) -> list[TensorType]:
    x = _float_type(ctx, 0, "input")
    if ctx.attrs.p not in (1, 2):
        ctx.fail(f"p={ctx.attrs.p} is not supported (the spec allows 1 and 2)")
    _trailing_axis(ctx, x)
    return [x]


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


register_op("LpNormalization", category=Category.NORMALIZATION, infer=_lp_infer, compute=_lp_compute)

# The spec's function adds this to the standard deviation (not the variance).
MVN_EPSILON = 1e-9


def _mvn_infer(ctx: InferContext) -> list[TensorType]:
    x = _float_type(ctx, 0, "X")
    if x.shape is not None:
        rank = len(x.shape)
        norm = [ctx.axis(a, rank) for a in ctx.attrs.axes]
        if len(set(norm)) != len(norm):
            ctx.fail(f"axes {list(ctx.attrs.axes)} repeat an axis")
    return [x]


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


register_op("MeanVarianceNormalization", category=Category.NORMALIZATION, infer=_mvn_infer, compute=_mvn_compute)
