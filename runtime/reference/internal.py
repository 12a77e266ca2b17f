"""Ops of graphc's own (domain "graphc") that passes create; no ONNX file contains them.

- graphc.MatMul: a (batched) matmul with transposed-operand flags and a scale, so that transpose
  elimination can fold a Transpose of the last two dims into the matmul that reads it:
  Y = alpha * op(A) @ op(B), op(X) = X with its last two dims swapped when the flag is set.

This module holds the numpy kernels (what the interpreter and a CPU engine run); type
inference and traits are in graphc.ops.internal.
"""

from __future__ import annotations

import numpy as np

from graphc.runtime.reference.registry import register_kernel

INTERNAL_DOMAIN = "graphc"


def _matmul_t_compute(ins, attrs, n):
    a, b = ins[0], ins[1]
    if attrs.trans_a:
        a = np.swapaxes(a, -1, -2)
    if attrs.trans_b:
        b = np.swapaxes(b, -1, -2)
    dt = a.dtype
    acc = np.float32 if dt in (np.float16,) or dt.name == "bfloat16" else dt
    y = np.matmul(a.astype(acc), b.astype(acc))
    if attrs.alpha != 1.0:
        y = y * np.asarray(attrs.alpha, dtype=acc)
    return [y.astype(dt)]


register_kernel("MatMul", _matmul_t_compute, domain=INTERNAL_DOMAIN)


def _matmul_fp8_compute(ins, attrs, n):
    """graphc.MatMulFp8: the e4m3 operands widened to float32 (exact), their products summed in
    float32 (numpy's sgemm; an e4m3 x e4m3 product is exact in float32, so only the sums round, as
    in the GPU's fp32 accumulators, in another order), times alpha in float32, then `to`."""
    from graphc.runtime.dtypes import DType

    a = np.asarray(ins[0]).astype(np.float32)
    b = np.asarray(ins[1]).astype(np.float32)
    y = np.matmul(a, b.T)
    if attrs.alpha != 1.0:
        y = y * np.float32(attrs.alpha)
    return [y.astype(DType(attrs.to).numpy)]


register_kernel("MatMulFp8", _matmul_fp8_compute, domain=INTERNAL_DOMAIN)
