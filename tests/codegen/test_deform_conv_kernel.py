"""The deform_conv family without a GPU: DeformConv's direct kernel for every case of
tests/graphc/ops/test_deform_conv.py (padding, strides, dilations, groups, offset groups, masks,
bias, offsets far outside the image) in float32, float16 and float64 renders, takes this family,
compiles with NVRTC for sm_80 and sm_90 and, compiled for the host by cuda_emulator.py (the
kernel's own text, one thread at a time), equals the numpy reference (ONNX's definition) to the
rounding of its float32 (double) accumulation; graphc.compile and `graphc check --target cuda`
take the op."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import graphc
from helpers import make_node_model

sys.path.insert(0, str(Path(__file__).parent))  # rd_helpers, cuda_emulator beside this file
sys.path.insert(0, str(Path(__file__).parent.parent / "graphc" / "ops"))
from rd_helpers import compile_each, kernels_of  # noqa: E402
from test_deform_conv import CASES, _case  # noqa: E402
from test_grid_sample import _HOST_PRELUDE  # noqa: E402

TOLERANCE = {"float32": 1e-5, "float64": 1e-12, "float16": 2e-3}  # relative to max(1, |expected|)


def _model(name: str, dtype):
    feeds, attrs, order = _case(**CASES[name])
    feeds = {k: v.astype(dtype) for k, v in feeds.items()}
    return make_node_model("DeformConv", feeds, attrs, opset=22, input_order=order), feeds


def _emulate(src, feeds: dict, out_shape, dtype) -> np.ndarray:
    from cuda_emulator import run_template_kernel

    return run_template_kernel(src, "deform_conv.cu.j2", _HOST_PRELUDE, feeds, "y", out_shape, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("name", list(CASES))
def test_kernel_compiles_and_matches_reference_on_host(name, dtype):
    model, feeds = _model(name, dtype)
    (want,) = graphc.interpret(graphc.load_onnx(model), feeds).values()
    (src,) = kernels_of(model, family="deform_conv")
    assert src.family == "deform_conv" and src.args == [*feeds, "y"]
    compile_each([src])
    got = _emulate(src, feeds, want.shape, dtype)
    scale = max(1.0, float(np.abs(want.astype(np.float64)).max()))
    tol = TOLERANCE[np.dtype(dtype).name]
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol * scale)


def test_cuda_compile_and_check_take_it(tmp_path):
    model, _ = _model("mask-bias", np.float32)
    path = tmp_path / "deform.onnx"
    import onnx

    onnx.save(model, str(path))
    from graphc.cli import main

    assert main(["check", str(path), "--target", "cuda"]) == 0
    eng = graphc.compile(model, target="cuda", arch=["sm_90"], precision="fp16")
    assert "DeformConv" in {s.op for s in eng.plan.steps}
