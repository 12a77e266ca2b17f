"""The roi_align family without a GPU: RoiAlign's direct kernel for both modes, both coordinate
modes, two sampling ratios and scales, boxes inside, across the edge, outside and degenerate
(tests/graphc/ops/test_sampling.py's), in float32, float16 and float64: renders, takes this family,
compiles with NVRTC for sm_80 and sm_90 and, compiled for the host by cuda_emulator.py (the kernel's
own text, one thread at a time), equals the numpy reference (ONNX's definition); a batch index
outside X writes 0 there. graphc.compile and `graphc check --target cuda` take the op."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import graphc
from helpers import make_node_model, rand

sys.path.insert(0, str(Path(__file__).parent))  # rd_helpers, cuda_emulator beside this file
sys.path.insert(0, str(Path(__file__).parent.parent / "graphc" / "ops"))
from rd_helpers import compile_each, kernels_of  # noqa: E402
from test_grid_sample import _HOST_PRELUDE  # noqa: E402
from test_sampling import _rois  # noqa: E402

TOLERANCE = {"float32": 1e-6, "float64": 1e-12, "float16": 1e-3}  # relative to max(1, |expected|)


def _model(mode, ctm, sampling, scale, dtype, opset=16, idx=None):
    x = rand((2, 3, 7, 8), seed=11).astype(dtype)
    rois, batch = _rois()
    attrs = {"mode": mode, "output_height": 3, "output_width": 2, "sampling_ratio": sampling, "spatial_scale": scale}
    if opset >= 16:
        attrs["coordinate_transformation_mode"] = ctm
    feeds = {"X": x, "rois": rois.astype(dtype), "batch_indices": batch if idx is None else idx}
    return make_node_model("RoiAlign", feeds, attrs, opset=opset), feeds


def _emulate(src, feeds: dict, out_shape, dtype) -> np.ndarray:
    from cuda_emulator import run_template_kernel

    return run_template_kernel(src, "roi_align.cu.j2", _HOST_PRELUDE, feeds, "y", out_shape, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("ctm", ["half_pixel", "output_half_pixel"])
@pytest.mark.parametrize(("sampling", "scale"), [(0, 1.0), (2, 0.5)])
def test_kernel_compiles_and_matches_reference_on_host(mode, ctm, sampling, scale, dtype):
    model, feeds = _model(mode, ctm, sampling, scale, dtype)
    (want,) = graphc.interpret(graphc.load_onnx(model), feeds).values()
    (src,) = kernels_of(model, family="roi_align")
    assert src.family == "roi_align" and src.args == ["X", "rois", "batch_indices", "y"]
    compile_each([src])
    got = _emulate(src, feeds, want.shape, dtype)
    w = want.astype(np.float64)
    tol = TOLERANCE[np.dtype(dtype).name]
    np.testing.assert_allclose(got.astype(np.float64), w, rtol=tol, atol=tol * max(1.0, float(np.abs(w).max())))


def test_opset_10_and_a_bad_batch_index():
    # opset 10 is output_half_pixel; a batch index outside X writes 0 on CUDA (the CPU target raises)
    model, feeds = _model("avg", None, 0, 1.0, np.float32, opset=10)
    (want,) = graphc.interpret(graphc.load_onnx(model), feeds).values()
    (src,) = kernels_of(model, family="roi_align")
    np.testing.assert_allclose(_emulate(src, feeds, want.shape, np.float32), want, rtol=1e-6, atol=1e-6)
    feeds["batch_indices"] = np.array([0, 1, 2, 0, -1], np.int64)
    got = _emulate(src, feeds, want.shape, np.float32)
    assert (got[2] == 0).all() and (got[4] == 0).all()
    np.testing.assert_allclose(got[[0, 1, 3]], want[[0, 1, 3]], rtol=1e-6, atol=1e-6)


def test_cuda_compile_and_check_take_it(tmp_path):
    import onnx

    from graphc.cli import main

    model, _ = _model("max", "half_pixel", 2, 0.5, np.float32)
    path = tmp_path / "roi.onnx"
    onnx.save(model, str(path))
    assert main(["check", str(path), "--target", "cuda"]) == 0
    eng = graphc.compile(model, target="cuda", arch=["sm_90"], precision="fp16")
    assert "RoiAlign" in {s.op for s in eng.plan.steps}
