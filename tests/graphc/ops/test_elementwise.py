"""Elementwise ops against ONNX Runtime and against independent float64 / Python-int formulas
written here from the spec (where ORT has no CPU kernel, the formula is the only oracle)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto

import graphc
from graphc.errors import GraphcError, ShapeError
from graphc.interpreter import InterpretError
from graphc.ir.types import DType, TensorType
from graphc.ops.elementwise import cast_to, erf
from graphc.ops.registry import InferContext, get_op
from helpers import assert_close, make_node_model, np_to_onnx_dtype, rand, run_graphc, run_ort

F32, F16, F64 = np.float32, np.float16, np.float64
BF16 = ml_dtypes.bfloat16


def ort_or_none(model: onnx.ModelProto, feeds: dict) -> dict | None:
    """ORT's outputs, or None where ORT has no CPU kernel for this op/type/opset."""
    try:
        return run_ort(model, feeds)
    except Exception as e:
        msg = str(e)
        # No kernel; or ORT's Python binding cannot take or give bfloat16/float8 numpy arrays.
        if any(s in msg for s in ("NOT_IMPLEMENTED", "not supported", "Numpy_type", "Numpy type")):
            return None
        raise


def close(actual, expected, **kw):
    """assert_close, with float8/float4 compared exactly as float32 (NaN equal to NaN)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.dtype.kind == "V" and actual.dtype.itemsize == 1:
        assert actual.dtype == expected.dtype, f"{kw.get('what')}: {actual.dtype} != {expected.dtype}"
        np.testing.assert_array_equal(actual.astype(F32), expected.astype(F32), err_msg=kw.get("what", ""))
    else:
        assert_close(actual, expected, **kw)


def check(op, inputs, attrs=None, *, ref=None, rtol=None, atol=None, outputs=("y",), not_ort=(), **kw):
    """Run a one-node model through graphc; compare with ORT (when it runs the op; not for the
    outputs named in `not_ort`) and with `ref` (expected arrays, one per output) when given."""
    feeds = {k: np.asarray(v) for k, v in inputs.items() if v is not None}
    model = make_node_model(op, feeds, attrs, outputs=outputs, **kw)
    actual = run_graphc(model, feeds)
    expected = ort_or_none(model, feeds)
    assert expected is not None or ref is not None, f"no oracle for {op}"
    for i, name in enumerate(outputs):
        if expected is not None and name not in not_ort:
            want = expected[name]
            if want.dtype == np.uint8 and actual[name].dtype.itemsize == 1 and actual[name].dtype.kind == "V":
                want = want.view(actual[name].dtype)  # ORT gives float8 outputs as raw bytes
            close(actual[name], want, rtol=rtol, atol=atol, what=f"{op} vs ORT, {name}")
        if ref is not None:
            close(actual[name], ref[i], rtol=rtol, atol=atol, what=f"{op} vs formula, {name}")
    return actual


def old_model(op, inputs, attrs, opset, out_dtype, outputs=("y",)):
    """A one-node model at an old opset, with output types given (ONNX shape inference does not
    fill them in for every old version). Outputs have the first input's shape."""
    node = onnx.helper.make_node(op, list(inputs), list(outputs), **attrs)
    shape = next(iter(inputs.values())).shape  # A's shape: old broadcasting is unidirectional
    g = onnx.helper.make_graph(
        [node],
        "old",
        [onnx.helper.make_tensor_value_info(k, np_to_onnx_dtype(v.dtype), v.shape) for k, v in inputs.items()],
        [onnx.helper.make_tensor_value_info(o, np_to_onnx_dtype(np.dtype(out_dtype)), shape) for o in outputs],
    )
    model = onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def infer(op: str, *types: TensorType | None, attrs=None, values=None, num_outputs=1):
    opdef = get_op(op)
    ctx = InferContext(
        op=op,
        node_name="n",
        attrs=opdef.attrs(**(attrs or {})),
        input_types=list(types),
        input_values=list(values or [None] * len(types)),
        num_outputs=num_outputs,
    )
    return opdef.infer(ctx)


# (dtype, shape) pairs: odd sizes, a unit dim, rank 0 and rank 1.
FLOAT_CASES = [(F32, (2, 3, 5)), (F16, (7,)), (F64, ()), (F32, (1, 4, 1))]

# ---- unary float ops ---------------------------------------------------------------------------


def _sig(x):
    return 1 / (1 + np.exp(-x))


def _softplus(x):
    return np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0)


_ERF64 = np.vectorize(math.erf)


def q(v: float) -> float:
    """v as a model stores a float attribute (float32)."""
    return float(np.float32(v))


# op -> (input range, float64 formula from the spec, attrs)
UNARY_FLOAT = {
    "Sqrt": ((0.1, 4), np.sqrt, {}),
    "Exp": ((-3, 3), np.exp, {}),
    "Log": ((0.1, 4), np.log, {}),
    "Erf": ((-3, 3), _ERF64, {}),
    "Tanh": ((-4, 4), np.tanh, {}),
    "Sigmoid": ((-8, 8), _sig, {}),
    "Relu": ((-2, 2), lambda x: np.where(x > 0, x, 0), {}),
    "Neg": ((-2, 2), lambda x: -x, {}),
    "Abs": ((-2, 2), np.abs, {}),
    "Sign": ((-2, 2), np.sign, {}),
    "Reciprocal": ((0.3, 3), lambda x: 1 / x, {}),
    "Floor": ((-5, 5), np.floor, {}),
    "Ceil": ((-5, 5), np.ceil, {}),
    "Round": ((-5, 5), np.round, {}),
    "Sin": ((-3, 3), np.sin, {}),
    "Cos": ((-3, 3), np.cos, {}),
    "Tan": ((-1.2, 1.2), np.tan, {}),
    "Asin": ((-0.95, 0.95), np.arcsin, {}),
    "Acos": ((-0.95, 0.95), np.arccos, {}),
    "Atan": ((-3, 3), np.arctan, {}),
    "Sinh": ((-3, 3), np.sinh, {}),
    "Cosh": ((-3, 3), np.cosh, {}),
    "Asinh": ((-3, 3), np.arcsinh, {}),
    "Acosh": ((1.1, 4), np.arccosh, {}),
    "Atanh": ((-0.9, 0.9), np.arctanh, {}),
    "Softplus": ((-5, 5), _softplus, {}),
    "Softsign": ((-5, 5), lambda x: x / (1 + np.abs(x)), {}),
    "Mish": ((-5, 5), lambda x: x * np.tanh(_softplus(x)), {}),
    "HardSwish": ((-5, 5), lambda x: x * np.clip(x / 6 + 0.5, 0, 1), {}),
    "LeakyRelu": ((-2, 2), lambda x: np.where(x < 0, q(0.2) * x, x), {"alpha": 0.2}),
    "Elu": ((-3, 3), lambda x: np.where(x < 0, q(0.7) * (np.exp(x) - 1), x), {"alpha": 0.7}),
    "Selu": (
        (-3, 3),
        lambda x: q(1.0507010221481323) * np.where(x <= 0, q(1.6732631921768188) * (np.exp(x) - 1), x),
        {},
    ),
    "Celu": (
        (-3, 3),
        lambda x: np.maximum(0, x) + np.minimum(0, 1.5 * (np.exp(x / 1.5) - 1)),
        {"alpha": 1.5},
    ),
    "HardSigmoid": ((-5, 5), lambda x: np.clip(q(0.3) * x + q(0.4), 0, 1), {"alpha": 0.3, "beta": 0.4}),
    "ThresholdedRelu": ((-2, 3), lambda x: np.where(x > 0.5, x, 0), {"alpha": 0.5}),
    "Gelu": ((-4, 4), lambda x: 0.5 * x * (1 + _ERF64(x / math.sqrt(2))), {}),
    "Swish": ((-6, 6), lambda x: x * _sig(q(0.8) * x), {"alpha": 0.8}),
    "Shrink": (
        (-2, 2),
        lambda x: np.where(x < -q(0.6), x + 0.25, np.where(x > q(0.6), x - 0.25, 0)),
        {"lambd": 0.6, "bias": 0.25},
    ),
}


@pytest.mark.parametrize("op", sorted(UNARY_FLOAT))
@pytest.mark.parametrize(("dtype", "shape"), FLOAT_CASES)
def test_unary_float(op, dtype, shape):
    (lo, hi), fn, attrs = UNARY_FLOAT[op]
    x = rand(shape, dtype, seed=len(op), low=lo, high=hi)
    # The formula sees the attrs as the model stores them (float32), like every implementation.
    ref = np.asarray(fn(x.astype(F64))).astype(dtype)
    check(op, {"x": x}, attrs, ref=[ref])


def test_unary_float_bfloat16_and_empty():
    # bfloat16 (ORT lacks most kernels) and a tensor with a zero dim, against the formulas.
    for op, ((lo, hi), fn, attrs) in UNARY_FLOAT.items():
        x = rand((3, 4), F32, seed=1, low=lo, high=hi).astype(BF16)
        if "bfloat16" in str(onnx.defs.get_schema(op).type_constraints[0].allowed_type_strs):
            ref = np.asarray(fn(x.astype(F64))).astype(BF16)
            check(op, {"x": x}, attrs, ref=[ref])
        e = np.zeros((0, 3), F32)
        check(op, {"x": e}, attrs, ref=[e])


def test_round_half_to_even():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 2.4999, 3.5001], F32)
    check("Round", {"x": x}, ref=[np.array([0, 2, 2, -0, -2, -2, 2, 4], F32)])


def test_gelu_tanh():
    x = rand((4, 7), F32, low=-5, high=5)
    x64 = x.astype(F64)
    ref = 0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64**3)))
    check("Gelu", {"x": x}, {"approximate": "tanh"}, ref=[ref.astype(F32)])


def test_activations_extreme_values():
    # No overflow in Sigmoid, Softplus, Mish, Swish for large |x|; NaN stays NaN.
    x = np.array([-1000, -88, -20, 0, 20, 88, 1000, np.inf, -np.inf, np.nan], F32)
    x64 = x.astype(F64)
    with np.errstate(over="ignore", invalid="ignore"):
        sig = np.where(x64 >= 0, 1 / (1 + np.exp(-x64)), np.exp(x64) / (1 + np.exp(x64)))
    sig[np.isneginf(x64)] = 0.0
    sp = np.where(x64 > 30, x64, np.log1p(np.exp(np.minimum(x64, 30))))
    check("Sigmoid", {"x": x}, ref=[sig.astype(F32)])
    check("Softplus", {"x": x}, ref=[sp.astype(F32)])
    for op in ("Mish", "Swish", "Tanh", "Erf", "Gelu", "HardSwish", "Elu", "Selu", "Celu"):
        out = run_graphc(make_node_model(op, {"x": x}), {"x": x})["y"]
        assert np.isnan(out[-1]) and not np.isnan(out[:-3]).any(), (op, out)


# ---- Erf accuracy ------------------------------------------------------------------------------


def test_erf_dense_grid_matches_math_erf():
    x = np.concatenate(
        [
            np.linspace(-7, 7, 140001),
            np.geomspace(1e-300, 1e-1, 2000),
            -np.geomspace(1e-300, 1e-1, 2000),
            [0.46875, 0.46875 + 1e-12, 4.0, 4.0 + 1e-12, 26.5, 27.5, 1e10, 1e300, 5e-324],
        ]
    )
    got = erf(x)
    want = _ERF64(x)
    # float64: a few ulps (Cody's erfc is good to ~1e-16 relative; 1 - erfc near |x| = 0.5
    # loses a little of that).
    np.testing.assert_allclose(got, want, rtol=1e-15, atol=0)
    # float32 through the op: correctly rounded almost everywhere; 1e-7 relative everywhere.
    with np.errstate(over="ignore"):
        x32 = x.astype(F32)
    out = run_graphc(make_node_model("Erf", {"x": x32}), {"x": x32})["y"]
    want32 = _ERF64(x32.astype(F64)).astype(F32)
    np.testing.assert_allclose(out, want32, rtol=1e-7, atol=3e-45)  # atol: float32 subnormals
    special = erf(np.array([np.inf, -np.inf, np.nan, 0.0, -0.0]))
    assert special[0] == 1 and special[1] == -1 and np.isnan(special[2])
    assert special[3] == 0 and np.signbit(special[4])


# ---- unary integer and bool ops ----------------------------------------------------------------

INT_UNARY = {
    "Relu": ([np.int8, np.int32, np.int64], lambda v: max(v, 0)),
    "Neg": ([np.int8, np.int32, np.int64], lambda v: -v),
    "Abs": ([np.int8, np.uint8, np.int16, np.int64], abs),
    "Sign": ([np.int32, np.uint8, np.int64], lambda v: (v > 0) - (v < 0)),
    "BitwiseNot": ([np.int8, np.uint16, np.int64, np.uint64], lambda v: ~v),
}


def _wrap(values, dtype):
    """Python ints wrapped to `dtype` (two's complement), as C casts do."""
    info = np.iinfo(dtype)
    span = 1 << (8 * np.dtype(dtype).itemsize)
    return np.array([((v - info.min) % span) + info.min for v in values], dtype=dtype)


@pytest.mark.parametrize(("op", "dtype"), [(op, dt) for op, (dts, _) in INT_UNARY.items() for dt in dts], ids=str)
def test_unary_int(op, dtype):
    info = np.iinfo(dtype)
    vals = [info.min, info.min + 1, -3, -1, 0, 1, 5, info.max] if info.min < 0 else [0, 1, 7, info.max]
    x = np.array(vals, dtype=dtype).reshape(-1, 1 if len(vals) % 2 else 2)
    ref = _wrap([INT_UNARY[op][1](int(v)) for v in x.ravel()], dtype).reshape(x.shape)
    check(op, {"x": x}, ref=[ref])


def test_not_bool():
    x = rand((3, 1, 4), np.bool_)
    check("Not", {"x": x}, ref=[~x])
    check("Not", {"x": np.array(True)}, ref=[np.array(False)])


def test_isnan_isinf():
    base = np.array([1.0, np.nan, np.inf, -np.inf, 0.0, -2.5, np.nan], F64)
    for dt in (F32, F16, F64):
        x = base.astype(dt).reshape(7, 1)
        check("IsNaN", {"x": x}, ref=[np.isnan(base).reshape(7, 1)])
        for pos, neg in ((1, 1), (1, 0), (0, 1), (0, 0)):
            want = (np.isposinf(base) & bool(pos)) | (np.isneginf(base) & bool(neg))
            check(
                "IsInf",
                {"x": x},
                {"detect_positive": pos, "detect_negative": neg},
                ref=[want.reshape(7, 1)],
            )
    # Narrow floats ORT may not run: against the formula.
    for dt in (BF16, ml_dtypes.float8_e5m2):
        x = base.astype(dt)
        out = run_graphc(make_node_model("IsInf", {"x": x}), {"x": x})["y"]
        np.testing.assert_array_equal(out, np.isinf(base))
        out = run_graphc(make_node_model("IsNaN", {"x": x}), {"x": x})["y"]
        np.testing.assert_array_equal(out, np.isnan(base))


# ---- binary arithmetic -------------------------------------------------------------------------

BCAST_SHAPES = [((2, 3, 5), (3, 1)), ((), (4, 3)), ((6,), (6,)), ((1, 4, 1), (3, 1, 2))]
ARITH_DTYPES = [F32, F16, F64, np.int32, np.int64, np.int8, np.uint8, np.uint64]


def _int_ref(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Python-int arithmetic wrapped to the dtype; Div truncates toward zero like C."""
    a2, b2 = np.broadcast_arrays(a, b)

    def f(x, y):
        if op == "Add":
            return x + y
        if op == "Sub":
            return x - y
        if op == "Mul":
            return x * y
        q = abs(x) // abs(y)
        return q if (x >= 0) == (y >= 0) else -q

    vals = [f(int(x), int(y)) for x, y in zip(a2.ravel(), b2.ravel(), strict=True)]
    return _wrap(vals, a.dtype).reshape(a2.shape)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("dtype", ARITH_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize(("sa", "sb"), BCAST_SHAPES, ids=str)
def test_arith(op, dtype, sa, sb):
    kind = np.dtype(dtype).kind
    lo = 0 if kind == "u" else -9
    a = rand(sa, dtype, seed=1, low=lo, high=9 if kind in "iu" else 3)
    b = rand(sb, dtype, seed=2, low=lo, high=9 if kind in "iu" else 3)
    if op == "Div":
        b = np.where(b == 0, np.ones((), dtype), b).astype(dtype)
    if kind in "iu":
        ref = _int_ref(op, a, b)
    else:
        fn = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}[op]
        ref = fn(a.astype(F64), b.astype(F64)).astype(dtype)
    check(op, {"a": a, "b": b}, ref=[ref])


def test_integer_overflow_wraps_and_div_truncates():
    a = np.array([127, -128, 100, -7, 7, -7, -128], np.int8)
    b = np.array([1, -1, 2, 2, -2, -2, -1], np.int8)
    for op in ("Add", "Sub", "Mul"):
        check(op, {"a": a, "b": b}, ref=[_int_ref(op, a, b)])
    # Div: -128 / -1 overflows (wraps to -128); ORT traps on it, so formula only.
    model = make_node_model("Div", {"a": a, "b": b})
    out = run_graphc(model, {"a": a, "b": b})["y"]
    np.testing.assert_array_equal(out, _int_ref("Div", a, b))
    i64 = np.array([2**62, -(2**63)], np.int64)
    check("Mul", {"a": i64, "b": np.array([4, -1], np.int64)}, ref=[_wrap([2**64, 2**63], np.int64)])


def test_bfloat16_arith():
    a = rand((3, 5), F32, seed=3).astype(BF16)
    b = rand((5,), F32, seed=4, low=0.5, high=2).astype(BF16)
    for op, fn in (("Add", np.add), ("Mul", np.multiply), ("Sub", np.subtract), ("Div", np.divide)):
        ref = fn(a.astype(F64), b.astype(F64)).astype(BF16)
        check(op, {"a": a, "b": b}, ref=[ref])


# ---- Pow ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tb", "te"),
    [(F32, F32), (F16, F16), (F64, F64), (F32, np.int32), (F32, np.int64), (np.int32, F32), (np.int64, F64)],
    ids=str,
)
def test_pow_mixed_types(tb, te):
    base = rand((3, 4), tb, seed=5, low=1, high=4)
    exp = rand((4,), te, seed=6, low=-2, high=3)
    ref = np.power(base.astype(F64), exp.astype(F64))
    ref = (np.trunc(ref) if np.dtype(tb).kind in "iu" else ref).astype(tb)
    check("Pow", {"a": base, "b": exp}, ref=[ref])


@pytest.mark.parametrize(
    ("dtype", "etype"), [(np.int32, np.int32), (np.int64, np.int64), (np.int32, np.uint8), (np.int64, np.int8)]
)
def test_pow_integer_exact_with_wraparound(dtype, etype):
    info = np.iinfo(dtype)
    bases = [0, 1, 2, 3, 7, 10, info.max, -1, -2, -3, info.min]
    exps = [0, 1, 2, 3, 5, 13, 40, 63] + ([-1, -2, -3] if np.iinfo(etype).min < 0 else [])
    b = np.array(bases, dtype).reshape(-1, 1)
    e = np.array(exps, etype).reshape(1, -1)

    def ipow(x, y):
        if y >= 0:
            return x**y
        return 1 if x == 1 else (-1) ** (-y) if x == -1 else 0  # the truncated real result

    vals = [ipow(int(x), int(y)) for x in b.ravel() for y in e.ravel()]
    ref = _wrap(vals, dtype).reshape(len(bases), len(exps))
    out = run_graphc(make_node_model("Pow", {"a": b, "b": e}), {"a": b, "b": e})["y"]
    np.testing.assert_array_equal(out, ref)


# ---- Mod ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint16, F32, F16, F64], ids=str)
def test_mod(fmod, dtype):
    kind = np.dtype(dtype).kind
    a = rand((3, 5), dtype, seed=7, low=0 if kind == "u" else -20, high=20)
    b = rand((5,), dtype, seed=8, low=0 if kind == "u" else -6, high=6)
    b = np.where(b == 0, np.full((), 3, dtype), b).astype(dtype)
    if kind in "iu":
        a2, b2 = np.broadcast_arrays(a, b)
        if fmod:
            vals = [int(math.fmod(int(x), int(y))) for x, y in zip(a2.ravel(), b2.ravel(), strict=True)]
        else:
            vals = [int(x) % int(y) for x, y in zip(a2.ravel(), b2.ravel(), strict=True)]
        ref = np.array(vals, dtype).reshape(a2.shape)
    else:
        a64, b64 = np.broadcast_arrays(a.astype(F64), b.astype(F64))
        f = math.fmod if fmod else (lambda x, y: x % y)  # Python's float % takes the divisor's sign
        ref = np.array([f(x, y) for x, y in zip(a64.ravel(), b64.ravel(), strict=True)]).reshape(a64.shape)
        ref = ref.astype(dtype)
    check("Mod", {"a": a, "b": b}, {"fmod": fmod}, ref=[ref], atol=1e-2 if dtype == F16 else None)


def test_mod_float_special_cases():
    # The opset-28 table for fmod=0.
    a = np.array([0.0, -0.0, np.inf, 3.0, 3.0, -3.0, 3.0, np.nan, 2.0], F64)
    b = np.array([-5.0, 5.0, 2.0, 0.0, np.inf, np.inf, -np.inf, 1.0, np.nan], F64)
    want = np.array([-0.0, 0.0, np.nan, np.nan, 3.0, np.inf, -np.inf, np.nan, np.nan])
    out = run_graphc(make_node_model("Mod", {"a": a, "b": b}), {"a": a, "b": b})["y"]
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(np.signbit(out[:2]), [True, False])


# ---- variadic ----------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["Max", "Min", "Sum", "Mean"])
@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("dtype", [F32, F16, F64, np.int32, np.int64, np.uint8], ids=str)
def test_variadic(op, n, dtype):
    if np.dtype(dtype).kind in "iu" and op in ("Sum", "Mean"):
        pytest.skip("Sum and Mean take floats only")
    shapes = [(2, 1, 5), (3, 1), (5,)][:n]
    ins = {f"x{i}": rand(s, dtype, seed=10 + i, low=0, high=9) for i, s in enumerate(shapes)}
    arrs = [v.astype(F64) for v in ins.values()]
    fn = {"Max": np.maximum, "Min": np.minimum, "Sum": np.add, "Mean": np.add}[op]
    acc = arrs[0]
    for x in arrs[1:]:
        acc = fn(acc, x)
    if op == "Mean":
        acc = acc / n
    check(op, ins, ref=[acc.astype(dtype)])


def test_max_min_propagate_nan():
    a = np.array([np.nan, 1.0, 2.0, np.nan, -np.inf], F32)
    b = np.array([1.0, np.nan, 3.0, np.nan, np.inf], F32)
    check("Max", {"a": a, "b": b}, ref=[np.array([np.nan, np.nan, 3, np.nan, np.inf], F32)])
    check("Min", {"a": a, "b": b}, ref=[np.array([np.nan, np.nan, 2, np.nan, -np.inf], F32)])


def test_sum_float16_accumulates_in_float32():
    xs = {f"x{i}": np.full((4,), 2048, F16) if i == 0 else np.ones((4,), F16) for i in range(5)}
    out = run_graphc(make_node_model("Sum", xs), xs)["y"]
    np.testing.assert_array_equal(out, np.full((4,), 2052, F16))  # pairwise fp16 adds give 2048


# ---- comparisons and logic ---------------------------------------------------------------------

COMPARE = {
    "Equal": np.equal,
    "Less": np.less,
    "LessOrEqual": np.less_equal,
    "Greater": np.greater,
    "GreaterOrEqual": np.greater_equal,
}


@pytest.mark.parametrize("op", sorted(COMPARE))
@pytest.mark.parametrize("dtype", [F32, F16, F64, np.int32, np.int64, np.uint8, np.int8], ids=str)
def test_compare(op, dtype):
    a = rand((2, 3, 4), dtype, seed=11, low=0, high=3)
    b = rand((3, 1), dtype, seed=12, low=0, high=3)
    if np.dtype(dtype).kind == "f":
        a = np.round(a).astype(dtype)  # equal values occur
        b = np.round(b).astype(dtype)
        a[0, 0, 0] = np.nan
    check(op, {"a": a, "b": b}, ref=[COMPARE[op](a, b)])


def test_equal_bool_and_string():
    a, b = rand((3, 4), np.bool_, seed=1), rand((4,), np.bool_, seed=2)
    check("Equal", {"a": a, "b": b}, ref=[a == b])
    s1 = np.array([["ab", "c"], ["", "x"]], dtype=object)
    s2 = np.array(["ab", "x"], dtype=object)
    check("Equal", {"a": s1, "b": s2}, ref=[np.array([[True, False], [False, True]])])


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
@pytest.mark.parametrize(("sa", "sb"), [((2, 3, 4), (4,)), ((), (3,)), ((5, 1), (1, 3))], ids=str)
def test_logic(op, sa, sb):
    a, b = rand(sa, np.bool_, seed=3), rand(sb, np.bool_, seed=4)
    fn = {"And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor}[op]
    check(op, {"a": a, "b": b}, ref=[fn(a, b)])


# ---- bitwise -----------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr", "BitwiseXor"])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.int32, np.uint64], ids=str)
def test_bitwise(op, dtype):
    info = np.iinfo(dtype)
    a = rand((3, 1, 4), dtype, seed=5, low=info.min, high=min(info.max, 2**62))
    b = rand((2, 4), dtype, seed=6, low=info.min, high=min(info.max, 2**62))
    fn = {"BitwiseAnd": np.bitwise_and, "BitwiseOr": np.bitwise_or, "BitwiseXor": np.bitwise_xor}[op]
    check(op, {"a": a, "b": b}, ref=[fn(a, b)])


def _shift_ref(x: int, y: int, direction: str, dtype) -> int:
    """BitShift from the opset-28 text, on Python ints."""
    bits = 8 * np.dtype(dtype).itemsize
    if y < 0 or y >= bits:
        return -1 if direction == "RIGHT" and x < 0 else 0
    return x >> y if direction == "RIGHT" else x << y


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int32, np.int64])
def test_bitshift(direction, dtype):
    info = np.iinfo(dtype)
    bits = 8 * np.dtype(dtype).itemsize
    xs = [0, 1, 3, info.max, info.max // 3] + ([-1, -5, info.min] if info.min < 0 else [])
    ys = [0, 1, 2, bits - 1, bits, bits + 3] + ([-1, -bits] if info.min < 0 else [])
    x = np.array(xs, dtype).reshape(-1, 1)
    y = np.array(ys, dtype).reshape(1, -1)
    vals = [_shift_ref(int(a), int(b), direction, dtype) for a in xs for b in ys]
    ref = _wrap(vals, dtype).reshape(len(xs), len(ys))
    model = make_node_model("BitShift", {"a": x, "b": y}, {"direction": direction})
    np.testing.assert_array_equal(run_graphc(model, {"a": x, "b": y})["y"], ref)
    # ORT agrees for in-range shifts of unsigned types (the pre-28 spec).
    if info.min == 0:
        yy = np.array([0, 1, 2, bits - 1], dtype).reshape(1, -1)
        check("BitShift", {"a": x, "b": yy}, {"direction": direction})


# ---- PRelu, Clip, Where ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("xs", "ss"), [((2, 3, 4, 5), (3, 1, 1)), ((2, 3, 4), (4,)), ((3, 5), ()), ((7,), (1,))], ids=str
)
@pytest.mark.parametrize("dtype", [F32, F16, F64, np.int32, np.int64], ids=str)
def test_prelu(xs, ss, dtype):
    x = rand(xs, dtype, seed=13, low=-5, high=5)
    s = rand(ss, dtype, seed=14, low=-2, high=3)
    ref = np.where(x.astype(F64) < 0, x.astype(F64) * s.astype(F64), x.astype(F64)).astype(dtype)
    check("PRelu", {"x": x, "s": s}, ref=[ref])


def test_prelu_slope_must_broadcast_to_x():
    with pytest.raises(ShapeError, match="unidirectional"):
        infer("PRelu", TensorType(DType.float32, (3,)), TensorType(DType.float32, (2, 3)))
    with pytest.raises(ShapeError, match="unidirectional"):
        infer("PRelu", TensorType(DType.float32, (3, 1)), TensorType(DType.float32, (3, 4)))


@pytest.mark.parametrize("dtype", [F32, F16, F64, np.int8, np.int32, np.int64, np.uint8], ids=str)
@pytest.mark.parametrize("bounds", ["both", "min", "max", "none", "crossed"])
def test_clip(dtype, bounds):
    x = rand((3, 1, 5), dtype, seed=15, low=0 if np.dtype(dtype).kind == "u" else -9, high=9)
    lo, hi = {"both": (2, 6), "min": (2, None), "max": (None, 6), "none": (None, None), "crossed": (6, 2)}[bounds]
    inits = {}
    order = ["x"]
    for name, v in (("lo", lo), ("hi", hi)):
        if v is not None:
            inits[name] = np.array(v, dtype)
        order.append(name if v is not None else "")
    while order[-1] == "":
        order.pop()
    ref = x.astype(F64)
    if lo is not None:
        ref = np.maximum(ref, lo)
    if hi is not None:
        ref = np.minimum(ref, hi)
    check("Clip", {"x": x}, initializers=inits, input_order=order, ref=[ref.astype(dtype)])


def test_clip_opset6_attributes():
    x = rand((4, 5), F32, seed=16, low=-3, high=3)
    for attrs, ref in (
        ({"min": -1.0, "max": 0.5}, np.clip(x, -1, 0.5)),
        ({"max": 0.5}, np.minimum(x, 0.5)),
        ({}, x),
    ):
        check("Clip", {"x": x}, attrs, opset=6, ref=[ref])
    x16 = x.astype(F16)  # the default bounds +-FLT_MAX become +-inf in float16: no clipping
    check("Clip", {"x": x16}, {"min": -1.0}, opset=6, ref=[np.maximum(x16, F16(-1))])


@pytest.mark.parametrize("shapes", [((2, 3, 4), (4,), (3, 1)), ((), (2, 3), ()), ((5, 1), (1, 6), (5, 6))], ids=str)
@pytest.mark.parametrize("dtype", [F32, F16, np.int64, np.bool_, np.uint8], ids=str)
def test_where(shapes, dtype):
    c = rand(shapes[0], np.bool_, seed=17)
    x = rand(shapes[1], dtype, seed=18)
    y = rand(shapes[2], dtype, seed=19)
    check("Where", {"c": c, "x": x, "z": y}, ref=[np.where(c, x, y)])


def test_where_strings():
    c = np.array([True, False, True])
    x = np.array(["a", "b", "c"], dtype=object)
    y = np.array(["z"], dtype=object)
    check("Where", {"c": c, "x": x, "z": y}, ref=[np.array(["a", "z", "c"], dtype=object)])


# ---- Dropout -----------------------------------------------------------------------------------


def test_dropout_inference_is_identity():
    x = rand((3, 5), F32, seed=20)
    check("Dropout", {"x": x}, outputs=("y", "mask"), ref=[x, np.ones(x.shape, bool)])
    check(
        "Dropout",
        {"x": x},
        initializers={"r": np.array(0.3, F32), "t": np.array(False)},
        outputs=("y", "mask"),
        ref=[x, np.ones(x.shape, bool)],
    )
    # Training mode with ratio 0 is the identity too.
    check(
        "Dropout",
        {"x": x},
        initializers={"r": np.array(0.0, F32), "t": np.array(True)},
        outputs=("y", "mask"),
        ref=[x, np.ones(x.shape, bool)],
    )


def test_dropout_training_mode_fails_clearly():
    x = rand((3, 5), F32, seed=21)
    model = make_node_model("Dropout", {"x": x}, initializers={"r": np.array(0.5, F32), "t": np.array(True)})
    with pytest.raises(InterpretError, match="training_mode is true with ratio 0.5"):
        run_graphc(model, {"x": x})
    # A run-time training_mode input: fails only when it is true.
    t = np.array(True)
    model = make_node_model(
        "Dropout", {"x": x, "t": t}, initializers={"r": np.array(0.1, F32)}, input_order=["x", "r", "t"]
    )
    assert_close(run_graphc(model, {"x": x, "t": np.array(False)})["y"], x)
    with pytest.raises(InterpretError, match="random"):
        run_graphc(model, {"x": x, "t": t})


@pytest.mark.parametrize("opset", [7, 10, 11])
def test_dropout_ratio_attribute(opset):
    x = rand((2, 3), F32, seed=22)
    # Before opset 10 the mask had X's type. ORT gives an all-false mask at opsets 10-11 in
    # inference; the ONNX reference (and ORT from 12) gives all true, i.e. every element kept.
    mask_t = F32 if opset < 10 else np.bool_
    model = old_model("Dropout", {"x": x}, {"ratio": 0.4}, opset, F32, outputs=("y", "mask"))
    model.graph.output[1].type.tensor_type.elem_type = np_to_onnx_dtype(np.dtype(mask_t))
    out = run_graphc(model, {"x": x})
    assert_close(out["y"], x)
    assert_close(out["mask"], np.ones(x.shape, mask_t))
    if opset >= 10:
        assert_close(run_ort(model, {"x": x})["y"], x)


def test_dropout_opset6_is_test():
    x = rand((2, 3), F32, seed=23)
    model = old_model("Dropout", {"x": x}, {"is_test": 1}, 6, F32)
    assert_close(run_graphc(model, {"x": x})["y"], x)
    model = old_model("Dropout", {"x": x}, {"ratio": 0.3}, 6, F32)  # is_test=0: training
    with pytest.raises(InterpretError, match="training"):
        run_graphc(model, {"x": x})


# ---- Cast, CastLike, BitCast -------------------------------------------------------------------

CAST_DTYPES = [F32, F16, F64, BF16, np.int8, np.uint8, np.int32, np.int64, np.uint64, np.bool_]
CAST_SOURCE = np.array([0.0, -0.0, 1.0, -1.0, 2.5, -2.7, 100.25, 0.3, 7.0, 1e-3], F64)


def _values_for(dtype) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return (CAST_SOURCE != 0) & (CAST_SOURCE > -1)
    if dt.kind == "u":
        return np.abs(CAST_SOURCE).astype(dt)
    return CAST_SOURCE.astype(dt)


@pytest.mark.parametrize("src", CAST_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("dst", CAST_DTYPES, ids=lambda d: np.dtype(d).name)
def test_cast_numeric(src, dst):
    x = _values_for(src).reshape(2, 5)
    to = DType.from_numpy(np.dtype(dst)).value
    # Values here are in range for every target, so C's rules equal numpy's via float64.
    x64 = x.astype(F64)
    ref = (x64 != 0) if np.dtype(dst) == np.bool_ else x64.astype(dst)
    if np.dtype(dst).kind in "iu" and np.dtype(src).kind == "f":
        ref = np.trunc(x64).astype(dst)
    elif np.dtype(src) == BF16 or np.dtype(dst) == BF16:
        ref = x.astype(F32).astype(dst) if np.dtype(dst) != np.bool_ else ref
    check("Cast", {"x": x}, {"to": to}, ref=[ref])
    like = np.zeros((1,), dst)
    check("CastLike", {"x": x, "like": like}, ref=[ref])


def test_cast_integer_wraps_and_float_specials():
    x = np.array([200, -56, 256, 65535, -1], np.int32)
    check("Cast", {"x": x}, {"to": TensorProto.INT8}, ref=[np.array([-56, -56, 0, -1, -1], np.int8)])
    check("Cast", {"x": x}, {"to": TensorProto.UINT8}, ref=[np.array([200, 200, 0, 255, 255], np.uint8)])
    f = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30], F32)
    check("Cast", {"x": f}, {"to": TensorProto.BOOL}, ref=[np.array([True, True, True, False, False, True])])
    check("Cast", {"x": f}, {"to": TensorProto.FLOAT16}, ref=[f.astype(F16)])
    big = np.array([1e300, -1e300, 1e-300], F64)
    check("Cast", {"x": big}, {"to": TensorProto.FLOAT}, ref=[np.array([np.inf, -np.inf, 0.0], F32)])


F8 = {
    TensorProto.FLOAT8E4M3FN: ml_dtypes.float8_e4m3fn,
    TensorProto.FLOAT8E4M3FNUZ: ml_dtypes.float8_e4m3fnuz,
    TensorProto.FLOAT8E5M2: ml_dtypes.float8_e5m2,
    TensorProto.FLOAT8E5M2FNUZ: ml_dtypes.float8_e5m2fnuz,
}
F8_INPUT = np.array(
    [0.47892547, 0.0, -0.0, 1e6, -1e6, 1e-7, -1e-7, np.nan, np.inf, -np.inf, 448, 464, 57344, 61440, 3.3], F32
)


@pytest.mark.parametrize("to", sorted(F8), ids=lambda t: TensorProto.DataType.Name(t))
@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("src", [F32, F16])
def test_cast_float8(to, saturate, src):
    with np.errstate(over="ignore"):
        x = F8_INPUT.astype(src)  # 1e6 is inf in float16
    dt = F8[to]
    fmax = float(ml_dtypes.finfo(dt).max)
    # The spec's tables: saturate clamps +-inf and out-of-range values to +-max; otherwise
    # they become NaN (inf for e5m2); everything else rounds to nearest even.
    ref = (np.clip(x.astype(F32), -fmax, fmax) if saturate else x.astype(F32)).astype(dt)
    out = check("Cast", {"x": x}, {"to": to, "saturate": saturate}, ref=[ref])["y"]
    back = out.astype(F32)
    if saturate:
        assert back[8] == fmax and back[9] == -fmax
    elif to == TensorProto.FLOAT8E5M2:
        assert np.isposinf(back[8]) and np.isneginf(back[9])
    else:
        assert np.isnan(back[8]) and np.isnan(back[9])
    # Back to float: exact.
    check("Cast", {"x": out}, {"to": TensorProto.FLOAT}, ref=[back])


@pytest.mark.parametrize(("to", "dt"), [(TensorProto.INT4, ml_dtypes.int4), (TensorProto.UINT4, ml_dtypes.uint4)])
def test_cast_4bit(to, dt):
    x = np.arange(-9, 16).astype(F32).reshape(5, 5)
    # Wrapping to 4 bits, as the ONNX tests (ml_dtypes) do.
    vals = [int(v) for v in x.ravel()]
    lo = -8 if to == TensorProto.INT4 else 0
    ref = np.array([((v - lo) % 16) + lo for v in vals]).astype(dt).reshape(5, 5)
    model = make_node_model("Cast", {"x": x}, {"to": to})
    out = run_graphc(model, {"x": x})["y"]
    assert out.dtype == np.dtype(dt)
    np.testing.assert_array_equal(out.astype(np.int32), ref.astype(np.int32))
    back = run_graphc(make_node_model("Cast", {"x": out}, {"to": TensorProto.FLOAT}), {"x": out})["y"]
    np.testing.assert_array_equal(back, ref.astype(F32))
    f4 = np.array([0.48, 0.25, 1.05, -3.5, -8, 9, 1e6, np.inf, -0.0], F32)
    out = run_graphc(make_node_model("Cast", {"x": f4}, {"to": TensorProto.FLOAT4E2M1}), {"x": f4})["y"]
    np.testing.assert_array_equal(out.astype(F32), f4.astype(ml_dtypes.float4_e2m1fn).astype(F32))


def test_cast_strings():
    f = np.array([0.1, 1e10, np.nan, -np.inf, np.inf, 3.0, 1 / 3, -2.5e-7], F32)
    check("Cast", {"x": f}, {"to": TensorProto.STRING})  # ORT: '%.8g', 'NaN', 'INF', '-INF'
    check("Cast", {"x": f.astype(F64) / 3}, {"to": TensorProto.STRING})
    check("Cast", {"x": np.array([5, -3, 0], np.int64)}, {"to": TensorProto.STRING})
    check("Cast", {"x": np.array([True, False])}, {"to": TensorProto.STRING})
    s = np.array(["1.5", "INF", "-inf", "NaN", "1e-5", "+INF", "-0.25"], dtype=object)
    check("Cast", {"x": s}, {"to": TensorProto.FLOAT})
    check("Cast", {"x": s}, {"to": TensorProto.DOUBLE})
    i = np.array(["15", "-3", "9007199254740993", "100.5"], dtype=object)
    check("Cast", {"x": i}, {"to": TensorProto.INT64}, ref=[np.array([15, -3, 9007199254740993, 100])])
    with pytest.raises(InterpretError, match="string"):
        bad = np.array(["hello"], dtype=object)
        run_graphc(make_node_model("Cast", {"x": bad}, {"to": TensorProto.FLOAT}), {"x": bad})


@pytest.mark.parametrize("opset", [6, 9, 13, 19])
def test_cast_older_opsets(opset):
    x = rand((3, 4), F32, seed=24)
    check("Cast", {"x": x}, {"to": TensorProto.INT32}, opset=opset, ref=[np.trunc(x).astype(np.int32)])


def test_cast_opset1_string_target():
    x = rand((2, 3), F64, seed=25)
    model = old_model("Cast", {"x": x}, {"to": "FLOAT"}, 1, F32)
    assert_close(run_graphc(model, {"x": x})["y"], x.astype(F32))


def test_cast_to_float8e8m0_powers_of_two():
    x = np.array([0.25, 1.0, 4.0, 64.0], F32)
    out = run_graphc(make_node_model("Cast", {"x": x}, {"to": TensorProto.FLOAT8E8M0}), {"x": x})["y"]
    assert out.dtype == ml_dtypes.float8_e8m0fnu
    np.testing.assert_array_equal(out.astype(F32), x)


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        (F32, np.int32),
        (np.int32, F32),
        (F64, np.uint64),
        (F16, np.int16),
        (BF16, np.uint16),
        (np.int8, np.uint8),
        (np.bool_, np.uint8),
        (ml_dtypes.float8_e4m3fn, np.int8),
    ],
    ids=str,
)
def test_bitcast(src, dst):
    x = rand((2, 3), F32, seed=26).astype(src) if np.dtype(src) != np.bool_ else rand((2, 3), np.bool_)
    to = DType.from_numpy(np.dtype(dst)).value
    check("BitCast", {"x": x}, {"to": to}, ref=[x.view(dst)])
    s = np.asarray(x[0, 0])  # rank 0
    check("BitCast", {"x": s}, {"to": to}, ref=[s.reshape(1).view(dst).reshape(())])


def test_bitcast_4bit_and_width_check():
    x = np.arange(-8, 8).astype(ml_dtypes.int4)
    pattern = np.arange(-8, 8) & 0xF
    out = run_graphc(make_node_model("BitCast", {"x": x}, {"to": TensorProto.UINT4}), {"x": x})["y"]
    np.testing.assert_array_equal(out.astype(np.int32), pattern)
    back = run_graphc(make_node_model("BitCast", {"x": out}, {"to": TensorProto.INT4}), {"x": out})["y"]
    np.testing.assert_array_equal(back.astype(np.int32), np.arange(-8, 8))
    f4 = run_graphc(make_node_model("BitCast", {"x": out}, {"to": TensorProto.FLOAT4E2M1}), {"x": out})["y"]
    np.testing.assert_array_equal(
        f4.astype(F32), np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn)[pattern].astype(F32)
    )
    with pytest.raises(ShapeError, match="width"):
        infer("BitCast", TensorType(DType.float32, (2,)), attrs={"to": TensorProto.INT64})


def test_cast_to_function_direct():
    # The public helper other families use: saturating float8 and strings.
    y = cast_to(np.array([1e6, -1e6], F32), DType.float8e4m3fn)
    np.testing.assert_array_equal(y.astype(F32), [448, -448])
    y = cast_to(np.array([1e6], F32), DType.float8e4m3fn, saturate=False)
    assert np.isnan(y.astype(F32)[0])
    y = cast_to(np.array([b"1.5", b" -2 "], dtype=object), DType.float32)  # bytes, padded
    np.testing.assert_array_equal(y, np.array([1.5, -2], F32))
    y = cast_to(np.array([[b"7", b"-8"]], dtype=object), DType.int4)
    np.testing.assert_array_equal(y.astype(np.int8), [[7, -8]])


# ---- type checks, shape inference, converters --------------------------------------------------


def test_type_checks_name_the_node():
    with pytest.raises(ShapeError, match="Sqrt node .* dtype int32"):
        graphc.load_onnx(make_node_model("Sqrt", {"x": np.zeros(3, np.int32)}))
    with pytest.raises(ShapeError, match="differ"):
        infer("Add", TensorType(DType.float32, (2,)), TensorType(DType.float16, (2,)))
    with pytest.raises(ShapeError, match="do not broadcast"):
        infer("Mul", TensorType(DType.float32, (2, 3)), TensorType(DType.float32, (4,)))
    with pytest.raises(ShapeError, match="bool"):
        infer("And", TensorType(DType.int32, (2,)), TensorType(DType.int32, (2,)))
    with pytest.raises(ShapeError, match="scalar"):
        infer("Clip", TensorType(DType.float32, (2,)), TensorType(DType.float32, (2,)))


def test_inference_symbolic_and_unknown_shapes():
    f32 = DType.float32
    (t,) = infer("Add", TensorType(f32, ("batch", 1, 5)), TensorType(f32, (3, 1)))
    assert t == TensorType(f32, ("batch", 3, 5))
    (t,) = infer("Less", TensorType(f32, None), TensorType(f32, (3,)))
    assert t == TensorType(DType.bool, None)
    (t,) = infer("Where", TensorType(DType.bool, (4, 1)), TensorType(DType.int64, ("n",)), TensorType(DType.int64, ()))
    assert t == TensorType(DType.int64, (4, "n"))
    (t,) = infer("Sum", TensorType(f32, (2, 1)), TensorType(f32, (3,)), TensorType(f32, (1, 1)))
    assert t == TensorType(f32, (2, 3))
    y, m = infer("Dropout", TensorType(DType.float16, ("s", 4)), num_outputs=2)
    assert y == TensorType(DType.float16, ("s", 4)) and m == TensorType(DType.bool, ("s", 4))


def test_legacy_broadcast_with_axis():
    a = rand((2, 3, 4, 5), F32, seed=27)
    b = rand((3, 4), F32, seed=28)
    for op, fn in (("Add", np.add), ("Mul", np.multiply), ("Sub", np.subtract), ("Div", np.divide)):
        model = old_model(op, {"a": a, "b": b}, {"broadcast": 1, "axis": 1}, 6, F32)
        out = run_graphc(model, {"a": a, "b": b})["y"]
        assert_close(out, fn(a, b[:, :, None]).astype(F32))
    # Without an axis: suffix matching, i.e. numpy's rule.
    c = rand((5,), F32, seed=29)
    model = old_model("Add", {"a": a, "b": c}, {"broadcast": 1}, 1, F32)
    assert_close(run_graphc(model, {"a": a, "b": c})["y"], a + c)
    bb = rand((4,), np.bool_, seed=1)
    ab = rand((2, 4, 3), np.bool_, seed=2)
    model = old_model("And", {"a": ab, "b": bb}, {"broadcast": 1, "axis": 1}, 1, np.bool_)
    np.testing.assert_array_equal(run_graphc(model, {"a": ab, "b": bb})["y"], ab & bb[:, None])


def test_opset1_defaults_and_consumed_inputs():
    x = rand((3, 4), F32, seed=30, low=-3, high=3)
    # Selu-1's defaults (alpha 1.6732, gamma 1.0507) differ from Selu-6's.
    model = old_model("Selu", {"x": x}, {"consumed_inputs": [0]}, 1, F32)
    g = graphc.load_onnx(model)
    (node,) = g.nodes
    assert node.attrs.alpha == pytest.approx(1.6732, abs=1e-6)
    assert node.attrs.gamma == pytest.approx(1.0507, abs=1e-6)
    x64 = x.astype(F64)
    ref = 1.0507 * np.where(x64 > 0, x64, 1.6732 * np.expm1(x64))
    assert_close(graphc.interpret(g, {"x": x})["y"], ref.astype(F32), rtol=1e-6)
    model = old_model("Relu", {"x": x}, {"consumed_inputs": [0]}, 1, F32)
    assert_close(run_graphc(model, {"x": x})["y"], np.maximum(x, 0))


@pytest.mark.parametrize(
    ("op", "opset"),
    [("Relu", 6), ("Sigmoid", 6), ("Add", 7), ("Pow", 7), ("Max", 8), ("Equal", 11), ("Erf", 9)],
)
def test_older_opsets_passthrough(op, opset):
    x = rand((2, 3), F32, seed=31, low=0.5, high=2)
    ins = {"a": x} if get_op(op).op_type in ("Relu", "Sigmoid", "Erf") else {"a": x, "b": x[0]}
    check(op, ins, opset=opset)


def test_errors_are_graphc_errors():
    x = np.zeros((2,), F32)
    with pytest.raises(GraphcError):
        graphc.load_onnx(make_node_model("Gelu", {"x": x}, {"approximate": "erf"}))


@pytest.mark.parametrize("round_mode", ["up", "down", "nearest"])
@pytest.mark.parametrize("saturate", [True, False])
def test_cast_to_float8e8m0_rounding_matches_onnx(round_mode, saturate):
    """Every rounding case: exact powers of two, ties (1.5 * 2^e), just above and below them,
    subnormals, zero, negatives, the largest float32s (saturation), inf and NaN; the oracle is
    onnx.numpy_helper's conversion (the ONNX tests' own)."""
    from onnx.numpy_helper import to_float8e8m0

    e = np.arange(-149, 128, dtype=np.float64)
    base = np.exp2(e).astype(F32)
    x = np.concatenate(
        [
            base,
            base * F32(1.5),
            np.nextafter(base * F32(1.5), F32(np.inf)),
            np.nextafter(base * F32(1.5), F32(0)),
            np.nextafter(base, F32(np.inf)),
            -base * F32(1.25),
            np.random.default_rng(0).standard_normal(200).astype(F32) * F32(1e3),
            np.array([0.0, -0.0, np.finfo(F32).max, -np.finfo(F32).max, np.inf, -np.inf, np.nan], F32),
        ]
    )
    got = cast_to(x, DType.float8e8m0, saturate=saturate, round_mode=round_mode)
    want = to_float8e8m0(x, saturate, round_mode)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    # float16 input goes through float32 exactly
    h = x[np.abs(x) < 6e4].astype(np.float16)
    np.testing.assert_array_equal(
        cast_to(h, DType.float8e8m0, saturate, round_mode).view(np.uint8),
        to_float8e8m0(h.astype(F32), saturate, round_mode).view(np.uint8),
    )
