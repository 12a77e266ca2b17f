"""Elementwise kernels on a GPU against the numpy references: scalar and vector paths, broadcasting,
16-bit storage, integer and bool ops, and a fused DAG."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import graphc

pytestmark = pytest.mark.gpu

F16, BF16 = TensorProto.FLOAT16, TensorProto.BFLOAT16


def _model(nodes, inputs, outputs, opset=20):
    graph = helper.make_graph(nodes, "g", inputs, outputs)  # opset 20: Gelu is an op from 20 on
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, t, shape):
    return helper.make_tensor_value_info(name, t, shape)


def _feeds(model, seed=0):
    import ml_dtypes

    rng = np.random.default_rng(seed)
    out = {}
    for i in model.graph.input:
        shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
        t = i.type.tensor_type.elem_type
        if t == TensorProto.BOOL:
            out[i.name] = rng.random(shape) < 0.5
        elif t in (TensorProto.INT32, TensorProto.INT64):
            out[i.name] = rng.integers(-50, 50, size=shape).astype(np.int32 if t == TensorProto.INT32 else np.int64)
        else:
            dt = {TensorProto.FLOAT: np.float32, F16: np.float16, BF16: ml_dtypes.bfloat16}[t]
            out[i.name] = rng.standard_normal(shape).astype(dt)
    return out


def _check(model, opt_level=2, rtol=None):
    feeds = _feeds(model)
    eng = graphc.compile(model, target="cuda", opt_level=opt_level)
    out = eng.run(feeds, to_numpy=True)
    ref = graphc.interpret(graphc.load_onnx(model), feeds)
    for k, r in ref.items():
        a = out[k]
        assert a.dtype == r.dtype and a.shape == r.shape
        if r.dtype.kind in "biu":
            np.testing.assert_array_equal(a, r)
        else:
            tol = rtol or {2: 1e-2}.get(r.dtype.itemsize, 1e-5)
            np.testing.assert_allclose(a.astype(np.float64), r.astype(np.float64), rtol=tol, atol=tol)


@pytest.mark.parametrize("t", [TensorProto.FLOAT, F16, BF16])
@pytest.mark.parametrize("shape", [[7], [3, 33], [2, 8, 64], [1]])
def test_fused_dag_vector_and_scalar_paths(t, shape):
    nodes = [
        helper.make_node("Mul", ["x", "y"], ["a"]),
        helper.make_node("Sigmoid", ["a"], ["s"]),
        helper.make_node("Add", ["s", "x"], ["b"]),
        helper.make_node("Relu", ["b"], ["z"]),
    ]
    _check(_model(nodes, [_vi("x", t, shape), _vi("y", t, shape)], [_vi("z", t, shape)]))


@pytest.mark.parametrize("t", [TensorProto.FLOAT, F16])
def test_broadcasting(t):
    nodes = [helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Mul", ["a", "c"], ["z"])]
    _check(
        _model(
            nodes, [_vi("x", t, [2, 3, 5, 7]), _vi("b", t, [3, 1, 1]), _vi("c", t, [7])], [_vi("z", t, [2, 3, 5, 7])]
        )
    )


def test_int_bool_where_cast():
    nodes = [
        helper.make_node("Greater", ["i", "j"], ["g"]),
        helper.make_node("Where", ["g", "i", "j"], ["m"]),
        helper.make_node("Cast", ["m"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("Div", ["i", "k"], ["d"]),
        helper.make_node("Mod", ["i", "k"], ["md"]),
        helper.make_node("Not", ["g"], ["ng"]),
    ]
    ins = [_vi("i", TensorProto.INT64, [5, 9]), _vi("j", TensorProto.INT64, [5, 9]), _vi("k", TensorProto.INT64, [9])]
    outs = [
        _vi("f", TensorProto.FLOAT, [5, 9]),
        _vi("d", TensorProto.INT64, [5, 9]),
        _vi("md", TensorProto.INT64, [5, 9]),
        _vi("ng", TensorProto.BOOL, [5, 9]),
    ]
    model = _model(nodes, ins, outs)
    feeds = _feeds(model)
    feeds["k"][feeds["k"] == 0] = 3  # no division by zero
    eng = graphc.compile(model, target="cuda", opt_level=0)
    out = eng.run(feeds, to_numpy=True)
    ref = graphc.interpret(graphc.load_onnx(model), feeds)
    for k in ref:
        np.testing.assert_array_equal(out[k], ref[k])


@pytest.mark.parametrize("op", ["Gelu", "Tanh", "Erf", "Exp", "HardSwish", "Softplus", "Sqrt"])
def test_unary_math(op):
    nodes = [helper.make_node("Abs", ["x"], ["a"]), helper.make_node(op, ["a"], ["z"])]
    _check(_model(nodes, [_vi("x", TensorProto.FLOAT, [4, 257])], [_vi("z", TensorProto.FLOAT, [4, 257])]), rtol=2e-6)
