"""fuse_elementwise: remaining elementwise DAGs -> Fused[Elementwise] nodes (no anchor)."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
from graphc.codegen.capabilities import CUDA
from graphc.ir.builder import GraphBuilder
from graphc.ir.graph import Graph
from graphc.ir.types import DType, TensorType
from graphc.ir.verify import verify_graph
from graphc.passes.fuse_elementwise import MAX_BROADCAST_OPS, fuse_elementwise

RNG = np.random.default_rng(3)
F32 = DType.float32


def _graph(inputs: dict, build) -> Graph:
    b = GraphBuilder("t", opset=21)
    xs = [b.add_input(k, TensorType(dt, tuple(s))) for k, (dt, s) in inputs.items()]
    outs = build(b, *xs)
    b.set_outputs(outs if isinstance(outs, list) else [outs])
    return b.build()


def _fuse(g: Graph) -> Graph:
    g1 = fuse_elementwise(g)
    verify_graph(g1)
    return g1


def _check(g0: Graph, g1: Graph) -> None:
    feeds = {}
    for v in g0.inputs:
        t = v.ttype
        if t.dtype == DType.bool:
            feeds[v.name] = RNG.random(t.shape) < 0.5
        elif t.dtype.is_int:
            feeds[v.name] = RNG.integers(1, 5, t.shape).astype(t.dtype.numpy)
        else:
            feeds[v.name] = RNG.standard_normal(t.shape).astype(t.dtype.numpy)
    a = graphc.interpret(g0, feeds)
    b = graphc.interpret(g1, feeds)
    for k in a:
        assert b[k].dtype == a[k].dtype and b[k].shape == a[k].shape
        np.testing.assert_allclose(b[k].astype(np.float64), a[k].astype(np.float64), rtol=1e-6, atol=1e-7, err_msg=k)


def _ops(node) -> list[str]:
    return [e.op for e in node.attrs.epilogue]


XY = {"x": (F32, (2, 3, 4)), "y": (F32, (2, 3, 4))}


def test_chain() -> None:
    def build(b, x, y):
        a = b.op("Exp", [x], name="exp")
        m = b.op("Mul", [a, y], name="mul")
        return b.op("Add", [m, b.add_constant(np.float32(1.0), "one")], name="add")

    g = _graph(XY, build)
    g1 = _fuse(g)
    (node,) = g1.nodes
    assert node.name == "add" and node.attrs.anchor_op is None
    assert _ops(node) == ["Exp", "Mul", "Add"]
    assert [v.name for v in node.inputs] == ["x", "y", "one"]
    assert set(g1.meta["origins"]["add"]) == {"exp", "mul", "add"}
    assert g1.op_counts() == {"Fused[Elementwise]": 1}
    _check(g, g1)


def test_lone_op() -> None:
    g = _graph(XY, lambda b, x, y: b.op("Sub", [x, y], name="sub"))
    g1 = _fuse(g)
    assert g1.op_counts() == {"Fused[Elementwise]": 1}
    _check(g, g1)


def test_dag_reading_an_input_twice() -> None:
    g = _graph(XY, lambda b, x, y: b.op("Mul", [x, b.op("Sigmoid", [x])]))
    g1 = _fuse(g)
    (node,) = g1.nodes
    assert _ops(node) == ["Sigmoid", "Mul"] and len(node.inputs) == 1
    _check(g, g1)


def test_diamond_inside_one_group() -> None:
    def build(b, x, y):
        a = b.op("Exp", [x])
        return b.op("Add", [b.op("Neg", [a]), b.op("Tanh", [a])])

    g = _graph(XY, build)
    g1 = _fuse(g)
    assert g1.op_counts() == {"Fused[Elementwise]": 1}
    _check(g, g1)


def test_shared_producer_read_outside_stays_apart() -> None:
    def build(b, x, y):
        a = b.op("Exp", [x], name="exp")
        return [b.op("Neg", [a]), b.op("ReduceSum", [a])]

    g = _graph(XY, build)
    g1 = _fuse(g)
    assert g1.op_counts() == {"Fused[Elementwise]": 2, "ReduceSum": 1}
    _check(g, g1)


def test_graph_output_intermediate_stays_apart() -> None:
    g = _graph(XY, lambda b, x, y: [b.op("Exp", [x], name="e"), b.op("Neg", [b.value("e")])])
    g1 = _fuse(g)
    assert g1.op_counts() == {"Fused[Elementwise]": 2}
    _check(g, g1)


def test_expensive_small_producer_is_not_recomputed_per_element() -> None:
    def build(b, x, v):
        return b.op("Add", [x, b.op("Exp", [v], name="exp_small")], name="add")

    g = _graph({"x": (F32, (2, 3, 4)), "v": (F32, (4,))}, build)
    g1 = _fuse(g)
    assert g1.op_counts() == {"Fused[Elementwise]": 2}
    _check(g, g1)


def test_cheap_small_producers_join_up_to_a_limit() -> None:
    def build(b, x, v):
        s = v
        for i in range(MAX_BROADCAST_OPS + 1):
            s = b.op("Mul", [s, b.add_constant(np.float32(i + 2.0), f"k{i}")], name=f"small{i}")
        return b.op("Add", [x, s], name="add")

    g = _graph({"x": (F32, (2, 3, 4)), "v": (F32, (3, 1))}, build)
    g1 = _fuse(g)
    assert g1.op_counts() == {"Fused[Elementwise]": 2}
    last = g1.nodes[-1]
    assert _ops(last) == ["Mul"] * MAX_BROADCAST_OPS + ["Add"]
    _check(g, g1)


def test_shape_arithmetic_is_left_alone() -> None:
    def build(b, x, n):
        return b.op("Add", [n, b.add_constant(np.array([1, 2], dtype=np.int64), "k")])

    g = _graph({"x": (F32, (2,)), "n": (DType.int64, (2,))}, build)
    assert fuse_elementwise(g) is g


def test_clip_with_an_omitted_min_stays() -> None:
    def build(b, x, y):
        return b.op("Clip", [b.op("Exp", [x]), None, b.add_constant(np.float32(2.0), "hi")], name="clip")

    g = _graph(XY, build)
    g1 = _fuse(g)
    assert g1.op_counts() == {"Clip": 1, "Fused[Elementwise]": 1}
    _check(g, g1)


def test_unsupported_ops_and_dtypes_stay() -> None:
    def build(b, x, s):
        return [
            b.op("BitShift", [x, b.add_constant(np.uint32(1), "k")], {"direction": "LEFT"}),
            b.op("Equal", [s, s]),
        ]

    g = _graph({"x": (DType.uint32, (3,)), "s": (DType.string, (3,))}, build)
    # The CUDA target renders no BitShift and stores no strings.
    assert fuse_elementwise(g, CUDA) is g
    # The reference executor computes BitShift inside a fused node too, but no strings either.
    assert [n.op for n in fuse_elementwise(g).nodes] == ["Fused", "Equal"]


@pytest.mark.parametrize("dtype", [DType.float16, DType.int32, DType.bool])
def test_dtypes(dtype: DType) -> None:
    def build(b, x, y):
        if dtype == DType.bool:
            return b.op("Not", [b.op("And", [x, y])])
        return b.op("Abs", [b.op("Sub", [x, y])])

    g = _graph({"x": (dtype, (3, 5)), "y": (dtype, (3, 5))}, build)
    g1 = _fuse(g)
    assert g1.op_counts() == {"Fused[Elementwise]": 1}
    _check(g, g1)


def test_where_and_compare() -> None:
    def build(b, x, y):
        return b.op("Where", [b.op("Greater", [x, y]), x, b.op("Neg", [y])])

    g = _graph(XY, build)
    g1 = _fuse(g)
    assert g1.op_counts() == {"Fused[Elementwise]": 1}
    _check(g, g1)


def test_anchored_fused_nodes_are_left_alone() -> None:
    def build(b, x, y):
        return b.op("Relu", [b.op("MatMul", [x, b.add_constant(RNG.standard_normal((4, 4)).astype(np.float32), "w")])])

    from graphc.passes.fuse_epilogue import fuse_epilogues

    g = fuse_epilogues(_graph(XY, build))
    assert fuse_elementwise(g) is g
