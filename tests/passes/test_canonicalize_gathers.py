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
