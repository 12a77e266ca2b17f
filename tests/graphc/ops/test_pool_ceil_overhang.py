"""Pools whose kernel is larger than the (padded) input under ceil_mode (issue 12): ONNX Runtime
and PyTorch give one window over the clipped input where ceil((in + pads - kernel) / stride) is 0
(how some CNN exports write a global pooling); graphc used to reject them with a ShapeError.
Checked against ONNX Runtime in the interpreter, and rendered + compiled (NVRTC) for CUDA."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphc
from graphc.errors import GraphcError
from tests.helpers import assert_close, rand, run_graphc, run_ort

F32 = np.float32

# (input shape, attrs): kernel one or two past the input, with and without pads, 1-D and 2-D.
CASES = [
    pytest.param((2, 3, 13, 13), dict(kernel_shape=[14, 14], strides=[2, 2]), id="k14-in13-s2"),
    pytest.param((1, 4, 5, 5), dict(kernel_shape=[7, 7], strides=[3, 3]), id="k7-in5-s3"),
    pytest.param((1, 2, 5, 6), dict(kernel_shape=[8, 7], strides=[4, 2], pads=[1, 0, 0, 0]), id="pads-asym"),
    pytest.param((2, 3, 6), dict(kernel_shape=[7], strides=[2]), id="1d"),
    pytest.param((1, 2, 6, 9), dict(kernel_shape=[7, 3], strides=[2, 2]), id="one-axis"),
]


def _model(op: str, shape, attrs, ceil_mode: int = 1) -> onnx.ModelProto:
    node = helper.make_node(op, ["x"], ["y"], ceil_mode=ceil_mode, **attrs)
    g = helper.make_graph(
        [node],
        "pool",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
    m.ir_version = 9
    return onnx.shape_inference.infer_shapes(m)


@pytest.mark.parametrize("shape,attrs", CASES)
@pytest.mark.parametrize(
    "op,extra", [("AveragePool", {"count_include_pad": 0}), ("AveragePool", {"count_include_pad": 1}), ("MaxPool", {})]
)
def test_kernel_larger_than_input_matches_ort(op, extra, shape, attrs):
    model = _model(op, shape, {**attrs, **extra})
    x = rand(shape, F32, seed=5)
    want = run_ort(model, {"x": x})["y"]
    assert want.size > 0
    got = run_graphc(model, {"x": x})["y"]
    assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert tuple(graphc.load_onnx(model).outputs[0].type.shape) == want.shape


def test_no_window_at_all_is_a_clear_error():
    # ceil((5 - 7) / 2) + 1 = 0 windows: ORT returns an empty tensor; graphc names the node.
    model = _model("AveragePool", (1, 1, 5, 5), dict(kernel_shape=[7, 7], strides=[2, 2]))
    with pytest.raises(GraphcError, match="no window fits even in ceil_mode"):
        graphc.load_onnx(model)
    # Without ceil_mode a kernel larger than the input stays an error.
    model = _model("AveragePool", (1, 1, 5, 5), dict(kernel_shape=[6, 6], strides=[2, 2]), ceil_mode=0)
    with pytest.raises(GraphcError, match="more than the padded input"):
        graphc.load_onnx(model)


def _have_nvrtc() -> bool:
    try:
        from graphc.codegen.nvrtc import nvrtc_version

        nvrtc_version()
        return True
    except Exception:
        return False


@pytest.mark.skipif(not _have_nvrtc(), reason="needs NVRTC (cuda-bindings)")
@pytest.mark.parametrize("include_pad", [0, 1])
def test_kernel_larger_than_input_compiles_for_cuda(include_pad):
    # Through the whole pipeline, then NVRTC (the GPU numbers: tests/codegen/test_pool_gpu.py).
    model = _model(
        "AveragePool", (2, 8, 13, 13), dict(kernel_shape=[14, 14], strides=[2, 2], count_include_pad=include_pad)
    )
    engine = graphc.compile(model, target="cuda", arch=["sm_80"])
    assert set(engine.kernels.families.values()) == {"pool"}
