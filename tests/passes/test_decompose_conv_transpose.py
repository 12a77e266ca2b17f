"""decompose_conv_transpose: the convolution form equals ConvTranspose's reference over strides,
dilations, pads, output_padding, output_shape, auto_pad, groups and 1-3 spatial dims; the CUDA
target compiles models with ConvTranspose (no GPU needed) and fuses its bias and activation."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphc
from graphc.ir.shapes import bind_shapes
from graphc.passes.decompose_conv_transpose import decompose_conv_transpose

RNG = np.random.default_rng(0)


def _model(x_shape, w_shape, attrs, bias=True, relu=False) -> onnx.ModelProto:
    w = RNG.standard_normal(w_shape).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w")]
    ins = ["x", "w"]
    if bias:
        c_out = w_shape[1] * attrs.get("group", 1)
        inits.append(numpy_helper.from_array(RNG.standard_normal(c_out).astype(np.float32), "b"))
        ins.append("b")
    nodes = [helper.make_node("ConvTranspose", ins, ["t" if relu else "y"], **attrs)]
    if relu:
        nodes.append(helper.make_node("Relu", ["t"], ["y"]))
    g = helper.make_graph(
        nodes,
        "ct",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return onnx.shape_inference.infer_shapes(m)


CASES = [
    # (x shape, w shape, attrs)
    ((1, 3, 5, 4), (3, 4, 3, 3), {}),
    ((2, 3, 5, 4), (3, 4, 3, 3), {"strides": [2, 2]}),
    ((1, 4, 5, 6), (4, 2, 3, 3), {"strides": [2, 3], "pads": [1, 0, 2, 1]}),
    ((1, 4, 5, 6), (4, 2, 3, 2), {"strides": [2, 2], "output_padding": [1, 1], "pads": [1, 1, 1, 1]}),
    ((1, 4, 5, 6), (4, 3, 3, 3), {"strides": [2, 2], "dilations": [2, 1], "pads": [0, 1, 1, 0]}),
    ((1, 4, 5, 6), (4, 3, 3, 3), {"strides": [2, 2], "group": 2}),
    ((1, 6, 4, 4), (6, 1, 4, 4), {"strides": [2, 2], "pads": [1, 1, 1, 1], "group": 6}),  # depthwise up-sampler
    ((1, 2, 5, 5), (2, 3, 3, 3), {"strides": [3, 2], "output_shape": [16, 11]}),
    ((1, 2, 5, 5), (2, 3, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 5, 5), (2, 3, 4, 4), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ((1, 2, 5, 5), (2, 3, 3, 3), {"strides": [2, 2], "auto_pad": "VALID"}),
    ((1, 2, 6, 6), (2, 3, 2, 2), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),  # pads beyond the kernel: a crop
    ((2, 3, 7), (3, 5, 4), {"strides": [3], "pads": [1, 2]}),
    ((1, 2, 3, 4, 3), (2, 2, 2, 3, 2), {"strides": [2, 1, 2], "pads": [0, 1, 0, 0, 1, 1]}),
]


@pytest.mark.parametrize(("x_shape", "w_shape", "attrs"), CASES)
def test_convolution_form_equals_reference(x_shape, w_shape, attrs):
    m = _model(x_shape, w_shape, attrs)
    g = bind_shapes(graphc.load_onnx(m), None)
    fired: list[str] = []
    d = decompose_conv_transpose(g, fired=fired)
    assert len(fired) == 1 and "ConvTranspose" not in {n.op for n in d.nodes}
    x = RNG.standard_normal(x_shape).astype(np.float32)
    ref, got = graphc.interpret(g, {"x": x})["y"], graphc.interpret(d, {"x": x})["y"]
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * float(np.abs(ref).max()))


def test_matches_onnxruntime_through_the_optimizer():
    from helpers import run_ort

    m = _model((1, 8, 6, 5), (8, 4, 4, 4), {"strides": [2, 2], "pads": [1, 1, 1, 1]}, relu=True)
    x = RNG.standard_normal((1, 8, 6, 5)).astype(np.float32)
    expected = run_ort(m, {"x": x})["y"]
    g = decompose_conv_transpose(bind_shapes(graphc.load_onnx(m), None))
    got = graphc.interpret(g, {"x": x})["y"]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * float(np.abs(expected).max()))


def test_cuda_target_compiles_conv_transpose_with_fused_epilogue(caplog):
    m = _model((1, 8, 6, 5), (8, 16, 4, 4), {"strides": [2, 2], "pads": [1, 1, 1, 1]}, relu=True)
    with caplog.at_level("WARNING"):
        eng = graphc.compile(m, target="cuda", precision="fp16", arch=["sm_90"])
    assert "zero-upsampled" in caplog.text  # the slow path is reported, not silent
    convs = [s for s in eng.plan.steps if any(ln.family == "conv" for ln in s.launches)]
    assert len(convs) == 1
    assert "Relu" in str(convs[0].attrs)  # bias and ReLU ride in the convolution's epilogue


def test_cpu_target_keeps_the_reference_op():
    m = _model((1, 3, 5, 4), (3, 4, 3, 3), {"strides": [2, 2]})
    eng = graphc.compile(m, target="cpu")
    assert any(s.op == "ConvTranspose" for s in eng.plan.steps)
