"""fuse_epilogues: conv/gemm/matmul + elementwise DAG -> one Fused[anchor] node."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
from graphc.codegen.capabilities import CUDA
from graphc.ir.builder import GraphBuilder
from graphc.ir.graph import Graph
from graphc.ir.types import DType, TensorType
from graphc.ir.verify import verify_graph
from graphc.ops.fused import FusedAttrs
from graphc.ops.internal import INTERNAL_DOMAIN
from graphc.passes import OptimizeOptions, optimize
from graphc.passes.fuse_epilogue import fuse_epilogues

RNG = np.random.default_rng(2)
F32 = DType.float32


def _rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def _graph(inputs: dict, build) -> Graph:
    b = GraphBuilder("t", opset=21)
    xs = [b.add_input(k, TensorType(dt, tuple(s))) for k, (dt, s) in inputs.items()]
    outs = build(b, *xs)
    b.set_outputs(outs if isinstance(outs, list) else [outs])
    return b.build()


def _fuse(g: Graph) -> Graph:
    g1 = fuse_epilogues(g)
    verify_graph(g1)
    return g1


def _feeds(g: Graph) -> dict[str, np.ndarray]:
    return {v.name: _rand(*v.ttype.shape, dtype=v.ttype.dtype.numpy) for v in g.inputs}


def _check(g0: Graph, g1: Graph, feeds=None, rtol=1e-5, atol=1e-6) -> None:
    feeds = feeds or _feeds(g0)
    a = graphc.interpret(g0, feeds)
    b = graphc.interpret(g1, feeds)
    assert list(a) == list(b)
    for k in a:
        assert b[k].dtype == a[k].dtype and b[k].shape == a[k].shape
        np.testing.assert_allclose(b[k].astype(np.float64), a[k].astype(np.float64), rtol=rtol, atol=atol, err_msg=k)


def _fused(g: Graph) -> list:
    return [n for n in g.nodes if n.op == "Fused"]


def _epilogue(node) -> list[str]:
    a: FusedAttrs = node.attrs
    return [e.op for e in a.epilogue]


def _conv(b, x, cout=4, bias=True, name="conv"):
    cin = x.ttype.shape[1]
    ins = [x, b.add_constant(_rand(cout, cin, 3, 3), f"{name}.w")]
    if bias:
        ins.append(b.add_constant(_rand(cout), f"{name}.b"))
    return b.op("Conv", ins, {"pads": [1, 1, 1, 1]}, name=name)


X = {"x": (F32, (2, 3, 5, 6))}


def test_conv_bias_relu() -> None:
    g = _graph(X, lambda b, x: b.op("Relu", [_conv(b, x)], name="relu"))
    g1 = _fuse(g)
    (node,) = g1.nodes
    assert node.name == "conv" and node.attrs.anchor_op == "Conv" and node.attrs.anchor_inputs == 2
    assert _epilogue(node) == ["Add", "Relu"]
    bias = g1.constants[node.inputs[2].name].data
    assert bias.shape == (4, 1, 1)
    assert g1.outputs[0].name == g.outputs[0].name
    assert set(g1.meta["origins"]["conv"]) == {"conv", "relu"}
    assert "Fused[Conv]" in str(g1.op_counts())
    _check(g, g1)


def test_conv_without_bias_or_epilogue_stays() -> None:
    g = _graph(X, lambda b, x: _conv(b, x, bias=False))
    assert fuse_epilogues(g) is g


def test_conv_with_bias_only_becomes_fused() -> None:
    g = _graph(X, lambda b, x: _conv(b, x))
    g1 = _fuse(g)
    assert _epilogue(g1.nodes[0]) == ["Add"]
    _check(g, g1)


def test_resnet_residual_lands_in_a_conv_epilogue() -> None:
    def build(b, x):
        y = b.op("Relu", [_conv(b, x, name="conv1")], name="relu1")
        y = _conv(b, y, name="conv2")
        shortcut = _conv(b, x, name="downsample")
        return b.op("Relu", [b.op("Add", [y, shortcut], name="add")], name="relu2")

    g = _graph(X, build)
    g1 = _fuse(g)
    assert g1.op_counts() == {"Fused[Conv]": 3}
    conv2 = next(n for n in g1.nodes if n.name == "conv2")
    assert _epilogue(conv2) == ["Add", "Add", "Relu"]
    assert set(g1.meta["origins"]["conv2"]) == {"conv2", "add", "relu2"}
    assert not g1.meta.get("near_misses")
    _check(g, g1)


@pytest.mark.parametrize(
    "act",
    [
        "Relu",
        "Sigmoid",
        "Tanh",
        "HardSwish",
        "Gelu",
        "LeakyRelu",
        "Clip",
        "SiLU",
        "Cast",
        "Scale",
    ],
)
def test_activations(act: str) -> None:
    def build(b, x):
        y = _conv(b, x)
        if act == "Clip":  # ReLU6
            lo, hi = b.add_constant(np.float32(0.0), "lo"), b.add_constant(np.float32(6.0), "hi")
            return b.op("Clip", [y, lo, hi])
        if act == "SiLU":
            return b.op("Mul", [y, b.op("Sigmoid", [y])])
        if act == "Cast":
            return b.op("Cast", [b.op("Relu", [y])], {"to": DType.float16.value})
        if act == "Scale":
            return b.op("Mul", [y, b.add_constant(np.float32(0.5), "s")])
        if act == "LeakyRelu":
            return b.op(act, [y], {"alpha": 0.2})
        return b.op(act, [y])

    g = _graph(X, build)
    g1 = _fuse(g)
    assert g1.op_counts() == {"Fused[Conv]": 1}
    _check(g, g1, atol=1e-3 if act == "Cast" else 1e-6, rtol=1e-3 if act == "Cast" else 1e-5)


def test_extra_input_broadcast_into_the_output() -> None:
    def build(b, x, s):
        return b.op("Mul", [_conv(b, x), b.op("Sigmoid", [s])], name="gate")

    g = _graph({"x": (F32, (2, 3, 5, 6)), "s": (F32, (2, 4, 1, 1))}, build)
    g1 = _fuse(g)
    assert g1.op_counts() == {"Fused[Conv]": 1, "Sigmoid": 1}
    _check(g, g1)


def test_a_broadcast_that_grows_the_output_is_not_fused() -> None:
    def build(b, x, r):
        return b.op("Add", [_conv(b, x, bias=False), r], name="grow")

    g = _graph({"x": (F32, (1, 3, 5, 6)), "r": (F32, (3, 4, 5, 6))}, build)
    assert fuse_epilogues(g) is g


def test_near_miss_when_an_intermediate_has_another_reader() -> None:
    def build(b, x):
        y = _conv(b, x, bias=False, name="conv1")
        r = b.op("Relu", [y], name="relu3")
        z = b.op("MaxPool", [y], {"kernel_shape": [1, 1]}, name="add7")
        return [r, z]

    g = _graph(X, build)
    g1 = fuse_epilogues(g)
    assert g1.op_counts() == g.op_counts()
    assert g1.meta["near_misses"] == ["Conv 'conv1' not fused with 'relu3': its output is also used by 'add7'"]


def test_chain_ends_where_a_value_is_read_elsewhere() -> None:
    def build(b, x):
        y = b.op("Relu", [_conv(b, x)], name="relu")
        z = b.op("Sigmoid", [y], name="sig")
        return [z, b.op("MaxPool", [y], {"kernel_shape": [2, 2]}, name="pool")]

    g = _graph(X, build)
    g1 = _fuse(g)
    conv = next(n for n in g1.nodes if n.op == "Fused")
    assert _epilogue(conv) == ["Add", "Relu"]
    assert "Sigmoid" in g1.op_counts()
    assert g1.meta["near_misses"] == ["Conv 'conv' not fused with 'sig': 'relu' is also used by 'pool'"]
    _check(g, g1)


def test_graph_output_intermediate() -> None:
    def build(b, x):
        y = b.op("Relu", [_conv(b, x)], name="relu")
        return [y, b.op("Tanh", [y], name="tanh")]

    g = _graph(X, build)
    g1 = _fuse(g)
    assert g1.op_counts() == {"Fused[Conv]": 1, "Tanh": 1}
    assert "graph output" in g1.meta["near_misses"][0]
    _check(g, g1)


@pytest.mark.parametrize("beta", [1.0, 0.5])
def test_gemm_c(beta: float) -> None:
    def build(b, x):
        y = b.op(
            "Gemm",
            [x, b.add_constant(_rand(5, 3), "w"), b.add_constant(_rand(5), "c")],
            {"transB": 1, "beta": beta},
            name="fc",
        )
        return b.op("Relu", [y])

    g = _graph({"x": (F32, (4, 3))}, build)
    g1 = _fuse(g)
    (node,) = g1.nodes
    assert node.attrs.anchor_inputs == (2 if beta == 1.0 else 3)
    assert _epilogue(node) == (["Add", "Relu"] if beta == 1.0 else ["Relu"])
    _check(g, g1)


def test_gemm_alone_stays() -> None:
    g = _graph({"x": (F32, (4, 3))}, lambda b, x: b.op("Gemm", [x, b.add_constant(_rand(3, 5), "w")]))
    assert fuse_epilogues(g) is g


def test_batched_matmul_bias_gelu_residual() -> None:
    def build(b, x):
        h = b.op("MatMul", [x, b.add_constant(_rand(8, 16), "w1")], name="fc1")
        h = b.op("Gelu", [b.op("Add", [h, b.add_constant(_rand(16), "b1")])], name="gelu")
        y = b.op("MatMul", [h, b.add_constant(_rand(16, 8), "w2")], name="fc2")
        y = b.op("Add", [b.add_constant(_rand(8), "b2"), y], name="bias2")  # bias on the left
        return b.op("Add", [x, y], name="residual")

    g = _graph({"x": (F32, ("batch", 7, 8))}, build)
    g1 = _fuse(g)
    assert g1.op_counts() == {"Fused[MatMul]": 2}
    fc1, fc2 = g1.nodes
    assert _epilogue(fc1) == ["Add", "Gelu"] and _epilogue(fc2) == ["Add", "Add"]
    x = _rand(2, 7, 8)
    _check(g, g1, {"x": x})


def test_internal_matmul_anchor() -> None:
    def build(b, q, k):
        s = b.op("MatMul", [q, k], {"trans_b": 1, "alpha": 0.25}, name="qk", domain=INTERNAL_DOMAIN)
        return b.op("Add", [s, b.add_constant(_rand(1, 1, 6, 6), "mask")], name="mask_add")

    g = _graph({"q": (F32, (2, 3, 6, 4)), "k": (F32, (2, 3, 6, 4))}, build)
    g1 = _fuse(g)
    (node,) = g1.nodes
    assert node.attrs.anchor_domain == INTERNAL_DOMAIN and node.attrs.anchor_attrs.trans_b == 1
    _check(g, g1)


def test_unsupported_op_is_not_absorbed() -> None:
    def build(b, x):
        y = b.op("MatMul", [x, b.add_constant(np.arange(6, dtype=np.uint32).reshape(3, 2), "w")])
        return b.op("BitShift", [y, b.add_constant(np.uint32(1), "s")], {"direction": "LEFT"})

    g = _graph({"x": (DType.uint32, (4, 3))}, build)
    # Not for the CUDA target, which has no BitShift expression; the reference executor takes it.
    assert fuse_epilogues(g, CUDA) is g
    assert [n.op for n in fuse_epilogues(g).nodes] == ["Fused"]


def test_two_anchors_one_add() -> None:
    """Add(conv_a, conv_b): one conv takes the Add, the other feeds it, no near miss."""

    def build(b, x):
        return b.op("Add", [_conv(b, x, name="a"), _conv(b, x, name="b")], name="add")

    g = _graph(X, build)
    g1 = _fuse(g)
    assert g1.op_counts() == {"Fused[Conv]": 2}
    assert not g1.meta.get("near_misses")
    _check(g, g1)


def test_float16_conv() -> None:
    def build(b, x):
        w = b.add_constant(_rand(4, 3, 3, 3, dtype=np.float16), "w")
        bias = b.add_constant(_rand(4, dtype=np.float16), "b")
        return b.op("Relu", [b.op("Conv", [x, w, bias])])

    g = _graph({"x": (DType.float16, (1, 3, 5, 5))}, build)
    g1 = _fuse(g)
    assert g1.op_counts() == {"Fused[Conv]": 1}
    _check(g, g1, rtol=2e-3, atol=2e-3)


def test_pipeline_conv_bn_relu_residual() -> None:
    """The full pipeline: BN folds, then bias, residual and ReLU join the conv."""

    def build(b, x):
        y = _conv(b, x, bias=False)
        c = 4
        params = [
            b.add_constant(RNG.uniform(0.5, 1.5, c).astype(np.float32), "g"),
            b.add_constant(_rand(c), "beta"),
            b.add_constant(_rand(c) * 0.1, "mean"),
            b.add_constant(RNG.uniform(0.5, 2, c).astype(np.float32), "var"),
        ]
        y = b.op("BatchNormalization", [y, *params])
        r = b.op("Conv", [x, b.add_constant(_rand(4, 3, 1, 1), "wd")], name="down")
        return b.op("Relu", [b.op("Add", [y, r])])

    g = _graph(X, build)
    g1 = optimize(g, OptimizeOptions(opt_level=2, verify=True)).graph
    assert g1.op_counts() == {"Fused[Conv]": 1, "Conv": 1}
    _check(g, g1, rtol=1e-5, atol=1e-5)


def _ints(b, values):
    return b.add_constant(np.array(values, dtype=np.int64), "shape")


def test_epilogue_looks_through_a_reshape() -> None:
    """GPT-2's Conv1D: gemm on (seq, hidden), viewed back as (1, seq, hidden), then the bias,
    GELU and the residual: the epilogue runs in the gemm's shape and the result is viewed."""

    def build(b, x, r):
        y = b.op("Gemm", [x, b.add_constant(_rand(6, 8), "w")], name="fc")
        y = b.op("Reshape", [y, _ints(b, [1, 5, 8])], name="view")
        y = b.op("Add", [y, b.add_constant(_rand(8), "bias")], name="bias")
        y = b.op("Gelu", [y], {"approximate": "tanh"}, name="gelu")
        return b.op("Add", [r, b.op("Mul", [y, b.add_constant(_rand(1, 1, 8), "gamma")])], name="residual")

    g = _graph({"x": (F32, (5, 6)), "r": (F32, (1, 5, 8))}, build)
    g1 = _fuse(g)
    assert g1.op_counts() == {"Fused[Gemm]": 1, "Reshape": 2}
    fused = next(n for n in g1.nodes if n.op == "Fused")
    assert _epilogue(fused) == ["Add", "Gelu", "Mul", "Add"]
    assert fused.outputs[0].ttype.shape == (5, 8)
    assert g1.outputs[0].name == g.outputs[0].name and g1.outputs[0].ttype.shape == (1, 5, 8)
    assert set(g1.meta["origins"]["fc"]) == {"fc", "view", "bias", "gelu", "residual"} | {
        n.name for n in g.nodes if n.op == "Mul"
    }
    _check(g, g1)


def test_reshape_that_moves_a_broadcast_axis_ends_the_epilogue() -> None:
    # (4, 6) viewed as (2, 12): a (12,) bias varies along elements the (4, 6) index cannot express.
    def build(b, x):
        y = b.op("Relu", [b.op("MatMul", [x, b.add_constant(_rand(3, 6), "w")], name="mm")], name="relu")
        y = b.op("Reshape", [y, _ints(b, [2, 12])], name="view")
        return b.op("Add", [y, b.add_constant(_rand(12), "c")], name="add")

    g = _graph({"x": (F32, (4, 3))}, build)
    g1 = _fuse(g)
    assert g1.op_counts() == {"Add": 1, "Fused[MatMul]": 1, "Reshape": 1}
    assert _epilogue(next(n for n in g1.nodes if n.op == "Fused")) == ["Relu"]
    _check(g, g1)


def test_trailing_reshape_stays_outside() -> None:
    def build(b, x):
        y = b.op("Relu", [b.op("MatMul", [x, b.add_constant(_rand(3, 6), "w")])])
        return b.op("Reshape", [y, _ints(b, [2, 12])])

    g = _graph({"x": (F32, (4, 3))}, build)
    g1 = _fuse(g)
    assert g1.op_counts() == {"Fused[MatMul]": 1, "Reshape": 1}
    _check(g, g1)
