"""gathers_to_views: a Gather/GatherND by constant indices that reads its data whole and in order
is a Reshape (the exporters' spelling of the attention mask's mask[:, None, None, :])."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphc
from graphc.passes.canonicalize_gathers import gathers_to_views, reads_in_order

F = TensorProto.FLOAT


def _graph(op: str, data_shape, idx: np.ndarray, out_shape, **attrs):
    node = helper.make_node(op, ["x", "i"], ["y"], **attrs)
    g = helper.make_graph(
        [node],
        "t",
        [helper.make_tensor_value_info("x", F, list(data_shape))],
        [helper.make_tensor_value_info("y", F, list(out_shape))],
        [numpy_helper.from_array(idx.astype(np.int64), "i")],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    return graphc.bind_shapes(graphc.load_onnx(model), {})


def _same(g0, g1, shape) -> None:
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    np.testing.assert_array_equal(graphc.interpret(g0, {"x": x})["y"], graphc.interpret(g1, {"x": x})["y"])


def test_gather_by_arange_is_a_reshape():
    # TorchScript's mask broadcast: the flattened (seq, 1) mask gathered by arange(seq) as (1, 1, 1, seq)
    g0 = _graph("Gather", (16, 1), np.arange(16).reshape(1, 1, 1, 16), (1, 1, 1, 16, 1), axis=0)
    g1 = gathers_to_views(g0)
    assert g1.op_counts() == {"Reshape": 1}
    _same(g0, g1, (16, 1))


def test_gather_nd_by_every_index_in_order_is_a_reshape():
    # dynamo's: GatherND of the (1, seq) mask by every (0, j), as (1, 1, 1, seq)
    idx = np.stack([np.zeros(16, np.int64), np.arange(16)], -1).reshape(1, 1, 1, 16, 2)
    g0 = _graph("GatherND", (1, 16), idx, (1, 1, 1, 16))
    g1 = gathers_to_views(g0)
    assert g1.op_counts() == {"Reshape": 1}
    _same(g0, g1, (1, 16))


def test_negative_indices_count_from_the_end():
    g0 = _graph("Gather", (2, 5), np.array([-5, -4, 2, 3, -1]), (2, 5), axis=1)
    assert gathers_to_views(g0).op_counts() == {"Reshape": 1}


@pytest.mark.parametrize(
    "idx",
    [np.array([0, 1, 2, 4, 3]), np.array([0, 1, 2, 3]), np.array([0, 1, 2, 3, 4, 4])],
    ids=["permuted", "short", "repeated"],
)
def test_a_gather_that_moves_drops_or_repeats_stays(idx):
    g0 = _graph("Gather", (2, 5), idx, (2, idx.size), axis=1)
    g1 = gathers_to_views(g0)
    assert g1.op_counts() == {"Gather": 1}
    _same(g0, g1, (2, 5))


def test_reads_in_order_gather_nd_partial_tuples():
    # k = 1 of a (3, 2) data: rows 0, 1, 2 in order -> in order; rows 0, 2, 1 -> not
    assert reads_in_order("GatherND", (3, 2), np.array([[0], [1], [2]]))
    assert not reads_in_order("GatherND", (3, 2), np.array([[0], [2], [1]]))
    assert not reads_in_order("GatherND", (3, 2), np.array([[0, 0], [0, 1]]))


def _roll_graph(shift: int, *, extra_axis: bool = False, slice_is_output: bool = False):
    # torch.roll(x, shift, dim=1) as the exporters write it: two slices and a concat
    n = 8
    inits = {
        "s0": np.array([n - shift]),
        "e0": np.array([n]),
        "s1": np.array([0]),
        "e1": np.array([n - shift]),
        "ax": np.array([1, 2] if extra_axis else [1]),
    }
    if extra_axis:
        inits.update(s0=np.array([n - shift, 1]), e0=np.array([n, 4]), s1=np.array([0, 1]), e1=np.array([n - shift, 4]))
    nodes = [
        helper.make_node("Slice", ["x", "s0", "e0", "ax"], ["a"]),
        helper.make_node("Slice", ["x", "s1", "e1", "ax"], ["b"]),
        helper.make_node("Concat", ["a", "b"], ["y"], axis=1),
    ]
    w = 3 if extra_axis else 4
    outs = [helper.make_tensor_value_info("y", F, [2, n, w])]
    if slice_is_output:
        outs.append(helper.make_tensor_value_info("a", F, [2, shift, w]))
    g = helper.make_graph(
        nodes,
        "t",
        [helper.make_tensor_value_info("x", F, [2, n, 4])],
        outs,
        [numpy_helper.from_array(v.astype(np.int64), k) for k, v in inits.items()],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    return graphc.bind_shapes(graphc.load_onnx(model), {})


def test_a_roll_is_one_gather():
    g0 = _roll_graph(3)
    g1 = gathers_to_views(g0)
    assert g1.op_counts() == {"Gather": 1}
    _same(g0, g1, (2, 8, 4))


def test_a_roll_by_zero_is_a_reshape():
    # the slices put x back in order: the Gather they become is a view on the fixed point's next run
    g0 = _roll_graph(0)
    g1 = gathers_to_views(gathers_to_views(g0))
    assert g1.op_counts() == {"Reshape": 1}
    _same(g0, g1, (2, 8, 4))


def test_slices_along_another_axis_or_read_elsewhere_stay():
    # (the second: a partition of the axis, but of a graph input, not of a GEMM's output: no Split)
    for g0 in (_roll_graph(3, extra_axis=True), _roll_graph(3, slice_is_output=True)):
        g1 = gathers_to_views(g0)
        assert g1.op_counts() == {"Slice": 2, "Concat": 1}


@pytest.mark.parametrize(
    ("perm", "idx", "view"),
    [
        ((3, 0, 1, 2, 4), [[2]], True),  # Falcon's x[..., -2, :] as dynamo writes it: then a view
        ((3, 0, 1, 2, 4), [[-1]], True),
        ((3, 0, 1, 2, 4), [[1], [3]], False),  # two indices: the order of the kept axes changes
        ((1, 0, 2, 3, 4), [[0]], True),
        ((2, 4, 3, 1, 0), [[1]], False),
    ],
)
def test_gather_nd_of_a_transpose_is_one_gather(perm, idx, view):
    from graphc.ir.graph import Graph
    from tests.helpers import OnnxNet, run_ort

    xs = (2, 5, 2, 4, 3)
    net = OnnxNet()
    x = net.input("x", TensorProto.FLOAT, list(xs))
    t = net.op("Transpose", x, perm=list(perm))
    y = net.op("GatherND", t, net.i64(idx))
    model = net.make([helper.make_tensor_value_info(y, TensorProto.FLOAT, None)], infer=True)
    g: Graph = gathers_to_views(graphc.bind_shapes(graphc.load_onnx(model), None))
    ops = g.op_counts()
    assert "GatherND" not in ops and ops.get("Gather") == 1, ops
    assert ("Reshape" in ops) == view and ("Transpose" in ops) != view, ops  # the input's Transpose is gone
    feeds = {"x": np.random.default_rng(4).normal(size=xs).astype(np.float32)}
    want = next(iter(run_ort(model, feeds).values()))
    np.testing.assert_array_equal(next(iter(graphc.interpret(g, feeds).values())), want)


def test_gather_nd_of_a_transpose_read_elsewhere_keeps_the_transpose():
    from tests.helpers import OnnxNet

    net = OnnxNet()
    x = net.input("x", TensorProto.FLOAT, [2, 3, 4])
    t = net.op("Transpose", x, perm=[2, 0, 1])
    y = net.op("GatherND", t, net.i64([[1]]))
    outs = [helper.make_tensor_value_info(v, TensorProto.FLOAT, None) for v in (y, t)]
    g = gathers_to_views(graphc.load_onnx(net.make(outs, infer=True)))
    assert g.op_counts().get("Transpose") == 1 and "GatherND" not in g.op_counts()


@pytest.mark.parametrize(
    ("parts", "split"),
    [
        ([(0, 8), (8, 16), (16, 24)], True),  # TorchScript's q, k, v of a fused QKV projection
        ([(16, 24), (0, 16)], True),  # any order, unequal sizes
        ([(0, 8), (8, 16)], False),  # leaves the end out
        ([(0, 8), (4, 24)], False),  # overlaps
    ],
)
def test_slices_that_partition_an_axis_are_one_split(parts, split):
    from tests.helpers import OnnxNet, run_ort

    net = OnnxNet()
    x = net.input("x", TensorProto.FLOAT, [2, 3, 16])
    rng = np.random.default_rng(6)
    # a fused projection with its bias, viewed as [2, 3, 2, 12] (GPT-NeoX's q, k, v per head)
    h = net.op("Add", net.op("MatMul", x, net.c(rng.normal(size=(16, 24)))), net.c(rng.normal(size=24)))
    h = net.op("Reshape", h, net.i64([2, 3, 2, 12]))
    parts = [(lo // 2, hi // 2) for lo, hi in parts]
    ys = [net.op("Slice", h, net.i64([lo]), net.i64([hi]), net.i64([-1])) for lo, hi in parts]
    outs = [helper.make_tensor_value_info(y, TensorProto.FLOAT, None) for y in ys]
    model = net.make(outs, infer=True)
    g = gathers_to_views(graphc.load_onnx(model))
    ops = g.op_counts()
    assert (ops.get("Split") == 1 and "Slice" not in ops) if split else ("Split" not in ops), ops
    feeds = {"x": np.random.default_rng(5).normal(size=(2, 3, 16)).astype(np.float32)}
    want = run_ort(model, feeds)
    got = graphc.interpret(g, feeds)
    for name, w in want.items():  # the same elements (the matmul's float sums aside)
        np.testing.assert_allclose(got[name], w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("parts", "read_elsewhere", "split"),
    [
        ([(0, 4), (4, 8), (8, 12)], False, True),  # TorchScript's GPT-NeoX q, k, v of the transposed projection
        ([(0, 6), (6, 12)], False, False),  # two halves: rotate_half's, left to the rotary matcher
        ([(0, 4), (4, 8), (8, 12)], True, True),  # read elsewhere too: still one kernel for the three
    ],
)
def test_slices_of_a_transposed_projection(parts, read_elsewhere, split):
    """Three or more Slices partitioning the last axis of a transposed fused projection are one
    Split of that transpose, as the dynamo exporter writes it."""
    from tests.helpers import OnnxNet, run_ort

    net = OnnxNet()
    x = net.input("x", TensorProto.FLOAT, [2, 3, 16])
    rng = np.random.default_rng(7)
    h = net.op("Add", net.op("MatMul", x, net.c(rng.normal(size=(16, 24)))), net.c(rng.normal(size=24)))
    t = net.op("Transpose", net.op("Reshape", h, net.i64([2, 3, 2, 12])), perm=[0, 2, 1, 3])
    ys = [net.op("Slice", t, net.i64([lo]), net.i64([hi]), net.i64([3])) for lo, hi in parts]
    if read_elsewhere:
        ys.append(net.op("Relu", t))
    model = net.make([helper.make_tensor_value_info(y, TensorProto.FLOAT, None) for y in ys], infer=True)
    g = gathers_to_views(graphc.load_onnx(model))
    ops = g.op_counts()
    assert (ops.get("Split") == 1 and "Slice" not in ops) if split else ("Split" not in ops), ops
    assert ops.get("Transpose") == 1
    feeds = {"x": rng.normal(size=(2, 3, 16)).astype(np.float32)}
    want, got = run_ort(model, feeds), graphc.interpret(g, feeds)
    for name, w in want.items():
        np.testing.assert_allclose(got[name], w, rtol=1e-5, atol=1e-5)
