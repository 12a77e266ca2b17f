"""The ops that the CUDA target runs in another form (passes/decompose_conv_transpose.py,
decompose_einsum.py, decompose_window_ops.py), run on a GPU against the numpy references, in fp32
and fp16: strided, dilated, grouped and cropped ConvTranspose with its bias and ReLU fused; einsum
contractions and an einsum attention block; LRN and LpPool."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphc

pytestmark = pytest.mark.gpu

RNG = np.random.default_rng(0)


def _model(nodes, inputs, inits=()) -> onnx.ModelProto:
    g = helper.make_graph(
        nodes,
        "forms",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in inits],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 10
    return onnx.shape_inference.infer_shapes(m)


def _check(m: onnx.ModelProto, precision: str) -> None:
    feeds = {
        i.name: RNG.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
        for i in m.graph.input
    }
    ref = graphc.interpret(graphc.load_onnx(m), feeds)["y"].astype(np.float64)
    got = np.asarray(graphc.compile(m, target="cuda", precision=precision).run(feeds, to_numpy=True)["y"], np.float64)
    scale = float(np.abs(ref).max()) or 1.0
    if precision == "fp32":
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-4 * scale)
    else:
        assert np.isfinite(got).all()
        cos = float((got * ref).sum() / (np.linalg.norm(got) * np.linalg.norm(ref)))
        assert cos >= 0.9995 and np.abs(got - ref).max() <= 2e-2 * scale


CONV_T = [
    ((1, 16, 7, 6), (16, 8, 4, 4), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((2, 8, 5, 5), (8, 8, 3, 3), {"strides": [2, 2], "output_padding": [1, 1], "pads": [1, 1, 1, 1]}),
    ((1, 8, 6, 5), (8, 4, 3, 3), {"strides": [2, 1], "dilations": [2, 1], "group": 2}),
    ((1, 8, 6, 6), (8, 1, 4, 4), {"strides": [2, 2], "pads": [1, 1, 1, 1], "group": 8}),
    ((1, 4, 6, 6), (4, 8, 2, 2), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),
    ((1, 8, 5, 5), (8, 8, 3, 3), {}),
]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize(("x_shape", "w_shape", "attrs"), CONV_T)
def test_conv_transpose(x_shape, w_shape, attrs, precision):
    c_out = w_shape[1] * attrs.get("group", 1)
    w = (RNG.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))).astype(np.float32)
    nodes = [
        helper.make_node("ConvTranspose", ["x", "w", "b"], ["t"], **attrs),
        helper.make_node("Relu", ["t"], ["y"]),
    ]
    _check(_model(nodes, [("x", x_shape)], [("w", w), ("b", RNG.standard_normal(c_out).astype(np.float32))]), precision)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize(
    ("equation", "shapes"),
    [
        ("bij,bjk->bik", [(3, 17, 24), (3, 24, 40)]),
        ("bqhd,bkhd->bhqk", [(2, 33, 4, 16), (2, 47, 4, 16)]),
        ("nchw,kc->nkhw", [(2, 16, 7, 5), (24, 16)]),
        ("abc,cd,de->abe", [(2, 9, 16), (16, 24), (24, 8)]),
    ],
)
def test_einsum(equation, shapes, precision):
    names = [f"x{i}" for i in range(len(shapes))]
    nodes = [helper.make_node("Einsum", names, ["y"], equation=equation)]
    _check(_model(nodes, list(zip(names, shapes, strict=True))), precision)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_einsum_attention(precision):
    b, h, s, d = 2, 4, 48, 64
    nodes = [
        helper.make_node("Einsum", ["q", "k"], ["s"], equation="bhqd,bhkd->bhqk"),
        helper.make_node("Mul", ["s", "scale"], ["t"]),
        helper.make_node("Softmax", ["t"], ["p"], axis=-1),
        helper.make_node("Einsum", ["p", "v"], ["y"], equation="bhqk,bhkd->bhqd"),
    ]
    m = _model(nodes, [(n, (b, h, s, d)) for n in "qkv"], [("scale", np.array(d**-0.5, np.float32))])
    _check(m, precision)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize(
    ("op", "shape", "attrs"),
    [
        ("LRN", (2, 24, 9, 7), {"size": 5, "alpha": 1e-2, "beta": 0.75, "bias": 1.0}),
        ("LpPool", (2, 8, 9, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "p": 2}),
        ("LpPool", (1, 8, 10, 10), {"kernel_shape": [2, 2], "strides": [2, 2], "p": 3}),
    ],
)
def test_window_ops(op, shape, attrs, precision):
    _check(_model([helper.make_node(op, ["x"], ["y"], **attrs)], [("x", shape)]), precision)
