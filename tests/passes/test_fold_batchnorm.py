"""fold_batchnorm: BN after a conv/gemm/matmul folds into its weights; other BNs become Mul/Add."""

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
from graphc.passes.fold_batchnorm import fold_batchnorm
from graphc.passes.manager import Pass
from graphc.passes.pipeline import cleanup

RNG = np.random.default_rng(0)


def _rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def _bn(b: GraphBuilder, y, c: int, *, dtype=np.float32, eps: float = 1e-5, name: str = "bn", training: int = 0):
    params = [
        b.add_constant(RNG.uniform(0.5, 1.5, c).astype(dtype), f"{name}.gamma"),
        b.add_constant(_rand(c, dtype=dtype), f"{name}.beta"),
        b.add_constant(_rand(c, dtype=dtype) * 0.1, f"{name}.mean"),
        b.add_constant(RNG.uniform(0.5, 2.0, c).astype(dtype), f"{name}.var"),
    ]
    return b.op("BatchNormalization", [y, *params], {"epsilon": eps, "training_mode": training}, name=name)


def _graph(shape, build, dtype=DType.float32) -> Graph:
    b = GraphBuilder("t", opset=21)
    x = b.add_input("x", TensorType(dtype, tuple(shape)))
    outs = build(b, x)
    b.set_outputs(outs if isinstance(outs, list) else [outs])
    return b.build()


def _fold(g: Graph) -> Graph:
    """fold_batchnorm, then the cleanup that evaluates the emitted constant arithmetic."""
    out = optimize(
        g, OptimizeOptions(opt_level=2, verify=True), stages=[Pass("fold_batchnorm", fold_batchnorm), cleanup()]
    )
    verify_graph(out.graph)
    return out.graph


def _check(g0: Graph, g1: Graph, x: np.ndarray, rtol=1e-5, atol=1e-5) -> None:
    a = graphc.interpret(g0, {"x": x})
    b = graphc.interpret(g1, {"x": x})
    for k in a:
        assert b[k].dtype == a[k].dtype
        np.testing.assert_allclose(b[k].astype(np.float64), a[k].astype(np.float64), rtol=rtol, atol=atol, err_msg=k)


def _weights_are_constants(g: Graph) -> None:
    for n in g.nodes:
        for v in n.inputs[1:]:
            assert v is None or v.name in g.constants, f"{n.op} '{n.name}' input {v.name} is computed"


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("group", [1, 3])
def test_conv_bn(bias: bool, group: int) -> None:
    def build(b, x):
        ins = [x, b.add_constant(_rand(6, 6 // group, 3, 3), "w")]
        if bias:
            ins.append(b.add_constant(_rand(6), "b"))
        y = b.op("Conv", ins, {"pads": [1, 1, 1, 1], "group": group}, name="conv")
        return _bn(b, y, 6)

    g = _graph((2, 6, 7, 5), build)
    g1 = _fold(g)
    assert g1.op_counts() == {"Conv": 1}
    conv = g1.nodes[0]
    assert conv.name == "conv" and len(conv.inputs) == 3
    _weights_are_constants(g1)
    assert set(g1.meta["origins"]["conv"]) == {"conv", "bn"}
    _check(g, g1, _rand(2, 6, 7, 5))


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("c_shape", [None, (5,), (1, 5), (4, 5), ()])
@pytest.mark.parametrize("alpha_beta", [(1.0, 1.0), (0.5, 2.0)])
def test_gemm_bn(trans_b: int, c_shape, alpha_beta) -> None:
    alpha, beta = alpha_beta

    def build(b, x):
        ins = [x, b.add_constant(_rand(5, 3) if trans_b else _rand(3, 5), "w")]
        if c_shape is not None:
            ins.append(b.add_constant(_rand(*c_shape), "c"))
        y = b.op("Gemm", ins, {"transB": trans_b, "alpha": alpha, "beta": beta}, name="fc")
        return _bn(b, y, 5)

    g = _graph((4, 3), build)
    g1 = _fold(g)
    assert g1.op_counts() == {"Gemm": 1}
    _weights_are_constants(g1)
    _check(g, g1, _rand(4, 3))


def test_matmul_bn_keeps_an_add() -> None:
    g = _graph((4, 3), lambda b, x: _bn(b, b.op("MatMul", [x, b.add_constant(_rand(3, 5), "w")], name="mm"), 5))
    g1 = _fold(g)
    assert g1.op_counts() == {"Add": 1, "MatMul": 1}
    _weights_are_constants(g1)
    _check(g, g1, _rand(4, 3))


@pytest.mark.parametrize("trans_b", [0, 1])
def test_internal_matmul_bn(trans_b: int) -> None:
    def build(b, x):
        w = b.add_constant(_rand(5, 3) if trans_b else _rand(3, 5), "w")
        y = b.op("MatMul", [x, w], {"trans_b": trans_b, "alpha": 0.5}, name="mm", domain=INTERNAL_DOMAIN)
        return _bn(b, y, 5)

    g = _graph((4, 3), build)
    g1 = _fold(g)
    assert g1.op_counts() == {"Add": 1, "graphc.MatMul": 1}
    _check(g, g1, _rand(4, 3))


@pytest.mark.parametrize("group", [1, 2])
def test_conv_transpose_bn(group: int) -> None:
    def build(b, x):
        w = b.add_constant(_rand(4, 6 // group, 3, 3), "w")
        y = b.op("ConvTranspose", [x, w], {"strides": [2, 2], "group": group}, name="up")
        return _bn(b, y, 6)

    g = _graph((1, 4, 3, 5), build)
    g1 = _fold(g)
    assert g1.op_counts() == {"ConvTranspose": 1}
    _weights_are_constants(g1)
    _check(g, g1, _rand(1, 4, 3, 5))


def test_shared_conv_output_becomes_mul_add_with_near_miss() -> None:
    def build(b, x):
        y = b.op("Conv", [x, b.add_constant(_rand(4, 3, 1, 1), "w")], name="conv1")
        z = _bn(b, y, 4, name="bn1")
        return b.op("Add", [z, b.op("Relu", [y], name="relu7")], name="add")

    g = _graph((1, 3, 4, 4), build)
    g1 = _fold(g)
    assert g1.op_counts() == {"Add": 2, "Conv": 1, "Mul": 1, "Relu": 1}
    assert g1.meta["near_misses"] == [
        "BatchNormalization 'bn1' not folded into Conv 'conv1': its output is also used by 'relu7'"
    ]
    mul = next(n for n in g1.nodes if n.op == "Mul")
    assert g1.constants[mul.inputs[1].name].data.shape == (4, 1, 1)
    _check(g, g1, _rand(1, 3, 4, 4))


@pytest.mark.parametrize("shape", [(2, 5), (2, 5, 7), (1, 5, 3, 4, 2)])
def test_bn_on_an_input_becomes_mul_add(shape) -> None:
    g = _graph(shape, lambda b, x: _bn(b, x, 5))
    g1 = _fold(g)
    assert g1.op_counts() == {"Add": 1, "Mul": 1}
    _check(g, g1, _rand(*shape))


def test_bn_after_3d_matmul_is_not_folded_into_the_weight() -> None:
    # BN's channel axis is 1 (the rows of the product), not the weight's last dim.
    g = _graph((2, 4, 3), lambda b, x: _bn(b, b.op("MatMul", [x, b.add_constant(_rand(3, 5), "w")]), 4))
    g1 = _fold(g)
    assert g1.op_counts() == {"Add": 1, "MatMul": 1, "Mul": 1}
    _check(g, g1, _rand(2, 4, 3))


def test_training_mode_bn_stays() -> None:
    g = _graph((2, 3, 4), lambda b, x: _bn(b, x, 3, training=1))
    assert fold_batchnorm(g) is g


def test_float16() -> None:
    def build(b, x):
        y = b.op("Conv", [x, b.add_constant(_rand(4, 3, 3, 3, dtype=np.float16), "w")], name="conv")
        return _bn(b, y, 4, dtype=np.float16)

    g = _graph((1, 3, 6, 6), build, DType.float16)
    g1 = _fold(g)
    assert g1.op_counts() == {"Conv": 1}
    _check(g, g1, _rand(1, 3, 6, 6, dtype=np.float16), rtol=1e-2, atol=2e-2)


def test_mixed_dtype_params() -> None:
    """BN's scale/bias/mean/var may be float32 on a float16 input (opset 15 on)."""

    def build(b, x):
        y = b.op("Conv", [x, b.add_constant(_rand(4, 3, 1, 1, dtype=np.float16), "w")], name="conv")
        return _bn(b, y, 4, dtype=np.float32)

    g = _graph((1, 3, 5, 5), build, DType.float16)
    g1 = _fold(g)
    assert g1.op_counts() == {"Conv": 1}
    _check(g, g1, _rand(1, 3, 5, 5, dtype=np.float16), rtol=1e-2, atol=2e-2)


def test_unchanged_graph_is_returned_as_is() -> None:
    g = _graph((2, 3), lambda b, x: b.op("Relu", [x]))
    assert fold_batchnorm(g) is g


def test_pipeline_conv_bn_relu() -> None:
    def build(b, x):
        y = b.op("Conv", [x, b.add_constant(_rand(4, 3, 3, 3), "w")], {"pads": [1, 1, 1, 1]}, name="conv")
        return b.op("Relu", [_bn(b, y, 4)], name="relu")

    g = _graph((1, 3, 6, 6), build)
    g1 = optimize(g, OptimizeOptions(opt_level=2, verify=True)).graph
    assert "BatchNormalization" not in g1.op_counts()
    _check(g, g1, _rand(1, 3, 6, 6))
