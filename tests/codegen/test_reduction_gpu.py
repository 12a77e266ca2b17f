"""GPU correctness of the reduction family against graphc's numpy references (graphc.interpret):
Reduce*, ArgMax/ArgMin, global pools, the softmax family, the normalizations, and fused
epilogues on reduction anchors. Odd row lengths (1, 7, 1000, 3000, 8193, and one long row that
does not fit in registers), axes first/middle/last, fp32/fp16/bf16; the arena is poisoned first.

Run on a GPU machine: python -m pytest tests/codegen/test_reduction_gpu.py -q
"""

from __future__ import annotations

import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from onnx import helper

from helpers import make_node_model, rand

sys.path.insert(0, str(Path(__file__).parent))  # rd_helpers beside this file
from rd_helpers import check_on_gpu  # noqa: E402

from graphc.ir.builder import GraphBuilder
from graphc.ir.types import DType, TensorType
from graphc.ops.fused import ACC, IN, OP, EpilogueOp, FusedAttrs
from graphc.ops.registry import get_op

pytestmark = pytest.mark.gpu

BF16 = ml_dtypes.bfloat16
F32, F16 = np.float32, np.float16
DTYPES = [F32, F16, BF16]
ROWS = [1, 7, 1000, 3000, 8193]


def _x(shape, dtype, seed=0, low=-2.0, high=2.0):
    return rand(shape, np.float32, seed=seed, low=low, high=high).astype(dtype)


def _reduce(op, x, axes, keepdims=1, noop=0):
    inits = {} if axes is None else {"axes": np.array(axes, np.int64)}
    attrs = {"keepdims": keepdims}
    if noop:
        attrs["noop_with_empty_axes"] = 1
    return make_node_model(op, {"x": x}, attrs, initializers=inits)


# ---- Reduce* -------------------------------------------------------------------------------------


@pytest.mark.parametrize("r", ROWS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_reduce_sum_last_axis(r, dtype):
    x = _x((3, r), dtype)
    check_on_gpu(_reduce("ReduceSum", x, [-1], keepdims=0), {"x": x})


@pytest.mark.parametrize(
    "op",
    [
        "ReduceMean",
        "ReduceMax",
        "ReduceMin",
        "ReduceL1",
        "ReduceL2",
        "ReduceSumSquare",
        "ReduceLogSumExp",
    ],
)
@pytest.mark.parametrize("dtype", [F32, F16], ids=lambda d: np.dtype(d).name)
def test_reduce_ops_rows(op, dtype):
    x = _x((5, 1000), dtype)
    check_on_gpu(_reduce(op, x, [1]), {"x": x})


@pytest.mark.parametrize("op", ["ReduceProd", "ReduceLogSum"])
def test_reduce_positive_ops(op):
    x = _x((5, 7, 33), F32, low=0.9, high=1.1)
    check_on_gpu(_reduce(op, x, [2]), {"x": x})
    check_on_gpu(_reduce(op, x, [0]), {"x": x})


@pytest.mark.parametrize(
    "shape,axes",
    [
        ((1000, 7), [0]),  # first axis: column layout
        ((3, 1000, 7), [1]),  # middle axis
        ((7, 3, 33, 5), [0, 2]),  # interleaved axes, column layout
        ((7, 3, 33, 5), [1, 3]),  # interleaved axes, row layout with gaps
        ((7, 3, 33), None),  # every axis
        ((3, 1, 8193), [1, 2]),
        ((8193, 3), [0]),
    ],
)
@pytest.mark.parametrize("dtype", [F32, BF16], ids=lambda d: np.dtype(d).name)
def test_reduce_axes(shape, axes, dtype):
    x = _x(shape, dtype)
    check_on_gpu(_reduce("ReduceSum", x, axes, keepdims=0), {"x": x})
    check_on_gpu(_reduce("ReduceMax", x, axes), {"x": x})


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceL2", "ReduceSumSquare"])
def test_reduce_split_rows(op):
    """Few long rows: each is split over blocks, partials meet in the workspace."""
    x = _x((3, 300001), F32)
    x[1, 123456] = np.nan if op == "ReduceMax" else x[1, 123456]
    check_on_gpu(_reduce(op, x, [1]), {"x": x})
    y = _x((4, 100000), F16)
    check_on_gpu(_reduce(op, y, None, keepdims=0), {"x": y})


def test_global_pool_large_maps():
    x = _x((1, 3, 512, 512), F16)
    check_on_gpu(make_node_model("GlobalAveragePool", {"x": x}), {"x": x})


def test_reduce_logsumexp_column_and_extremes():
    x = _x((3, 200, 9), F32, low=-50, high=50)
    x[0, :, 0] = -np.inf
    x[1, 5, 1] = np.inf
    check_on_gpu(_reduce("ReduceLogSumExp", x, [1]), {"x": x})
    check_on_gpu(_reduce("ReduceLogSumExp", x.transpose(0, 2, 1).copy(), [2]), {"x": x.transpose(0, 2, 1).copy()})


def test_reduce_noop_and_empty_axes():
    x = _x((3, 7), F32)
    check_on_gpu(_reduce("ReduceL2", x, [], noop=1), {"x": x})
    check_on_gpu(_reduce("ReduceMean", x, None, keepdims=0), {"x": x})


@pytest.mark.parametrize("dtype", [np.int32, np.int64], ids=lambda d: np.dtype(d).name)
def test_reduce_integers(dtype):
    x = rand((4, 7, 1000), dtype, low=-100, high=100)
    for op in ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceMean", "ReduceL1"):
        check_on_gpu(_reduce(op, x, [2]), {"x": x})
    check_on_gpu(_reduce("ReduceSum", x, [0]), {"x": x})


def test_reduce_bool_max():
    x = rand((4, 9, 10), np.bool_)
    check_on_gpu(_reduce("ReduceMax", x, [1]), {"x": x})
    check_on_gpu(_reduce("ReduceMin", x, [2]), {"x": x})


def test_reduce_nan_propagates():
    x = _x((4, 1000), F32)
    x[1, 17] = np.nan
    check_on_gpu(_reduce("ReduceMax", x, [1]), {"x": x})
    check_on_gpu(_reduce("ReduceMin", x, [0]), {"x": x})


# ---- ArgMax / ArgMin -------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("last", [0, 1])
@pytest.mark.parametrize("shape,axis", [((5, 1000), 1), ((5, 8193), -1), ((300, 7), 0), ((3, 33, 5), 1)])
def test_arg(op, last, shape, axis):
    # Small integers: many ties, so the first/last index rule matters.
    x = rand(shape, np.int32, low=-3, high=3).astype(F16)
    m = make_node_model(op, {"x": x}, {"axis": axis, "select_last_index": last, "keepdims": 0})
    check_on_gpu(m, {"x": x})


def test_arg_int_and_nan():
    x = rand((6, 77), np.int64, low=-5, high=5)
    check_on_gpu(make_node_model("ArgMax", {"x": x}, {"axis": 1}), {"x": x})
    y = _x((6, 77), F32)
    y[2, 40] = np.nan
    check_on_gpu(make_node_model("ArgMin", {"x": y}, {"axis": 1}), {"x": y})


# ---- global pools ------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(2, 3, 7, 9), (1, 64, 56, 56), (2, 5, 1, 1)])
@pytest.mark.parametrize("dtype", [F32, F16], ids=lambda d: np.dtype(d).name)
def test_global_pool(op, shape, dtype):
    x = _x(shape, dtype)
    check_on_gpu(make_node_model(op, {"x": x}), {"x": x})


# ---- softmax family ------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("r", [*ROWS, 40000])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_softmax_rows(op, r, dtype):
    x = _x((3, r), dtype, low=-8, high=8)
    check_on_gpu(make_node_model(op, {"x": x}, {"axis": -1}), {"x": x})


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("axis", [0, 1])
def test_softmax_other_axes(op, axis):
    x = rand((5, 33, 7), np.int32, low=-3, high=3).astype(F32) if op == "Hardmax" else _x((5, 33, 7), F32)
    check_on_gpu(make_node_model(op, {"x": x}, {"axis": axis}), {"x": x})


@pytest.mark.parametrize("r", [7, 1000, 8193])
def test_hardmax_rows(r):
    x = rand((4, r), np.int32, low=-9, high=9).astype(F16)
    check_on_gpu(make_node_model("Hardmax", {"x": x}, {"axis": -1}), {"x": x})


def test_softmax_forced_params():
    """The tuner's choices: a row of 8193 held by 32 lanes does not fit in registers."""
    x = _x((5, 8193), F32)
    m = make_node_model("Softmax", {"x": x}, {"axis": -1})
    for tpr in (32, 256):
        check_on_gpu(m, {"x": x}, params={"tpr": tpr})


# ---- normalizations ------------------------------------------------------------------------------


@pytest.mark.parametrize("r", [*ROWS, 40000])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_layernorm_rows(r, dtype):
    x = _x((3, r), dtype, low=-3, high=5)
    s, b = _x((r,), dtype, seed=1), _x((r,), dtype, seed=2)
    m = make_node_model("LayerNormalization", {"x": x}, {"axis": -1, "epsilon": 1e-5}, initializers={"s": s, "b": b})
    check_on_gpu(m, {"x": x})


def test_layernorm_stats_and_axis():
    x = _x((2, 3, 7, 11), F16)
    s = _x((7, 11), F16, seed=1)
    m = make_node_model(
        "LayerNormalization",
        {"x": x},
        {"axis": 2},
        initializers={"s": s},
        outputs=("y", "mean", "inv"),
    )
    check_on_gpu(m, {"x": x})


@pytest.mark.parametrize("r", [7, 1000, 8193])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_rmsnorm(r, dtype):
    x = _x((3, r), dtype)
    s = _x((r,), dtype, seed=1)
    check_on_gpu(make_node_model("RMSNormalization", {"x": x}, {"axis": -1}, initializers={"s": s}), {"x": x})


@pytest.mark.parametrize("dtype", [F32, F16], ids=lambda d: np.dtype(d).name)
def test_instance_and_group_norm(dtype):
    x = _x((2, 6, 7, 9), dtype)
    s, b = _x((6,), dtype, seed=1), _x((6,), dtype, seed=2)
    check_on_gpu(make_node_model("InstanceNormalization", {"x": x}, initializers={"s": s, "b": b}), {"x": x})
    m = make_node_model("GroupNormalization", {"x": x}, {"num_groups": 3}, initializers={"s": s, "b": b})
    # ONNX shape inference does not type GroupNormalization's output; declare it.
    m.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(x.dtype), x.shape))
    check_on_gpu(m, {"x": x})


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [-1, 1])
def test_lpnorm(p, axis):
    x = _x((4, 33, 1000), F16)
    x[1, 2, :] = 0  # a zero norm gives zeros
    check_on_gpu(make_node_model("LpNormalization", {"x": x}, {"axis": axis, "p": p}), {"x": x})


@pytest.mark.parametrize("dtype", [F32, F16], ids=lambda d: np.dtype(d).name)
def test_batchnorm_inference(dtype):
    x = _x((2, 6, 7, 9), dtype)
    inits = {"s": _x((6,), dtype, 1), "b": _x((6,), dtype, 2), "m": _x((6,), dtype, 3), "v": _x((6,), dtype, 4, 0.5, 2)}
    check_on_gpu(make_node_model("BatchNormalization", {"x": x}, initializers=inits), {"x": x})


# ---- fused epilogues on reduction anchors ----------------------------------------------------------


def _fused_graph(anchor, anchor_attrs, x, params, epilogue, outputs, extra):
    """Fused(anchor(x, params...), epilogue over acc and the extra inputs)."""
    b = GraphBuilder("fused")
    xv = b.add_input("x", TensorType(DType.from_numpy(x.dtype), x.shape))
    ins = [xv] + [b.add_constant(p, f"p{i}") for i, p in enumerate(params)]
    n_anchor = len(ins)
    for k, e in enumerate(extra):
        ins.append(b.add_input(f"e{k}", TensorType(DType.from_numpy(e.dtype), e.shape)))
    attrs = FusedAttrs(
        anchor_op=anchor,
        anchor_attrs=get_op(anchor).attrs(**anchor_attrs),
        anchor_inputs=n_anchor,
        epilogue=tuple(EpilogueOp(op, get_op(op).attrs(), args) for op, args in epilogue),
        outputs=outputs,
    )
    node = b.add_node("Fused", ins, attrs, domain="graphc", outputs=len(outputs))
    b.set_outputs(list(node.outputs), [f"y{k}" for k in range(len(outputs))])
    return b.build()


@pytest.mark.parametrize("dtype", [F32, F16], ids=lambda d: np.dtype(d).name)
def test_fused_layernorm_residual_relu(dtype):
    x, r = _x((5, 1000), dtype), _x((5, 1000), dtype, seed=3)
    g = _fused_graph(
        "LayerNormalization",
        {"axis": -1},
        x,
        [_x((1000,), dtype, 1), _x((1000,), dtype, 2)],
        [("Add", (ACC, IN(3))), ("Relu", (OP(0),))],
        (OP(1), ACC),
        [r],
    )
    check_on_gpu(g, {"x": x, "e0": r})


def test_fused_softmax_scale_and_rmsnorm():
    x, m = _x((3, 8193), F32), _x((3, 8193), F32, seed=5)
    g = _fused_graph("Softmax", {"axis": -1}, x, [], [("Mul", (ACC, IN(1)))], (OP(0),), [m])
    check_on_gpu(g, {"x": x, "e0": m})
    c = _x((3, 1), F16, seed=6)
    xh = _x((3, 1000), F16)
    g = _fused_graph(
        "RMSNormalization", {"axis": -1}, xh, [_x((1000,), F16, 1)], [("Mul", (ACC, IN(2)))], (OP(0),), [c]
    )
    check_on_gpu(g, {"x": xh, "e0": c})


def test_fused_reduce_epilogue():
    x, s = _x((7, 1000), F16), _x((7, 1), F16, seed=7)
    b = GraphBuilder("fused")
    xv = b.add_input("x", TensorType(DType.float16, x.shape))
    axes = b.add_constant(np.array([1], np.int64), "axes")
    sv = b.add_input("s", TensorType(DType.float16, s.shape))
    attrs = FusedAttrs(
        anchor_op="ReduceMean",
        anchor_attrs=get_op("ReduceMean").attrs(keepdims=1),
        anchor_inputs=2,
        epilogue=(
            EpilogueOp("Sub", get_op("Sub").attrs(), (ACC, IN(2))),
            EpilogueOp("Tanh", get_op("Tanh").attrs(), (OP(0),)),
        ),
        outputs=(OP(1),),
    )
    node = b.add_node("Fused", [xv, axes, sv], attrs, domain="graphc")
    b.set_outputs([node.outputs[0]], ["y"])
    check_on_gpu(b.build(), {"x": x, "s": s})
