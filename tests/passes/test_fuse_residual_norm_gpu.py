"""Row-norm epilogues on a GPU: GEMM + bias + residual + LayerNorm/RMSNorm in one kernel (with and
without split-K in one launch, post- and pre-LN) against ONNX Runtime / numpy, three runs of one
engine (CUDA graph capture and replays: the band counters must come back to zero).

Run on a GPU machine:  python -m pytest tests/passes/test_fuse_residual_norm_gpu.py -q
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import rand, run_ort
from tests.passes.test_fuse_residual_norm import _model

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(
    "batch,seq,k,n,pre_ln",
    [
        (2, 16, 64, 64, False),
        (1, 128, 768, 768, False),
        (1, 128, 3072, 768, True),
        (1, 197, 3072, 768, True),
        (4, 50, 768, 1000, True),
    ],
)
@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("arch", [None, "sm_90"])
def test_rownorm_engine_matches_ort(batch, seq, k, n, pre_ln, precision, arch):
    # arch sm_90 alone (an H100/H200): fp16/bf16 take the wgmma kernel with cluster split-K, whose
    # last cluster of each band normalizes it; the default arch list runs the GPU's own plan
    import graphc

    model = _model(batch, seq, k, n, pre_ln=pre_ln)
    eng = graphc.compile(
        model, target="cuda", precision=precision, row_norm_epilogues=True, **({"arch": [arch]} if arch else {})
    )
    assert "LayerNormalization" not in {s.op for s in eng.plan.steps}
    tol = {"fp16": 3e-3, "bf16": 2e-2, "fp32": 1e-5}[precision]
    for seed in range(3):
        feeds = {"x": rand((batch, seq, k), seed=seed, low=-1, high=1), "r": rand((batch, seq, n), seed=9 + seed)}
        expected = run_ort(model, feeds)
        got = eng.run(feeds, to_numpy=True)
        for name, ref in expected.items():
            err = np.linalg.norm(got[name].astype(np.float64) - ref) / np.linalg.norm(ref)
            assert err < tol, f"run {seed}, {name}: relative error {err:.3g}"


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_gpt2_form_engine_matches_ort(precision):
    import graphc
    from tests.passes.test_fuse_residual_norm import _conv1d_model

    model = _conv1d_model(1, 128, 768, 768)
    eng = graphc.compile(model, target="cuda", precision=precision, row_norm_epilogues=True)
    feeds = {"x": rand((1, 128, 768), seed=1, low=-1, high=1), "r": rand((1, 128, 768), seed=2)}
    expected = run_ort(model, feeds)
    for _ in range(2):
        got = eng.run(feeds, to_numpy=True)
        for name, ref in expected.items():
            err = np.linalg.norm(got[name].astype(np.float64) - ref) / np.linalg.norm(ref)
            assert err < (3e-3 if precision == "fp16" else 1e-5), f"{name}: relative error {err:.3g}"
