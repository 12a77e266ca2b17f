"""decompose_window_ops: LRN and LpPool through AveragePool equal their references (sizes, odd and
even windows, pads, strides, p = 1, 2, 3, 1-D to 3-D); ceil_mode LpPool stays; the CUDA target
compiles an LRN CNN block (no GPU needed)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphc
from graphc.ir.shapes import bind_shapes
from graphc.passes.decompose_window_ops import decompose_window_ops

RNG = np.random.default_rng(0)


def _graph(op: str, shape, attrs, opset: int = 18):
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    g = helper.make_graph(
        [node],
        "w",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    m = onnx.shape_inference.infer_shapes(m)
    return m, bind_shapes(graphc.load_onnx(m), None)


def _check(g, shape):
    fired: list[str] = []
    d = decompose_window_ops(g, fired=fired)
    assert len(fired) == 1
    x = RNG.standard_normal(shape).astype(np.float32)
    ref, got = graphc.interpret(g, {"x": x})["y"], graphc.interpret(d, {"x": x})["y"]
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("shape", "attrs"),
    [
        ((2, 7, 5, 4), {"size": 5}),
        ((1, 6, 3, 3), {"size": 4, "alpha": 0.01, "beta": 0.5, "bias": 2.0}),
        ((1, 3, 4), {"size": 3}),
        ((1, 5, 2, 3, 2), {"size": 1}),
        ((1, 2, 3, 3), {"size": 7}),  # window wider than the channels
    ],
)
def test_lrn(shape, attrs):
    _check(_graph("LRN", shape, attrs)[1], shape)


@pytest.mark.parametrize(
    ("shape", "attrs"),
    [
        ((1, 3, 6, 5), {"kernel_shape": [2, 2], "p": 2}),
        ((2, 3, 7, 6), {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1], "p": 3}),
        ((1, 2, 9), {"kernel_shape": [3], "strides": [2], "p": 1}),
        ((1, 2, 4, 5, 4), {"kernel_shape": [2, 2, 2], "p": 2}),
        ((1, 3, 6, 6), {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "p": 2}),
    ],
)
def test_lp_pool(shape, attrs):
    _check(_graph("LpPool", shape, attrs)[1], shape)


def test_ceil_mode_lp_pool_stays():
    _, g = _graph("LpPool", (1, 3, 5, 5), {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1})
    assert decompose_window_ops(g) is g


def test_lrn_block_matches_onnxruntime_and_compiles_for_cuda():
    from helpers import run_ort

    m, _ = _graph("LRN", (1, 16, 9, 9), {"size": 5, "alpha": 1e-4, "beta": 0.75, "bias": 1.0})
    x = RNG.standard_normal((1, 16, 9, 9)).astype(np.float32) * 10
    expected = run_ort(m, {"x": x})["y"]
    eng = graphc.compile(m, target="cuda", arch=["sm_90"])
    assert all(s.op != "LRN" for s in eng.plan.steps)
    got = graphc.compile(m, target="cpu").run({"x": x})["y"]  # the CPU engine keeps the reference op
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    d = decompose_window_ops(bind_shapes(graphc.load_onnx(m), None))
    np.testing.assert_allclose(graphc.interpret(d, {"x": x})["y"], expected, rtol=2e-5, atol=1e-6)
