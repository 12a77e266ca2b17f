"""The LayerNorm fold's kernel on an sm_90 GPU (docs/layernorm_fold.md), launched directly: the
cp.async wgmma GEMM with LNFOLD on the raw rows h and the folded weights against float64
LayerNorm(h) W + c, and the row statistics it stores against numpy's; one K slice and cluster
split-K, tails (197 rows, N = 200), three launches of one module with new inputs on outputs
poisoned with NaN (a tile share or a statistic no CTA stores shows up).

Run on a GPU machine:  python -m pytest tests/codegen/test_gemm_lnfold_gpu.py -q
"""

from __future__ import annotations

import numpy as np
import pytest

from graphc.codegen import lnfold

pytestmark = pytest.mark.gpu

CASES = [(128, 2304, 768, 3), (128, 3072, 768, 2), (197, 768, 768, 4), (200, 200, 320, 1), (64, 256, 256, 1)]


@pytest.fixture(scope="module")
def arch() -> str:
    from graphc.runtime.cuda import device_arch

    a = device_arch()
    if a != "sm_90":
        pytest.skip("needs an sm_90 GPU (wgmma, thread-block clusters)")
    return a


@pytest.mark.parametrize("m,n,k,splits", CASES, ids=[f"{m}x{n}x{k}-s{s}" for m, n, k, s in CASES])
def test_fold_kernel_matches_layernorm_then_gemm(m, n, k, splits, arch):
    import cupy

    eps = 1e-5
    ctx = lnfold.context(m, n, k, splits=splits, eps=eps)
    kern, fn = lnfold.launchable(ctx)
    out_name, stats_name = ctx.step.outputs[0], kern.args[-1]
    for seed in range(3):
        rng = np.random.default_rng(seed)
        h = (0.5 * seed + rng.standard_normal((m, k))).astype(np.float16)  # means 0, 0.5, 1
        g = 1 + 0.1 * rng.standard_normal(k)
        b = 0.1 * rng.standard_normal(k)
        w = rng.standard_normal((k, n)) / np.sqrt(k)
        c = 0.1 * rng.standard_normal(n)
        f = lnfold.fold_weights(g, b, w, c)
        dev = {name: cupy.asarray(x) for name, x in lnfold.host_args(ctx, kern, h, f).items()}
        fn(kern.grid, kern.block, tuple(dev[x] for x in kern.args), shared_mem=kern.shared_bytes)
        cupy.cuda.runtime.deviceSynchronize()
        out = cupy.asnumpy(dev[out_name]).astype(np.float64)
        stats = cupy.asnumpy(dev[stats_name]).astype(np.float64)
        ref, mean, rstd = lnfold.reference(h, g, b, w, c, eps)
        assert np.isfinite(out).all(), f"launch {seed}: {np.count_nonzero(~np.isfinite(out))} outputs unwritten"
        err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
        assert err < 3e-3, f"launch {seed}: relative error {err:.3g} with {kern.params}"
        assert np.isfinite(stats).all(), f"launch {seed}: row statistics unwritten"
        np.testing.assert_allclose(stats[:, 0], mean, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(stats[:, 1], rstd, rtol=1e-3)
