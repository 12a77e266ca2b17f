"""Ops of graphc's own (domain "graphc") that passes create; no ONNX file contains them.

- graphc.MatMul: a (batched) matmul with transposed-operand flags and a scale, so that transpose
  elimination can fold a Transpose of the last two dims into the matmul that reads it:
  Y = alpha * op(A) @ op(B), op(X) = X with its last two dims swapped when the flag is set.
- graphc.MatMulFp8: the FP8 GEMM of an fp8 engine (passes/quantize_fp8.py):
  Y [..., N] = alpha * (A [..., K] . B [N, K]^T) with A and B float8e4m3fn, products summed in
  float32, Y in `to` (float32 when built; the precision pass retypes it with the engine's storage
  type, as it does a Cast to float32). B is [N, K] so that both operands are K-major, the layout
  the sm_90 FP8 wgmma reads; alpha is the dequantize scale (activation scale x weight scale).

This module holds type inference and traits; the numpy kernels are in
graphc.runtime.reference.internal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from graphc.ir.attrs import Attrs
from graphc.ir.types import DType, TensorType
from graphc.ops.registry import Category, InferContext, broadcast_shapes, register_op
from graphc.runtime.reference.internal import INTERNAL_DOMAIN as INTERNAL_DOMAIN


@dataclass(frozen=True, kw_only=True)
class MatMulTAttrs(Attrs):
    op_type: ClassVar[str] = "MatMul"
    domain: ClassVar[str] = INTERNAL_DOMAIN
    trans_a: int = 0
    trans_b: int = 0
    alpha: float = 1.0


def _swap_last(shape, flag):
    if not flag:
        return tuple(shape)
    return (*shape[:-2], shape[-1], shape[-2])


def _matmul_t_infer(ctx: InferContext):
    a, b = ctx.type(0), ctx.type(1)
    if a.dtype != b.dtype:
        ctx.fail(f"operand dtypes differ: {a.dtype.name} and {b.dtype.name}")
    if a.shape is None or b.shape is None:
        return [a.with_shape(None)]
    if len(a.shape) < 2 or len(b.shape) < 2:
        ctx.fail("operands must have rank 2 or more")
    sa = _swap_last(a.shape, ctx.attrs.trans_a)
    sb = _swap_last(b.shape, ctx.attrs.trans_b)
    k1, k2 = sa[-1], sb[-2]
    if isinstance(k1, int) and isinstance(k2, int) and k1 != k2:
        ctx.fail(f"inner dims differ: {sa} @ {sb}")
    batch = broadcast_shapes(ctx, sa[:-2], sb[:-2])
    return [a.with_shape(None if batch is None else (*batch, sa[-2], sb[-1]))]


register_op(
    "MatMul",
    domain=INTERNAL_DOMAIN,
    attrs=MatMulTAttrs,
    category=Category.MATMUL,
    infer=_matmul_t_infer,
    doc="Batched matmul with transposed-operand flags and a scale.",
)


@dataclass(frozen=True, kw_only=True)
class MatMulFp8Attrs(Attrs):
    op_type: ClassVar[str] = "MatMulFp8"
    domain: ClassVar[str] = INTERNAL_DOMAIN
    alpha: float = 1.0
    to: int = DType.float32.value  # the output's dtype (an ONNX TensorProto code, as Cast's `to`)


FP8_OUT = (DType.float32, DType.float16, DType.bfloat16)


def _matmul_fp8_infer(ctx: InferContext):
    a, b = ctx.type(0), ctx.type(1)
    for i, t in ((0, a), (1, b)):
        if t.dtype is not DType.float8e4m3fn:
            ctx.fail(f"input {i} is {t.dtype.name}: MatMulFp8 takes float8e4m3fn operands")
    out = DType(ctx.attrs.to)
    if out not in FP8_OUT:
        ctx.fail(f"output dtype {out.name}: one of {', '.join(d.name for d in FP8_OUT)}")
    if a.shape is None or b.shape is None:
        return [TensorType(out, None)]
    if len(a.shape) < 1 or len(b.shape) != 2:
        ctx.fail(f"operands {a.shape} . {b.shape}^T: A [..., K] and a 2-D B [N, K]")
    if isinstance(a.shape[-1], int) and isinstance(b.shape[1], int) and a.shape[-1] != b.shape[1]:
        ctx.fail(f"inner dims differ: {a.shape} . {b.shape}^T")
    return [TensorType(out, (*a.shape[:-1], b.shape[0]))]


register_op(
    "MatMulFp8",
    domain=INTERNAL_DOMAIN,
    attrs=MatMulFp8Attrs,
    category=Category.MATMUL,
    infer=_matmul_fp8_infer,
    doc="FP8 E4M3 matmul A . B^T with float32 accumulation and a dequantize scale.",
)
