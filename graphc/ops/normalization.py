"""Normalization ops: BatchNormalization, InstanceNormalization, GroupNormalization,
LayerNormalization, RMSNormalization, LpNormalization, MeanVarianceNormalization.

IR forms are the newest ONNX versions (GroupNormalization: scale and bias per channel, opset 21;
the frontend converts opset 18's per-group form). Statistics are computed in float32, or in
float64 when an input is float64 (or `stash_type` asks for it), and the result is cast back to
the output dtype once: float16 inputs neither overflow in x*x nor lose the mean.

This module holds type inference and traits; the numpy kernels are in
graphc.runtime.reference.normalization.
"""

from __future__ import annotations

import onnx.defs

from graphc.ir.types import DType, Shape, TensorType
from graphc.ops.registry import Category, InferContext, register_op


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


register_op("BatchNormalization", category=Category.NORMALIZATION, infer=_bn_infer)

# ---- InstanceNormalization ---------------------------------------------------------------------


def _in_infer(ctx: InferContext) -> list[TensorType]:
    x = _float_type(ctx, 0, "input")
    _min_rank(ctx, x, "input", 2)
    c = x.shape[1] if x.shape is not None else None
    _check_vector(ctx, 1, "scale", c)
    _check_vector(ctx, 2, "B", c)
    return [x]


register_op("InstanceNormalization", category=Category.NORMALIZATION, infer=_in_infer)

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


def _stash_dtype(ctx: InferContext) -> DType:
    try:
        dt = DType.from_onnx(ctx.attrs.stash_type)
    except ValueError:
        dt = None
    if dt is None or not dt.is_float:
        ctx.fail(f"stash_type {ctx.attrs.stash_type} is not a float type")
    return dt


register_op("GroupNormalization", category=Category.NORMALIZATION, infer=_gn_infer)

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


register_op("LayerNormalization", category=Category.NORMALIZATION, infer=_ln_infer)


def _rms_infer(ctx: InferContext) -> list[TensorType]:
    x = _float_type(ctx, 0, "X")
    _trailing_axis(ctx, x)
    _check_unidirectional(ctx, x, 1, "scale")
    _stash_dtype(ctx)
    # Y has the type of scale (V), not of X.
    return [x.with_dtype(ctx.type(1).dtype)]


def _has_schema(op: str) -> bool:
    try:
        onnx.defs.get_schema(op)
    except onnx.defs.SchemaError:
        return False
    return True


HAS_RMS_NORMALIZATION = _has_schema("RMSNormalization")  # opset 23; older onnx lacks it
if HAS_RMS_NORMALIZATION:
    register_op("RMSNormalization", category=Category.NORMALIZATION, infer=_rms_infer)

# ---- LpNormalization, MeanVarianceNormalization ------------------------------------------------


def _lp_infer(ctx: InferContext) -> list[TensorType]:
    x = _float_type(ctx, 0, "input")
    if ctx.attrs.p not in (1, 2):
        ctx.fail(f"p={ctx.attrs.p} is not supported (the spec allows 1 and 2)")
    _trailing_axis(ctx, x)
    return [x]


register_op("LpNormalization", category=Category.NORMALIZATION, infer=_lp_infer)


def _mvn_infer(ctx: InferContext) -> list[TensorType]:
    x = _float_type(ctx, 0, "X")
    if x.shape is not None:
        rank = len(x.shape)
        norm = [ctx.axis(a, rank) for a in ctx.attrs.axes]
        if len(set(norm)) != len(norm):
            ctx.fail(f"axes {list(ctx.attrs.axes)} repeat an axis")
    return [x]


register_op("MeanVarianceNormalization", category=Category.NORMALIZATION, infer=_mvn_infer)
