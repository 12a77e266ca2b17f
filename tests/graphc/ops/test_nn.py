"""NN ops (convolutions, pools, LRN, MaxUnpool) against ONNX Runtime, and against direct numpy
formulas (one output position at a time) where ORT has no kernel (float64 Conv/ConvTranspose)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import graphc
from graphc.errors import ShapeError
from graphc.ir.builder import GraphBuilder
from graphc.ir.types import DType, TensorType
from helpers import (
    assert_close,
    check_against_ort,
    make_node_model,
    rand,
    run_graphc,
    run_ort,
)

F16, F32, F64 = np.float16, np.float32, np.float64

# ---- independent formulas ----------------------------------------------------------------------


def ref_conv(x, w, b=None, *, strides=None, pads=None, dilations=None, group=1):
    """Direct convolution in float64, one output position at a time."""
    nsp = x.ndim - 2
    strides = strides or [1] * nsp
    pads = pads or [0] * (2 * nsp)
    dilations = dilations or [1] * nsp
    x, w = x.astype(F64), w.astype(F64)
    k = w.shape[2:]
    xp = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[i + nsp]) for i in range(nsp)])
    out = [(xp.shape[2 + i] - (k[i] - 1) * dilations[i] - 1) // strides[i] + 1 for i in range(nsp)]
    m, cg = w.shape[0], x.shape[1] // group
    mg = m // group
    y = np.zeros((x.shape[0], m, *out))
    axes = list(range(1, nsp + 2))
    for pos in np.ndindex(*out):
        win = xp[
            (
                slice(None),
                slice(None),
                *(
                    slice(p * s, p * s + (kk - 1) * d + 1, d)
                    for p, s, kk, d in zip(pos, strides, k, dilations, strict=True)
                ),
            )
        ]
        for g in range(group):
            y[(slice(None), slice(g * mg, (g + 1) * mg), *pos)] = np.tensordot(
                win[:, g * cg : (g + 1) * cg], w[g * mg : (g + 1) * mg], axes=(axes, axes)
            )
    if b is not None:
        y += b.astype(F64).reshape(-1, *[1] * nsp)
    return y


def ref_conv_transpose(x, w, b=None, *, strides=None, pads=None, dilations=None, group=1, output_padding=None):
    """Direct transposed convolution in float64: every input position scatters its window."""
    nsp = x.ndim - 2
    strides = strides or [1] * nsp
    pads = pads or [0] * (2 * nsp)
    dilations = dilations or [1] * nsp
    output_padding = output_padding or [0] * nsp
    x, w = x.astype(F64), w.astype(F64)
    k = w.shape[2:]
    cg, mg = x.shape[1] // group, w.shape[1]
    full = [(x.shape[2 + i] - 1) * strides[i] + (k[i] - 1) * dilations[i] + 1 + output_padding[i] for i in range(nsp)]
    y = np.zeros((x.shape[0], mg * group, *full))
    for pos in np.ndindex(*x.shape[2:]):
        win = tuple(
            slice(p * s, p * s + (kk - 1) * d + 1, d) for p, s, kk, d in zip(pos, strides, k, dilations, strict=True)
        )
        for g in range(group):
            contrib = np.tensordot(x[(slice(None), slice(g * cg, (g + 1) * cg), *pos)], w[g * cg : (g + 1) * cg], 1)
            y[(slice(None), slice(g * mg, (g + 1) * mg), *win)] += contrib
    crop = tuple(slice(pads[i], full[i] - pads[i + nsp]) for i in range(nsp))
    y = y[(slice(None), slice(None), *crop)]
    if b is not None:
        y = y + b.astype(F64).reshape(-1, *[1] * nsp)
    return y


# ---- Conv --------------------------------------------------------------------------------------

# (x shape, w shape, attrs, with bias)
CONV_CASES = [
    ((1, 3, 7, 9), (5, 3, 3, 3), {}, True),
    ((2, 3, 7, 9), (4, 3, 3, 2), {"pads": [1, 0, 2, 1], "strides": [2, 3]}, True),
    ((1, 2, 11, 10), (3, 2, 3, 3), {"dilations": [2, 3], "pads": [2, 1, 0, 3]}, False),
    ((1, 6, 8, 7), (9, 2, 3, 3), {"group": 3, "pads": [1, 1, 1, 1]}, True),
    ((2, 5, 9, 9), (5, 1, 3, 3), {"group": 5, "pads": [1, 1, 1, 1], "strides": [2, 2]}, True),  # depthwise
    ((1, 4, 6, 6), (8, 1, 3, 3), {"group": 4}, False),  # depthwise, channel multiplier 2
    ((1, 3, 9, 8), (4, 3, 1, 1), {"strides": [2, 2]}, True),
    ((1, 3, 9, 8), (4, 3, 4, 4), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}, False),
    ((1, 3, 9, 8), (4, 3, 4, 2), {"auto_pad": "SAME_LOWER", "strides": [2, 3]}, True),
    ((1, 3, 9, 8), (4, 3, 3, 3), {"auto_pad": "VALID", "strides": [2, 2]}, False),
    ((1, 3, 5, 5), (2, 3, 3, 3), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, False),
    ((2, 4, 11), (3, 4, 5), {"strides": [2], "pads": [2, 1]}, True),  # 1-D
    ((1, 2, 13), (2, 1, 3), {"group": 2, "dilations": [3]}, False),  # 1-D grouped, dilated
    ((1, 2, 5, 6, 7), (4, 2, 3, 2, 3), {"pads": [1, 0, 1, 0, 1, 2], "strides": [1, 2, 2]}, True),  # 3-D
    ((1, 1, 1, 1), (1, 1, 1, 1), {}, True),
    ((3, 1, 4, 4), (2, 1, 4, 4), {}, False),  # kernel as large as the input
]


def _conv_inputs(xs, ws, bias, dtype, seed=0):
    feeds = {"x": rand(xs, dtype, seed=seed), "w": rand(ws, dtype, seed=seed + 1, low=-1, high=1)}
    if bias:
        feeds["b"] = rand((ws[0],), dtype, seed=seed + 2)
    return feeds


@pytest.mark.parametrize("xs, ws, attrs, bias", CONV_CASES)
@pytest.mark.parametrize("dtype", [F32, F16])
def test_conv_vs_ort(xs, ws, attrs, bias, dtype):
    feeds = _conv_inputs(xs, ws, bias, dtype)
    # ORT's fp16 Conv rounds its sums to fp16; graphc sums in fp32: allow a few fp16 ulps.
    tol = {"rtol": 4e-3, "atol": 4e-3} if dtype == F16 else {}
    check_against_ort("Conv", feeds, attrs, **tol)


def _explicit_pads(xs, ws, attrs):
    """Explicit pads for the auto_pad cases, computed by hand from the spec's formula."""
    nsp = len(xs) - 2
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if auto_pad == "NOTSET":
        return attrs.get("pads")
    if auto_pad == "VALID":
        return [0] * (2 * nsp)
    strides = attrs.get("strides", [1] * nsp)
    begin, end = [], []
    for i in range(nsp):
        out = -(-xs[2 + i] // strides[i])
        total = max(0, (out - 1) * strides[i] + ws[2 + i] - xs[2 + i])
        small, big = total // 2, total - total // 2
        begin.append(small if auto_pad == "SAME_UPPER" else big)
        end.append(big if auto_pad == "SAME_UPPER" else small)
    return begin + end


@pytest.mark.parametrize("xs, ws, attrs, bias", CONV_CASES)
def test_conv_float64_vs_formula(xs, ws, attrs, bias):
    feeds = _conv_inputs(xs, ws, bias, F64)
    got = run_graphc(make_node_model("Conv", feeds, attrs), feeds)["y"]
    want = ref_conv(
        feeds["x"],
        feeds["w"],
        feeds.get("b"),
        strides=attrs.get("strides"),
        pads=_explicit_pads(xs, ws, attrs),
        dilations=attrs.get("dilations"),
        group=attrs.get("group", 1),
    )
    assert_close(got, want)


def test_conv_bfloat16_vs_formula():
    import ml_dtypes

    feeds = _conv_inputs((1, 4, 6, 5), (6, 2, 3, 3), True, F32)
    bf = {k: v.astype(ml_dtypes.bfloat16) for k, v in feeds.items()}
    got = run_graphc(make_node_model("Conv", bf, {"group": 2, "pads": [1, 1, 1, 1]}), bf)["y"]
    want = ref_conv(*(v.astype(F64) for v in bf.values()), pads=[1, 1, 1, 1], group=2)
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(got.astype(F64), want, rtol=1e-2, atol=3e-2)


def test_conv_large_batch_is_chunked(monkeypatch):
    """Batches whose im2col buffer is over the limit run in chunks with the same result."""
    import graphc.runtime.reference.nn as nn

    feeds = _conv_inputs((5, 3, 6, 6), (4, 3, 3, 3), True, F32)
    model = make_node_model("Conv", feeds, {"pads": [1, 1, 1, 1]})
    whole = run_graphc(model, feeds)["y"]
    monkeypatch.setattr(nn, "_COLS_MAX_ELEMENTS", 2 * 27 * 36)
    assert_close(run_graphc(model, feeds)["y"], whole, rtol=0, atol=0)
    check_against_ort("Conv", feeds, {"pads": [1, 1, 1, 1]})


@pytest.mark.parametrize("opset", [1, 11])
def test_conv_older_opsets(opset):
    feeds = _conv_inputs((1, 3, 7, 6), (4, 3, 3, 3), True, F32)
    attrs = {"pads": [1, 0, 1, 2], "strides": [2, 1]}
    if opset == 1:
        want = ref_conv(feeds["x"], feeds["w"], feeds["b"], **attrs).astype(F32)
        assert_close(run_graphc(make_node_model("Conv", feeds, attrs, opset=1), feeds)["y"], want)
    else:
        check_against_ort("Conv", feeds, attrs, opset=opset)


# ---- ConvInteger -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "attrs, zero_points",
    [({}, False), ({"pads": [1, 0, 1, 2], "strides": [2, 1]}, True), ({"group": 2, "dilations": [2, 1]}, True)],
)
def test_conv_integer_vs_ort(attrs, zero_points):
    g = attrs.get("group", 1)
    feeds = {
        "x": rand((2, 4, 7, 6), np.uint8, low=0, high=255),
        "w": rand((6, 4 // g, 3, 2), np.uint8, seed=1, low=0, high=255),
    }
    if zero_points:
        feeds["xz"] = np.array(131, np.uint8)
        feeds["wz"] = np.array(7, np.uint8)
    check_against_ort("ConvInteger", feeds, attrs)


# ---- ConvTranspose -----------------------------------------------------------------------------

CONVT_CASES = [
    ((1, 3, 4, 5), (3, 2, 3, 3), {}, True),
    ((2, 3, 4, 5), (3, 4, 3, 2), {"strides": [2, 3], "pads": [1, 0, 0, 1]}, False),
    ((1, 2, 5, 4), (2, 3, 3, 3), {"strides": [2, 2], "output_padding": [1, 0]}, True),
    ((1, 2, 5, 4), (2, 3, 3, 3), {"dilations": [2, 1], "pads": [1, 1, 2, 0]}, False),
    ((1, 4, 3, 3), (4, 3, 3, 3), {"group": 2, "strides": [2, 2]}, True),
    ((1, 6, 4, 4), (6, 1, 3, 3), {"group": 6, "strides": [2, 2], "pads": [1, 1, 1, 1]}, False),  # depthwise
    ((1, 2, 3, 4), (2, 2, 3, 3), {"strides": [2, 2], "output_shape": [8, 9]}, False),
    ((1, 2, 3, 4), (2, 2, 3, 3), {"strides": [2, 2], "output_shape": [7, 10], "output_padding": [1, 1]}, False),
    ((1, 2, 3, 4), (2, 2, 3, 4), {"strides": [2, 3], "auto_pad": "SAME_UPPER"}, True),
    ((1, 2, 3, 4), (2, 2, 3, 4), {"strides": [2, 3], "auto_pad": "SAME_LOWER"}, False),
    ((1, 2, 3, 4), (2, 2, 3, 3), {"auto_pad": "VALID", "strides": [1, 2]}, False),
    ((2, 3, 7), (3, 2, 4), {"strides": [3], "pads": [1, 2]}, True),  # 1-D
    ((1, 2, 3, 4, 2), (2, 2, 2, 3, 2), {"strides": [2, 1, 2], "pads": [0, 1, 0, 1, 0, 1]}, False),  # 3-D
]


@pytest.mark.parametrize("xs, ws, attrs, bias", CONVT_CASES)
@pytest.mark.parametrize("dtype", [F32, F16])
def test_conv_transpose_vs_ort(xs, ws, attrs, bias, dtype):
    feeds = {"x": rand(xs, dtype), "w": rand(ws, dtype, seed=1, low=-1, high=1)}
    if bias:
        feeds["b"] = rand((ws[1] * attrs.get("group", 1),), dtype, seed=2)
    tol = {"rtol": 4e-3, "atol": 4e-3} if dtype == F16 else {}
    check_against_ort("ConvTranspose", feeds, attrs, **tol)


@pytest.mark.parametrize(
    "xs, ws, attrs, bias", [c for c in CONVT_CASES if "output_shape" not in c[2] and "auto_pad" not in c[2]]
)
def test_conv_transpose_float64_vs_formula(xs, ws, attrs, bias):
    feeds = {"x": rand(xs, F64), "w": rand(ws, F64, seed=1, low=-1, high=1)}
    if bias:
        feeds["b"] = rand((ws[1] * attrs.get("group", 1),), F64, seed=2)
    got = run_graphc(make_node_model("ConvTranspose", feeds, attrs), feeds)["y"]
    assert_close(got, ref_conv_transpose(*feeds.values(), **attrs))


@pytest.mark.parametrize("opset", [1, 10])
@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
def test_conv_transpose_old_opsets_split_pads_like_ort(opset, auto_pad):
    """The version-1 pads formula was a doc error (onnx/onnx#1609): the fixed rule applies."""
    feeds = {"x": rand((1, 1, 3, 3)), "w": rand((1, 2, 3, 3), seed=1)}
    attrs = {"auto_pad": auto_pad, "strides": [2, 2]}
    new = run_graphc(make_node_model("ConvTranspose", feeds, attrs), feeds)["y"]
    old = run_graphc(make_node_model("ConvTranspose", feeds, attrs, opset=opset), feeds)["y"]
    assert_close(old, new, rtol=0, atol=0)
    if opset == 10:
        check_against_ort("ConvTranspose", feeds, attrs, opset=opset)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
def test_conv_transpose_same_with_kernel_below_stride_follows_spec(auto_pad):
    """Kernel 2 < stride 3: the total padding is -1. The spec's output is input * stride (ONNX's
    reference agrees); ORT clamps the padding to 0 and gives one element less."""
    from onnx.reference import ReferenceEvaluator

    feeds = {"x": rand((1, 2, 3, 4)), "w": rand((2, 2, 3, 2), seed=1)}
    model = make_node_model("ConvTranspose", feeds, {"strides": [2, 3], "auto_pad": auto_pad})
    got = run_graphc(model, feeds)["y"]
    assert got.shape == (1, 2, 6, 12)
    assert_close(got, ReferenceEvaluator(model).run(None, feeds)[0])


# ---- MaxPool -----------------------------------------------------------------------------------

POOL_CASES = [
    ((1, 3, 7, 9), {"kernel_shape": [3, 3]}),
    ((2, 2, 8, 7), {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1]}),
    ((1, 2, 9, 9), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),  # ResNet stem
    ((1, 2, 7, 8), {"kernel_shape": [2, 3], "strides": [2, 2], "ceil_mode": 1}),
    ((1, 2, 6, 6), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}),
    ((1, 1, 9, 8), {"kernel_shape": [2, 2], "dilations": [2, 3], "strides": [1, 2]}),
    ((1, 2, 7, 8), {"kernel_shape": [3, 2], "auto_pad": "SAME_UPPER", "strides": [2, 3]}),
    ((1, 2, 7, 8), {"kernel_shape": [2, 2], "auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    ((1, 2, 7, 8), {"kernel_shape": [3, 3], "auto_pad": "VALID", "strides": [2, 2]}),
    ((2, 3, 10), {"kernel_shape": [3], "strides": [2], "pads": [1, 2]}),  # 1-D
    ((1, 2, 5, 6, 7), {"kernel_shape": [2, 3, 2], "strides": [2, 1, 2], "pads": [0, 1, 1, 1, 0, 0]}),  # 3-D
    ((1, 1, 1, 1), {"kernel_shape": [1, 1]}),
]


@pytest.mark.parametrize("xs, attrs", POOL_CASES)
@pytest.mark.parametrize("dtype", [F32, F16, F64, np.int8, np.uint8])
def test_maxpool_vs_ort(xs, attrs, dtype):
    check_against_ort("MaxPool", {"x": rand(xs, dtype, low=-100, high=100)}, attrs)


@pytest.mark.parametrize("xs, attrs", POOL_CASES)
@pytest.mark.parametrize("storage_order", [0, 1])
def test_maxpool_indices_vs_ort(xs, attrs, storage_order):
    x = rand(xs, F32)
    x.reshape(-1)[::5] = 1.0  # ties: the first maximum in the window wins
    check_against_ort("MaxPool", {"x": x}, {**attrs, "storage_order": storage_order}, outputs=("y", "i"))


def test_maxpool_indices_skip_padding_and_neg_inf():
    """Padding never wins, even against -inf; every index points into the input."""
    x = np.full((1, 1, 3, 3), -np.inf, F32)
    x[0, 0, 2, 2] = -1.0
    feeds = {"x": x}
    got = run_graphc(
        make_node_model("MaxPool", feeds, {"kernel_shape": [3, 3], "pads": [2, 2, 0, 0]}, outputs=("y", "i")), feeds
    )
    assert np.isneginf(got["y"][0, 0, 0, 0]) and got["y"][0, 0, 2, 2] == -1.0
    assert got["i"].min() >= 0 and got["i"].max() < 9
    assert got["i"][0, 0, 2, 2] == 8


@pytest.mark.parametrize("opset", [8, 10, 11])
def test_maxpool_older_opsets(opset):
    attrs = {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 0, 1]}
    outputs = ("y",) if opset < 8 else ("y", "i")
    check_against_ort("MaxPool", {"x": rand((1, 2, 7, 6))}, attrs, opset=opset, outputs=outputs)


# ---- AveragePool, LpPool -----------------------------------------------------------------------


@pytest.mark.parametrize("xs, attrs", POOL_CASES)
@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("dtype", [F32, F16])
def test_averagepool_vs_ort(xs, attrs, count_include_pad, dtype):
    attrs = {**attrs, "count_include_pad": count_include_pad}
    check_against_ort("AveragePool", {"x": rand(xs, dtype)}, attrs)


@pytest.mark.parametrize("xs, attrs", POOL_CASES[:6])
def test_averagepool_float64_vs_ort_float32(xs, attrs):
    """ORT has no float64 AveragePool: its float32 result on the same values is the oracle."""
    x = rand(xs, F32)
    want = run_ort(make_node_model("AveragePool", {"x": x}, attrs), {"x": x})["y"]
    got = run_graphc(make_node_model("AveragePool", {"x": x.astype(F64)}, attrs), {"x": x.astype(F64)})["y"]
    assert got.dtype == F64
    assert_close(got.astype(F32), want)


@pytest.mark.parametrize("opset", [7, 10, 11, 19])
def test_averagepool_older_opsets(opset):
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1}
    if opset >= 10:
        attrs["ceil_mode"] = 1
    check_against_ort("AveragePool", {"x": rand((1, 2, 8, 7))}, attrs, opset=opset)


@pytest.mark.parametrize("xs, attrs", POOL_CASES)
@pytest.mark.parametrize("p", [1, 2, 3])
def test_lppool_vs_ort(xs, attrs, p):
    check_against_ort("LpPool", {"x": rand(xs)}, {**attrs, "p": p})


def _typed_output(model, dtype, shape):
    """Give output 0 a type where ONNX shape inference left none (old opsets)."""
    out = model.graph.output[0].type.tensor_type
    out.elem_type = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    out.shape.Clear()
    for d in shape:
        out.shape.dim.add().dim_value = d
    return model


def test_lppool_float16_and_opset1_float_p():
    x = rand((1, 2, 6, 7), F16)
    check_against_ort("LpPool", {"x": x}, {"kernel_shape": [2, 3], "p": 2})
    xs = rand((1, 2, 6, 7))
    model = make_node_model("LpPool", {"x": xs}, {"kernel_shape": [2, 3], "p": 3.0}, opset=1)
    old = run_graphc(_typed_output(model, F32, (1, 2, 5, 5)), {"x": xs})
    new = check_against_ort("LpPool", {"x": xs}, {"kernel_shape": [2, 3], "p": 3})
    assert_close(old["y"], new["y"], rtol=0, atol=0)


# ---- Global pools, LRN -------------------------------------------------------------------------


@pytest.mark.parametrize("xs", [(2, 3, 5, 7), (1, 4, 9), (1, 2, 3, 4, 5), (1, 1, 1, 1)])
@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("dtype", [F32, F16])
def test_global_pools_vs_ort(xs, op, dtype):
    check_against_ort(op, {"x": rand(xs, dtype)})


@pytest.mark.parametrize("dtype", [F32, F16, F64])
@pytest.mark.parametrize("p", [1, 2, 3])
def test_global_lp_pool_vs_formula(dtype, p):
    x = rand((2, 3, 5, 4), dtype)
    got = run_graphc(make_node_model("GlobalLpPool", {"x": x}, {"p": p}), {"x": x})["y"]
    want = (np.abs(x.astype(F64)) ** p).sum(axis=(2, 3), keepdims=True) ** (1 / p)
    assert_close(got, want.astype(dtype))


def test_global_pools_float64():
    x = rand((2, 3, 5, 4), F64)
    got = run_graphc(make_node_model("GlobalAveragePool", {"x": x}), {"x": x})["y"]
    assert_close(got, x.mean(axis=(2, 3), keepdims=True))
    got = run_graphc(make_node_model("GlobalMaxPool", {"x": x}), {"x": x})["y"]
    assert_close(got, x.max(axis=(2, 3), keepdims=True))


@pytest.mark.parametrize("size", [1, 3, 5, 9])
@pytest.mark.parametrize("dtype", [F32, F16])
def test_lrn_vs_ort(size, dtype):
    # ORT's LRN takes odd sizes and 4-D inputs only; the formula test below covers the rest.
    check_against_ort("LRN", {"x": rand((2, 7, 4, 5), dtype)}, {"size": size, "alpha": 0.02, "beta": 0.6, "bias": 1.5})


def ref_lrn(x, size, alpha=1e-4, beta=0.75, bias=1.0):
    """The spec's sum over channels [c - floor((size-1)/2), c + ceil((size-1)/2)], in float64."""
    x = x.astype(F64)
    c = x.shape[1]
    s = np.zeros_like(x)
    for ch in range(c):
        lo, hi = max(0, ch - (size - 1) // 2), min(c - 1, ch + -(-(size - 1) // 2))
        s[:, ch] = (x[:, lo : hi + 1] ** 2).sum(axis=1)
    return x / (bias + alpha / size * s) ** beta


@pytest.mark.parametrize("size", [1, 2, 4, 5])
@pytest.mark.parametrize("xs", [(1, 5, 3, 3), (2, 6, 7), (1, 3, 2, 2, 3)])
@pytest.mark.parametrize("dtype", [F64, F32])
def test_lrn_vs_formula(size, xs, dtype):
    x = rand(xs, dtype)
    got = run_graphc(make_node_model("LRN", {"x": x}, {"size": size}), {"x": x})["y"]
    assert_close(got, ref_lrn(x, size).astype(dtype))


# ---- MaxUnpool ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "xs, attrs, out_shape",
    [
        ((1, 2, 6, 8), {"kernel_shape": [2, 2], "strides": [2, 2]}, None),
        ((1, 2, 7, 7), {"kernel_shape": [2, 2], "strides": [2, 2]}, [1, 2, 7, 7]),
        ((2, 1, 7, 6), {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 0]}, None),
        ((2, 1, 8, 6), {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 0]}, [2, 1, 8, 6]),
        ((1, 2, 9), {"kernel_shape": [3], "strides": [3]}, None),
    ],
)
def test_maxunpool_inverts_maxpool_like_ort(xs, attrs, out_shape):
    x = rand(xs, low=0.1)  # positive, so the zeros MaxUnpool fills in never win a re-pool
    pooled = run_ort(make_node_model("MaxPool", {"x": x}, attrs, outputs=("y", "i")), {"x": x})
    feeds = {"y": pooled["y"], "i": pooled["i"]}
    inits = {"shape": np.array(out_shape, np.int64)} if out_shape else None
    model = make_node_model("MaxUnpool", feeds, attrs, initializers=inits, outputs=("z",))
    if out_shape:  # ONNX shape inference leaves the output untyped
        model = _typed_output(model, F32, out_shape)
    got = run_graphc(model, feeds)["z"]
    assert_close(got, run_ort(model, feeds)["z"])
    # Pooling the unpooled tensor gives back the pooled values.
    again = run_graphc(make_node_model("MaxPool", {"x": got}, attrs), {"x": got})["y"]
    assert_close(again, pooled["y"])


# ---- inference ---------------------------------------------------------------------------------


def _infer(op, types, attrs=None, outputs=1):
    b = GraphBuilder()
    ins = [b.add_input(f"in{i}", t) for i, t in enumerate(types)]
    return [v.type for v in b.add_node(op, ins, attrs or {}, outputs=outputs).outputs]


def test_infer_symbolic_dims():
    f32 = DType.float32
    (t,) = _infer("Conv", [TensorType(f32, ("N", 3, "H", "W")), TensorType(f32, (8, 3, 3, 3))], {"pads": [1, 1, 1, 1]})
    assert t == TensorType(f32, ("N", 8, "H", "W"))
    (t,) = _infer("Conv", [TensorType(f32, ("N", 3, "H", 9)), TensorType(f32, (8, 3, 3, 3))], {"strides": [2, 2]})
    assert t == TensorType(f32, ("N", 8, None, 4))
    (t,) = _infer("Conv", [TensorType(f32, ("N", 3, "H", "W")), TensorType(f32, None)])
    assert t == TensorType(f32, ("N", None, None, None))
    y, i = _infer("MaxPool", [TensorType(f32, (1, 3, "H", 8))], {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER"}, 2)
    assert y == TensorType(f32, (1, 3, "H", 8)) and i == TensorType(DType.int64, (1, 3, "H", 8))
    (t,) = _infer("GlobalAveragePool", [TensorType(f32, ("N", 3, "H", "W"))])
    assert t == TensorType(f32, ("N", 3, 1, 1))
    (t,) = _infer(
        "ConvTranspose", [TensorType(f32, (1, 4, 5, 5)), TensorType(f32, (4, 3, 3, 3))], {"group": 2, "strides": [2, 2]}
    )
    assert t == TensorType(f32, (1, 6, 11, 11))


def test_infer_unknown_rank():
    f32, unknown = DType.float32, TensorType(DType.float32, None)
    (t,) = _infer("Conv", [unknown, TensorType(f32, (8, 3, 3, 3))], {"pads": [1, 1, 1, 1]})
    assert t == TensorType(f32, (None, 8, None, None))
    (t,) = _infer("Conv", [unknown, TensorType(f32, None)])
    assert t == TensorType(f32, None)
    y, i = _infer("MaxPool", [unknown], {"kernel_shape": [3, 3, 3]}, 2)
    assert y == TensorType(f32, (None,) * 5) and i == TensorType(DType.int64, (None,) * 5)
    assert _infer("GlobalMaxPool", [unknown]) == [unknown]
    assert _infer("LRN", [unknown], {"size": 3}) == [unknown]


@pytest.mark.parametrize(
    "op, types, attrs, match",
    [
        ("Conv", [(1, 4, 5, 5), (6, 3, 3, 3)], {}, "channels"),
        ("Conv", [(1, 4, 5, 5), (6, 2, 3, 3)], {"group": 4}, "channels"),
        ("Conv", [(1, 4, 5, 5), (6, 4, 3, 3)], {"kernel_shape": [2, 2]}, "kernel_shape"),
        ("Conv", [(1, 4, 2, 2), (6, 4, 3, 3)], {}, "kernel spans"),
        ("Conv", [(1, 4, 5, 5), (6, 4, 3, 3)], {"strides": [1]}, "strides"),
        ("Conv", [(4, 5, 5), (6, 4, 3, 3)], {}, "rank"),
        ("Conv", [(1, 4, 5, 5), (6, 4, 3, 3)], {"pads": [1, 1, -1, 1]}, "pads"),
        ("MaxPool", [(1, 4, 5, 5)], {"kernel_shape": [3, 3], "auto_pad": "SAME"}, "auto_pad"),
        ("ConvTranspose", [(1, 4, 5, 5), (3, 2, 3, 3)], {}, "channels"),
    ],
)
def test_infer_errors_name_the_node(op, types, attrs, match):
    with pytest.raises(ShapeError, match=match) as e:
        _infer(op, [TensorType(DType.float32, s) for s in types], attrs)
    assert op in str(e.value)


def test_conv_in_a_graph_with_symbolic_batch():
    """A model whose batch dim is symbolic runs with any batch size."""
    w = rand((4, 3, 3, 3))
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 5, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 5, 6])],
        [__import__("onnx").numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    graph = graphc.load_onnx(model)
    for n in (1, 3):
        x = rand((n, 3, 5, 6), seed=n)
        got = graphc.interpret(graph, {"x": x})
        assert_close(next(iter(got.values())), ref_conv(x, w, pads=[1, 1, 1, 1]).astype(F32))
