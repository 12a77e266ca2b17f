"""The padding analysis (graphc/padding.py): which dynamic dims may be padded to a bucket.

Each case is a small ONNX graph with a symbolic dim; the verdict must say "paddable" exactly when
padding the dim and slicing the outputs back gives the unpadded result, which the numeric check
at the end confirms through ONNX Runtime for every case the analysis calls paddable.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphc.frontend import load_onnx
from graphc.ir.shapes import bind_shapes
from graphc.padding import analyse_padding
from graphc.passes.constant_folding import fold_constants

RNG = np.random.default_rng(0)


def _model(nodes, inputs, outputs, inits=(), opset=17) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "t", inputs, outputs, [numpy_helper.from_array(a, n) for n, a in inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _x(name="x", shape=("N", 4)):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def _y(name="y", rank=2):
    # symbolic output dims: graphc infers them; the checker wants a shape field
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [f"o{i}" for i in range(rank)])


def _verdict(model, dim="N", n1=3, n2=4, other=None):
    g = load_onnx(model)
    other = other or {}
    a = fold_constants(bind_shapes(g, {dim: n1, **other}))
    b = fold_constants(bind_shapes(g, {dim: n2, **other}))
    return analyse_padding(a, b, n1, n2, f"dim '{dim}'")


W = RNG.standard_normal((4, 5)).astype(np.float32)


def mlp():
    return _model(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        [_x()],
        [_y()],
        [("w", W)],
    )


def reduce_over_batch():
    axes = np.array([0], np.int64)
    return _model(
        [
            helper.make_node("ReduceMean", ["x", "axes"], ["m"], keepdims=1),
            helper.make_node("Sub", ["x", "m"], ["y"]),
        ],
        [_x()],
        [_y()],
        [("axes", axes)],
        opset=18,
    )


def batchnorm_training():
    c = np.ones(4, np.float32)
    return _model(
        [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], training_mode=1)],
        [_x(shape=("N", 4, 3, 3))],
        [_y(rank=4)],
        [("s", c), ("b", c * 0), ("m", c * 0), ("v", c)],
        opset=15,
    )


def batchnorm_inference_conv():
    c = np.ones(4, np.float32)
    w = RNG.standard_normal((4, 4, 3, 3)).astype(np.float32)
    return _model(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["y"]),
        ],
        [_x(shape=("N", 4, 3, 3))],
        [_y(rank=4)],
        [("w", w), ("s", c), ("b", c * 0.5), ("m", c * 0.1), ("v", c)],
    )


def reshape_mixing_batch():
    # [N, 4] -> [4, N]: the batch lands on axis 1 with another dim before it: rows interleave
    shape = np.array([4, -1], np.int64)
    return _model([helper.make_node("Reshape", ["x", "s"], ["y"])], [_x()], [_y()], [("s", shape)])


def reshape_merging_batch():
    # [N, 2, 2] -> [N*2, 2] -> MatMul -> [N, 2, 5]: a flattened batch keeps rows in order
    w = RNG.standard_normal((2, 5)).astype(np.float32)
    return _model(
        [
            helper.make_node("Reshape", ["x", "s1"], ["f"]),
            helper.make_node("MatMul", ["f", "w"], ["h"]),
            helper.make_node("Reshape", ["h", "s2"], ["y"]),
        ],
        [_x(shape=("N", 2, 2))],
        [_y(rank=3)],
        [("s1", np.array([-1, 2], np.int64)), ("w", w), ("s2", np.array([-1, 2, 5], np.int64))],
    )


def softmax_over_sequence():
    return _model([helper.make_node("Softmax", ["x"], ["y"], axis=1)], [_x(shape=(2, "N"))], [_y()])


def softmax_over_features():
    return _model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], [_x()], [_y()])


def attention_over_sequence():
    # scores = x x^T: the sequence on two axes, then a softmax over keys
    return _model(
        [
            helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]),
            helper.make_node("MatMul", ["x", "xt"], ["s"]),
            helper.make_node("Softmax", ["s"], ["p"], axis=-1),
            helper.make_node("MatMul", ["p", "x"], ["y"]),
        ],
        [_x()],
        [_y()],
    )


def scale_by_batch_size():
    # x * N (a Shape read into data): padding would change N itself
    return _model(
        [
            helper.make_node("Shape", ["x"], ["sh"]),
            helper.make_node("Gather", ["sh", "zero"], ["n"], axis=0),
            helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["x", "nf"], ["y"]),
        ],
        [_x()],
        [_y()],
        [("zero", np.array(0, np.int64))],
    )


def gather_rows():
    # x[idx] along the batch: takes rows by index, which padding would move
    return _model(
        [helper.make_node("Gather", ["x", "i"], ["y"], axis=0)], [_x()], [_y()], [("i", np.array([0, 2], np.int64))]
    )


def cumsum_over_batch():
    return _model([helper.make_node("CumSum", ["x", "ax"], ["y"])], [_x()], [_y()], [("ax", np.array(0, np.int64))])


def pad_shift(begin: int, end: int, axis: int):
    def build():
        pads = np.zeros(4, np.int64)
        pads[axis], pads[2 + axis] = begin, end
        return _model([helper.make_node("Pad", ["x", "p"], ["y"])], [_x()], [_y()], [("p", pads)], opset=18)

    return build


def _row_indices(reverse: bool = False) -> list:
    """Nodes computing b = 0..N-1 (or N-1..0) as 'b1' [N, 1] from the shape of x, as exporters do."""
    nodes = [
        helper.make_node("Shape", ["x"], ["sh"]),
        helper.make_node("Gather", ["sh", "zero"], ["n"], axis=0),
        helper.make_node("Range", ["zero", "n", "one"], ["b"]),
    ]
    if reverse:  # N-1-b: each row reads another row's mask
        nodes += [helper.make_node("Sub", ["n", "one"], ["last"]), helper.make_node("Sub", ["last", "b"], ["b_"])]
    else:
        nodes.append(helper.make_node("Identity", ["b"], ["b_"]))
    return [*nodes, helper.make_node("Unsqueeze", ["b_", "ax1"], ["b1"])]


_IDX_INITS = [
    ("zero", np.array(0, np.int64)),
    ("one", np.array(1, np.int64)),
    ("ax1", np.array([1], np.int64)),
    ("four", np.array(4, np.int64)),
    ("k", np.arange(4, dtype=np.int64)),
    ("two", np.array(2.0, np.float32)),
]


def flat_mask_gather(reverse: bool = False):
    """Transformers' padding mask (TorchScript): the mask flattened, gathered at b * 4 + k."""

    def build():
        nodes = [
            *_row_indices(reverse),
            helper.make_node("Mul", ["b1", "four"], ["base"]),
            helper.make_node("Add", ["base", "k"], ["idx"]),
            helper.make_node("Reshape", ["x", "flat"], ["xf"]),
            helper.make_node("Gather", ["xf", "idx"], ["g"], axis=0),
            helper.make_node("Mul", ["g", "two"], ["y"]),
        ]
        return _model(nodes, [_x()], [_y()], [*_IDX_INITS, ("flat", np.array([-1], np.int64))], opset=18)

    return build


def mask_gather_nd():
    """The same mask through dynamo's GatherND at (b, k)."""
    nodes = [
        *_row_indices(),
        helper.make_node("Mul", ["b1", "zero"], ["z1"]),
        helper.make_node("Add", ["b1", "kz"], ["bb"]),
        helper.make_node("Add", ["z1", "k"], ["kk"]),
        helper.make_node("Unsqueeze", ["bb", "axl"], ["bu"]),
        helper.make_node("Unsqueeze", ["kk", "axl"], ["ku"]),
        helper.make_node("Concat", ["bu", "ku"], ["idx"], axis=-1),
        helper.make_node("GatherND", ["x", "idx"], ["g"]),
        helper.make_node("Mul", ["g", "two"], ["y"]),
    ]
    inits = [*_IDX_INITS, ("kz", np.zeros(4, np.int64)), ("axl", np.array([-1], np.int64))]
    return _model(nodes, [_x()], [_y()], inits, opset=18)


CASES = {
    "flat_mask_gather": (flat_mask_gather(), True),
    "flat_mask_gather_reversed": (flat_mask_gather(reverse=True), False),  # row b reads row N-1-b
    "mask_gather_nd": (mask_gather_nd, True),
    "pad_features": (pad_shift(1, 2, 1), True),
    "pad_shift_batch": (pad_shift(-1, 1, 0), False),  # row i becomes row i+1: the last takes a pad row
    "mlp": (mlp, True),
    "reduce_over_batch": (reduce_over_batch, False),
    "batchnorm_training": (batchnorm_training, False),
    "batchnorm_inference_conv": (batchnorm_inference_conv, True),
    "reshape_mixing_batch": (reshape_mixing_batch, False),
    "reshape_merging_batch": (reshape_merging_batch, True),
    "softmax_over_sequence": (softmax_over_sequence, False),
    "softmax_over_features": (softmax_over_features, True),
    "attention_over_sequence": (attention_over_sequence, False),
    "scale_by_batch_size": (scale_by_batch_size, False),
    "gather_rows": (gather_rows, False),
    "cumsum_over_batch": (cumsum_over_batch, False),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_verdict(name):
    build, paddable = CASES[name]
    v = _verdict(build())
    assert v.paddable is paddable, v.reason
    if not paddable:
        assert v.reason and "\n" not in v.reason
    else:
        assert v.outputs  # every case's output carries the dim


@pytest.mark.parametrize("name", sorted(n for n, (_b, ok) in CASES.items() if ok))
def test_paddable_verdicts_hold_numerically(name):
    """Pad 3 rows to 8 (edge rows), run in ONNX Runtime, slice back: equal to the unpadded run."""
    model = CASES[name][0]()
    v = _verdict(model)
    sess = ort.InferenceSession(model.SerializeToString())
    inp = sess.get_inputs()[0]
    shape = [3 if not isinstance(d, int) else d for d in inp.shape]
    axis = next(i for i, d in enumerate(inp.shape) if not isinstance(d, int))
    x = RNG.standard_normal(shape).astype(np.float32)
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, 5)
    (ref,) = sess.run(None, {inp.name: x})
    (got,) = sess.run(None, {inp.name: np.pad(x, widths, mode="edge")})
    out_axis, mult = v.outputs["y"]
    got = np.take(got, np.arange(mult * 3), axis=out_axis)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "name",
    [
        "reduce_over_batch",
        "scale_by_batch_size",
        "softmax_over_sequence",
        "attention_over_sequence",
        "pad_shift_batch",
        "flat_mask_gather_reversed",
    ],
)
def test_refused_verdicts_would_be_wrong(name):
    """These refusals are not over-caution: padding the dim changes the real rows. (Some refusals
    are: a forward CumSum over the batch or a Gather of fixed rows would survive end padding; the
    analysis refuses what it has no rule for.)"""
    model = CASES[name][0]()
    sess = ort.InferenceSession(model.SerializeToString())
    inp = sess.get_inputs()[0]
    axis = next(i for i, d in enumerate(inp.shape) if not isinstance(d, int))
    shape = [3 if i == axis else d for i, d in enumerate(inp.shape)]
    x = RNG.standard_normal(shape).astype(np.float32) + 1.0
    widths = [(0, 5) if i == axis else (0, 0) for i in range(x.ndim)]
    (ref,) = sess.run(None, {inp.name: x})
    (got,) = sess.run(None, {inp.name: np.pad(x, widths, mode="edge")})
    got = got[tuple(slice(0, n) for n in ref.shape)]
    assert not np.allclose(got, ref, rtol=1e-4)
