"""fold_affine: per-channel Mul/Div/Add/Sub by constants after a conv or matmul fold into it."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
from graphc.ir.builder import GraphBuilder
from graphc.ir.graph import Graph
from graphc.ir.types import DType, TensorType
from graphc.ir.verify import verify_graph
from graphc.ops.internal import INTERNAL_DOMAIN
from graphc.passes import OptimizeOptions, optimize
from graphc.passes.fold_affine import fold_affine
from graphc.passes.manager import FixedPoint, Pass
from graphc.passes.pipeline import cleanup

RNG = np.random.default_rng(1)


def _rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def _graph(shape, build, dtype=DType.float32) -> Graph:
    b = GraphBuilder("t", opset=21)
    x = b.add_input("x", TensorType(dtype, tuple(shape)))
    outs = build(b, x)
    b.set_outputs(outs if isinstance(outs, list) else [outs])
    return b.build()


def _fold(g: Graph) -> Graph:
    """fold_affine and cleanup to a fixed point (a chain of affine ops folds one per round)."""
    stage = FixedPoint("folding", (Pass("fold_affine", fold_affine), *cleanup().passes))
    out = optimize(g, OptimizeOptions(opt_level=2, verify=True), stages=[stage])
    verify_graph(out.graph)
    return out.graph


def _check(g0: Graph, g1: Graph, x: np.ndarray, rtol=1e-5, atol=1e-5) -> None:
    a = graphc.interpret(g0, {"x": x})
    b = graphc.interpret(g1, {"x": x})
    for k in a:
        assert b[k].dtype == a[k].dtype and b[k].shape == a[k].shape
        np.testing.assert_allclose(b[k].astype(np.float64), a[k].astype(np.float64), rtol=rtol, atol=atol, err_msg=k)


def _conv(b, x, bias=False, cout=4):
    ins = [x, b.add_constant(_rand(cout, 3, 3, 3), "w")]
    if bias:
        ins.append(b.add_constant(_rand(cout), "b"))
    return b.op("Conv", ins, {"pads": [1, 1, 1, 1]}, name="conv")


def _positive(*shape):
    return RNG.uniform(0.5, 2.0, shape).astype(np.float32)


# c / conv and c - conv are not affine maps of the conv's weights: only conv / c, conv - c.
OP_ORDERS = [
    (op, first) for op in ("Mul", "Div", "Add", "Sub") for first in (False, True) if op in ("Mul", "Add") or not first
]


@pytest.mark.parametrize("op, const_first", OP_ORDERS)
@pytest.mark.parametrize("c_shape", [(1, 4, 1, 1), (4, 1, 1), (), (1,), (1, 1, 1, 1)])
@pytest.mark.parametrize("bias", [False, True])
def test_conv_affine(op: str, const_first: bool, c_shape, bias: bool) -> None:

    def build(b, x):
        y = _conv(b, x, bias)
        c = b.add_constant(_positive(*c_shape), "c")
        return b.op(op, [c, y] if const_first else [y, c], name="affine")

    g = _graph((2, 3, 5, 6), build)
    g1 = _fold(g)
    assert g1.op_counts() == {"Conv": 1}
    conv = g1.nodes[0]
    assert all(v.name in g1.constants for v in conv.inputs[1:])
    assert set(g1.meta["origins"]["conv"]) == {"conv", "affine"}
    assert g1.outputs[0].name == g.outputs[0].name
    _check(g, g1, _rand(2, 3, 5, 6))


def test_conv_chain_folds_to_one_conv() -> None:
    def build(b, x):
        y = _conv(b, x, bias=True)
        y = b.op("Mul", [y, b.add_constant(_positive(1, 4, 1, 1), "s")])
        y = b.op("Add", [y, b.add_constant(_rand(4, 1, 1), "t")])
        y = b.op("Div", [y, b.add_constant(np.float32(3.0), "d")])
        return b.op("Sub", [y, b.add_constant(np.float32(0.25), "e")])

    g = _graph((1, 3, 4, 4), build)
    g1 = _fold(g)
    assert g1.op_counts() == {"Conv": 1}
    _check(g, g1, _rand(1, 3, 4, 4))


@pytest.mark.parametrize(
    "c_shape",
    [
        (1, 1, 5, 1),  # varies along a spatial axis
        (2, 4, 1, 1),  # varies along the batch
        (1, 4, 5, 6),  # a full map
        (6,),  # along the last spatial axis
        (1, 1, 1, 1, 1),  # grows the rank
    ],
)
def test_not_per_channel_is_not_folded(c_shape) -> None:
    g = _graph((2, 3, 5, 6), lambda b, x: b.op("Mul", [_conv(b, x), b.add_constant(_positive(*c_shape), "c")]))
    assert fold_affine(g) is g


def test_shared_output_is_not_folded() -> None:
    def build(b, x):
        y = _conv(b, x)
        return [b.op("Mul", [y, b.add_constant(_positive(1, 4, 1, 1), "c")]), y]

    g = _graph((1, 3, 4, 4), build)
    assert fold_affine(g) is g


def test_non_constant_weight_is_not_folded() -> None:
    def build(b, x):
        w = b.op("Relu", [b.add_constant(_rand(4, 3, 1, 1), "w")])
        y = b.op("Conv", [x, w])
        return b.op("Mul", [y, b.add_constant(_positive(4, 1, 1), "c")])

    g = _graph((1, 3, 4, 4), build)
    assert fold_affine(g) is g


def test_non_constant_operand_is_not_folded() -> None:
    g = _graph((1, 3, 4, 4), lambda b, x: b.op("Mul", [_conv(b, x), b.op("ReduceMax", [x])]))
    assert fold_affine(g) is g


@pytest.mark.parametrize("op", ["Mul", "Div", "Add", "Sub"])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("c_shape", [None, (5,), (4, 5)])
def test_gemm_affine(op: str, trans_b: int, c_shape) -> None:
    def build(b, x):
        ins = [x, b.add_constant(_rand(5, 3) if trans_b else _rand(3, 5), "w")]
        if c_shape is not None:
            ins.append(b.add_constant(_rand(*c_shape), "c"))
        y = b.op("Gemm", ins, {"transB": trans_b, "alpha": 0.5, "beta": 2.0}, name="fc")
        return b.op(op, [y, b.add_constant(_positive(1, 5), "k")])

    g = _graph((4, 3), build)
    g1 = _fold(g)
    assert g1.op_counts() == {"Gemm": 1}
    _check(g, g1, _rand(4, 3))


@pytest.mark.parametrize("op", ["Mul", "Div"])
@pytest.mark.parametrize("w_shape", [(3, 5), (2, 3, 5)])
def test_matmul_scale(op: str, w_shape) -> None:
    def build(b, x):
        y = b.op("MatMul", [x, b.add_constant(_rand(*w_shape), "w")], name="mm")
        return b.op(op, [y, b.add_constant(_positive(5), "k")])

    g = _graph((2, 4, 3), build)
    g1 = _fold(g)
    assert g1.op_counts() == {"MatMul": 1}
    _check(g, g1, _rand(2, 4, 3))


def test_matmul_add_stays() -> None:
    g = _graph(
        (4, 3),
        lambda b, x: b.op(
            "Add", [b.op("MatMul", [x, b.add_constant(_rand(3, 5), "w")]), b.add_constant(_rand(5), "k")]
        ),
    )
    assert fold_affine(g) is g


@pytest.mark.parametrize("op", ["Mul", "Div"])
@pytest.mark.parametrize("bias_first", [False, True])
@pytest.mark.parametrize("c_shape", [(5,), (1, 1, 5), ()])
def test_layer_scale_after_bias_folds(op: str, bias_first: bool, c_shape) -> None:
    # ConvNeXt's gamma * (x @ W + b): the scale goes into W and b, the bias Add stays (epilogue)
    def build(b, x):
        y = b.op("MatMul", [x, b.add_constant(_rand(3, 5), "w")], name="mm")
        bias = b.add_constant(_rand(5), "bias")
        y = b.op("Add", [bias, y] if bias_first else [y, bias], name="add")
        return b.op(op, [y, b.add_constant(_positive(*c_shape), "gamma")], name="scale")

    g = _graph((2, 4, 3), build)
    g1 = _fold(g)
    assert g1.op_counts() == {"MatMul": 1, "Add": 1}
    _check(g, g1, _rand(2, 4, 3))


@pytest.mark.parametrize(
    "case", ["bias_not_per_column", "scale_not_per_column", "add_shared", "bias_not_const"]
)
def test_layer_scale_after_bias_not_folded(case: str) -> None:
    def build(b, x):
        y = b.op("MatMul", [x, b.add_constant(_rand(3, 5), "w")], name="mm")
        if case == "bias_not_per_column":
            bias = b.add_constant(_rand(4, 5), "bias")
        elif case == "bias_not_const":
            bias = b.op("Relu", [b.op("MatMul", [x, b.add_constant(_rand(3, 5), "w2")])])
        else:
            bias = b.add_constant(_rand(5), "bias")
        z = b.op("Add", [y, bias], name="add")
        gamma = b.add_constant(_positive(4, 1) if case == "scale_not_per_column" else _positive(5), "gamma")
        out = b.op("Mul", [z, gamma], name="scale")
        return [out, z] if case == "add_shared" else out

    g = _graph((2, 4, 3), build)
    g1 = _fold(g)
    assert g1.op_counts().get("Mul") == 1, g1.op_counts()
    _check(g, g1, _rand(2, 4, 3))


@pytest.mark.parametrize("trans_b", [0, 1])
def test_internal_matmul_scale(trans_b: int) -> None:
    def build(b, x):
        w = b.add_constant(_rand(5, 3) if trans_b else _rand(3, 5), "w")
        y = b.op("MatMul", [x, w], {"trans_b": trans_b}, name="mm", domain=INTERNAL_DOMAIN)
        return b.op("Mul", [y, b.add_constant(_positive(5), "k")])

    g = _graph((2, 4, 3), build)
    g1 = _fold(g)
    assert g1.op_counts() == {"graphc.MatMul": 1}
    _check(g, g1, _rand(2, 4, 3))


@pytest.mark.parametrize("op", ["Mul", "Add"])
def test_conv_transpose(op: str) -> None:
    def build(b, x):
        y = b.op("ConvTranspose", [x, b.add_constant(_rand(3, 2, 2, 2), "w")], {"group": 3, "strides": [2, 2]})
        return b.op(op, [y, b.add_constant(_positive(1, 6, 1, 1), "k")])

    g = _graph((1, 3, 3, 4), build)
    g1 = _fold(g)
    assert g1.op_counts() == {"ConvTranspose": 1}
    _check(g, g1, _rand(1, 3, 3, 4))


def test_cast_after_the_affine_op_stays() -> None:
    # The Mul folds; the Cast after it is not affine and stays.
    g = _graph(
        (1, 3, 4, 4),
        lambda b, x: b.op("Cast", [b.op("Mul", [_conv(b, x), b.add_constant(_positive(4, 1, 1), "c")])], {"to": 11}),
    )
    g1 = _fold(g)
    assert g1.op_counts() == {"Cast": 1, "Conv": 1}


def test_float16() -> None:
    def build(b, x):
        y = b.op("Conv", [x, b.add_constant(_rand(4, 3, 3, 3, dtype=np.float16), "w")])
        y = b.op("Mul", [y, b.add_constant(_positive(4, 1, 1).astype(np.float16), "s")])
        return b.op("Add", [y, b.add_constant(_rand(4, 1, 1, dtype=np.float16), "t")])

    g = _graph((1, 3, 5, 5), build, DType.float16)
    g1 = _fold(g)
    assert g1.op_counts() == {"Conv": 1}
    _check(g, g1, _rand(1, 3, 5, 5, dtype=np.float16), rtol=1e-2, atol=2e-2)


@pytest.mark.parametrize("op, value", [("Div", 0.0), ("Mul", np.inf), ("Add", np.nan)])
def test_non_finite_or_zero_divisor_is_not_folded(op: str, value: float) -> None:
    def build(b, x):
        c = _positive(4, 1, 1)
        c[1] = value
        return b.op(op, [_conv(b, x), b.add_constant(c, "c")])

    g = _graph((1, 3, 4, 4), build)
    assert fold_affine(g) is g
