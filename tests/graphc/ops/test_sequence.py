"""Sequence ops against ONNX Runtime on small multi-node graphs, plus their type inference."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from graphc.errors import ShapeError
from graphc.ir.builder import GraphBuilder
from graphc.ir.types import DType, SequenceType, TensorType
from helpers import ONNX_OPSET, assert_close, np_to_onnx_dtype, rand, run_graphc, run_ort

I64 = np.int64


def _model(nodes, inputs, outputs, consts=None, seq_inputs=None, ranks=None):
    """A graph of `nodes` (helper.make_node) over tensor inputs, sequence inputs (name -> element
    dtype) and constants; outputs are named and typed by ONNX shape inference."""
    g_in = [helper.make_tensor_value_info(k, np_to_onnx_dtype(v.dtype), v.shape) for k, v in inputs.items()]
    for k, dt in (seq_inputs or {}).items():
        elem = helper.make_tensor_type_proto(np_to_onnx_dtype(dt), (None, None))
        g_in.append(helper.make_value_info(k, helper.make_sequence_type_proto(elem)))
    g_out = [helper.make_value_info(o, onnx.TypeProto()) for o in outputs]
    inits = [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in (consts or {}).items()]
    graph = helper.make_graph(nodes, "seq", g_in, g_out, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)])
    model.ir_version = min(model.ir_version, 10)
    model = onnx.shape_inference.infer_shapes(model)
    # Shape inference fills outputs in value_info; copy the types onto the graph outputs.
    known = {vi.name: vi for vi in model.graph.value_info}
    for vi in model.graph.output:
        if vi.name in known:
            vi.CopyFrom(known[vi.name])
        # The checker wants a shape on graph outputs; give unknown dims of the right rank where
        # ONNX inference could not tell.
        tt = vi.type.sequence_type.elem_type.tensor_type if vi.type.HasField("sequence_type") else vi.type.tensor_type
        if not tt.HasField("shape") and vi.name in (ranks or {}):
            tt.shape.dim.extend(onnx.TensorShapeProto.Dimension() for _ in range(ranks[vi.name]))
    return model


def _compare(model, feeds):
    expected = run_ort(model, feeds)
    actual = run_graphc(model, feeds)
    for k, e in expected.items():
        a = actual[k]
        if isinstance(e, list):
            assert isinstance(a, list) and len(a) == len(e), f"{k}: {len(a)} elements != {len(e)}"
            for i, (x, y) in enumerate(zip(a, e, strict=True)):
                assert_close(x, y, what=f"{k}[{i}]")
        else:
            assert_close(a, e, what=k)
    return actual


def N(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs, **attrs)


# ---- SplitToSequence ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "axis", "split"),
    [
        ((5, 3), 0, None),
        ((2, 7), -1, np.array(3, I64)),  # chunks of 3, last one shorter
        ((2, 6), 1, np.array(2, I64)),
        ((4, 3, 2), 1, np.array([1, 0, 2], I64)),
        ((6,), 0, np.array([6], I64)),
    ],
)
@pytest.mark.parametrize("keepdims", [1, 0])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.bool_])
def test_split_to_sequence(shape, axis, split, keepdims, dtype):
    ins = ["x"] if split is None else ["x", "split"]
    consts = None if split is None else {"split": split}
    nodes = [N("SplitToSequence", ins, ["s"], axis=axis, keepdims=keepdims), N("SequenceLength", ["s"], ["n"])]
    x = rand(shape, dtype)
    model = _model(nodes, {"x": x}, ["s", "n"], consts)
    if split is not None and split.ndim == 0 and not keepdims:
        # keepdims only applies without split; ORT squeezes a scalar split's chunks anyway.
        with_dims = run_graphc(_model([N("SplitToSequence", ins, ["s"], axis=axis)], {"x": x}, ["s"], consts), {"x": x})
        got = run_graphc(model, {"x": x})
        for a, b in zip(got["s"], with_dims["s"], strict=True):
            assert_close(a, b)
        return
    got = _compare(model, {"x": x})
    assert got["n"] == len(got["s"])


def test_split_to_sequence_runtime_split():
    x = rand((3, 7))
    nodes = [N("SplitToSequence", ["x", "split"], ["s"], axis=1)]
    _compare(
        _model(nodes, {"x": x, "split": np.array([2, 4, 1], I64)}, ["s"]), {"x": x, "split": np.array([2, 4, 1], I64)}
    )


# ---- Construct, At, Length, Insert, Erase ------------------------------------------------------


@pytest.mark.parametrize("pos", [0, 2, -1, -3])
@pytest.mark.parametrize("pos_dtype", [np.int64, np.int32])
def test_construct_at_length(pos, pos_dtype):
    ins = {"a": rand((2, 3)), "b": rand((4, 3), seed=1), "c": rand((1, 3), seed=2)}
    nodes = [
        N("SequenceConstruct", ["a", "b", "c"], ["s"]),
        N("SequenceAt", ["s", "p"], ["y"]),
        N("SequenceLength", ["s"], ["n"]),
    ]
    model = _model(nodes, ins, ["s", "y", "n"], {"p": np.array(pos, pos_dtype)})
    _compare(model, ins)


@pytest.mark.parametrize("pos", [None, 0, 1, -1, 2])
def test_insert(pos):
    ins = {"a": rand((2, 3)), "b": rand((2, 5), seed=1), "t": rand((2, 1), seed=2)}
    args = ["s", "t"] if pos is None else ["s", "t", "p"]
    nodes = [N("SequenceConstruct", ["a", "b"], ["s"]), N("SequenceInsert", args, ["s2"])]
    consts = None if pos is None else {"p": np.array(pos, I64)}
    _compare(_model(nodes, ins, ["s2"], consts), ins)


@pytest.mark.parametrize("pos", [None, 0, -2, 2])
def test_erase(pos):
    ins = {"a": rand((3,)), "b": rand((3,), seed=1), "c": rand((3,), seed=2)}
    args = ["s"] if pos is None else ["s", "p"]
    nodes = [N("SequenceConstruct", ["a", "b", "c"], ["s"]), N("SequenceErase", args, ["s2"])]
    consts = None if pos is None else {"p": np.array(pos, I64)}
    _compare(_model(nodes, ins, ["s2"], consts), ins)


@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.INT64, TensorProto.FLOAT16])
def test_empty_then_insert_and_concat(dtype):
    np_dt = helper.tensor_dtype_to_np_dtype(dtype)
    ins = {"a": rand((2, 3), np_dt), "b": rand((1, 3), np_dt, seed=1)}
    nodes = [
        N("SequenceEmpty", [], ["e"], dtype=dtype),
        N("SequenceLength", ["e"], ["n0"]),
        N("SequenceInsert", ["e", "a"], ["s1"]),
        N("SequenceInsert", ["s1", "b", "p"], ["s2"]),
        N("ConcatFromSequence", ["s2"], ["y"], axis=0),
    ]
    model = _model(nodes, ins, ["n0", "s2", "y"], {"p": np.array(0, I64)}, ranks={"s2": 2, "y": 2})
    _compare(model, ins)


@pytest.mark.parametrize(("axis", "new_axis"), [(0, 0), (1, 0), (-1, 0), (0, 1), (2, 1), (-1, 1), (-3, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
def test_concat_from_sequence(axis, new_axis, dtype):
    ins = {f"x{i}": rand((2, 3), dtype, seed=i) for i in range(3)}
    nodes = [
        N("SequenceConstruct", list(ins), ["s"]),
        N("ConcatFromSequence", ["s"], ["y"], axis=axis, new_axis=new_axis),
    ]
    _compare(_model(nodes, ins, ["y"]), ins)


def test_sequence_graph_input():
    seq = [rand((2, 3)), rand((4, 3), seed=1)]
    nodes = [N("ConcatFromSequence", ["s"], ["y"], axis=0), N("SequenceAt", ["s", "p"], ["z"])]
    model = _model(
        nodes, {}, ["y", "z"], {"p": np.array(-1, I64)}, seq_inputs={"s": np.float32}, ranks={"y": 2, "z": 2}
    )
    _compare(model, {"s": seq})


# ---- type inference ----------------------------------------------------------------------------


def _build():
    b = GraphBuilder("t")
    return b


def T(shape, dtype=DType.float32):
    return TensorType(dtype, None if shape is None else tuple(shape))


def test_inference_lengths_and_elements():
    b = _build()
    a = b.add_input("a", T(("n", 3)))
    c = b.add_input("c", T((2, 3)))
    s = b.op("SequenceConstruct", [a, c])
    assert s.type == SequenceType(T((None, 3)), 2)
    n = b.op("SequenceLength", [s])
    assert b.known_value(n) == 2
    s2 = b.op("SequenceInsert", [s, c])
    assert s2.type == SequenceType(T((None, 3)), 3)
    s3 = b.op("SequenceErase", [s2, b.add_constant(np.array(0, I64))])
    assert s3.type.length == 2
    y = b.op("ConcatFromSequence", [s3], {"axis": 1})
    assert y.type == T((None, 6))
    z = b.op("ConcatFromSequence", [s3], {"axis": -1, "new_axis": 1})
    assert z.type == T((None, 3, 2))
    e = b.op("SequenceEmpty", [], {"dtype": TensorProto.INT64})
    assert e.type == SequenceType(T(None, DType.int64), 0)
    e1 = b.op("SequenceInsert", [e, b.add_input("i", T((4,), DType.int64))])
    assert e1.type == SequenceType(T((4,), DType.int64), 1)


def test_inference_split_to_sequence():
    b = _build()
    x = b.add_input("x", T((4, 7)))
    assert b.op("SplitToSequence", [x], {"axis": 1, "keepdims": 0}).type == SequenceType(T((4,)), 7)
    s = b.op("SplitToSequence", [x, b.add_constant(np.array(3, I64))], {"axis": 1})
    assert s.type == SequenceType(T((4, None)), 3)
    s = b.op("SplitToSequence", [x, b.add_constant(np.array([2, 2], I64))])
    assert s.type == SequenceType(T((2, 7)), 2)
    with pytest.raises(ShapeError, match="sum"):
        b.op("SplitToSequence", [x, b.add_constant(np.array([2, 3], I64))])


def test_inference_errors():
    b = _build()
    a = b.add_input("a", T((2,)))
    s = b.op("SequenceConstruct", [a, a])
    with pytest.raises(ShapeError, match="out of range"):
        b.op("SequenceAt", [s, b.add_constant(np.array(2, I64))])
    with pytest.raises(ShapeError, match="must be a sequence"):
        b.op("SequenceLength", [a])
    with pytest.raises(ShapeError, match="dtypes"):
        b.op("SequenceInsert", [s, b.add_input("i", T((2,), DType.int64))])
    with pytest.raises(ShapeError, match="empty"):
        b.op("SequenceErase", [b.op("SequenceEmpty", [])])
