"""Ops of graphc's own (domain "graphc") that passes create; no ONNX file contains them.

- graphc.MatMul: a (batched) matmul with transposed-operand flags and a scale, so that transpose
  elimination can fold a Transpose of the last two dims into the matmul that reads it:
  Y = alpha * op(A) @ op(B), op(X) = X with its last two dims swapped when the flag is set.

This module holds type inference and traits; the numpy kernels are in
graphc.runtime.reference.internal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from graphc.ir.attrs import Attrs
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
