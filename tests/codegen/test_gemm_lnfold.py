"""The LayerNorm fold's kernel without a GPU (docs/layernorm_fold.md): the folded weights reproduce
LayerNorm + GEMM as the kernel computes it (numpy, the kernel's fp32 formula), the cp.async wgmma
kernel with LNFOLD renders and compiles for sm_90a with and without cluster split-K and carries its
three extra arguments, its SASS keeps the wgmma, and the forms it does not take are refused."""

from __future__ import annotations

import numpy as np
import pytest

from graphc.codegen import lnfold
from graphc.codegen.families.gemm import LNFOLD_ARGS, standalone_context
from graphc.codegen.kernel import family_for
from graphc.errors import CompileError
from graphc.ir.types import DType


def _emulate(h16: np.ndarray, f: lnfold.FoldedWeights, eps: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The kernel's arithmetic in numpy: sums in fp32, the GEMM of the 16-bit operands, correction."""
    hf = h16.astype(np.float32)
    k = hf.shape[1]
    s1 = hf.sum(1, dtype=np.float32)
    s2 = (hf * hf).sum(1, dtype=np.float32)
    mean = s1 / k
    rstd = 1 / np.sqrt(np.maximum(s2 / k - mean * mean, 0) + eps)
    acc = hf @ f.w.astype(np.float32)
    return rstd[:, None] * (acc - mean[:, None] * f.colsum) + f.shift, mean, rstd


@pytest.mark.parametrize("mean", [0.0, 3.0])
def test_folded_weights_reproduce_layernorm_then_gemm(mean):
    rng = np.random.default_rng(0)
    m, k, n, eps = 64, 256, 192, 1e-5
    h16 = (mean + rng.standard_normal((m, k))).astype(np.float16)
    g = 1 + 0.1 * rng.standard_normal(k)
    b = 0.1 * rng.standard_normal(k)
    w = rng.standard_normal((k, n)) / np.sqrt(k)
    c = 0.1 * rng.standard_normal(n)
    f = lnfold.fold_weights(g, b, w, c)
    assert f.w.dtype == np.float16 and f.colsum.dtype == np.float32 and f.shift.dtype == np.float32
    ref, rmean, rrstd = lnfold.reference(h16, g, b, w, c, eps)
    out, emean, erstd = _emulate(h16, f, eps)
    err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    assert err < 2e-3, err  # the rounding of W' to fp16, as today's LayerNorm output is rounded
    np.testing.assert_allclose(emean, rmean, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(erstd, rrstd, rtol=1e-4)
    # a wrong fold is caught at this tolerance: the shift without b W, or colsum of the unrounded W'
    bad = rrstd[:, None] * (h16.astype(np.float32) @ f.w.astype(np.float32) - rmean[:, None] * f.colsum) + c
    assert np.linalg.norm(bad - ref) / np.linalg.norm(ref) > 1e-2


def test_no_shift_without_bias_and_c():
    f = lnfold.fold_weights(np.ones(8), None, np.eye(8), None)
    assert not f.shift.any() and np.array_equal(f.colsum, np.ones(8, np.float32))
    with pytest.raises(ValueError, match="fp16 or bf16"):
        lnfold.fold_weights(np.ones(8), None, np.eye(8), None, DType.float32)


@pytest.mark.parametrize("m,n,k,splits", [(128, 2304, 768, 3), (197, 768, 768, 4), (200, 200, 320, 1)])
def test_fold_kernel_renders_and_compiles(m, n, k, splits):
    pytest.importorskip("cuda.bindings.nvrtc")
    from graphc.codegen.nvrtc import compile_cubin

    ctx = lnfold.context(m, n, k, splits=splits)
    (kern,) = family_for(ctx).generate(ctx)
    p = kern.params
    assert p["LNFOLD"] == 1 and p["path"] == "wgmma" and p["SPLITS"] == splits
    assert (p.get("CLUSTER") == 1) == (splits > 1) and kern.workspace_bytes == 0
    assert kern.args[-3:] == [f"{ctx.step.name}/{a}" for a in LNFOLD_ARGS]
    assert kern.block == (128, 1, 1) and "gc_ln_cs" in kern.source and "rsqrtf" in kern.source
    assert kern.shared_bytes <= 227 * 1024
    cubin = compile_cubin(kern.source, kern.name, p["requires_arch"])
    assert cubin[:4] == b"\x7fELF"


def test_fold_kernel_keeps_hgmma():
    pytest.importorskip("cuda.bindings.nvrtc")
    import subprocess

    from helpers import cuobjdump_path

    tool = cuobjdump_path()
    if tool is None:
        pytest.skip("cuobjdump not installed")
    from graphc.codegen.nvrtc import compile_cubin

    ctx = lnfold.context(128, 768, 768, splits=4)
    (kern,) = family_for(ctx).generate(ctx)
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "k.cubin"
        f.write_bytes(compile_cubin(kern.source, kern.name, kern.params["requires_arch"]))
        sass = subprocess.run([tool, "-sass", str(f)], capture_output=True, text=True, check=True).stdout
    assert "HGMMA" in sass and "UCGABAR_ARV" in sass


def test_fold_refuses_what_it_does_not_take():
    base = {"path": "wgmma", "BM": 64, "BN": 64, "BK": 64, "STAGES": 4, "LNFOLD": 1}
    cases = [
        ({**base, "SPLITS": 2, "SERIAL": 1}, [(128, 768), (768, 768)], {}, "cluster split-K"),
        ({**base, "path": "mma", "BK": 32, "WM": 2, "WN": 2, "SPLITS": 1}, [(128, 768), (768, 768)], {}, "wgmma"),
    ]
    for params, shapes, _attrs, msg in cases:
        ctx = standalone_context("MatMul", shapes, DType.float16, params=params)
        with pytest.raises(CompileError, match=msg):
            family_for(ctx).generate(ctx)
