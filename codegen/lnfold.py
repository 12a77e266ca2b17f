"""The LayerNorm fold's pieces outside the kernel (docs/layernorm_fold.md): the folded weights, a
one-step GEMM context for the cp.async wgmma kernel with LNFOLD, and the float64 reference.

    LayerNorm(h; g, b) W + c = rstd * (h W' - mean * colsum(W')) + (b W + c),   W' = diag(g) W

W' is rounded to the engine's 16-bit type and colsum taken over the rounded values (what the MMA
sums), so the correction cancels the mean exactly in exact arithmetic. Nothing in the compiler uses
this yet: tests/codegen/test_gemm_lnfold*.py and tools/bench_lnfold.py do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from graphc.ir.types import DType


@dataclass(frozen=True)
class FoldedWeights:
    w: np.ndarray  # W' = diag(g) W in the GEMM's storage type, [K, N]
    colsum: np.ndarray  # fp32 [N]: column sums of W' as stored
    shift: np.ndarray  # fp32 [N]: b W + c


def _storage(x: np.ndarray, dtype: DType) -> np.ndarray:
    if dtype not in (DType.float16, DType.bfloat16):
        raise ValueError(f"the LayerNorm fold takes fp16 or bf16 GEMMs, not {dtype.name}")
    from graphc.runtime.cpu import numpy_dtype

    return x.astype(numpy_dtype(dtype.name))


def fold_weights(
    g: np.ndarray, b: np.ndarray | None, w: np.ndarray, c: np.ndarray | None, dtype: DType = DType.float16
) -> FoldedWeights:
    """W' = diag(g) W (rounded to `dtype`), colsum(W') and b W + c, for W [K, N] (float)."""
    w = np.asarray(w, np.float32)
    k, n = w.shape
    wp = _storage(np.asarray(g, np.float32).reshape(k, 1) * w, dtype)
    colsum = wp.astype(np.float32).sum(0, dtype=np.float32)
    shift = np.zeros(n, np.float32)
    if b is not None:
        shift += np.asarray(b, np.float32) @ w
    if c is not None:
        shift += np.asarray(c, np.float32)
    return FoldedWeights(wp, colsum.astype(np.float32), shift.astype(np.float32))


def context(
    m: int, n: int, k: int, *, dtype: DType = DType.float16, splits: int = 1, eps: float = 1e-5, bn: int = 64
) -> Any:
    """A standalone MatMul step [M, K] x [K, N] on the cp.async wgmma kernel with the fold: 64-row
    tiles, `splits` K slices as one cluster (1: none)."""
    from graphc.codegen.families.gemm import standalone_context

    params: dict[str, Any] = {"path": "wgmma", "BM": 64, "BN": bn, "BK": 64, "STAGES": 4 if splits > 1 else 6}
    params.update({"SPLITS": splits, "LNFOLD": 1, "LN_EPS": float(eps)})
    if splits > 1:
        params["CLUSTER"] = 1
    return standalone_context("MatMul", [(m, k), (k, n)], dtype, params=params)


def launchable(ctx: Any) -> tuple[Any, Any]:
    """(the fold kernel's KernelSource, its cupy function) for `ctx` on the local GPU: generated,
    compiled with NVRTC, loaded, its dynamic shared memory allowed. Needs cupy and an sm_90 GPU."""
    import cupy

    from graphc.codegen.kernel import family_for
    from graphc.codegen.nvrtc import compile_cubin
    from graphc.runtime.cuda import allow_large_shared_memory

    (kernel,) = family_for(ctx).generate(ctx)
    module = cupy.cuda.function.Module()
    module.load(compile_cubin(kernel.source, kernel.name, kernel.params["requires_arch"]))
    fn = module.get_function(kernel.name)
    allow_large_shared_memory(fn, kernel.shared_bytes)
    return kernel, fn


def host_args(ctx: Any, kernel: Any, h: np.ndarray, folded: FoldedWeights) -> dict[str, np.ndarray]:
    """The kernel's arguments by name for a direct launch: h, W', colsum, shift, and the output and
    row statistics filled with NaN (an element no CTA stores stays NaN)."""
    m, n = h.shape[0], folded.w.shape[1]
    a_name, b_name = ctx.step.inputs[:2]
    cs, shift, stats = kernel.args[-3:]
    return {
        a_name: h,
        b_name: folded.w,
        cs: folded.colsum,
        shift: folded.shift,
        ctx.step.outputs[0]: np.full((m, n), np.nan, h.dtype),
        stats: np.full((m, 2), np.nan, np.float32),
    }


def reference(
    h: np.ndarray, g: np.ndarray, b: np.ndarray | None, w: np.ndarray, c: np.ndarray | None, eps: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(LayerNorm(h) W + c, mean, rstd) in float64 from h as given (the engine's 16-bit rows)."""
    hd = np.asarray(h, np.float64)
    mean = hd.mean(-1, keepdims=True)
    rstd = 1.0 / np.sqrt(hd.var(-1, keepdims=True) + eps)
    y = (hd - mean) * rstd * np.asarray(g, np.float64)
    if b is not None:
        y = y + np.asarray(b, np.float64)
    out = y @ np.asarray(w, np.float64)
    if c is not None:
        out = out + np.asarray(c, np.float64)
    return out, mean[..., 0], rstd[..., 0]
