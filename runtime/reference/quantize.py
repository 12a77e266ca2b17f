"""QuantizeLinear and DequantizeLinear (their newest versions): per-tensor, per-axis and blocked.

    Quantize:   y = saturate(round_half_even(x / y_scale) + y_zero_point)
    Dequantize: y = (x - x_zero_point) * x_scale

The scale's shape sets the granularity: a scalar (or one element) is per-tensor; a 1-D scale runs
along `axis`; a scale of x's rank with `block_size` > 0 repeats each value over a block of
`block_size` along `axis` (the last block may be short). The zero point has the scale's shape.

Quantize divides in the type numpy promotes x and y_scale to (so fp16 by fp16 divides in fp16, as
the spec's "the scale's type sets the precision" says), or in `precision` when given; integer
results round half to even, add the zero point in int32 and saturate to the output type's range.
float8 outputs cast (saturating unless `saturate` = 0; the zero point is not added, it must be 0);
float4e2m1 adds the zero point and casts (the type has no inf to overflow into). Dequantize
subtracts in float32 and multiplies by the scale (float32 at least), then casts to `output_dtype`,
or to the scale's type.

For the CUDA target, passes/decompose_qdq.py rewrites both into Div/Round/Add/Clip/Cast and
Cast/Sub/Mul where the types allow, which the elementwise kernels (and epilogues) run.

This module holds the numpy kernels (what the interpreter and a CPU engine run); type
inference and traits are in graphc.ops.quantize.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from graphc.runtime.dtypes import DType
from graphc.runtime.reference.elementwise import cast_to
from graphc.runtime.reference.registry import register_kernel

# Saturation ranges of the integer quantized types.
INT_RANGES: dict[DType, tuple[int, int]] = {
    DType.uint8: (0, 255),
    DType.int8: (-128, 127),
    DType.uint16: (0, 65535),
    DType.int16: (-32768, 32767),
    DType.uint4: (0, 15),
    DType.int4: (-8, 7),
    DType.uint2: (0, 3),
    DType.int2: (-2, 1),
}
FLOAT8 = frozenset({DType.float8e4m3fn, DType.float8e4m3fnuz, DType.float8e5m2, DType.float8e5m2fnuz})


def scale_layout(x_shape: tuple, s_shape: tuple, axis: int, block_size: int, fail) -> tuple[str, int]:
    """('tensor' | 'axis' | 'block', the normalized axis) for a scale of `s_shape` against x; `fail`
    reports an invalid combination."""
    rank = len(x_shape)
    size = int(np.prod(s_shape)) if len(s_shape) else 1
    if block_size < 0:
        fail(f"block_size must be positive, got {block_size}")
    if block_size == 0 and size == 1 and len(s_shape) <= 1:
        return "tensor", 0
    if rank == 0:
        fail(f"a scale of shape {list(s_shape)} for a scalar input")
    if not -rank <= axis < rank:
        fail(f"axis {axis} is out of range for rank {rank}")
    axis = axis + rank if axis < 0 else axis
    if block_size == 0:
        if len(s_shape) != 1:
            fail(f"a per-axis scale must be 1-D, got shape {list(s_shape)} (blocked scales need block_size)")
        if isinstance(x_shape[axis], int) and s_shape[0] != x_shape[axis]:
            fail(f"the scale has {s_shape[0]} values for axis {axis} of size {x_shape[axis]}")
        return "axis", axis
    if len(s_shape) != rank:
        fail(f"a blocked scale must have the input's rank {rank}, got shape {list(s_shape)}")
    for d, (xd, sd) in enumerate(zip(x_shape, s_shape, strict=True)):
        if not isinstance(xd, int):
            continue
        if d == axis:
            blocks = -(-xd // block_size)
            if blocks != sd:
                fail(f"axis {axis} of size {xd} in blocks of {block_size} needs {blocks} scales, got {sd}")
        elif xd != sd:
            fail(f"the blocked scale's shape {list(s_shape)} differs from the input's {list(x_shape)} off axis {axis}")
    return "block", axis


def broadcast_param(p: np.ndarray, x_shape: tuple, axis: int, block_size: int) -> np.ndarray:
    """A scale or zero point as an array that broadcasts against x elementwise."""
    p = np.asarray(p)
    kind, axis = scale_layout(tuple(x_shape), p.shape, axis, block_size, _raise)
    if kind == "tensor":
        return p.reshape(())
    if kind == "axis":
        shape = [1] * len(x_shape)
        shape[axis] = p.shape[0]
        return p.reshape(shape)
    return np.repeat(p, block_size, axis=axis).take(np.arange(x_shape[axis]), axis=axis)


def _raise(message: str):
    raise ValueError(message)


def _quantize_compute(ins, attrs, n):
    x, scale = np.asarray(ins[0]), np.asarray(ins[1])
    zp = ins[2] if len(ins) > 2 else None
    out = DType.from_onnx(attrs.output_dtype) if attrs.output_dtype else DType.uint8
    if zp is not None:
        out = DType.from_numpy(np.asarray(zp).dtype)
    s = broadcast_param(scale, x.shape, attrs.axis, attrs.block_size)
    p = division_dtype(x.dtype, s.dtype, attrs.precision)
    q = x.astype(p) / s.astype(p)
    if out in INT_RANGES:
        lo, hi = INT_RANGES[out]
        r = np.rint(q.astype(np.float64))
        if zp is not None:
            r = r + broadcast_param(np.asarray(zp), x.shape, attrs.axis, attrs.block_size).astype(np.float64)
        return [cast_to(np.clip(np.nan_to_num(r, nan=lo), lo, hi).astype(np.int64), out)]
    if out in FLOAT8:
        return [cast_to(q.astype(np.float32), out, saturate=bool(attrs.saturate))]
    if zp is not None:  # float4e2m1
        q = q.astype(np.float32) + broadcast_param(np.asarray(zp), x.shape, attrs.axis, attrs.block_size).astype(
            np.float32
        )
    return [cast_to(q.astype(np.float32), out)]


# numpy has no arithmetic promotion for these: they take part as float32.
_AS_FLOAT32 = (np.dtype(ml_dtypes.bfloat16), np.dtype(ml_dtypes.float8_e8m0fnu))


def division_dtype(x: np.dtype, s: np.dtype, precision: int = 0) -> np.dtype:
    """The type QuantizeLinear divides x by its scale in: `precision` when set, else numpy's
    promotion of the two (bfloat16 and float8e8m0 taken as float32). passes/decompose_qdq.py
    divides in the same type."""
    if precision:
        return DType.from_onnx(precision).numpy
    widen = [np.dtype(np.float32) if d in _AS_FLOAT32 else d for d in (np.dtype(x), np.dtype(s))]
    return np.result_type(*widen)


def _dequantize_compute(ins, attrs, n):
    x, scale = np.asarray(ins[0]), np.asarray(ins[1])
    zp = ins[2] if len(ins) > 2 else None
    out = DType.from_onnx(attrs.output_dtype).numpy if attrs.output_dtype else scale.dtype
    dx = x.astype(np.float32)
    xt = DType.from_numpy(x.dtype)
    if zp is not None and xt not in FLOAT8:
        dx = dx - broadcast_param(np.asarray(zp), x.shape, attrs.axis, attrs.block_size).astype(np.float32)
    s = broadcast_param(scale, x.shape, attrs.axis, attrs.block_size)
    if s.dtype in _AS_FLOAT32:
        s = s.astype(np.float32)
    return [(dx * s).astype(out)]


register_kernel("QuantizeLinear", _quantize_compute)
register_kernel("DequantizeLinear", _dequantize_compute)
