"""Data movement ops against ONNX Runtime, and against numpy formulas where ORT has no kernel
or is not the spec (noted per test)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from graphc.errors import ShapeError, UnsupportedOpError
from graphc.ir.builder import GraphBuilder
from graphc.ir.types import DType, TensorType
from helpers import assert_close, make_node_model, np_to_onnx_dtype, rand, run_graphc, run_ort

DTYPES = [np.float32, np.float16, np.int64, np.bool_]
I64 = np.int64
INT_MAX = np.iinfo(np.int64).max
INT_MIN = np.iinfo(np.int64).min


def i64(*v):
    return np.array(v, dtype=I64)


def _model(op, inputs, attrs, consts, order, opset, outputs, out_type):
    model = make_node_model(op, inputs, attrs, initializers=consts, input_order=order, opset=opset, outputs=outputs)
    if out_type is not None:  # old opsets that ONNX shape inference leaves untyped
        dtype, shape = out_type
        for vi in model.graph.output:
            vi.CopyFrom(helper.make_tensor_value_info(vi.name, np_to_onnx_dtype(dtype), shape))
    return model


def check(op, inputs, attrs=None, *, consts=None, order=None, opset=None, outputs=("y",), out_type=None, atol=None):
    """Compare graphc with ORT on a one-node model; `consts` are initializers (constant inputs),
    `order` the node's input order ("" = omitted)."""
    inputs = {k: np.asarray(v) for k, v in inputs.items()}
    model = _model(op, inputs, attrs, consts, order, opset, outputs, out_type)
    expected = run_ort(model, inputs)
    actual = run_graphc(model, inputs)
    for k in outputs:
        assert_close(actual[k], expected[k], what=f"{op} output {k}", atol=atol)
    return actual


def graphc_only(op, inputs, attrs=None, *, consts=None, order=None, opset=None, outputs=("y",), out_type=None):
    inputs = {k: np.asarray(v) for k, v in inputs.items()}
    model = _model(op, inputs, attrs, consts, order, opset, outputs, out_type)
    out = run_graphc(model, inputs)
    return [out[o] for o in outputs]


def infer(op, types, attrs=None, consts=None, outputs=1):
    """Output types of one node built over inputs of the given types (None = omitted) and
    constants (values known at build time)."""
    b = GraphBuilder("t")
    vals = []
    for i, t in enumerate(types):
        if t is None:
            vals.append(None)
        elif isinstance(t, np.ndarray):
            vals.append(b.add_constant(t, f"c{i}"))
        else:
            vals.append(b.add_input(f"x{i}", t))
    return [v.type for v in b.add_node(op, vals, attrs or {}, outputs=outputs).outputs]


def T(shape, dtype=DType.float32):
    return TensorType(dtype, None if shape is None else tuple(shape))


# ---- Transpose, Tile, Concat -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "perm"),
    [((), None), ((5,), None), ((2, 3), None), ((2, 1, 3), [1, 2, 0]), ((3, 1, 4, 2), [2, 0, 3, 1])],
)
@pytest.mark.parametrize("dtype", DTYPES)
def test_transpose(shape, perm, dtype):
    check("Transpose", {"x": rand(shape, dtype)}, {} if perm is None else {"perm": perm})


def test_transpose_bad_perm():
    with pytest.raises(ShapeError, match="permutation"):
        infer("Transpose", [T((2, 3))], {"perm": (0, 0)})
    assert infer("Transpose", [T(None)], {"perm": (1, 0, 2)}) == [T((None, None, None))]
    assert infer("Transpose", [T(("b", 3, 5))]) == [T((5, 3, "b"))]


@pytest.mark.parametrize(("shape", "reps"), [((3,), [2]), ((2, 3), [1, 3]), ((2, 1, 3), [2, 3, 1]), ((2, 3), [0, 2])])
@pytest.mark.parametrize("dtype", DTYPES)
def test_tile(shape, reps, dtype):
    check("Tile", {"x": rand(shape, dtype)}, consts={"r": i64(*reps)})


def test_tile_inference():
    assert infer("Tile", [T(("b", 3)), i64(1, 2)]) == [T(("b", 6))]
    assert infer("Tile", [T(("b", 3)), T((2,), DType.int64)]) == [T((None, None))]
    with pytest.raises(ShapeError, match="one entry per axis"):
        infer("Tile", [T((2, 3)), i64(2)])


@pytest.mark.parametrize(
    ("shapes", "axis"),
    [
        ([(3,), (4,)], 0),
        ([(2, 3), (2, 1), (2, 5)], 1),
        ([(2, 3), (2, 1), (2, 5)], -1),
        ([(2, 3, 4), (1, 3, 4)], -3),
        ([(2, 0, 3), (2, 2, 3)], 1),
        ([(3, 2)], 0),
    ],
)
@pytest.mark.parametrize("dtype", DTYPES)
def test_concat(shapes, axis, dtype):
    ins = {f"x{i}": rand(s, dtype, seed=i) for i, s in enumerate(shapes)}
    check("Concat", ins, {"axis": axis})


def test_concat_opset1_default_axis():
    ins = {"a": rand((2, 3)), "b": rand((2, 2), seed=1)}
    (y,) = graphc_only("Concat", ins, opset=3, out_type=(np.float32, (2, 5)))
    assert_close(y, np.concatenate([ins["a"], ins["b"]], axis=1))


def test_concat_inference():
    assert infer("Concat", [T(("b", 3)), T(("b", 4))], {"axis": 1}) == [T(("b", 7))]
    assert infer("Concat", [T(("b", 3)), T((2, 3))], {"axis": 0}) == [T((None, 3))]
    assert infer("Concat", [T((2, "n")), T((3, "n"))], {"axis": 0}) == [T((5, "n"))]
    assert infer("Concat", [T(("b", "n")), T(("b", 0))], {"axis": 1}) == [T(("b", "n"))]
    assert infer("Concat", [T(("b", 3)), T(None)], {"axis": 1}) == [T(("b", None))]
    with pytest.raises(ShapeError, match="differ"):
        infer("Concat", [T((2, 3)), T((3, 4))], {"axis": 0})
    with pytest.raises(ShapeError, match="dtypes"):
        infer("Concat", [T((2,)), T((2,), DType.int64)], {"axis": 0})


# ---- Split -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "axis", "split"),
    [((7,), 0, [2, 5]), ((2, 9), 1, [3, 0, 6]), ((4, 5, 3), -2, [1, 1, 3]), ((6, 2), -2, None)],
)
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
def test_split_input(shape, axis, split, dtype):
    n = 3 if split is None else len(split)
    outputs = [f"y{i}" for i in range(n)]
    consts = None if split is None else {"split": i64(*split)}
    opset = 13 if split is None else None  # opset 18 needs split or num_outputs
    check("Split", {"x": rand(shape, dtype)}, {"axis": axis}, consts=consts, outputs=outputs, opset=opset)


@pytest.mark.parametrize(("dim", "n"), [(7, 4), (6, 3), (5, 2), (1, 1)])
def test_split_num_outputs(dim, n):
    outputs = [f"y{i}" for i in range(n)]
    check("Split", {"x": rand((2, dim))}, {"axis": 1, "num_outputs": n}, outputs=outputs)


@pytest.mark.parametrize("split", [[2, 3], None])
def test_split_opset11_attr(split):
    attrs = {"axis": -1} if split is None else {"axis": -1, "split": split}
    check("Split", {"x": rand((3, 4 if split is None else 5))}, attrs, outputs=["a", "b"], opset=11)


def test_split_inference():
    (a, b) = infer("Split", [T(("b", 6))], {"axis": 1}, outputs=2)
    assert a == b == T(("b", 3))
    assert infer("Split", [T(("b", 6)), T((2,), DType.int64)], outputs=2) == [T((None, 6))] * 2
    with pytest.raises(ShapeError, match="equal parts"):
        infer("Split", [T((7,))], outputs=2)
    with pytest.raises(ShapeError, match="sum"):
        infer("Split", [T((7,)), i64(3, 3)], outputs=2)


# ---- Slice -------------------------------------------------------------------------------------

SLICES = [
    # starts, ends, axes, steps
    ([1], [3], [0], None),
    ([0, 1], [-1, 1000], None, None),
    ([-2], [INT_MAX], [1], [1]),
    ([10], [20], [0], None),  # start out of bounds
    ([-100], [2], [-1], None),
    ([INT_MAX], [INT_MIN], [1], [-1]),  # whole axis backwards
    ([-1, 4], [INT_MIN, 0], [0, 2], [-2, -3]),
    ([3], [0], [2], [-1]),
    ([3], [1], [2], [1]),  # empty
    ([0, 0, 0], [2, 3, 5], [2, 1, 0], [2, 2, 3]),
    ([20], [-20], [1], [-1]),
    ([1], [2], [-3], [5]),
]


@pytest.mark.parametrize(("starts", "ends", "axes", "steps"), SLICES)
@pytest.mark.parametrize("index_dtype", [np.int64, np.int32])
def test_slice(starts, ends, axes, steps, index_dtype):
    consts = {"starts": np.array(starts), "ends": np.array(ends)}
    for k in consts:
        consts[k] = consts[k].clip(np.iinfo(index_dtype).min, np.iinfo(index_dtype).max)
        consts[k] = consts[k].astype(index_dtype)
    order = ["x", "starts", "ends"]
    if axes is not None:
        consts["axes"] = np.array(axes, dtype=index_dtype)
        order.append("axes")
    if steps is not None:
        if axes is None:
            order.append("")
        consts["steps"] = np.array(steps, dtype=index_dtype)
        order.append("steps")
    check("Slice", {"x": rand((5, 4, 6))}, consts=consts, order=order)


@pytest.mark.parametrize("dtype", DTYPES)
def test_slice_dtypes(dtype):
    check(
        "Slice", {"x": rand((4, 7), dtype)}, consts={"s": i64(1, -1), "e": i64(3, 0), "a": i64(0, 1), "st": i64(1, -2)}
    )


def test_slice_opset9_attrs():
    x = rand((5, 6))
    check("Slice", {"x": x}, {"starts": [1, -3], "ends": [4, 1000], "axes": [0, 1]}, opset=9)
    check("Slice", {"x": x}, {"starts": [1], "ends": [-1]}, opset=9)


def test_slice_dynamic_bounds():
    # Bounds computed at run time: shapes unknown at build time, values still exact.
    x = rand((5, 6))
    ins = {"x": x, "s": i64(1, 2), "e": i64(4, -1)}
    check("Slice", ins)
    assert infer("Slice", [T((5, 6)), T((2,), DType.int64), T((2,), DType.int64)]) == [T((None, None))]
    assert infer("Slice", [T((5, 6)), T((1,), DType.int64), T((1,), DType.int64), i64(1)]) == [T((5, None))]


def test_slice_symbolic():
    t = T(("b", "s", 8))
    assert infer("Slice", [t, i64(0), i64(INT_MAX), i64(1)]) == [T(("b", "s", 8))]
    assert infer("Slice", [t, i64(-1), i64(INT_MIN), i64(0), i64(-1)]) == [t]
    assert infer("Slice", [t, i64(1, 2), i64(3, 7), i64(1, 2)]) == [T(("b", None, 5))]
    with pytest.raises(ShapeError, match="step"):
        infer("Slice", [t, i64(0), i64(1), i64(0), i64(0)])
    with pytest.raises(ShapeError, match="repeated"):
        infer("Slice", [t, i64(0, 0), i64(1, 1), i64(1, -2)])


# ---- Gather family -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "idx", "axis"),
    [
        ((5,), np.array(3), 0),
        ((5, 3), np.array([[0, -1], [4, 2]]), 0),
        ((5, 3), np.array([2, -3, 0]), 1),
        ((2, 3, 4), np.array([[1], [3]]), -1),
        ((2, 3), np.zeros((0,), np.int64), 1),
    ],
)
@pytest.mark.parametrize("index_dtype", [np.int64, np.int32])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.bool_])
def test_gather(shape, idx, axis, index_dtype, dtype):
    check("Gather", {"x": rand(shape, dtype), "i": idx.astype(index_dtype)}, {"axis": axis})


@pytest.mark.parametrize(
    ("shape", "ishape", "axis"),
    [((3, 4), (3, 4), 0), ((3, 4), (2, 5), 1), ((2, 3, 5), (2, 3, 2), -1), ((4,), (6,), 0), ((3, 4), (1, 2), 0)],
)
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
def test_gather_elements(shape, ishape, axis, dtype):
    rng = np.random.default_rng(1)
    d = shape[axis]
    idx = rng.integers(-d, d, size=ishape).astype(I64)
    check("GatherElements", {"x": rand(shape, dtype), "i": idx}, {"axis": axis})


@pytest.mark.parametrize(
    ("shape", "ishape", "batch_dims"),
    [
        ((4, 5), (3, 2), 0),
        ((4, 5), (2, 1), 0),
        ((2, 3, 4), (5, 1, 3), 0),
        ((2, 3, 4), (2, 1), 1),
        ((2, 3, 4), (2, 3, 1), 2),
        ((2, 3, 4, 5), (2, 3, 2, 2), 1),
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_gathernd(shape, ishape, batch_dims, dtype):
    rng = np.random.default_rng(2)
    k = ishape[-1]
    dims = np.array(shape[batch_dims : batch_dims + k])
    idx = (rng.integers(0, 1 << 20, size=ishape) % dims) - rng.integers(0, 2, size=ishape) * dims
    check("GatherND", {"x": rand(shape, dtype), "i": idx.astype(I64)}, {"batch_dims": batch_dims})


# ---- Scatter family ----------------------------------------------------------------------------


def _np_scatter_elements(data, idx, upd, axis, reduction):
    out = data.copy()
    it = np.nditer(idx, flags=["multi_index"])
    ops = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}
    for v in it:
        pos = list(it.multi_index)
        pos[axis] = int(v) % data.shape[axis]
        u = upd[it.multi_index]
        out[tuple(pos)] = u if reduction == "none" else ops[reduction](out[tuple(pos)], u)
    return out


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize(
    ("shape", "ushape", "axis"), [((5,), (3,), 0), ((3, 4), (3, 2), 1), ((4, 3, 2), (2, 3, 2), -3)]
)
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_scatter_elements(reduction, shape, ushape, axis, dtype):
    rng = np.random.default_rng(3)
    d = shape[axis]
    if reduction == "none":  # duplicates only meet a reduction
        perm = np.argsort(rng.random((*ushape[:axis], d, *ushape[axis + 1 :])), axis=axis)
        idx = np.take(perm, np.arange(ushape[axis]), axis=axis)
    else:
        idx = rng.integers(0, d, size=ushape)
    idx = np.where(rng.random(ushape) < 0.3, idx - d, idx).astype(I64)
    ins = {"x": rand(shape, dtype), "i": idx, "u": rand(ushape, dtype, seed=4)}
    attrs = {"axis": axis, "reduction": reduction}
    got = check("ScatterElements", ins, attrs)["y"]
    assert_close(got, _np_scatter_elements(ins["x"], idx, ins["u"], axis % len(shape), reduction))


def test_scatter_deprecated_alias():
    ins = {"x": rand((3, 4)), "i": i64([0, 2], [1, 1], [3, 0]), "u": rand((3, 2), seed=1)}
    check("Scatter", ins, {"axis": 1}, opset=10)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize(
    ("shape", "ishape"), [((8,), (4, 1)), ((4, 3, 2), (2, 1)), ((4, 3, 2), (2, 2, 3)), ((3, 5), (3, 2))]
)
def test_scatternd(reduction, shape, ishape):
    rng = np.random.default_rng(5)
    k = ishape[-1]
    dims = np.array(shape[:k])
    n = int(np.prod(ishape[:-1]))
    if reduction == "none":  # distinct target positions
        flat = rng.permutation(int(np.prod(dims)))[:n]
        idx = np.stack(np.unravel_index(flat, tuple(dims)), axis=-1).reshape(ishape)
    else:
        idx = rng.integers(0, 1 << 20, size=ishape) % dims
    idx = (idx - (rng.random(ishape) < 0.3) * dims).astype(I64)
    ushape = ishape[:-1] + shape[k:]
    ins = {"x": rand(shape), "i": idx, "u": rand(ushape, seed=6)}
    got = check("ScatterND", ins, {"reduction": reduction})["y"]
    # independent loop formula
    want = ins["x"].copy()
    ops = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}
    for pos in np.ndindex(*ishape[:-1]):
        t = tuple(int(v) for v in idx[pos])
        want[t] = ins["u"][pos] if reduction == "none" else ops[reduction](want[t], ins["u"][pos])
    assert_close(got, want)


# ---- NonZero, OneHot, Compress, EyeLike, Trilu -------------------------------------------------


@pytest.mark.parametrize("shape", [(7,), (3, 4), (2, 3, 2), (0, 3)])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
def test_nonzero(shape, dtype):
    x = rand(shape, dtype, seed=7, low=-1, high=1)
    if dtype != np.bool_:
        x = np.where(rand(shape, np.float32, seed=8) > 0, x, 0).astype(dtype)
    check("NonZero", {"x": x})


def test_nonzero_scalar_and_known():
    # ORT's scalar NonZero differs across versions; the spec: shape (0, N).
    (y,) = graphc_only("NonZero", {"x": np.array(3.0, np.float32)})
    assert y.shape == (0, 1) and y.dtype == np.int64
    (t,) = infer("NonZero", [np.array([[0, 1], [2, 0]], dtype=np.int64)])
    assert t == T((2, 2), DType.int64)
    assert infer("NonZero", [T(("b", 3))]) == [T((2, None), DType.int64)]


@pytest.mark.parametrize("axis", [-1, 0, 1, -2])
@pytest.mark.parametrize("vdtype", [np.float32, np.int64, np.float16])
def test_onehot(axis, vdtype):
    idx = np.array([[0, 3, -1], [5, -6, 2]], dtype=I64)  # 5 and -6 are out of range for depth 5
    values = np.array([2, 7], dtype=vdtype)
    check("OneHot", {"i": idx}, {"axis": axis}, consts={"d": np.array(5, I64), "v": values})


def test_onehot_float_inputs():
    idx = np.array([1.0, 0.0, 2.0], np.float32)
    consts = {"d": np.array([3.0], np.float32), "v": np.array([0, 1], np.float32)}
    check("OneHot", {"i": idx}, consts=consts, opset=11)


@pytest.mark.parametrize(
    ("shape", "axis", "cond"),
    [((3, 4), 0, [1, 0, 1]), ((3, 4), -1, [0, 1, 1, 0]), ((3, 4), 1, [1, 1]), ((2, 3), None, [1, 0, 0, 1, 1])],
)
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
def test_compress(shape, axis, cond, dtype):
    attrs = {} if axis is None else {"axis": axis}
    check("Compress", {"x": rand(shape, dtype)}, attrs, consts={"c": np.array(cond, bool)})


def test_compress_runtime_condition():
    x, c = rand((3, 4)), np.array([True, False, True])
    check("Compress", {"x": x, "c": c}, {"axis": 0})


@pytest.mark.parametrize(("shape", "k"), [((3, 3), 0), ((3, 5), 1), ((4, 2), -1), ((2, 3), 4)])
@pytest.mark.parametrize("dtype", [None, 7, 1])
def test_eyelike(shape, k, dtype):
    attrs = {"k": k} if dtype is None else {"k": k, "dtype": dtype}
    check("EyeLike", {"x": rand(shape, np.int32)}, attrs)


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, 0, 2, -1, -7, 9])
@pytest.mark.parametrize("shape", [(4, 5), (2, 3, 3), (1, 4)])
def test_trilu(upper, k, shape):
    consts = None if k is None else {"k": np.array(k, I64)}
    check("Trilu", {"x": rand(shape)}, {"upper": upper}, consts=consts)


@pytest.mark.parametrize("dtype", [np.float16, np.int64, np.bool_])
def test_trilu_dtypes(dtype):
    x = rand((3, 4), dtype)
    (y,) = graphc_only("Trilu", {"x": x}, consts={"k": np.array(1, I64)})
    assert_close(y, np.triu(x, 1))


# ---- Pad, CenterCropPad ------------------------------------------------------------------------

PADS = [[1, 0, 2, 3], [0, 2, 1, 0], [-1, 2, 1, -2], [2, -1, -1, 1]]


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads", PADS)
def test_pad(mode, pads):
    consts = {"pads": i64(*pads)}
    if mode == "constant":
        consts["cv"] = np.array(1.5, np.float32)
    check("Pad", {"x": rand((4, 5))}, {"mode": mode}, consts=consts)


@pytest.mark.parametrize("dtype", [np.float16, np.int64, np.bool_, np.float64])
def test_pad_dtypes(dtype):
    x = rand((2, 3, 1), dtype)
    check("Pad", {"x": x}, consts={"pads": i64(1, 0, 0, 0, 2, 1), "cv": np.ones((), dtype)})
    check("Pad", {"x": x}, {"mode": "edge"}, consts={"pads": i64(1, 0, 2, 0, 2, 1)})


@pytest.mark.parametrize("axes", [[1], [-1, 0], [2, 0]])
def test_pad_axes(axes):
    consts = {"pads": i64(*([1] * len(axes) + [2] * len(axes))), "cv": np.array(-3, np.float32), "axes": i64(*axes)}
    check("Pad", {"x": rand((3, 4, 5))}, {"mode": "constant"}, consts=consts)
    del consts["cv"]
    check("Pad", {"x": rand((3, 4, 5))}, {"mode": "reflect"}, consts=consts, order=["x", "pads", "", "axes"])


def test_pad_older_opsets():
    x = rand((3, 4))
    f32 = np.float32
    attrs = {"mode": "constant", "pads": [0, 1, 2, 0], "value": 2.5}
    check("Pad", {"x": x}, attrs, opset=2, out_type=(f32, (5, 5)))
    check("Pad", {"x": x}, {"mode": "reflect", "pads": [1, 1, 2, 2]}, opset=10)
    check("Pad", {"x": x}, {"mode": "edge"}, consts={"pads": i64(1, 0, 0, 3)}, opset=11)
    (y,) = graphc_only("Pad", {"x": x}, {"paddings": [1, 0, 0, 1]}, opset=1, out_type=(f32, (4, 5)))
    assert_close(y, np.pad(x, [(1, 0), (0, 1)]))


def test_pad_inference():
    assert infer("Pad", [T(("b", 4)), i64(0, 1, 0, 2)]) == [T(("b", 7))]
    assert infer("Pad", [T(("b", 4)), T((4,), DType.int64)]) == [T((None, None))]
    with pytest.raises(ShapeError, match="2 entries"):
        infer("Pad", [T((2, 4)), i64(1, 1)])
    with pytest.raises(ShapeError, match="remove more"):
        infer("Pad", [T((2, 4)), i64(-3, 0, 0, 0)])


@pytest.mark.parametrize(
    ("shape", "target", "axes"),
    [
        ((5, 6), [3, 4], None),
        ((5, 6), [8, 9], None),
        ((5, 6, 3), [4, 9], [0, 1]),
        ((4, 7, 3), [9, 2], [-2, 0]),
        ((3, 3), [3, 3], None),
    ],
)
def test_center_crop_pad(shape, target, axes):
    x = rand(shape)
    attrs = {} if axes is None else {"axes": axes}
    got = check("CenterCropPad", {"x": x}, attrs, consts={"s": i64(*target)})["y"]
    # numpy formula: the centered window of each axis, extra element at the end
    want = np.zeros(got.shape, np.float32)
    src, dst = [slice(None)] * x.ndim, [slice(None)] * x.ndim
    for a, s in zip(axes or range(x.ndim), target, strict=True):
        d = x.shape[a]
        if s < d:
            src[a] = slice((d - s) // 2, (d - s) // 2 + s)
        else:
            dst[a] = slice((s - d) // 2, (s - d) // 2 + d)
    want[tuple(dst)] = x[tuple(src)]
    assert_close(got, want)


# ---- DepthToSpace, SpaceToDepth ----------------------------------------------------------------


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
@pytest.mark.parametrize(("shape", "b"), [((1, 8, 2, 3), 2), ((2, 18, 1, 2), 3), ((1, 3, 2, 2), 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_depth_to_space(mode, shape, b, dtype):
    check("DepthToSpace", {"x": rand(shape, dtype)}, {"blocksize": b, "mode": mode})


@pytest.mark.parametrize(("shape", "b"), [((1, 2, 4, 6), 2), ((2, 1, 3, 6), 3)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_space_to_depth(shape, b, dtype):
    check("SpaceToDepth", {"x": rand(shape, dtype)}, {"blocksize": b})


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_space_to_depth_inverts_depth_to_space(mode):
    # SpaceToDepth-28's modes (no ORT kernel yet): each inverts DepthToSpace of the same mode.
    x = rand((2, 12, 3, 2))
    (y,) = graphc_only("DepthToSpace", {"x": x}, {"blocksize": 2, "mode": mode})
    (z,) = graphc_only("SpaceToDepth", {"x": y}, {"blocksize": 2, "mode": mode})
    assert_close(z, x)


def test_depth_space_inference():
    assert infer("DepthToSpace", [T(("n", 8, "h", 3))], {"blocksize": 2}) == [T(("n", 2, None, 6))]
    with pytest.raises(ShapeError, match="divisible"):
        infer("DepthToSpace", [T((1, 6, 2, 2))], {"blocksize": 2})
    with pytest.raises(ShapeError, match="divisible"):
        infer("SpaceToDepth", [T((1, 6, 3, 2))], {"blocksize": 2})


# ---- TopK --------------------------------------------------------------------------------------


@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize(("shape", "axis", "k"), [((7,), 0, 3), ((3, 5), -1, 5), ((4, 3, 2), 0, 2), ((3, 4), 1, 0)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.float64])
def test_topk(largest, shape, axis, k, dtype):
    # Few distinct values, so ties are common: the lower index must come first.
    x = rand(shape, dtype, low=-3, high=3)
    x = np.round(x).astype(dtype)
    check("TopK", {"x": x}, {"axis": axis, "largest": largest}, consts={"k": i64(k)}, outputs=["v", "i"])


def test_topk_older_opsets():
    x = np.round(rand((3, 6), low=-2, high=2))
    check("TopK", {"x": x}, {"k": 4}, outputs=["v", "i"], opset=9)
    check("TopK", {"x": x}, {"axis": 0}, consts={"k": i64(2)}, outputs=["v", "i"], opset=10)


def test_topk_uint64_and_symbolic():
    x = np.array([[3, 1, 2**63, 3], [0, 0, 1, 1]], dtype=np.uint64)
    v, i = graphc_only("TopK", {"x": x}, consts={"k": i64(3)}, outputs=["v", "i"])
    np.testing.assert_array_equal(i, [[2, 0, 3], [2, 3, 0]])
    np.testing.assert_array_equal(v, np.take_along_axis(x, i, 1))
    assert infer("TopK", [T(("b", 9)), i64(4)], outputs=2) == [T(("b", 4)), T(("b", 4), DType.int64)]
    with pytest.raises(ShapeError, match="larger"):
        infer("TopK", [T((3, 2)), i64(4)], outputs=2)


# ---- CumSum, CumProd ---------------------------------------------------------------------------


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize(("shape", "axis"), [((6,), 0), ((3, 5), 1), ((3, 5), -2), ((2, 3, 4), -1)])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int32, np.float64])
def test_cumsum(exclusive, reverse, shape, axis, dtype):
    check("CumSum", {"x": rand(shape, dtype)}, {"exclusive": exclusive, "reverse": reverse}, consts={"a": i64(axis)})


def _np_cumprod(x, axis, exclusive, reverse):
    y = np.flip(x, axis) if reverse else x
    y = np.cumprod(y, axis=axis, dtype=x.dtype)
    if exclusive:
        ones = np.ones_like(np.take(y, [0], axis=axis))
        y = np.concatenate([ones, np.take(y, np.arange(y.shape[axis] - 1), axis=axis)], axis=axis)
    return np.flip(y, axis) if reverse else y


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize(("shape", "axis"), [((6,), 0), ((3, 5), -1), ((2, 3, 4), 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.float16])
def test_cumprod(exclusive, reverse, shape, axis, dtype):
    # CumProd (opset 26) has no ORT kernel here: numpy formula.
    x = rand(shape, dtype, low=-2, high=2)
    attrs = {"exclusive": exclusive, "reverse": reverse}
    (y,) = graphc_only("CumProd", {"x": x}, attrs, consts={"a": np.array(axis, np.int32)})
    want = _np_cumprod(x.astype(np.float32) if dtype == np.float16 else x, axis, exclusive, reverse)
    assert_close(y, want.astype(dtype))


def test_cumsum_float16_accumulates_in_float32():
    x = np.full(4000, 0.1, np.float16)
    (y,) = graphc_only("CumSum", {"x": x}, consts={"a": i64(0)})
    assert abs(float(y[-1]) - 400) < 1  # a float16 accumulator stalls at 256


# ---- ReverseSequence, Unique -------------------------------------------------------------------


@pytest.mark.parametrize(("batch_axis", "time_axis"), [(1, 0), (0, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
def test_reverse_sequence(batch_axis, time_axis, dtype):
    shape = [0, 0, 3]
    shape[batch_axis], shape[time_axis] = 4, 5
    attrs = {"batch_axis": batch_axis, "time_axis": time_axis}
    check("ReverseSequence", {"x": rand(shape, dtype), "l": i64(5, 1, 3, 2)}, attrs)


@pytest.mark.parametrize("sorted_", [1, 0])
@pytest.mark.parametrize(("shape", "axis"), [((9,), None), ((3, 4), None), ((4, 3), 0), ((2, 5), -1), ((2, 4, 2), 1)])
def test_unique(sorted_, shape, axis):
    rng = np.random.default_rng(9)
    x = rng.integers(0, 3, size=shape).astype(np.float32)
    attrs = {"sorted": sorted_} if axis is None else {"sorted": sorted_, "axis": axis}
    outs = ["y", "idx", "inv", "cnt"]
    got = graphc_only("Unique", {"x": x}, attrs, outputs=outs)
    y, first, inv, cnt = got
    # Properties of the spec: first occurrences, inverse map, counts, order.
    a = 0 if axis is None else axis % x.ndim
    flat = x.reshape(-1) if axis is None else x
    assert_close(np.take(flat, first, axis=a), y)
    assert_close(np.take(y, inv, axis=a), flat)
    np.testing.assert_array_equal(cnt, np.bincount(inv, minlength=len(first)))
    if sorted_:
        want = np.unique(flat, axis=None if axis is None else a)
        assert_close(y, want)
    else:
        assert np.all(np.diff(first) > 0)
    if axis is None:  # ORT has no axis support in every build; compare where it runs
        expected = run_ort(make_node_model("Unique", {"x": x}, attrs, outputs=outs), {"x": x})
        for k, v in zip(outs, got, strict=True):
            assert_close(v, expected[k], what=k)


def test_unique_inference():
    ts = infer("Unique", [T((3, 4))], outputs=4)
    assert ts == [T((None,)), T((None,), DType.int64), T((12,), DType.int64), T((None,), DType.int64)]
    ts = infer("Unique", [np.array([3, 1, 3], np.int64)], outputs=4)
    assert ts[0] == T((2,), DType.int64) and ts[2] == T((3,), DType.int64)


# ---- Resize ------------------------------------------------------------------------------------

COORD_MODES = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric"]
SCALES = [[1, 1, 2.0, 1.5], [1, 1, 0.6, 0.8], [1, 1, 1.7, 0.45]]


def _resize(x, attrs, *, scales=None, sizes=None, roi=None, opset=None, ref=False):
    consts, order = {}, ["x", "", "", ""]
    for i, (name, v, dt) in enumerate(
        ((("roi", roi, np.float32)), ("scales", scales, np.float32), ("sizes", sizes, I64))
    ):
        if v is not None:
            consts[name] = np.array(v, dtype=dt)
            order[i + 1] = name
    while order[-1] == "":
        order.pop()
    if ref:
        return graphc_only("Resize", {"x": x}, attrs, consts=consts, order=order, opset=opset)[0]
    # Interpolation sums several rounded products: float32 results agree to ~1e-6 absolute.
    atol = 1e-5 if x.dtype == np.float32 and attrs.get("mode") != "nearest" else None
    return check("Resize", {"x": x}, attrs, consts=consts, order=order, opset=opset, atol=atol)["y"]


@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
@pytest.mark.parametrize("ctm", COORD_MODES)
@pytest.mark.parametrize("scales", SCALES)
def test_resize_nearest(nearest_mode, ctm, scales):
    attrs = {"mode": "nearest", "nearest_mode": nearest_mode, "coordinate_transformation_mode": ctm}
    _resize(rand((1, 2, 5, 7)), attrs, scales=scales)


@pytest.mark.parametrize("ctm", COORD_MODES)
@pytest.mark.parametrize("scales", SCALES)
def test_resize_bilinear(ctm, scales):
    _resize(rand((2, 3, 5, 7)), {"mode": "linear", "coordinate_transformation_mode": ctm}, scales=scales)


@pytest.mark.parametrize("ctm", ["half_pixel", "align_corners", "asymmetric"])
def test_resize_trilinear_and_1d(ctm):
    attrs = {"mode": "linear", "coordinate_transformation_mode": ctm}
    _resize(rand((1, 2, 3, 4, 5)), attrs, scales=[1, 1, 2.0, 0.5, 1.4])
    _resize(rand((2, 3, 7)), attrs, sizes=[2, 3, 11])


@pytest.mark.parametrize("ctm", ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"])
@pytest.mark.parametrize("a", [-0.75, -0.5])
@pytest.mark.parametrize("exclude_outside", [0, 1])
@pytest.mark.parametrize("scales", SCALES[:2])
def test_resize_cubic(ctm, a, exclude_outside, scales):
    attrs = {
        "mode": "cubic",
        "coordinate_transformation_mode": ctm,
        "cubic_coeff_a": a,
        "exclude_outside": exclude_outside,
    }
    _resize(rand((1, 2, 6, 5)), attrs, scales=scales)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("sizes", [[1, 2, 9, 4], [1, 2, 3, 11], [1, 2, 1, 1]])
def test_resize_sizes(mode, sizes):
    _resize(rand((1, 2, 5, 7)), {"mode": mode}, sizes=sizes)


@pytest.mark.parametrize("policy", ["stretch", "not_larger", "not_smaller"])
@pytest.mark.parametrize("axes", [None, [2, 3], [3, 2]])
def test_resize_sizes_aspect_policy(policy, axes):
    attrs = {"mode": "nearest", "keep_aspect_ratio_policy": policy}
    if axes is not None:
        attrs["axes"] = axes
    sizes = [8, 9] if axes is not None else [1, 2, 8, 9]
    y = _resize(rand((1, 2, 5, 7)), attrs, sizes=sizes)
    if axes == [3, 2]:
        # ORT ignores a negative axis under keep_aspect_ratio_policy; the spec normalizes it.
        attrs["axes"] = [3, -2]
        assert_close(_resize(rand((1, 2, 5, 7)), attrs, sizes=sizes, ref=True), y)


@pytest.mark.parametrize("axes", [[2, 3], [-1], [0, 3]])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_axes_scales(axes, mode):
    scales = {2: 1.5, 3: 0.6, -1: 2.5, 0: 2.0}
    x = rand((2, 2, 5, 7))
    s = [scales[a] for a in axes]
    if mode == "linear" and 0 in axes:
        # ORT's linear kernel only resizes the inner axes: compare with full-rank scales.
        full = [1.0] * 4
        for a, v in zip(axes, s, strict=True):
            full[a] = v
        want = _resize(x, {"mode": mode}, scales=full, ref=True)
        assert_close(_resize(x, {"mode": mode, "axes": axes}, scales=s, ref=True), want)
    else:
        _resize(x, {"mode": mode, "axes": axes}, scales=s)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("extrapolation_value", [0.0, 10.0])
def test_resize_tf_crop_and_resize(mode, extrapolation_value):
    attrs = {
        "mode": mode,
        "coordinate_transformation_mode": "tf_crop_and_resize",
        "extrapolation_value": extrapolation_value,
    }
    x = rand((1, 1, 6, 5))
    _resize(x, attrs, roi=[0, 0, 0.4, -0.2, 1, 1, 1.2, 0.7], sizes=[1, 1, 4, 6])
    attrs["axes"] = [3, 2]
    _resize(x, attrs, roi=[0.1, 0.3, 0.8, 0.9], sizes=[3, 1])


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("scales", [[1, 1, 0.45, 0.7], [1, 1, 0.3, 1.5], [1, 1, 0.25, 0.25]])
def test_resize_antialias(mode, scales):
    _resize(rand((1, 2, 9, 11)), {"mode": mode, "antialias": 1}, scales=scales)


@pytest.mark.parametrize("dtype", [np.float16, np.uint8, np.int8, np.int32])
def test_resize_nearest_dtypes(dtype):
    _resize(rand((1, 1, 4, 5), dtype, low=-50, high=50), {"mode": "nearest"}, scales=[1, 1, 1.5, 0.6])


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_float16_float64(mode):
    x = rand((1, 1, 4, 5))
    attrs = {"mode": mode}
    _resize(x.astype(np.float16), attrs, scales=[1, 1, 1.5, 0.6])
    # ORT has no float64 Resize: the float64 result must match float32's to float32 precision.
    want = _resize(x, attrs, scales=[1, 1, 1.5, 0.6])
    got = _resize(x.astype(np.float64), attrs, scales=[1, 1, 1.5, 0.6], ref=True)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_integer_rounds(dtype, mode):
    # ORT truncates (and has no cubic kernel for integers); the ONNX reference rounds to
    # nearest and saturates, which is what graphc does: compare with the float result.
    x = rand((1, 1, 5, 7), dtype, low=-128, high=255)
    y = _resize(x, {"mode": mode}, scales=[1, 1, 1.7, 0.6], ref=True)
    f = _resize(x.astype(np.float64), {"mode": mode}, scales=[1, 1, 1.7, 0.6], ref=True)
    info = np.iinfo(dtype)
    assert_close(y, np.clip(np.round(f), info.min, info.max).astype(dtype))


def test_resize_opset11_and_13_forms():
    x = rand((1, 2, 4, 6))
    empty = np.zeros(0, np.float32)
    # Opset 11: roi and scales required, empty when unused.
    consts = {"roi": empty, "scales": empty, "sizes": i64(1, 2, 7, 3)}
    check("Resize", {"x": x}, {"mode": "linear"}, consts=consts, opset=11)
    consts = {"roi": empty, "scales": np.array([1, 1, 2, 0.5], np.float32)}
    check(
        "Resize",
        {"x": x},
        {"mode": "cubic", "coordinate_transformation_mode": "align_corners"},
        consts=consts,
        opset=11,
    )
    check(
        "Resize",
        {"x": x},
        {"mode": "nearest"},
        consts={"scales": np.array([1, 1, 2, 3], np.float32)},
        order=["x", "", "scales"],
        opset=13,
    )
    with pytest.raises(UnsupportedOpError, match="tf_half_pixel_for_nn"):
        graphc_only(
            "Resize", {"x": x}, {"coordinate_transformation_mode": "tf_half_pixel_for_nn"}, consts=consts, opset=11
        )


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [[1, 1, 2, 3], [1, 1, 0.5, 0.7], [1, 1, 2.5, 0.5]])
def test_resize_opset10(mode, scales):
    check(
        "Resize", {"x": rand((1, 2, 4, 6))}, {"mode": mode}, consts={"scales": np.array(scales, np.float32)}, opset=10
    )


def test_upsample():
    x = rand((1, 2, 3, 4))
    s = np.array([1, 1, 2, 3], np.float32)
    check("Upsample", {"x": x}, {"mode": "nearest"}, consts={"scales": s}, opset=9)
    check("Upsample", {"x": x}, {"mode": "linear"}, consts={"scales": s}, opset=9)
    check("Upsample", {"x": x, "scales": s}, {"mode": "nearest"}, opset=9)  # run-time scales
    check("Upsample", {"x": x}, {"mode": "nearest", "scales": [1.0, 1.0, 2.0, 2.0]}, opset=7)


def test_resize_output_size_uses_float32_product():
    # float32(0.7) * 10 = 7 in float32 but 6.99999988 in float64; ORT and ONNX say 7.
    _resize(rand((1, 10)), {"mode": "nearest"}, scales=[1, 0.7])


def test_resize_inference():
    scales = np.array([1, 1, 2, 0.5], np.float32)
    empty = np.zeros(0, np.float32)
    assert infer("Resize", [T(("n", 3, 8, 6)), None, scales]) == [T(("n", 3, 16, 3))]
    assert infer("Resize", [T(("n", 3, 8, 6)), empty, empty, i64(1, 3, 5, 5)]) == [T((1, 3, 5, 5))]
    assert infer("Resize", [T(("n", 3, 8, 6)), None, None, T((4,), DType.int64)]) == [T((None,) * 4)]
    assert infer(
        "Resize", [T(("n", 3, 8, 6)), None, None, i64(4, 4)], {"axes": (2, 3), "keep_aspect_ratio_policy": "not_larger"}
    ) == [T(("n", 3, 4, 3))]
    with pytest.raises(ShapeError, match="one of scales and sizes"):
        infer("Resize", [T((1, 2)), empty, empty])
    with pytest.raises(ShapeError, match="one entry per resized axis"):
        infer("Resize", [T((1, 2)), None, np.ones(3, np.float32)])
    with pytest.raises(ShapeError, match="mode"):
        infer("Resize", [T((1, 2)), None, np.ones(2, np.float32)], {"mode": "bicubic"})


def test_resize_where_ort_departs_from_the_spec():
    # 1. tf_crop_and_resize crops an axis whose length does not change (ORT returns the input).
    x = np.arange(20, dtype=np.float32).reshape(1, 1, 5, 4)  # x[i, j] = 4 i + j
    attrs = {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize"}
    y = _resize(x, attrs, roi=[0, 0, 0.2, 0, 1, 1, 0.6, 1], sizes=[1, 1, 5, 4], ref=True)
    rows = 0.2 * 4 + np.arange(5) * (0.6 - 0.2) * 4 / 4
    assert_close(y[0, 0], (4 * rows[:, None] + np.arange(4)[None, :]).astype(np.float32))
    # 2. antialias widens the filter only when downscaling: upscaled axes are plain linear/cubic
    # (ORT's antialias kernel differs when upscaling by a non-integer factor).
    x = rand((1, 1, 7, 5))
    for mode in ("linear", "cubic"):
        plain = _resize(x, {"mode": mode}, scales=[1, 1, 1.43, 1.02])
        aa = _resize(x, {"mode": mode, "antialias": 1}, scales=[1, 1, 1.43, 1.02], ref=True)
        assert_close(aa, plain, atol=1e-5)
