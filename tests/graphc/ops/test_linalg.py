"""Linalg ops (Gemm, MatMul, Einsum, MatMulInteger, Det) against ONNX Runtime, and against numpy
formulas where ORT has no kernel (integer Gemm, some Einsum/Det dtypes)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from graphc.errors import ShapeError
from graphc.ir.builder import GraphBuilder
from graphc.ir.types import DType, TensorType
from helpers import assert_close, check_against_ort, make_node_model, np_to_onnx_dtype, rand, run_graphc, run_ort

F16, F32, F64 = np.float16, np.float32, np.float64
M, K, N = 3, 5, 4

# ---- Gemm --------------------------------------------------------------------------------------

C_SHAPES = [None, (), (1,), (N,), (1, N), (M, 1), (1, 1), (M, N)]


def _gemm_feeds(trans_a, trans_b, c_shape, dtype, seed=0):
    feeds = {
        "a": rand((K, M) if trans_a else (M, K), dtype, seed=seed),
        "b": rand((N, K) if trans_b else (K, N), dtype, seed=seed + 1),
    }
    if c_shape is not None:
        feeds["c"] = rand(c_shape, dtype, seed=seed + 2)
    return feeds


@pytest.mark.parametrize("c_shape", C_SHAPES)
@pytest.mark.parametrize("alpha, beta", [(1.0, 1.0), (0.5, 1.0), (1.0, 0.0), (-1.5, 2.25)])
@pytest.mark.parametrize("trans_a, trans_b", list(itertools.product([0, 1], [0, 1])))
def test_gemm_vs_ort(trans_a, trans_b, alpha, beta, c_shape):
    feeds = _gemm_feeds(trans_a, trans_b, c_shape, F32)
    check_against_ort("Gemm", feeds, {"transA": trans_a, "transB": trans_b, "alpha": alpha, "beta": beta})


@pytest.mark.parametrize("c_shape", [None, (N,), (M, N)])
@pytest.mark.parametrize("dtype", [F16, F64])
@pytest.mark.parametrize("trans_a, trans_b", [(0, 0), (1, 1)])
def test_gemm_dtypes_vs_ort(trans_a, trans_b, dtype, c_shape):
    feeds = _gemm_feeds(trans_a, trans_b, c_shape, dtype)
    check_against_ort("Gemm", feeds, {"transA": trans_a, "transB": trans_b, "alpha": 0.75, "beta": 1.5})


def test_gemm_default_beta_keeps_c():
    """beta defaults to 1.0: C is added even when the node gives no beta."""
    feeds = _gemm_feeds(0, 0, (M, N), F32)
    got = check_against_ort("Gemm", feeds)["y"]
    assert_close(got, (feeds["a"].astype(F64) @ feeds["b"] + feeds["c"]).astype(F32))


def test_gemm_beta_zero_ignores_nonfinite_c():
    feeds = _gemm_feeds(0, 0, (M, N), F32)
    feeds["c"][:] = np.nan
    got = check_against_ort("Gemm", feeds, {"beta": 0.0})["y"]
    assert np.isfinite(got).all()


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint32, np.uint64])
@pytest.mark.parametrize("alpha, beta", [(1.0, 1.0), (2.0, 3.0), (0.5, 1.0)])
def test_gemm_integers_vs_formula(dtype, alpha, beta):
    feeds = {
        k: rand(v.shape, dtype, seed=i, low=0, high=9) for i, (k, v) in enumerate(_gemm_feeds(1, 0, (N,), F32).items())
    }
    got = run_graphc(make_node_model("Gemm", feeds, {"transA": 1, "alpha": alpha, "beta": beta}), feeds)["y"]
    want = np.trunc(alpha * (feeds["a"].T.astype(F64) @ feeds["b"]) + beta * feeds["c"]).astype(dtype)
    assert_close(got, want)


def test_gemm_bfloat16_vs_formula():
    import ml_dtypes

    feeds = {k: v.astype(ml_dtypes.bfloat16) for k, v in _gemm_feeds(0, 1, (N,), F32).items()}
    got = run_graphc(make_node_model("Gemm", feeds, {"transB": 1, "alpha": 2.0}), feeds)["y"]
    f = {k: v.astype(F64) for k, v in feeds.items()}
    want = 2.0 * f["a"] @ f["b"].T + f["c"]
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(got.astype(F64), want, rtol=1e-2, atol=2e-2)


@pytest.mark.parametrize("opset", [6, 7, 9, 11])
def test_gemm_older_opsets(opset):
    feeds = _gemm_feeds(1, 0, (N,), F32)
    attrs = {"transA": 1, "alpha": 0.5, "beta": 2.0}
    if opset <= 6:
        attrs["broadcast"] = 1
        want = (0.5 * feeds["a"].T.astype(F64) @ feeds["b"] + 2.0 * feeds["c"]).astype(F32)
        assert_close(run_graphc(make_node_model("Gemm", feeds, attrs, opset=opset), feeds)["y"], want)
    else:
        check_against_ort("Gemm", feeds, attrs, opset=opset)


# ---- MatMul ------------------------------------------------------------------------------------

MATMUL_SHAPES = [
    ((3, 5), (5, 4)),
    ((5,), (5,)),  # 1-D . 1-D -> scalar
    ((5,), (5, 4)),
    ((3, 5), (5,)),
    ((5,), (2, 5, 3)),
    ((2, 3, 1, 5), (5,)),
    ((2, 3, 5), (2, 5, 4)),
    ((2, 1, 3, 5), (4, 5, 6)),  # batch broadcast
    ((3, 5), (2, 5, 4)),
    ((1, 1, 1), (1, 1, 7)),
    ((2, 1, 4, 5), (1, 3, 5, 2)),
]


@pytest.mark.parametrize("sa, sb", MATMUL_SHAPES)
@pytest.mark.parametrize("dtype", [F32, F16, F64, np.int32, np.int64, np.uint32, np.uint64])
def test_matmul_vs_ort(sa, sb, dtype):
    low = 0 if np.dtype(dtype).kind == "u" else -5
    check_against_ort("MatMul", {"a": rand(sa, dtype, low=low, high=5), "b": rand(sb, dtype, seed=1, low=low, high=5)})


def test_matmul_float16_accumulates_in_float32():
    """A long fp16 dot product: summing in fp16 would lose the small terms."""
    a = np.full((1, 4096), 1.0, F16)
    a[0, 0] = 2048.0
    b = np.ones((4096, 1), F16)
    got = run_graphc(make_node_model("MatMul", {"a": a, "b": b}), {"a": a, "b": b})["y"]
    assert got[0, 0] == F16(2048 + 4095)


def test_matmul_int32_wraps():
    a = np.array([[2**30, 2**30]], np.int32)
    b = np.array([[2], [1]], np.int32)
    got = run_graphc(make_node_model("MatMul", {"a": a, "b": b}), {"a": a, "b": b})["y"]
    assert got.dtype == np.int32 and got[0, 0] == np.int32(-(2**30))


@pytest.mark.parametrize("opset", [1, 9, 13])
def test_matmul_older_opsets(opset):
    check_against_ort("MatMul", {"a": rand((2, 3, 5)), "b": rand((5, 4), seed=1)}, opset=opset)


# ---- MatMulInteger -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sa, sb, az, bz",
    [
        ((3, 5), (5, 4), None, None),
        ((3, 5), (5, 4), (), ()),
        ((3, 5), (5, 4), (3,), (4,)),  # per-row and per-column zero points
        ((2, 3, 5), (5, 4), (), (4,)),
        ((5,), (5, 4), (), None),
    ],
)
@pytest.mark.parametrize("ta, tb", [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)])
def test_matmul_integer_vs_ort(sa, sb, az, bz, ta, tb):
    lo_a, lo_b = (0 if np.dtype(t).kind == "u" else -128 for t in (ta, tb))
    feeds = {"a": rand(sa, ta, low=lo_a, high=127), "b": rand(sb, tb, seed=1, low=lo_b, high=127)}
    order = ["a", "b"]
    if az is not None:
        feeds["az"] = rand(az, ta, seed=2, low=lo_a, high=20)
        order.append("az")
    if bz is not None:
        if az is None:
            order.append("")
        feeds["bz"] = rand(bz, tb, seed=3, low=lo_b, high=20)
        order.append("bz")
    model = make_node_model("MatMulInteger", feeds, input_order=order)
    got = run_graphc(model, feeds)["y"]
    if az == (3,):  # ORT takes only a scalar a_zero_point: check per-row ones against the formula
        a = feeds["a"].astype(np.int64) - feeds["az"].astype(np.int64).reshape(-1, 1)
        b = feeds["b"].astype(np.int64) - feeds["bz"].astype(np.int64)
        assert_close(got, (a @ b).astype(np.int32))
    else:
        assert_close(got, run_ort(model, feeds)["y"])


# ---- Einsum ------------------------------------------------------------------------------------

EINSUM_CASES = [
    ("ij,jk->ik", [(3, 5), (5, 4)]),
    ("bij,bjk->bik", [(2, 3, 5), (2, 5, 4)]),
    ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)]),
    ("ij->ji", [(3, 5)]),
    ("ii->i", [(4, 4)]),
    ("ii", [(4, 4)]),  # implicit output: the trace
    ("ij->", [(3, 5)]),
    ("i,i", [(5,), (5,)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ij,jk", [(3, 5), (5, 4)]),  # implicit: ik
    ("ba,ac", [(3, 5), (5, 4)]),  # implicit output is sorted: bc
    ("...ij,...jk->...ik", [(2, 1, 3, 5), (1, 4, 5, 2)]),  # ellipsis broadcast
    ("...ii->...i", [(2, 3, 3)]),
    ("i...->...", [(3, 2, 4)]),
    ("ij, jk -> ik", [(3, 5), (5, 4)]),  # spaces
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("", [()]),
]


def _einsum_model(feeds, equation):
    """An Einsum model whose output is typed (ONNX's shape inference gives up on some equations,
    and then ORT refuses the model)."""
    model = make_node_model("Einsum", feeds, {"equation": equation})
    want = np.einsum(equation.replace(" ", ""), *(np.zeros(v.shape, v.dtype) for v in feeds.values()))
    out = model.graph.output[0].type.tensor_type
    out.elem_type = np_to_onnx_dtype(next(iter(feeds.values())).dtype)
    out.shape.Clear()
    for d in np.shape(want):
        out.shape.dim.add().dim_value = d
    return model


@pytest.mark.parametrize("equation, shapes", EINSUM_CASES)
@pytest.mark.parametrize("dtype", [F32, F64])
def test_einsum_vs_ort(equation, shapes, dtype):
    feeds = {f"x{i}": rand(s, dtype, seed=i) for i, s in enumerate(shapes)}
    model = _einsum_model(feeds, equation)
    assert_close(run_graphc(model, feeds)["y"], run_ort(model, feeds)["y"])


@pytest.mark.parametrize("equation, shapes", EINSUM_CASES[:4])
@pytest.mark.parametrize("dtype", [F16, np.int32, np.int64])
def test_einsum_dtypes_vs_ort(equation, shapes, dtype):
    feeds = {f"x{i}": rand(s, dtype, seed=i, low=-5, high=5) for i, s in enumerate(shapes)}
    tol = {"rtol": 4e-3, "atol": 4e-3} if dtype == F16 else {}
    check_against_ort("Einsum", feeds, {"equation": equation}, **tol)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint16, np.uint32, np.uint64])
def test_einsum_small_ints_vs_numpy(dtype):
    feeds = {"x0": rand((3, 4), dtype, low=0, high=5), "x1": rand((4, 2), dtype, seed=1, low=0, high=5)}
    got = run_graphc(make_node_model("Einsum", feeds, {"equation": "ij,jk->ik"}), feeds)["y"]
    assert_close(got, np.einsum("ij,jk->ik", feeds["x0"], feeds["x1"]).astype(dtype))


def test_einsum_ellipsis_of_different_ranks_vs_numpy():
    """ONNX's shape inference wants equal ellipsis ranks; graphc broadcasts them as numpy does."""
    feeds = {"x0": rand((2, 1, 3, 5)), "x1": rand((4, 5, 2), seed=1)}
    model = _einsum_model(feeds, "...ij,...jk->...ik")
    want = np.einsum("...ij,...jk->...ik", feeds["x0"].astype(F64), feeds["x1"]).astype(F32)
    assert_close(run_graphc(model, feeds)["y"], want)


def test_einsum_uppercase_labels():
    feeds = {"x0": rand((3, 5)), "x1": rand((5, 4), seed=1)}
    got = run_graphc(make_node_model("Einsum", feeds, {"equation": "Ab,bC->CA"}), feeds)["y"]
    assert_close(got, np.einsum("Ab,bC->CA", feeds["x0"].astype(F64), feeds["x1"]).astype(F32))


# ---- Det ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(3, 3), (1, 1), (2, 4, 4), (2, 1, 5, 5)])
@pytest.mark.parametrize("dtype", [F32, F16])
def test_det_vs_ort(shape, dtype):
    check_against_ort("Det", {"x": rand(shape, dtype, low=-1, high=1)}, rtol=1e-4 if dtype == F32 else None)


def test_det_float64_and_singular():
    x = rand((2, 4, 4), F64)
    x[1, 3] = x[1, 0] * 2  # singular
    got = run_graphc(make_node_model("Det", {"x": x}), {"x": x})["y"]
    assert_close(got, np.linalg.det(x), atol=1e-12)
    assert abs(got[1]) < 1e-12


# ---- inference ---------------------------------------------------------------------------------


def _infer(op, types, attrs=None):
    b = GraphBuilder()
    ins = [None if t is None else b.add_input(f"in{i}", t) for i, t in enumerate(types)]
    return b.add_node(op, ins, attrs or {}).outputs[0].type


F = DType.float32


@pytest.mark.parametrize(
    "sa, sb, out",
    [
        (("B", "S", 768), (768, 3072), ("B", "S", 3072)),
        (("B", 12, "S", 64), ("B", 12, 64, "S"), ("B", 12, "S", "S")),
        ((768,), ("B", 768, 4), ("B", 4)),
        ((1, "S", 8), (3, 8, 2), (3, "S", 2)),
        (None, (8, 2), None),
    ],
)
def test_matmul_infer_symbolic(sa, sb, out):
    assert _infer("MatMul", [TensorType(F, sa), TensorType(F, sb)]) == TensorType(F, out)


def test_gemm_and_einsum_infer_symbolic():
    t = _infer("Gemm", [TensorType(F, ("B", 768)), TensorType(F, (1000, 768)), TensorType(F, (1000,))], {"transB": 1})
    assert t == TensorType(F, ("B", 1000))
    t = _infer("Einsum", [TensorType(F, ("B", 3, 5)), TensorType(F, (5, "N"))], {"equation": "...ij,jk"})
    assert t == TensorType(F, ("B", 3, "N"))
    assert _infer("Det", [TensorType(F, ("B", 3, 3))]) == TensorType(F, ("B",))


@pytest.mark.parametrize(
    "op, types, attrs, match",
    [
        ("MatMul", [(3, 5), (4, 2)], {}, "inner dims"),
        ("MatMul", [(2, 3, 5), (3, 5, 2)], {}, "broadcast"),
        ("MatMul", [(), (3,)], {}, "scalar"),
        ("Gemm", [(3, 5), (5, 4), (2, 4)], {}, "broadcast"),
        ("Gemm", [(3, 5), (4, 5)], {}, "inner dims"),
        ("Gemm", [(3, 5, 1), (5, 4)], {}, "matrix"),
        ("Einsum", [(3, 5), (4, 2)], {"equation": "ij,jk->ik"}, "label 'j'"),
        ("Einsum", [(3, 5)], {"equation": "ij,jk->ik"}, "input terms"),
        ("Einsum", [(3, 5)], {"equation": "ijk->i"}, "rank"),
        ("Det", [(3, 4)], {}, "square"),
    ],
)
def test_infer_errors_name_the_node(op, types, attrs, match):
    with pytest.raises(ShapeError, match=match) as e:
        _infer(op, [TensorType(F, s) for s in types], attrs)
    assert op in str(e.value)
