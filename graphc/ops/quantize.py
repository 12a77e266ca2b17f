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

This module holds type inference and traits; the numpy kernels are in
graphc.runtime.reference.quantize.
"""

from __future__ import annotations

from graphc.ir.types import DType, TensorType, ValueType
from graphc.ops.elementwise import check_types
from graphc.ops.registry import Category, InferContext, register_op
from graphc.runtime.reference.quantize import FLOAT8, scale_layout
from graphc.runtime.reference.quantize import INT_RANGES as INT_RANGES
from graphc.runtime.reference.quantize import broadcast_param as broadcast_param
from graphc.runtime.reference.quantize import division_dtype as division_dtype

QUANT_TYPES = frozenset(INT_RANGES) | FLOAT8 | {DType.float4e2m1}


def _dtype_attr(ctx: InferContext, code: int) -> DType | None:
    """The DType of a type-code attribute; None for 0 (not set)."""
    if not code:
        return None
    try:
        return DType.from_onnx(int(code))
    except ValueError:
        ctx.fail(f"type {code} is not a type graphc supports")


def quantize_output_dtype(ctx: InferContext) -> DType:
    out = _dtype_attr(ctx, ctx.attrs.output_dtype)
    if ctx.has_input(2):
        zp = ctx.type(2).dtype
        if out is not None and out != zp:
            ctx.fail(f"output_dtype {out.name} differs from the zero point's type {zp.name}")
        out = zp
    out = out or DType.uint8
    if out not in QUANT_TYPES:
        ctx.fail(f"{out.name} is not a quantized type ({', '.join(sorted(d.name for d in QUANT_TYPES))})")
    return out


def _single(shape) -> bool:
    return shape is not None and len(shape) <= 1 and all(d == 1 for d in shape)


def _check_params(ctx: InferContext, scale_index: int) -> None:
    x, s = ctx.type(0), ctx.type(scale_index)
    if ctx.has_input(2) and ctx.type(2).shape != s.shape and not (_single(ctx.type(2).shape) and _single(s.shape)):
        # (a scalar and a one-element 1-D tensor both mean per-tensor: exporters mix them)
        ctx.fail(f"the zero point's shape {ctx.type(2).shape} differs from the scale's {s.shape}")
    if x.shape is not None and s.shape is not None and all(isinstance(d, int) for d in s.shape):
        scale_layout(tuple(x.shape), tuple(s.shape), ctx.attrs.axis, ctx.attrs.block_size, ctx.fail)


def _quantize_infer(ctx: InferContext) -> list[ValueType]:
    check_types(ctx)
    _check_params(ctx, 1)
    if ctx.attrs.precision:
        p = _dtype_attr(ctx, ctx.attrs.precision)
        if p not in (DType.float32, DType.float16, DType.bfloat16, DType.float64):
            ctx.fail(f"precision {p.name} is not a float type")
    return [TensorType(quantize_output_dtype(ctx), ctx.type(0).shape)]


def dequantize_output_dtype(ctx: InferContext) -> DType:
    out = _dtype_attr(ctx, ctx.attrs.output_dtype) or ctx.type(1).dtype
    if out not in (DType.float32, DType.float16, DType.bfloat16):
        ctx.fail(f"output type {out.name}: set output_dtype to float, float16 or bfloat16")
    return out


def _dequantize_infer(ctx: InferContext) -> list[ValueType]:
    check_types(ctx)
    _check_params(ctx, 1)
    return [TensorType(dequantize_output_dtype(ctx), ctx.type(0).shape)]


register_op("QuantizeLinear", category=Category.OTHER, infer=_quantize_infer)
register_op("DequantizeLinear", category=Category.OTHER, infer=_dequantize_infer)
