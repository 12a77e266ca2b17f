"""GPU correctness of the data movement family against graphc's numpy references: bit-exact for
the ops that move elements, a tolerance for Resize (linear, cubic) and CumSum. Odd shapes, size-1
dims, several dtypes (wide and narrow element moves); the arena is poisoned first.

Run on a GPU machine: python -m pytest tests/codegen/test_data_gpu.py -q
"""

from __future__ import annotations

import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from helpers import make_node_model, rand

sys.path.insert(0, str(Path(__file__).parent))  # rd_helpers beside this file
from rd_helpers import check_on_gpu  # noqa: E402

pytestmark = pytest.mark.gpu

BF16 = ml_dtypes.bfloat16
F32, F16 = np.float32, np.float16


def _x(shape, dtype=F32, seed=0):
    if np.dtype(dtype).kind in "iub":
        return rand(shape, dtype, seed=seed, low=-100, high=100)
    return rand(shape, np.float32, seed=seed).astype(dtype)


def _check(op, inputs, attrs=None, inits=None, exact=True, initializers=None, **kw):
    m = make_node_model(op, inputs, attrs, initializers=inits or initializers, **kw)
    check_on_gpu(m, inputs, exact=exact)


@pytest.mark.parametrize(
    "shape,perm",
    [
        ((3, 40, 33, 37), (0, 2, 3, 1)),  # NCHW -> NHWC: tiled
        ((3, 7, 40, 33), (0, 2, 3, 1)),  # 7 channels: index kernel
        ((3, 40, 33, 7), (0, 3, 1, 2)),  # NHWC -> NCHW with 7 channels: index kernel
        ((2, 3, 5, 64), (0, 2, 1, 3)),  # inner dim kept: wide copies
        ((1000, 3000), (1, 0)),
        ((1, 7, 1), (2, 1, 0)),
        ((5, 6, 7), (2, 0, 1)),
    ],
)
@pytest.mark.parametrize("dtype", [F32, F16, np.int64, np.uint8], ids=lambda d: np.dtype(d).name)
def test_transpose(shape, perm, dtype):
    _check("Transpose", {"x": _x(shape, dtype)}, {"perm": list(perm)})


@pytest.mark.parametrize(
    "starts,ends,axes,steps",
    [
        ([1, -1], [3, -40], [1, 3], [1, -2]),
        ([8], [32], [3], [1]),  # inner run cut at multiples of 8: wide copies
        ([0, 0], [100, 100], [0, 2], [2, 3]),
        ([-1], [-1000], [2], [-1]),
        ([5], [1], [1], [1]),  # empty
    ],
)
@pytest.mark.parametrize("dtype", [F32, BF16], ids=lambda d: np.dtype(d).name)
def test_slice(starts, ends, axes, steps, dtype):
    x = _x((3, 7, 40, 33), dtype)
    inits = {"s": np.array(starts), "e": np.array(ends), "a": np.array(axes), "st": np.array(steps)}
    m = make_node_model("Slice", {"x": x}, initializers=inits)
    if 0 in [d.dim_value for d in m.graph.output[0].type.tensor_type.shape.dim]:
        pytest.skip("empty output: no kernel")
    check_on_gpu(m, {"x": x}, exact=True)


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_concat_split(axis):
    a, b, c = _x((3, 4, 8), F16), _x((3, 4, 8), F16, 1), _x((3, 4, 8), F16, 2)
    _check("Concat", {"a": a, "b": b, "c": c}, {"axis": axis})
    x = _x((6, 10, 14), F32)
    n = x.shape[axis]
    _check("Split", {"x": x}, {"axis": axis}, {"sp": np.array([1, n - 3, 2])}, outputs=("y0", "y1", "y2"))


@pytest.mark.parametrize(
    "mode,pads",
    [
        ("constant", [0, 1, 2, 0, 2, 1]),
        ("constant", [0, -1, 0, 0, 2, 0]),
        ("reflect", [0, 2, 3, 0, 1, 2]),
        ("edge", [0, 2, -1, 0, 1, 2]),
        ("wrap", [1, 2, 3, 0, 1, 2]),
    ],
)
@pytest.mark.parametrize("dtype", [F32, F16, np.int32], ids=lambda d: np.dtype(d).name)
def test_pad(mode, pads, dtype):
    x = _x((3, 4, 5), dtype)
    inits = {"p": np.array(pads)}
    if mode == "constant":
        inits["v"] = np.array(3, dtype)
    _check("Pad", {"x": x}, {"mode": mode}, inits)


def test_pad_wide_inner():
    x = _x((3, 4, 64), F16)
    _check("Pad", {"x": x}, {"mode": "constant"}, {"p": np.array([1, 2, 0, 0, 1, 0]), "v": np.array(1.5, F16)})


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("ids_dtype", [np.int64, np.int32], ids=lambda d: np.dtype(d).name)
def test_gather_embedding(dtype, ids_dtype):
    table = _x((1000, 768), dtype)
    ids = np.array([[1, 5, -1, 999, 0], [7, 7, 3, 2, -1000]], ids_dtype)
    _check("Gather", {"x": table, "i": ids}, {"axis": 0})


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_gather_axes(axis):
    x = _x((10, 7, 3), F32)
    ids = np.array([[1, 2], [-1, 0]], np.int64)
    _check("Gather", {"x": x, "i": ids}, {"axis": axis})


def test_gather_elements_nd():
    x = _x((10, 7), F16)
    idx = np.array([[1, 5, -1]] * 10, np.int64)
    _check("GatherElements", {"x": x, "i": idx}, {"axis": 1})
    _check("GatherElements", {"x": x, "i": np.array([[0, -1, 9, 3, 2, 1, 0]] * 2, np.int64)}, {"axis": 0})
    y = _x((4, 5, 6), F32)
    _check("GatherND", {"x": y, "i": np.array([[1, 2], [0, -1], [3, 4]], np.int64)})
    _check(
        "GatherND",
        {"x": y, "i": np.array([[[1], [2]], [[0], [3]], [[1], [1]], [[4], [0]]], np.int64)},
        {"batch_dims": 1},
    )


def test_expand_tile():
    x = _x((3, 1, 5), F16)
    _check("Expand", {"x": x}, initializers={"sh": np.array([2, 3, 4, 5])})
    _check("Expand", {"x": _x((3, 1, 8), F32)}, initializers={"sh": np.array([3, 7, 8])})
    _check("Tile", {"x": _x((3, 2, 8), F16)}, initializers={"r": np.array([2, 1, 3])})
    _check("Tile", {"x": _x((3, 2, 5), np.int64)}, initializers={"r": np.array([2, 3, 2])})


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_space(mode):
    _check("DepthToSpace", {"x": _x((2, 8, 3, 5))}, {"blocksize": 2, "mode": mode})
    _check("DepthToSpace", {"x": _x((1, 36, 20, 20), F16)}, {"blocksize": 3, "mode": mode})
    if mode == "DCR":
        _check("SpaceToDepth", {"x": _x((2, 3, 4, 6))}, {"blocksize": 2})
        _check("SpaceToDepth", {"x": _x((1, 8, 64, 64), F16)}, {"blocksize": 4})


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [-2, 0, 3])
def test_trilu(upper, k):
    _check("Trilu", {"x": _x((2, 5, 7))}, {"upper": upper}, {"k": np.array(k, np.int64)})


@pytest.mark.parametrize("shape,axis", [((3, 1000), 1), ((3, 8193), -1), ((3, 7, 5), 1), ((40, 3), 0)])
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
def test_cumsum(shape, axis, exclusive, reverse):
    x = _x(shape, F32)
    _check("CumSum", {"x": x}, {"exclusive": exclusive, "reverse": reverse}, {"ax": np.array(axis)}, exact=False)


@pytest.mark.parametrize("shape,axis", [((3, 1000), 1), ((40, 3), 0)])
def test_cumprod(shape, axis):
    x = rand(shape, F32, low=0.99, high=1.01)
    _check("CumProd", {"x": x}, {"exclusive": 1}, {"ax": np.array(axis)}, exact=False)
    _check("CumProd", {"x": x}, {"reverse": 1}, {"ax": np.array(axis)}, exact=False)


def test_cumsum_int_and_half():
    _check("CumSum", {"x": _x((3, 300), np.int32)}, {}, {"ax": np.array(1)})
    _check("CumSum", {"x": _x((3, 300), F16)}, {"reverse": 1}, {"ax": np.array(1)}, exact=False)


_RESIZE = [
    ("nearest", "asymmetric", "floor", [1, 1, 2, 3]),
    ("nearest", "half_pixel", "round_prefer_floor", [1, 1, 0.6, 1.7]),
    ("nearest", "align_corners", "round_prefer_ceil", [1, 1, 1.5, 0.5]),
    ("nearest", "pytorch_half_pixel", "ceil", [1, 1, 2.5, 2]),
    ("linear", "half_pixel", "", [1, 1, 2, 1.5]),
    ("linear", "align_corners", "", [1, 1, 0.5, 3]),
    ("linear", "asymmetric", "", [1, 1, 3, 2]),
    ("linear", "pytorch_half_pixel", "", [1, 1, 1.7, 0.6]),
    ("cubic", "half_pixel", "", [1, 1, 2, 2]),
]


@pytest.mark.parametrize("mode,ctm,nearest,scales", _RESIZE)
@pytest.mark.parametrize("dtype", [F32, F16], ids=lambda d: np.dtype(d).name)
def test_resize_scales(mode, ctm, nearest, scales, dtype):
    x = _x((2, 3, 7, 9), dtype)
    attrs = {"mode": mode, "coordinate_transformation_mode": ctm}
    if nearest:
        attrs["nearest_mode"] = nearest
    inits = {"roi": np.array([], F32), "sc": np.array(scales, F32)}
    _check("Resize", {"x": x}, attrs, inits, exact=mode == "nearest")


def test_resize_sizes_and_ints():
    x = _x((1, 3, 7, 9), np.uint8)
    inits = {"roi": np.array([], F32), "sc": np.array([], F32), "sz": np.array([1, 3, 5, 13])}
    _check("Resize", {"x": x}, {"mode": "linear"}, inits)
    inits = {"roi": np.array([0.1, 0.2, 0.9, 0.7], F32), "sc": np.array([], F32), "sz": np.array([11, 6])}
    _check(
        "Resize",
        {"x": _x((1, 3, 7, 9))},
        {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize", "axes": [2, 3]},
        inits,
        exact=False,
    )


def test_scatter():
    x = _x((4, 5))
    _check("ScatterND", {"x": x, "i": np.array([[1], [3]], np.int64), "u": _x((2, 5), seed=1)})
    _check("ScatterND", {"x": x, "i": np.array([[1, 2], [-1, 0]], np.int64), "u": _x((2,), seed=1)})
    upd = _x((2, 3), seed=2)
    _check("ScatterElements", {"x": x, "i": np.array([[1, 0, 3], [2, 2, -4]], np.int64), "u": upd}, {"axis": 0})
    i = np.array([[1, 0, 1], [2, 2, -1]], np.int64)
    _check("ScatterElements", {"x": x, "i": i, "u": upd}, {"axis": 1, "reduction": "add"}, exact=False)


def test_onehot_eyelike():
    ids = np.array([[0, 3, -1], [9, 2, 4]], np.int64)
    _check("OneHot", {"i": ids}, {"axis": -1}, {"d": np.array(10), "v": np.array([0.5, 2.0], F32)})
    _check("OneHot", {"i": ids}, {"axis": 0}, {"d": np.array(10), "v": np.array([1, 7], np.int64)})
    _check("EyeLike", {"x": _x((4, 7), F16)}, {"k": 2})
