"""Horizontal GEMM fusion on a GPU: the Q/K/V model compiled for CUDA (one batched GEMM, its
slabs read as views at byte offsets, split-K in one launch at a long K) against ONNX Runtime.

Run on a GPU machine:  python -m pytest tests/passes/test_fuse_horizontal_gpu.py -q
"""

from __future__ import annotations

import numpy as np
import pytest

from graphc.runtime.plan import ALIAS
from tests.helpers import rand, run_ort
from tests.passes.test_fuse_horizontal import _qkv_model

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(
    "batch,seq,k,n,out_q",
    [(2, 16, 64, 64, True), (1, 128, 768, 768, False), (1, 64, 3072, 256, True)],
)
def test_qkv_engine_matches_ort(batch, seq, k, n, out_q, tmp_path):
    import graphc

    model = _qkv_model(batch, seq, k, n, out_q=out_q)
    eng = graphc.compile(model, target="cuda", precision="fp16")
    assert any(t.kind == ALIAS and t.alias_offset for t in eng.plan.tensors.values())
    feeds = {"x": rand((batch, seq, k), seed=4, low=-1.0, high=1.0)}
    expected = run_ort(model, feeds)
    for run in range(2):  # the second run is a CUDA graph replay
        got = eng.run(feeds, to_numpy=True)
        for name, ref in expected.items():
            err = np.linalg.norm(got[name].astype(np.float64) - ref) / np.linalg.norm(ref)
            assert err < 3e-3, f"run {run}, {name}: relative error {err:.3g}"
    # and the same after a save and load (the views' offsets through the engine file)
    path = tmp_path / "qkv.engine"
    eng.save(path)
    import graphc.runtime

    back = graphc.runtime.load(path).run(feeds, to_numpy=True)
    for name, ref in expected.items():
        assert np.linalg.norm(back[name].astype(np.float64) - ref) / np.linalg.norm(ref) < 3e-3
