"""QDQ models on the GPU: ONNX Runtime-quantized zoo models run as CUDA engines and reproduce the
quantization of the CPU engine (which equals ONNX Runtime exactly, tests/passes/test_decompose_qdq.py)."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
from helpers import quantize_zoo_model

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name", ["resnet", "mobilenetv2", "bert"])
def test_quantized_zoo_model_on_cuda(name, tmp_path):
    pytest.importorskip("onnxruntime.quantization")
    q, feeds = quantize_zoo_model(name, tmp_path)
    shapes = {k: v.shape for k, v in feeds.items()}
    cpu = graphc.compile(q, target="cpu", shapes=shapes).run(feeds)
    gpu = graphc.compile(q, target="cuda", shapes=shapes).run(feeds, to_numpy=True)
    for k, ref in cpu.items():
        got = np.asarray(gpu[k], dtype=np.float64)
        ref = np.asarray(ref, dtype=np.float64)
        scale = float(np.abs(ref).max())
        # The GPU sums in another order, so an activation on a rounding boundary can land one
        # quantization step away and carry that through later layers: few elements, small errors.
        err = np.abs(got - ref)
        assert np.isfinite(got).all()
        assert (err > 1e-6 * scale).mean() < 0.05, f"{name}/{k}: {(err > 1e-6 * scale).mean():.3f} differ"
        assert err.max() <= 0.05 * scale, f"{name}/{k}: max error {err.max():.3g} of scale {scale:.3g}"
