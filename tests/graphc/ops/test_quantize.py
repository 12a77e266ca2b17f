"""QuantizeLinear / DequantizeLinear against ONNX Runtime: per-tensor, per-axis, blocked, zero points,
8/16-bit and 4-bit types, fp16 inputs, older opsets; and the errors for scales that do not fit."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
from graphc.errors import ShapeError
from helpers import check_against_ort, int8_weights, make_node_model, rand

RNG = np.random.default_rng(0)
X = rand([2, 6, 5], seed=1, low=-40, high=40)


def _scale(n: int | None, dtype=np.float32) -> np.ndarray:
    s = RNG.uniform(0.05, 0.4, size=() if n is None else (n,)).astype(dtype)
    return s


def _check(op, x, inits, attrs=None, opset=21, names=("x", "s", "zp")):
    order = [names[0], *[k for k in names[1:] if k in inits]]
    out = check_against_ort(
        op, {"x": x}, attrs or {}, initializers=inits, opset=opset, input_order=order, rtol=0, atol=0
    )
    return out["y"]


@pytest.mark.parametrize("zp_dtype", [np.uint8, np.int8, np.uint16, np.int16, None])
def test_quantize_per_tensor(zp_dtype):
    inits = {"s": np.array(0.1, np.float32)}  # |x| / s up to 400: both ends of 8 bits saturate
    if zp_dtype is not None:
        info = np.iinfo(zp_dtype)
        inits["zp"] = np.array(min(info.max, max(info.min, 3)), dtype=zp_dtype)
    y = _check("QuantizeLinear", X, inits)
    assert y.dtype == (zp_dtype or np.uint8)
    if zp_dtype in (np.uint8, None):
        assert (y == 0).any() and (y == 255).any()  # both ends saturate on this input


@pytest.mark.parametrize("axis", [1, -2, 2, 0])
def test_quantize_dequantize_per_axis(axis):
    n = X.shape[axis]
    s = _scale(n)
    zp = RNG.integers(-5, 5, size=n).astype(np.int8)
    q = _check("QuantizeLinear", X, {"s": s, "zp": zp}, {"axis": axis})
    _check("DequantizeLinear", q, {"s": s, "zp": zp}, {"axis": axis})


@pytest.mark.parametrize(("axis", "block"), [(1, 2), (1, 4), (2, 3), (-1, 5)])
def test_quantize_dequantize_blocked(axis, block):
    shape = list(X.shape)
    shape[axis] = -(-shape[axis] // block)
    s = RNG.uniform(0.05, 0.4, size=shape).astype(np.float32)
    zp = RNG.integers(0, 9, size=shape).astype(np.uint8)
    attrs = {"axis": axis, "block_size": block}
    q = _check("QuantizeLinear", X, {"s": s, "zp": zp}, attrs)
    _check("DequantizeLinear", q, {"s": s, "zp": zp}, attrs)


def _formula_q(x, s, zp, lo, hi, dtype):
    """The spec's formula, written out: divide in the promoted type, round half to even."""
    return np.clip(np.rint((x / s).astype(np.float64)) + zp, lo, hi).astype(dtype)


def test_fp16_input_and_scale():
    """fp16 by an fp16 scale divides in fp16, as the spec says the scale's type sets the division's
    precision (the ONNX reference does too). ONNX Runtime divides in float32 and can land one step
    away, so the quantize side is checked against the formula; dequantize against ONNX Runtime."""
    x = X.astype(np.float16)
    s = _scale(None, np.float16)
    m = make_node_model("QuantizeLinear", {"x": x}, initializers={"s": s, "zp": np.array(7, np.int8)}, opset=21)
    q = graphc.interpret(graphc.load_onnx(m), {"x": x})["y"]
    np.testing.assert_array_equal(q, _formula_q(x, s, 7, -128, 127, np.int8))
    y = _check("DequantizeLinear", q, {"s": s, "zp": np.array(7, np.int8)})
    assert y.dtype == np.float16


def test_int4_and_int32():
    """int4 against the formula (ONNX Runtime returns no int4 arrays to numpy); int32 dequantize
    against ONNX Runtime."""
    import ml_dtypes

    s = _scale(None)
    zp = np.array(1, dtype=ml_dtypes.int4)
    m = make_node_model("QuantizeLinear", {"x": X}, initializers={"s": s, "zp": zp}, opset=21)
    q = graphc.interpret(graphc.load_onnx(m), {"x": X})["y"]
    assert q.dtype == np.dtype(ml_dtypes.int4)
    np.testing.assert_array_equal(q.astype(np.int8), _formula_q(X, s, 1, -8, 7, np.int8))
    m = make_node_model("DequantizeLinear", {"x": q}, initializers={"s": s, "zp": zp}, opset=21)
    y = graphc.interpret(graphc.load_onnx(m), {"x": q})["y"]
    np.testing.assert_array_equal(y, (q.astype(np.float32) - 1) * s)
    _check("DequantizeLinear", rand([3, 4], np.int32, low=-1000, high=1000), {"s": s})


@pytest.mark.parametrize("opset", [10, 13, 19])
def test_older_opsets(opset):
    s, zp = _scale(None), np.array(128, np.uint8)
    q = _check("QuantizeLinear", X, {"s": s, "zp": zp}, opset=opset)
    _check("DequantizeLinear", q, {"s": s, "zp": zp}, opset=opset)


def test_ties_round_to_even():
    s = np.array(0.5, np.float32)
    x = np.array([0.25, 0.75, 1.25, -0.25, -0.75, 63.25, 63.75], np.float32)  # x / s = k + 0.5
    y = _check("QuantizeLinear", x, {"s": s, "zp": np.array(0, np.int8)})
    np.testing.assert_array_equal(y, [0, 2, 2, 0, -2, 126, 127])


@pytest.mark.parametrize(
    ("scale_shape", "attrs", "message"),
    [
        ((4,), {"axis": 1}, "4 values for axis 1 of size 6"),
        ((2, 6), {"axis": 1}, "per-axis scale must be 1-D"),
        ((2, 2, 5), {"axis": 1, "block_size": 2}, "needs 3 scales, got 2"),
        ((2, 3, 4), {"axis": 1, "block_size": 2}, "differs from the input's"),
        ((6,), {"axis": 3}, "axis 3 is out of range"),
    ],
)
def test_scales_that_do_not_fit_name_the_node(scale_shape, attrs, message):
    m = make_node_model(
        "QuantizeLinear", {"x": X}, attrs, initializers={"s": np.ones(scale_shape, np.float32)}, opset=21
    )
    with pytest.raises(ShapeError, match=message) as e:
        graphc.load_onnx(m)
    assert "QuantizeLinear node" in str(e.value)


def _close_to_integer_definition(got: np.ndarray, expected: np.ndarray) -> None:
    """The float computation may put an output on a rounding boundary one step off the integer one."""
    diff = np.abs(got.astype(np.int32) - expected.astype(np.int32))
    assert got.dtype == expected.dtype
    assert diff.max() <= 1 and (diff > 0).mean() < 0.02, f"{(diff > 0).mean():.3f} of outputs differ"


@pytest.mark.parametrize(("dtype", "per_column"), [(np.uint8, False), (np.int8, False), (np.uint8, True)])
def test_qlinear_matmul_against_onnxruntime(dtype, per_column):
    """Per-tensor a, per-tensor or per-column b (ONNX Runtime takes per-row scales for a only
    per tensor)."""
    from helpers import run_ort

    m, k, n = 7, 33, 10
    info = np.iinfo(dtype)
    a = RNG.integers(info.min, info.max, size=(2, m, k)).astype(dtype)
    inits = {
        "a_s": np.float32(0.02),
        "a_zp": np.array(3, dtype),
        "b": RNG.integers(info.min, info.max, size=(k, n)).astype(dtype),
        "b_s": RNG.uniform(0.01, 0.03, n).astype(np.float32) if per_column else np.float32(0.02),
        "b_zp": np.full(n, 1, dtype) if per_column else np.array(1, dtype),
        "y_s": np.float32(4.0),
        "y_zp": np.array(5, dtype),
    }
    order = ["a", "a_s", "a_zp", "b", "b_s", "b_zp", "y_s", "y_zp"]
    model = make_node_model("QLinearMatMul", {"a": a}, initializers=inits, input_order=order, opset=21)
    expected = run_ort(model, {"a": a})["y"]
    got = graphc.interpret(graphc.load_onnx(model), {"a": a})["y"]
    _close_to_integer_definition(got, expected)


def test_qlinear_conv_against_onnxruntime_and_for_cuda():
    from helpers import run_ort

    c_in, c_out = 6, 8
    x = RNG.integers(0, 255, size=(1, c_in, 9, 7)).astype(np.uint8)
    inits = {
        "x_s": np.float32(0.03),
        "x_zp": np.array(120, np.uint8),
        "w": int8_weights(RNG, (c_out, c_in, 3, 3)),  # exact in ORT on every x86 CPU (helpers.py)
        "w_s": RNG.uniform(0.001, 0.004, c_out).astype(np.float32),
        "w_zp": np.zeros(c_out, np.int8),
        "y_s": np.float32(0.05),
        "y_zp": np.array(100, np.uint8),
        "bias": RNG.integers(-2000, 2000, size=c_out).astype(np.int32),
    }
    order = ["x", "x_s", "x_zp", "w", "w_s", "w_zp", "y_s", "y_zp", "bias"]
    model = make_node_model(
        "QLinearConv", {"x": x}, {"pads": [1, 1, 1, 1], "strides": [1, 2]}, initializers=inits, input_order=order
    )
    expected = run_ort(model, {"x": x})["y"]
    got = graphc.interpret(graphc.load_onnx(model), {"x": x})["y"]
    _close_to_integer_definition(got, expected)
    _close_to_integer_definition(graphc.compile(model, target="cpu").run({"x": x})["y"], expected)
    eng = graphc.compile(model, target="cuda", arch=["sm_90"])  # no GPU needed to build it
    assert "conv" in {ln.family for s in eng.plan.steps for ln in s.launches}
