"""Reduce*, ArgMax/ArgMin and Softmax/LogSoftmax/Hardmax against ONNX Runtime and numpy."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from graphc.errors import ShapeError
from helpers import assert_close, check_against_ort, make_node_model, rand, run_graphc, run_ort

REDUCE_OPS = [
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceSumSquare",
    "ReduceLogSum",
    "ReduceLogSumExp",
]
# (shape, axes or None for "all", keepdims)
REDUCE_CASES = [
    ((3, 5, 7), [1], 1),
    ((3, 5, 7), [-1, 0], 0),
    ((3, 5, 7), None, 1),
    ((3, 5, 7), None, 0),
    ((1, 6, 1, 3), [0, 2], 0),
    ((2, 3, 4, 5), [-3, 3], 1),
    ((7,), [0], 0),
    ((), None, 1),
]


def _reduce_input(op: str, shape, dtype, seed: int = 0) -> np.ndarray:
    if op == "ReduceProd":  # keep products of many factors in range
        return rand(shape, dtype, seed=seed, low=0.7, high=1.3)
    if op == "ReduceLogSum":  # log of a positive sum
        return rand(shape, dtype, seed=seed, low=0.1, high=2.0)
    return rand(shape, dtype, seed=seed)


def _reduce(op, x, axes, keepdims, *, opset=None, noop=None, **kw):
    inits = {}
    attrs = {"keepdims": keepdims}
    if noop is not None:
        attrs["noop_with_empty_axes"] = noop
    axes_as_input = opset is None or opset >= (13 if op == "ReduceSum" else 18)
    if axes is not None:
        if axes_as_input:
            inits["axes"] = np.array(axes, dtype=np.int64)
        else:
            attrs["axes"] = axes
    return check_against_ort(op, {"x": x}, attrs, initializers=inits, opset=opset, **kw)


def _raw_model(op, inputs, attrs, *, initializers=None, opset=18, out_type=TensorProto.FLOAT, out_rank=0):
    """A one-node model without ONNX shape inference (for models it rejects or cannot type)."""
    initializers = initializers or {}
    node = helper.make_node(op, [*inputs, *initializers], ["y"], **attrs)
    g = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
            for k, v in inputs.items()
        ],
        [helper.make_tensor_value_info("y", out_type, [None] * out_rank)],
        [onnx.numpy_helper.from_array(v, k) for k, v in initializers.items()],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("shape,axes,keepdims", REDUCE_CASES)
def test_reduce_float32(op, shape, axes, keepdims):
    _reduce(op, _reduce_input(op, shape, np.float32), axes, keepdims)


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_reduce_float16_float64(op, dtype):
    x = _reduce_input(op, (4, 9, 5), dtype, seed=3)
    _reduce(op, x, [0, 2], 1)
    _reduce(op, x, None, 0)


@pytest.mark.parametrize(
    "op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceSumSquare"]
)
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_reduce_int(op, dtype):
    x = rand((3, 4, 5), dtype, seed=1, low=-7, high=7)
    if op == "ReduceProd":
        x = rand((3, 4, 5), dtype, seed=1, low=-2, high=2)
    _reduce(op, x, [1], 1)
    _reduce(op, x, [0, -1], 0)


@pytest.mark.parametrize("op", ["ReduceL2", "ReduceLogSum", "ReduceLogSumExp"])
def test_reduce_int_float_valued_opset18(op):
    # Opsets 18-27 allow ints here (28 drops them): computed in float, truncated back to int.
    x = rand((3, 4, 5), np.int32, seed=1, low=1, high=9)
    _reduce(op, x, [1], 0, opset=18)


def test_reduce_mean_int_truncates_towards_zero():
    x = np.array([[-3, -4], [3, 4], [-1, 0]], dtype=np.int32)
    got = _reduce("ReduceMean", x, [1], 0)["y"]
    np.testing.assert_array_equal(got, np.array([-3, 3, 0], dtype=np.int32))


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.bool_])
def test_reduce_max_min_small_types(op, dtype):
    x = rand((4, 6), dtype, seed=2, low=-9, high=9)
    _reduce(op, x, [1], 0)
    _reduce(op, x, None, 1)


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_opset11_axes_attribute(op):
    x = _reduce_input(op, (3, 4, 5), np.float32, seed=4)
    _reduce(op, x, [-1, 1], 0, opset=11)
    _reduce(op, x, None, 1, opset=11)


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceMax", "ReduceSumSquare", "ReduceLogSumExp"])
def test_reduce_opset13_axes_attribute(op):
    _reduce(op, _reduce_input(op, (2, 5, 3), np.float32, seed=5), [0, 2], 1, opset=13)


# noop_with_empty_axes=1 with no axes: identity reduction, but the non-reducing steps still apply.
NOOP_EXPECTED = {
    "ReduceSum": lambda x: x,
    "ReduceMean": lambda x: x,
    "ReduceMax": lambda x: x,
    "ReduceMin": lambda x: x,
    "ReduceProd": lambda x: x,
    "ReduceL1": np.abs,
    "ReduceL2": np.abs,
    "ReduceSumSquare": lambda x: x * x,
    "ReduceLogSum": np.log,
    "ReduceLogSumExp": lambda x: x,
}


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("empty_axes_input", [False, True])
def test_reduce_noop_with_empty_axes(op, empty_axes_input):
    x = _reduce_input(op, (3, 4), np.float32, seed=6)
    inits = {"axes": np.zeros((0,), dtype=np.int64)} if empty_axes_input else {}
    model = make_node_model(op, {"x": x}, {"noop_with_empty_axes": 1, "keepdims": 0}, initializers=inits)
    got = run_graphc(model, {"x": x})["y"]
    assert_close(got, NOOP_EXPECTED[op](x).astype(np.float32), what=op)


# Reduction over an empty set gives the identity of the reduction (or the spec's stated value).
EMPTY_EXPECTED = {
    "ReduceSum": 0.0,
    "ReduceMean": np.nan,
    "ReduceMax": -np.inf,
    "ReduceMin": np.inf,
    "ReduceProd": 1.0,
    "ReduceL1": 0.0,
    "ReduceL2": 0.0,
    "ReduceSumSquare": 0.0,
    "ReduceLogSum": -np.inf,
    "ReduceLogSumExp": -np.inf,
}


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_empty_set(op, keepdims):
    x = np.zeros((2, 0, 3), dtype=np.float32)
    model = make_node_model(op, {"x": x}, {"keepdims": keepdims}, initializers={"axes": np.array([1], dtype=np.int64)})
    got = run_graphc(model, {"x": x})["y"]
    shape = (2, 1, 3) if keepdims else (2, 3)
    assert_close(got, np.full(shape, EMPTY_EXPECTED[op], dtype=np.float32), what=op)


@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.bool_])
def test_reduce_max_min_empty_set_non_float(dtype):
    x = np.zeros((0, 3), dtype=dtype)
    axes = {"axes": np.array([0], dtype=np.int64)}
    lo, hi = (False, True) if dtype == np.bool_ else (np.iinfo(dtype).min, np.iinfo(dtype).max)
    for op, value in (("ReduceMax", lo), ("ReduceMin", hi)):
        got = run_graphc(make_node_model(op, {"x": x}, {"keepdims": 0}, initializers=axes), {"x": x})["y"]
        assert_close(got, np.full((3,), value, dtype=dtype), what=op)


def test_reduce_all_over_an_empty_tensor():
    x = np.zeros((0, 4), dtype=np.float32)
    got = run_graphc(make_node_model("ReduceSum", {"x": x}, {"keepdims": 0}), {"x": x})["y"]
    assert got.shape == () and got == 0


def test_reduce_log_sum_exp_is_stable():
    # (ONNX Runtime's CPU kernel overflows here, so the oracle is the closed form.)
    x = np.array([[1000.0, 1000.0, 999.0], [-1000.0, -1001.0, -1000.0]], dtype=np.float32)
    model = make_node_model(
        "ReduceLogSumExp", {"x": x}, {"keepdims": 0}, initializers={"axes": np.array([1], np.int64)}
    )
    got = run_graphc(model, {"x": x})["y"]
    want = np.array([1000 + np.log(2 + np.exp(-1)), -1000 + np.log(2 + np.exp(-1))], dtype=np.float32)
    assert_close(got, want)
    # A row of -inf is log(0) = -inf; a row holding +inf is +inf: never inf - inf = NaN.
    x = np.array([[-np.inf, -np.inf], [np.inf, 1.0], [-np.inf, 2.0]], dtype=np.float16)
    model = make_node_model(
        "ReduceLogSumExp", {"x": x}, {"keepdims": 0}, initializers={"axes": np.array([1], np.int64)}
    )
    got = run_graphc(model, {"x": x})["y"]
    assert_close(got, np.array([-np.inf, np.inf, 2.0], dtype=np.float16))


def test_reduce_float16_accumulates_in_float32():
    # An fp16 accumulator stalls at 2048 when adding ones; the fp32 one reaches 3000 exactly.
    x = np.ones((3000,), dtype=np.float16)
    got = _reduce("ReduceSum", x, None, 0)["y"]
    assert got.dtype == np.float16 and float(got) == 3000.0
    model = make_node_model("ReduceMean", {"x": x}, {"keepdims": 0})
    assert float(run_graphc(model, {"x": x})["y"]) == 1.0


def test_reduce_bfloat16_matches_float32_reference():
    import ml_dtypes

    x32 = rand((5, 33), np.float32, seed=9)
    x = x32.astype(ml_dtypes.bfloat16)
    model = make_node_model("ReduceSum", {"x": x32}, {"keepdims": 0}, initializers={"axes": np.array([1], np.int64)})
    # make_node_model typed x as float32; rebuild with the bf16 input type.
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.BFLOAT16
    got = run_graphc(model, {"x": x})["y"]
    want = x.astype(np.float32).sum(axis=1).astype(ml_dtypes.bfloat16)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))


@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_axes_known_only_at_run_time(keepdims):
    x = rand((3, 4, 5), seed=7)
    axes = np.array([2, 0], dtype=np.int64)
    model = _raw_model("ReduceMax", {"x": x, "axes": axes}, {"keepdims": keepdims}, out_rank=3 if keepdims else 1)
    import graphc

    g = graphc.load_onnx(model)
    out = g.outputs[0].ttype
    assert out.shape == ((None, None, None) if keepdims else (None,))
    feeds = {"x": x, "axes": axes}
    assert_close(graphc.interpret(g, feeds)["y"], run_ort(model, feeds)["y"])


@pytest.mark.parametrize("axes", [[3], [-4], [1, -2]])
def test_reduce_bad_axes(axes):
    x = rand((2, 3, 4))
    model = _raw_model("ReduceSum", {"x": x}, {}, initializers={"axes": np.array(axes, dtype=np.int64)})
    with pytest.raises(ShapeError, match="ReduceSum node"):
        run_graphc(model, {"x": x})


# ---- ArgMax / ArgMin ---------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize(
    "shape,axis,keepdims",
    [((3, 5, 7), 0, 1), ((3, 5, 7), -1, 0), ((3, 5, 7), 1, 1), ((1, 4), 0, 0), ((9,), 0, 1), ((9,), -1, 0)],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int32, np.int64, np.uint8])
def test_arg(op, shape, axis, keepdims, dtype):
    x = rand(shape, dtype, seed=11, low=0, high=9)  # small ints: many ties
    check_against_ort(op, {"x": x}, {"axis": axis, "keepdims": keepdims})


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("select_last_index", [0, 1])
def test_arg_ties(op, select_last_index):
    x = np.array([[2, 5, 5, 1, 1], [0, 0, 0, 0, 0], [3, 1, 4, 1, 4]], dtype=np.float32)
    got = check_against_ort(op, {"x": x}, {"axis": 1, "keepdims": 0, "select_last_index": select_last_index})
    first = {"ArgMax": [1, 0, 2], "ArgMin": [3, 0, 1]}[op]
    last = {"ArgMax": [2, 4, 4], "ArgMin": [4, 4, 3]}[op]
    np.testing.assert_array_equal(got["y"], last if select_last_index else first)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg_opset11(op):
    check_against_ort(op, {"x": rand((4, 3, 2), seed=12)}, {"axis": -2, "keepdims": 0}, opset=11)


def test_arg_empty_axis_refused():
    x = np.zeros((3, 0), dtype=np.float32)
    with pytest.raises(ShapeError, match="ArgMax node"):
        run_graphc(_raw_model("ArgMax", {"x": x}, {"axis": 1}, out_type=TensorProto.INT64), {"x": x})


# ---- Softmax, LogSoftmax, Hardmax --------------------------------------------------------------

SOFTMAX_OPS = ["Softmax", "LogSoftmax", "Hardmax"]


@pytest.mark.parametrize("op", SOFTMAX_OPS)
@pytest.mark.parametrize("shape,axis", [((3, 4, 5), 0), ((3, 4, 5), 1), ((3, 4, 5), -1), ((7,), 0), ((2, 1, 9), -2)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_softmax_family(op, shape, axis, dtype):
    x = rand(shape, dtype, seed=13, low=-4, high=4)
    if op == "Hardmax" and dtype == np.float64:  # no ONNX Runtime kernel
        got = run_graphc(make_node_model(op, {"x": x}, {"axis": axis}), {"x": x})["y"]
        want = (x == np.max(x, axis=axis, keepdims=True)).astype(dtype)  # random data: no ties
        assert_close(got, want)
        return
    check_against_ort(op, {"x": x}, {"axis": axis})


@pytest.mark.parametrize("op", SOFTMAX_OPS)
def test_softmax_family_default_axis(op):
    check_against_ort(op, {"x": rand((2, 3, 6), seed=14)}, {})


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_large_inputs_do_not_overflow(op):
    x = np.array([[1000.0, 999.0, 998.0], [-1e4, 0.0, 1e4]], dtype=np.float32)
    got = check_against_ort(op, {"x": x}, {"axis": -1})["y"]
    assert np.isfinite(got).all()
    # float16: x*exp would overflow at 11; the shifted float32 computation does not.
    x16 = np.array([[60000.0, 59000.0, -60000.0]], dtype=np.float16)
    got16 = run_graphc(make_node_model(op, {"x": x16}, {}), {"x": x16})["y"]
    d = float(x16[0, 1]) - float(x16[0, 0])  # 59000 rounds to 59008 in float16
    want = {"Softmax": [1.0, 0.0, 0.0], "LogSoftmax": [0.0, d, -np.inf]}[op]
    assert np.isfinite(got16[0, :2]).all()
    assert_close(got16[0, :2], np.array(want[:2], dtype=np.float16))


def test_hardmax_first_maximum():
    x = np.array([[3, 3, 3, 1], [0, 7, 2, 7]], dtype=np.float32)
    got = check_against_ort("Hardmax", {"x": x}, {"axis": 1})["y"]
    np.testing.assert_array_equal(got, [[1, 0, 0, 0], [0, 1, 0, 0]])


@pytest.mark.parametrize("op", SOFTMAX_OPS)
@pytest.mark.parametrize("axis", [None, 0, 1, 2, -1, -3])
def test_softmax_family_opset11_flattens(op, axis):
    x = rand((3, 4, 5), seed=15, low=-3, high=3)
    attrs = {} if axis is None else {"axis": axis}
    check_against_ort(op, {"x": x}, attrs, opset=11)


def _symbolic_model(op: str, opset: int, axis: int) -> onnx.ModelProto:
    node = helper.make_node(op, ["x"], ["y"], axis=axis)
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 5])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("op", SOFTMAX_OPS)
def test_softmax_family_opset11_symbolic_batch(op):
    model = _symbolic_model(op, 11, axis=1)
    x = rand((3, 4, 5), seed=16)
    assert_close(run_graphc(model, {"x": x})["y"], run_ort(model, {"x": x})["y"], what=op)


def test_softmax_opset11_last_axis_is_one_node():
    import graphc

    g = graphc.load_onnx(_symbolic_model("Softmax", 11, axis=2))
    assert [n.op for n in g.nodes] == ["Softmax"]


def test_softmax_rank0_refused():
    x = np.array(1.0, dtype=np.float32)
    with pytest.raises(ShapeError, match="Softmax node"):
        run_graphc(_raw_model("Softmax", {"x": x}, {}), {"x": x})


def test_softmax_empty_axis():
    x = np.zeros((2, 0), dtype=np.float32)
    for op in SOFTMAX_OPS:
        got = run_graphc(make_node_model(op, {"x": x}, {}), {"x": x})["y"]
        assert got.shape == (2, 0) and got.dtype == np.float32
